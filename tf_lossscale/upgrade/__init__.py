"""Migrates source code: TensorFlow's loss-scaling names become tf_lossscale's.

The migration tool lives in the `tf_lossscale_upgrade` package, which never
imports TensorFlow; this module re-exports it under the documented name (and
`python -m tf_lossscale.upgrade` runs its command line). See
`tf_lossscale_upgrade` for the details.

>>> from tf_lossscale.upgrade import upgrade_source
>>> print(upgrade_source(
...     "import tensorflow as tf\\n"
...     "s = tf.mixed_precision.experimental.FixedLossScale(8)\\n").code, end="")
import tensorflow as tf
import tf_lossscale
s = tf_lossscale.mixed_precision.experimental.FixedLossScale(8)
"""

import tf_lossscale_upgrade

try:
  from tf_lossscale_upgrade import Finding, Result, main, upgrade_source
except ImportError:  # No libcst: the command says what to install; the names raise.
  from tf_lossscale_upgrade import main

  def __getattr__(name):
    if name in __all__:
      return getattr(tf_lossscale_upgrade, name)  # raises ImportError, naming the extra
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Finding", "Result", "main", "upgrade_source"]
