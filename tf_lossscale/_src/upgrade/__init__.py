"""`tf-lossscale-upgrade`: rewrites TensorFlow 2.x-era loss-scaling code to tf_lossscale.

This package is the tool's implementation: it rewrites text with libcst and
uses no TensorFlow. The public spelling is `tf_lossscale.upgrade` (see its
docstring), and the command is `tf-lossscale-upgrade` or
`python -m tf_lossscale.upgrade`.
"""

try:
  import libcst  # noqa: F401
except ImportError as error:
  raise ImportError(
    "tf-lossscale-upgrade needs libcst: pip install tf-lossscale[upgrade]"
  ) from error

from tf_lossscale._src.upgrade._cli import main
from tf_lossscale._src.upgrade._rewrite import Finding, Result, upgrade_source

__all__ = ["Finding", "Result", "main", "upgrade_source"]
