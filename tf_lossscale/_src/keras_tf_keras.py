"""`LossScaleOptimizer` family bases for tf_keras inner optimizers.

`OptimizerV2Family` takes `tf_keras.optimizers.legacy.*` (OptimizerV2, the
optimizers of TF 2.4), `TfKerasOptimizerFamily` the newer
`tf_keras.optimizers.*`. Each concrete class `(LossScaleOptimizer, family)` is
an optimizer of that kind and a tf_keras `BaseLossScaleOptimizer`, so that
tf_keras's `Model.compile` under a `mixed_float16` policy does not wrap it
again. No base constructor runs; tf_keras's own loss-scaling code is never
reached (`LossScaleOptimizer` comes first in the method resolution order).
Both kinds of inner optimizer can apply gradients that `LossScaleOptimizer`
already all-reduced (`experimental_aggregate_gradients=False`,
`skip_gradients_aggregation=True`).
"""

import tensorflow as tf
import tf_keras
from tf_keras.src.mixed_precision import loss_scale_optimizer as tf_keras_lso
from tf_keras.src.optimizers import optimizer as tf_keras_optimizer
from tf_keras.src.optimizers.legacy import optimizer_v2

from tf_lossscale._src import keras_optimizer


class OptimizerV2Family(optimizer_v2.OptimizerV2, tf_keras_lso.BaseLossScaleOptimizer):
  """Makes a `LossScaleOptimizer` an `OptimizerV2` around an `OptimizerV2`."""

  _HAS_AGGREGATE_GRAD = True

  @staticmethod
  def _accepts(inner_optimizer):
    return isinstance(inner_optimizer, optimizer_v2.OptimizerV2)

  @staticmethod
  def _is_loss_scale_optimizer(inner_optimizer):
    return isinstance(inner_optimizer, tf_keras_lso.BaseLossScaleOptimizer)

  @staticmethod
  def _register_serializable(concrete_class, name):
    tf_keras.saving.register_keras_serializable("tf_lossscale", name)(concrete_class)

  def _init_family(self):
    pass

  # --- Hooks used by LossScaleOptimizer -------------------------------------

  def _build_inner(self, var_list):
    with tf.name_scope(self._optimizer._name), tf.init_scope():  # pylint: disable=protected-access
      self._optimizer._create_all_weights(var_list)  # pylint: disable=protected-access

  def _reduce_gradients(self, grads_and_vars):
    grads_and_vars = self._optimizer._transform_unaggregated_gradients(grads_and_vars)  # pylint: disable=protected-access
    return self._optimizer._aggregate_gradients(grads_and_vars)  # pylint: disable=protected-access

  def _apply_inner(self, grads, wrapped_vars, name, aggregate):
    return self._optimizer.apply_gradients(
      list(zip(grads, wrapped_vars.value, strict=True)),
      name=name,
      experimental_aggregate_gradients=aggregate,
    )

  def _can_apply_reduced(self):
    # OptimizerV2 refuses experimental_aggregate_gradients=False there.
    return not isinstance(
      tf.distribute.get_strategy(),
      (
        tf.distribute.experimental.CentralStorageStrategy,
        tf.compat.v1.distribute.experimental.CentralStorageStrategy,
        tf.distribute.experimental.ParameterServerStrategy,
        tf.compat.v1.distribute.experimental.ParameterServerStrategy,
      ),
    )

  def _count_skipped_step(self):
    return self._optimizer.iterations.assign_add(1, read_value=False)

  @staticmethod
  def _hyperparameter_names(optimizer):
    return set(optimizer._hyper)  # pylint: disable=protected-access

  def _get_hyperparameter(self, name):
    return self._optimizer._get_hyper(name)  # pylint: disable=protected-access

  def _set_hyperparameter(self, name, value):
    self._optimizer._set_hyper(name, value)  # pylint: disable=protected-access

  @staticmethod
  def _serialize_inner(optimizer):
    return tf_keras.optimizers.serialize(optimizer)

  @staticmethod
  def _deserialize_family_inner(config, custom_objects):
    return tf_keras.optimizers.deserialize(
      dict(config), custom_objects=custom_objects, use_legacy_optimizer=True
    )

  @staticmethod
  def _has_automatic_name(optimizer):
    del optimizer  # OptimizerV2 default names are not made unique.
    return False

  # --- OptimizerV2 API, delegated to the inner optimizer ---------------------

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
    self._optimizer._create_all_weights(var_list)  # pylint: disable=protected-access

  def _aggregate_gradients(self, grads_and_vars):
    return self._optimizer._aggregate_gradients(grads_and_vars)  # pylint: disable=protected-access

  def _restore_slot_variable(self, slot_name, variable, slot_variable):
    return self._optimizer._restore_slot_variable(slot_name, variable, slot_variable)  # pylint: disable=protected-access

  def _create_or_restore_slot_variable(self, slot_variable_position, slot_name, variable):
    return self._optimizer._create_or_restore_slot_variable(  # pylint: disable=protected-access
      slot_variable_position, slot_name, variable
    )


