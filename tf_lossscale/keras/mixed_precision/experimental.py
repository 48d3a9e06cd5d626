"""Mirrors `tf.keras.mixed_precision.experimental` (deprecated in TF 2.4)."""

from tf_lossscale._src.keras_experimental import LossScaleOptimizer
from tf_lossscale._src.keras_policy import (
  Policy,
  get_layer_policy,
  global_policy,
  set_policy,
  wrap_optimizer_for_policy,
)

__all__ = [
  "LossScaleOptimizer",
  "Policy",
  "get_layer_policy",
  "global_policy",
  "set_policy",
  "wrap_optimizer_for_policy",
]
