"""Migrates source code: TensorFlow's loss-scaling names become tf_lossscale's.

The command line is `tf-lossscale-upgrade` (also `python -m tf_lossscale_upgrade`,
or `python -m tf_lossscale.upgrade`). This package rewrites text and never imports
TensorFlow or Keras, so it starts in a fraction of a second; `tf_lossscale.upgrade`
re-exports it (importing the `tf_lossscale` package imports TensorFlow). It needs
`libcst`: `pip install tf-lossscale[upgrade]`.

`upgrade_source` rewrites one module's text and reports what it did. A name is
rewritten however TensorFlow was imported:

>>> from tf_lossscale_upgrade import upgrade_source
>>> result = upgrade_source(
...     "import tensorflow as tf\\n"
...     "opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD())\\n")
>>> print(result.code, end="")
import tensorflow as tf
import tf_lossscale
opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD())
>>> for finding in result.findings:
...   print(finding.line, finding.describe())
2 tf.keras.mixed_precision.LossScaleOptimizer -> tf_lossscale.keras.mixed_precision.LossScaleOptimizer

An import whose every use has a tf_lossscale twin is rewritten instead of the
uses, so the code keeps its style:

>>> result = upgrade_source(
...     "from tensorflow.keras.mixed_precision import experimental as mixed_precision\\n"
...     "opt = mixed_precision.LossScaleOptimizer(opt, loss_scale='dynamic')\\n")
>>> print(result.code, end="")
from tf_lossscale.keras.mixed_precision import experimental as mixed_precision
opt = mixed_precision.LossScaleOptimizer(opt, loss_scale='dynamic')

A name that only looks like TensorFlow's is left alone:

>>> code = "import mixed_precision\\nopt = mixed_precision.LossScaleOptimizer(opt)\\n"
>>> upgrade_source(code).code == code
True
"""

import sys

__all__ = ["Finding", "Result", "main", "upgrade_source"]

_NEEDS_LIBCST = "tf-lossscale-upgrade needs libcst: pip install 'tf-lossscale[upgrade]'"

try:
  import libcst  # noqa: F401
except ImportError as _missing:
  _MISSING = _missing

  def main(argv=None):
    """Without libcst, the command says what to install (exit status 2, an error)."""
    del argv
    print(_NEEDS_LIBCST, file=sys.stderr)
    return 2

  def __getattr__(name):
    if name in __all__:
      raise ImportError(_NEEDS_LIBCST) from _MISSING
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

else:
  from tf_lossscale_upgrade._cli import main
  from tf_lossscale_upgrade._rewrite import Finding, Result, upgrade_source
