"""`python -m tf_lossscale.upgrade`: runs `tf-lossscale-upgrade`."""

import sys

from tf_lossscale.upgrade import main

if __name__ == "__main__":
  sys.exit(main())
