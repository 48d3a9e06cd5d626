"""Legacy loss scales: `tf.compat.v1.mixed_precision.{LossScale, FixedLossScale, DynamicLossScale}`."""

from tf_lossscale._src.loss_scale import (
  DynamicLossScale,
  FixedLossScale,
  LossScale,
  deserialize,
  get,
  serialize,
)

__all__ = ["DynamicLossScale", "FixedLossScale", "LossScale", "deserialize", "get", "serialize"]
