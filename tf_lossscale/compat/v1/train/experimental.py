"""Mirrors `tf.compat.v1.train.experimental`."""

from tf_lossscale._src.compat_v1_optimizer import MixedPrecisionLossScaleOptimizer
from tf_lossscale._src.loss_scale import DynamicLossScale, FixedLossScale, LossScale

__all__ = ["DynamicLossScale", "FixedLossScale", "LossScale", "MixedPrecisionLossScaleOptimizer"]
