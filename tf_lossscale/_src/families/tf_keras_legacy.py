"""The tf_keras OptimizerV2 family: `tf_keras.optimizers.legacy.*`.

The optimizers of TF 2.4. The wrapper is an OptimizerV2 and a tf_keras
`BaseLossScaleOptimizer`, so tf_keras's `Model.compile` under a
`mixed_float16` policy does not wrap it again. No base constructor runs;
tf_keras's own loss-scaling code is never reached (`LossScaleOptimizer` comes
first in the method resolution order). OptimizerV2 can apply gradients the
wrapper already all-reduced (`experimental_aggregate_gradients=False`),
except under the strategies that must aggregate themselves.
"""

import tensorflow as tf
import tf_keras

from tf_lossscale._src import framework_internals, validation
from tf_lossscale._src.families import base

_SELF_AGGREGATING_STRATEGIES = (
  tf.distribute.experimental.CentralStorageStrategy,
  tf.compat.v1.distribute.experimental.CentralStorageStrategy,
  tf.distribute.experimental.ParameterServerStrategy,
  tf.compat.v1.distribute.experimental.ParameterServerStrategy,
)


class ArgumentsAsGiven(type(framework_internals.tf_keras_base_loss_scale_optimizer())):
  """tf_keras's loss-scale-optimizer metaclass, passing constructor arguments on as given.

  Its own `__call__` passes the inner optimizer on positionally, which a
  subclass taking keywords only refuses (Horovod's rebuild of `type(opt)`,
  whose `__init__(self, **kwargs)` gets `cls.from_config`'s keywords).
  """

  def __call__(cls, *args, **kwargs):
    return type.__call__(cls, *args, **kwargs)


class OptimizerV2Api(
  tf_keras.optimizers.legacy.Optimizer,
  framework_internals.tf_keras_base_loss_scale_optimizer(),
  metaclass=ArgumentsAsGiven,
):
  """OptimizerV2's API of the wrapper, delegated to the inner optimizer."""

  _HAS_AGGREGATE_GRAD = True

  def get_gradients(self, loss, params):
    """Returns the unscaled gradients of `loss` (scaled first) for `params`.

    Args:
      loss: The loss tensor (graph mode).
      params: List of variables.

    Returns:
      List of unscaled gradient tensors.
    """
    loss = self.get_scaled_loss(loss)
    grads = self._optimizer.get_gradients(loss, params)
    return self.get_unscaled_gradients(grads)

  def get_slot_names(self):
    return self._optimizer.get_slot_names()

  def get_slot(self, var, slot_name):
    return self._optimizer.get_slot(var, slot_name)

  def add_slot(self, var, slot_name, initializer="zeros", shape=None):
    return self._optimizer.add_slot(var, slot_name, initializer, shape)

  def variables(self):
    return self._optimizer.variables()

  @property
  def weights(self):
    return self._optimizer.weights

  def get_weights(self):
    return self._optimizer.get_weights()

  def set_weights(self, weights):
    return self._optimizer.set_weights(weights)

  def _create_all_weights(self, var_list):
    framework_internals.v2_create_all_weights(self._optimizer, var_list)

  def _decayed_lr(self, var_dtype):
    """The inner optimizer's current learning rate (its schedule and `decay`
    at its `iterations`), a tensor of `var_dtype`."""
    return framework_internals.v2_decayed_lr(self._optimizer, var_dtype)

  def _aggregate_gradients(self, grads_and_vars):
    return framework_internals.v2_aggregate_gradients(self._optimizer, grads_and_vars)

  def _restore_slot_variable(self, slot_name, variable, slot_variable):
    return framework_internals.v2_restore_slot_variable(
      self._optimizer, slot_name, variable, slot_variable
    )

  def _create_or_restore_slot_variable(self, slot_variable_position, slot_name, variable):
    return framework_internals.v2_create_or_restore_slot_variable(
      self._optimizer, slot_variable_position, slot_name, variable
    )


def _is_tf_keras_loss_scale_optimizer(optimizer):
  return isinstance(optimizer, framework_internals.tf_keras_base_loss_scale_optimizer())


