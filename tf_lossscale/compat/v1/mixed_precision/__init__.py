"""Mirrors `tf.compat.v1.mixed_precision`."""

from tf_lossscale._src.compat_v1_optimizer import MixedPrecisionLossScaleOptimizer
from tf_lossscale._src.graph_rewrite import (
  disable_mixed_precision_graph_rewrite,
  enable_mixed_precision_graph_rewrite,
)
from tf_lossscale._src.loss_scale import DynamicLossScale, FixedLossScale, LossScale
from tf_lossscale.compat.v1.mixed_precision import experimental

__all__ = [
  "DynamicLossScale",
  "FixedLossScale",
  "LossScale",
  "MixedPrecisionLossScaleOptimizer",
  "disable_mixed_precision_graph_rewrite",
  "enable_mixed_precision_graph_rewrite",
  "experimental",
]
