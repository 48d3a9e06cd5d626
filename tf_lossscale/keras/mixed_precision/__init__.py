"""Mirrors `tf.keras.mixed_precision`."""

from tf_lossscale._src.keras_optimizer import LossScaleOptimizer
from tf_lossscale._src.keras_policy import KerasPolicy as Policy
from tf_lossscale._src.keras_policy import global_policy, set_global_policy
from tf_lossscale.keras.mixed_precision import experimental

__all__ = ["LossScaleOptimizer", "Policy", "experimental", "global_policy", "set_global_policy"]