def _register(serialized_class, name, deserialized_class):
  package, _, short_name = name.partition(">")
  tf_keras.saving.register_keras_serializable(package, short_name)(serialized_class)
  # After the line above, which maps the name to `serialized_class` too.
  tf_keras.saving.get_custom_objects()[name] = deserialized_class


class OptimizerV2Family(base.Family):
  """Adapter of a tf_keras OptimizerV2 inner optimizer."""

  optimizer_api = OptimizerV2Api
  gradient_dtype_must_match = True
  returns_step_op = True  # TF 2.4's: TF1 graphs and Sessions run it.
  applies_no_gradients = True  # OptimizerV2 returns a no-op, TF 2.4's wrapper counted a step.
  built_in_apply_conditional = True  # TF 2.4's `cond_1/Adam/iter`.
  updates_keras3_variables = False

  def __init__(self, inner):
    super().__init__(inner)
    framework_internals.v2_check_members(inner)

  @classmethod
  def accepts_class(cls, klass):
    return issubclass(klass, tf_keras.optimizers.legacy.Optimizer)

  @classmethod
  def is_loss_scale_optimizer(cls, optimizer):
    return _is_tf_keras_loss_scale_optimizer(optimizer)

  @classmethod
  def register_serializable(cls, serialized_class, name, deserialized_class):
    _register(serialized_class, name, deserialized_class)

  @classmethod
  def registered_name(cls, klass):
    return base.registered_name(klass, tf_keras.saving)

  @classmethod
  def claims_config(cls, config):
    return base.is_optimizer_v2_config(config)

  @classmethod
  def deserialize(cls, config, custom_objects):
    return tf_keras.optimizers.deserialize(
      dict(config), custom_objects=custom_objects, use_legacy_optimizer=True
    )

  @classmethod
  def init_wrapper(cls, wrapper):
    del wrapper  # OptimizerV2 needs nothing before attributes are set.

  def build(self, grads_and_vars):
    # OptimizerV2 makes slots only for variables with a gradient.
    var_list = [v for g, v in grads_and_vars if g is not None]
    # Outside its strategy it would update one replica's copy.
    validation.check_variables_in_their_strategy(var_list)
    framework_internals.v2_create_all_weights(self.inner, var_list)

  def unknown_variables(self, variables):
    del variables  # OptimizerV2 creates the slots of a new variable when it comes.
    return []

  def compute_gradients(self, loss, var_list, grad_loss, tape):
    # As TF 2.4's wrapper: the inner optimizer's own computation (its name
    # scope, loss transform and dtype check) on the scaled loss.
    grads_and_vars = framework_internals.v2_compute_gradients(
      self.inner, loss, var_list, grad_loss, tape
    )
    if grads_and_vars is None:
      return super().compute_gradients(loss, var_list, grad_loss, tape)
    return grads_and_vars

  def reduce_gradients(self, grads_and_vars):
    return framework_internals.v2_aggregate_gradients(self.inner, grads_and_vars)

  def can_apply_reduced(self):
    # OptimizerV2 refuses experimental_aggregate_gradients=False there.
    return not isinstance(tf.distribute.get_strategy(), _SELF_AGGREGATING_STRATEGIES)

  def apply(self, grads, variables, name, aggregate):
    return self.inner.apply_gradients(
      list(zip(grads, variables, strict=True)),
      name=name,
      experimental_aggregate_gradients=aggregate,
    )

  def count_skipped_step(self, skipped):
    counter = self.inner.iterations
    return counter.assign_add(tf.cast(skipped, counter.dtype), read_value=False)

  def hyperparameter_names(self):
    return framework_internals.v2_hyperparameter_names(self.inner)

  def get_hyperparameter(self, name):
    return framework_internals.v2_get_hyperparameter(self.inner, name)

  def set_hyperparameter(self, name, value):
    framework_internals.v2_set_hyperparameter(self.inner, name, value)

  def serialize(self):
    return tf_keras.optimizers.serialize(self.inner)

  def has_automatic_name(self):
    return False  # OptimizerV2's default names are not made unique.


FAMILY = OptimizerV2Family
