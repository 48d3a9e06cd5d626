"""`python -m tf_lossscale_upgrade`: the command without importing TensorFlow."""

import sys

from tf_lossscale_upgrade import main

if __name__ == "__main__":
  sys.exit(main())
