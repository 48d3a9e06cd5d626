"""The deprecated experimental Keras `LossScaleOptimizer(optimizer, loss_scale)`."""

from typing import Any

import tensorflow as tf

from tf_lossscale._src import families, keras_optimizer
from tf_lossscale._src import loss_scale as loss_scale_module

# The options beyond TF 2.4 a non-experimental config may hold. This class
# keeps TF 2.4's constructor: they reach it in its `DynamicLossScale`.
_SCALE_OPTIONS = ("min_loss_scale", "max_loss_scale", "hysteresis")


class LossScaleOptimizer(keras_optimizer.LossScaleOptimizer):
  """A deprecated optimizer that applies loss scaling.

  Warning: This class is deprecated, as it was in TF 2.4; tf_lossscale keeps
  it for code written for TF 2.3 and 2.4. Please use the non-experimental
  class `tf_lossscale.keras.mixed_precision.LossScaleOptimizer` instead.

  It is identical to the non-experimental class except for its constructor,
  which takes a `loss_scale` where the non-experimental one takes `dynamic`,
  `initial_scale` and `dynamic_growth_steps`. Conversions to the
  non-experimental class (configs of Keras 3 optimizers built without a name
  are compared with `comparable_config`, see `LossScaleOptimizer`):

  >>> import tf_lossscale
  >>> from tf_lossscale.keras import mixed_precision
  >>> # In all of the the examples below, `opt1` and `opt2` are identical
  >>> opt1 = mixed_precision.experimental.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD(), loss_scale='dynamic')
  >>> opt2 = mixed_precision.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD())
  >>> assert opt1.comparable_config() == opt2.comparable_config()

  >>> opt1 = mixed_precision.experimental.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD(), loss_scale=123)
  >>> # dynamic=False indicates to use fixed loss scaling. initial_scale=123
  >>> # refers to the initial loss scale, which is the single fixed loss scale
  >>> # when dynamic=False.
  >>> opt2 = mixed_precision.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD(), dynamic=False, initial_scale=123)
  >>> assert opt1.comparable_config() == opt2.comparable_config()

  >>> loss_scale = tf_lossscale.mixed_precision.experimental.DynamicLossScale(
  ...     initial_loss_scale=2048, increment_period=500)
  >>> opt1 = mixed_precision.experimental.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD(name='sgd'), loss_scale=loss_scale)
  >>> opt2 = mixed_precision.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD(name='sgd'), initial_scale=2048,
  ...     dynamic_growth_steps=500)
  >>> assert opt1.get_config() == opt2.get_config()

  The experimental class subclasses the non-experimental class, not the
  reverse; switch `isinstance` checks to the non-experimental class:

  >>> opt1 = mixed_precision.experimental.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD(), loss_scale='dynamic')
  >>> # The experimental class subclasses the non-experimental class
  >>> isinstance(opt1, mixed_precision.LossScaleOptimizer)
  True
  >>> opt2 = mixed_precision.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD())
  >>> # The non-experimental class does NOT subclass the experimental class.
  >>> isinstance(opt2, mixed_precision.experimental.LossScaleOptimizer)
  False

  The options beyond TF 2.4 (`min_loss_scale`, `max_loss_scale`,
  `hysteresis`) are not arguments of this class, which keeps TF 2.4's
  constructor: set them on the `DynamicLossScale` passed as `loss_scale`.

  Args:
    optimizer: The optimizer instance to wrap.
    loss_scale: The loss scale: an int/float for a fixed loss scale, the
      string "dynamic" for dynamic loss scaling (the same as passing
      `DynamicLossScale()`), a `FixedLossScale`, or a `DynamicLossScale`
      whose `multiplier` is 2 (the default); its options beyond TF 2.4 carry
      over.

  Raises:
    ValueError: For a number that is not finite and > 0, a
      `DynamicLossScale` whose multiplier is not 2, or a `loss_scale` of
      another kind.
    TypeError: For a `LossScale` that is neither a `FixedLossScale` nor a
      `DynamicLossScale`.
  """

  _INNER_ARGUMENT = "optimizer"

  def __init__(
    self, optimizer: Any, loss_scale: "str | float | loss_scale_module.LossScale"
  ) -> None:
    settings = keras_optimizer.settings_from_legacy_loss_scale(loss_scale)
    arguments = "".join(f", {key}={value}" for key, value in settings.items() if key != "dynamic")
    if not settings["dynamic"]:
      arguments = ", dynamic=False" + arguments
    tf.get_logger().warning(
      "tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer is "
      "deprecated. Please use tf_lossscale.keras.mixed_precision.LossScaleOptimizer "
      "instead. For example\n"
      f"  opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(opt{arguments})"
    )
    super().__init__(optimizer, **settings)

  def __reduce_ex__(self, protocol):
    """Copies and pickles as this class.

    Keras 3 pickles its optimizers through its saving format, and that loads
    this class's saved name (TF 2.4's, `LossScaleOptimizerV1`) as the
    non-experimental class, as TF 2.4 loaded a saved model.
    """
    rebuild, arguments, *rest = super().__reduce_ex__(protocol)
    return (_rebuilt, (rebuild, arguments), *rest)

  @classmethod
  def from_config(
    cls, config: dict[str, Any], custom_objects: dict[str, Any] | None = None
  ) -> "LossScaleOptimizer":
    """Creates the optimizer from `get_config()`'s output (either class's).

    Args:
      config: The config dict.
      custom_objects: Optional dict of user-defined objects.

    Returns:
      A new experimental `LossScaleOptimizer`.

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(name='sgd'), 8)
    >>> LossScaleOptimizer.from_config(opt.get_config()).initial_scale
    8.0
    """
    config = keras_optimizer.copied_config(config)
    with keras_optimizer.settings_only_scope():
      if "loss_scale" not in config:
        config["optimizer"] = config.pop("inner_optimizer")
        # Those left out take their defaults, as in the non-experimental class.
        given = {
          "initial_loss_scale": config.pop("initial_scale", None),
          "increment_period": config.pop("dynamic_growth_steps", None),
        }
        if config.pop("dynamic", True):
          options = {k: config.pop(k) for k in _SCALE_OPTIONS if k in config}
          given = {k: v for k, v in given.items() if v is not None}
          config["loss_scale"] = loss_scale_module.DynamicLossScale(**given, **options)
        else:
          config["loss_scale"] = given["initial_loss_scale"]
      loss_scale = config.pop("loss_scale")
      if isinstance(loss_scale, dict):
        loss_scale = loss_scale_module.deserialize(loss_scale)
        keras_optimizer.settings_from_legacy_loss_scale(loss_scale, deserializing=True)
    optimizer = config.pop("optimizer")
    if isinstance(optimizer, dict):
      optimizer = keras_optimizer.deserialize_inner(cls, optimizer, custom_objects)
    return cls(optimizer=optimizer, loss_scale=loss_scale)


def _rebuilt(rebuild, arguments):
  """What `rebuild(*arguments)` makes, as the experimental class (which keeps no
  state of its own)."""
  optimizer = rebuild(*arguments)
  if not isinstance(optimizer, LossScaleOptimizer):
    optimizer.__class__ = keras_optimizer.concrete_class(
      LossScaleOptimizer, families.for_optimizer(optimizer.inner_optimizer)
    )
  return optimizer


# TF 2.4 serialized this class under its class name, LossScaleOptimizerV1, and
# deserialized that name as the non-experimental class.
families.register_public_class(
  LossScaleOptimizer, "LossScaleOptimizerV1", keras_optimizer.LossScaleOptimizer
)
