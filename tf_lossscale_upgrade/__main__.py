"""`python -m tf_lossscale_upgrade`: runs `tf-lossscale-upgrade`."""

import sys

from tf_lossscale_upgrade import main

if __name__ == "__main__":
  sys.exit(main())
