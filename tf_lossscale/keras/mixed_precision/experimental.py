"""Mirrors `tf.keras.mixed_precision.experimental` (deprecated in TF 2.4)."""

from tf_lossscale._src.keras_experimental import LossScaleOptimizer

__all__ = ["LossScaleOptimizer"]
