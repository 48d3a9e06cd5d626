"""Mirrors `tf.mixed_precision.experimental`."""

from tf_lossscale._src.loss_scale import DynamicLossScale, FixedLossScale, LossScale

__all__ = ["DynamicLossScale", "FixedLossScale", "LossScale"]
