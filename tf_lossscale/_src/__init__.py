"""Private implementation of tf_lossscale; import the public namespaces instead.

Imported before any of its modules: it checks first that TensorFlow >= 2.16 is
installed, which pip does not install by name (see setup.py), and says how to
install one.
"""

import re

try:
  import tensorflow as tf
except ModuleNotFoundError as error:
  if error.name != "tensorflow":
    raise
  raise ModuleNotFoundError(
    "tf_lossscale needs TensorFlow >= 2.16, and none is installed: pip install "
    "'tf-lossscale[tensorflow]' (or 'tf-lossscale[tensorflow-cpu]', or your own build "
    "of TensorFlow)",
    name="tensorflow",
  ) from error

if tuple(int(n) for n in re.findall(r"\d+", tf.__version__)[:2]) < (2, 16):
  raise ImportError(
    f"tf_lossscale needs TensorFlow >= 2.16; this is TensorFlow {tf.__version__}, whose "
    "tf.keras (Keras 2) still has the loss-scaling APIs tf_lossscale brings back "
    "(tf.keras.mixed_precision.LossScaleOptimizer, ...): use them, or upgrade TensorFlow"
  )
