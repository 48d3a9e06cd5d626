"""Deprecated experimental Keras `LossScaleOptimizer`. Placeholder until issue 3 lands."""

from tf_lossscale._src import keras_optimizer


class LossScaleOptimizer(keras_optimizer.LossScaleOptimizer):
  """Not implemented yet: see issue 3."""
