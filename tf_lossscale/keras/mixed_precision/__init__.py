"""Mirrors `tf.keras.mixed_precision`."""

from tf_lossscale._src.keras_optimizer import LossScaleOptimizer
from tf_lossscale.keras.mixed_precision import experimental

__all__ = ["LossScaleOptimizer", "experimental"]
