"""tf_lossscale: TensorFlow 2.4's mixed-precision loss-scaling APIs on today's TensorFlow.

The namespaces mirror TensorFlow's: a migration is an import rewrite, e.g.
`tf.keras.mixed_precision.LossScaleOptimizer` becomes
`tf_lossscale.keras.mixed_precision.LossScaleOptimizer`.
"""

from tf_lossscale import compat, keras, loss_scale, mixed_precision
from tf_lossscale._src.compat_v1_optimizer import MixedPrecisionLossScaleOptimizer
from tf_lossscale._src.keras_optimizer import LossScaleOptimizer
from tf_lossscale._src.loss_scale import DynamicLossScale, FixedLossScale, LossScale

__version__ = "0.1.0"

__all__ = [
  "DynamicLossScale",
  "FixedLossScale",
  "LossScale",
  "LossScaleOptimizer",
  "MixedPrecisionLossScaleOptimizer",
  "compat",
  "keras",
  "loss_scale",
  "mixed_precision",
]
