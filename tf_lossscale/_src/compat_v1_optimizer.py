"""compat.v1 `MixedPrecisionLossScaleOptimizer`. Placeholder until issue 4 lands."""


class MixedPrecisionLossScaleOptimizer:
  """Not implemented yet: see issue 4."""

  def __init__(self, *args, **kwargs):
    raise NotImplementedError(
        "tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer "
        "is not implemented yet."
    )
