"""Keras `LossScaleOptimizer` (TF 2.4 API). Placeholder until issue 3 lands."""


class LossScaleOptimizer:
  """Not implemented yet: see issue 3."""

  def __init__(self, *args, **kwargs):
    raise NotImplementedError(
        "tf_lossscale.keras.mixed_precision.LossScaleOptimizer is not implemented yet."
    )