class TfKerasOptimizerFamily(tf_keras_optimizer.Optimizer, tf_keras_lso.BaseLossScaleOptimizer):
  """Makes a `LossScaleOptimizer` a new tf_keras optimizer around one."""

  @staticmethod
  def _accepts(inner_optimizer):
    return isinstance(inner_optimizer, tf_keras_optimizer.Optimizer)

  _is_loss_scale_optimizer = staticmethod(OptimizerV2Family._is_loss_scale_optimizer)
  _register_serializable = staticmethod(OptimizerV2Family._register_serializable)
  _has_automatic_name = staticmethod(OptimizerV2Family._has_automatic_name)
  _serialize_inner = staticmethod(OptimizerV2Family._serialize_inner)

  def _init_family(self):
    pass

  def _build_inner(self, var_list):
    with tf.init_scope():
      self._optimizer.build(var_list)

  def _reduce_gradients(self, grads_and_vars):
    return self._optimizer.aggregate_gradients(grads_and_vars)

  def _can_apply_reduced(self):
    return True

  def _apply_inner(self, grads, wrapped_vars, name, aggregate):
    # Its result, the iterations variable, cannot leave a cond branch.
    self._optimizer.apply_gradients(
      list(zip(grads, wrapped_vars.value, strict=True)),
      name=name,
      skip_gradients_aggregation=not aggregate,
    )

  def _count_skipped_step(self):
    self._optimizer.iterations.assign_add(1)

  @staticmethod
  def _hyperparameter_names(optimizer):
    return keras_optimizer.tf24_hyperparameters(optimizer, tf_keras.optimizers)

  def _get_hyperparameter(self, name):
    return getattr(self._optimizer, name)

  def _set_hyperparameter(self, name, value):
    setattr(self._optimizer, name, value)

  @staticmethod
  def _deserialize_family_inner(config, custom_objects):
    return tf_keras.optimizers.deserialize(
      dict(config), custom_objects=custom_objects, use_legacy_optimizer=False
    )

  # --- tf_keras Optimizer API, on the inner optimizer's state ---------------

  @property
  def variables(self):
    """The inner optimizer's variables (the loss scale's are not included)."""
    return self._optimizer.variables

  def build(self, var_list):
    """Creates the inner optimizer's variables for `var_list`."""
    self._optimizer.build(var_list)

  def compute_gradients(self, loss, var_list, tape=None):
    """Unscaled `(gradient, variable)` pairs of `loss`, scaled first."""
    tape = tf.GradientTape() if tape is None else tape
    with tape:
      scaled_loss = self.get_scaled_loss(loss)
      if callable(scaled_loss):
        scaled_loss = scaled_loss()
    grads_and_vars = self._optimizer.compute_gradients(scaled_loss, var_list, tape=tape)
    grads = self.get_unscaled_gradients([g for g, _ in grads_and_vars])
    return list(zip(grads, [v for _, v in grads_and_vars], strict=True))

  def finalize_variable_values(self, var_list):
    self._optimizer.finalize_variable_values(var_list)


def _register_public_classes():
  # Deserializing in a fresh process needs the names before any instance.
  from tf_lossscale._src import keras_experimental, keras_optimizer  # pylint: disable=g-import-not-at-top

  for cls in (keras_optimizer.LossScaleOptimizer, keras_experimental.LossScaleOptimizer):
    tf_keras.saving.register_keras_serializable("tf_lossscale", cls._REGISTERED_NAME)(cls)  # pylint: disable=protected-access


_register_public_classes()
