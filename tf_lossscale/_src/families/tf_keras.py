"""The new tf_keras family: `tf_keras.optimizers.*` (not `.legacy`).

As for OptimizerV2 (`tf_keras_legacy`), the wrapper is an optimizer of this
kind and a tf_keras `BaseLossScaleOptimizer`, with no base constructor run.
These optimizers apply already-reduced gradients with
`skip_gradients_aggregation=True`; a subclass whose `apply_gradients` does
not take it (or `name`) is not passed it, and sums the gradients itself.
"""

import inspect

import tensorflow as tf
import tf_keras

from tf_lossscale._src import framework_internals
from tf_lossscale._src.families import base, tf_keras_legacy


class TfKerasOptimizerApi(
  tf_keras.optimizers.Optimizer,
  framework_internals.tf_keras_base_loss_scale_optimizer(),
  metaclass=tf_keras_legacy.ArgumentsAsGiven,
):
  """tf_keras's optimizer API of the wrapper, on the inner optimizer's state."""

  @property
  def variables(self):
    """The inner optimizer's variables (the loss scale's are not included)."""
    return self._optimizer.variables

  def set_weights(self, weights):
    """Sets the inner optimizer's variables (the `.h5` format's restore)."""
    self._optimizer.set_weights(weights)

  def exclude_from_weight_decay(self, var_list=None, var_names=None):
    """Excludes variables from the inner optimizer's weight decay."""
    self._optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

  def build(self, var_list):
    """Creates the inner optimizer's variables for `var_list`."""
    self._optimizer.build(var_list)

  def compute_gradients(self, loss, var_list, tape=None):
    """Unscaled `(gradient, variable)` pairs of `loss`, scaled first (a
    callable stays one: the inner optimizer calls it, and a callable
    `var_list`, on the tape where it watches the variables)."""
    tape = tf.GradientTape() if tape is None else tape
    if callable(loss):
      scaled_loss = self.get_scaled_loss(loss)
    else:
      with tape:
        scaled_loss = self.get_scaled_loss(loss)
    grads_and_vars = self._optimizer.compute_gradients(scaled_loss, var_list, tape=tape)
    grads = self.get_unscaled_gradients([g for g, _ in grads_and_vars])
    return list(zip(grads, [v for _, v in grads_and_vars], strict=True))

  def finalize_variable_values(self, var_list):
    self._optimizer.finalize_variable_values(var_list)


class TfKerasFamily(base.Family):
  """Adapter of a new tf_keras inner optimizer."""

  optimizer_api = TfKerasOptimizerApi
  gradient_dtype_must_match = True
  returns_step_op = False  # As tf_keras's own wrapper of these optimizers.
  applies_no_gradients = True  # As its plain apply (tf_keras's own wrapper fails).
  built_in_apply_conditional = False  # tf_keras's wrapper builds before it.
  updates_keras3_variables = False

  def __init__(self, inner):
    super().__init__(inner)
    # A subclass may narrow `apply_gradients` (tf_keras's own wrapper always
    # passes `skip_gradients_aggregation`, and fails on one).
    parameters = inspect.signature(inner.apply_gradients).parameters.values()
    self._apply_gradients_names = {p.name for p in parameters}
    self._apply_gradients_takes_any = any(p.kind == p.VAR_KEYWORD for p in parameters)

  @classmethod
  def accepts_class(cls, klass):
    return issubclass(klass, tf_keras.optimizers.Optimizer)

  is_loss_scale_optimizer = tf_keras_legacy.OptimizerV2Family.is_loss_scale_optimizer
  register_serializable = tf_keras_legacy.OptimizerV2Family.register_serializable
  registered_name = tf_keras_legacy.OptimizerV2Family.registered_name

  @classmethod
  def claims_config(cls, config):
    return base.written_by_tf_keras(config) and not tf_keras_legacy.FAMILY.claims_config(config)

  @classmethod
  def deserialize(cls, config, custom_objects):
    """Rebuilds a newer tf_keras optimizer, any of `tf_keras.optimizers`
    (tf_keras's own `deserialize` knows neither Adafactor nor Lion)."""
    public = base.exported_classes(config, tf_keras.optimizers, tf_keras.optimizers.Optimizer)
    return tf_keras.optimizers.deserialize(
      dict(config), custom_objects={**public, **(custom_objects or {})}, use_legacy_optimizer=False
    )

  init_wrapper = tf_keras_legacy.OptimizerV2Family.init_wrapper

  def build(self, grads_and_vars):
    # Every variable passed, None gradient or not, as its own apply builds.
    with tf.init_scope():
      self.inner.build([v for _, v in grads_and_vars])

  def unknown_variables(self, variables):
    return [v for v in variables if not framework_internals.tf_keras_knows_variable(self.inner, v)]

  def reduce_gradients(self, grads_and_vars):
    return self.inner.aggregate_gradients(grads_and_vars)

  def _apply_gradients_takes(self, argument):
    """Whether the inner optimizer's `apply_gradients` takes `argument`."""
    return self._apply_gradients_takes_any or argument in self._apply_gradients_names

  def can_apply_reduced(self):
    return self._apply_gradients_takes("skip_gradients_aggregation")

  def apply(self, grads, variables, name, aggregate):
    kwargs = {"name": name} if self._apply_gradients_takes("name") else {}
    if not aggregate:
      kwargs["skip_gradients_aggregation"] = True
    # Its result, the iterations variable, cannot leave a cond branch.
    self.inner.apply_gradients(list(zip(grads, variables, strict=True)), **kwargs)

  def count_skipped_step(self, skipped):
    counter = self.inner.iterations
    counter.assign_add(tf.cast(skipped, counter.dtype))

  def hyperparameter_names(self):
    return base.tf24_hyperparameters(self.inner, tf_keras.optimizers)

  def get_hyperparameter(self, name):
    return getattr(self.inner, name)

  def set_hyperparameter(self, name, value):
    setattr(self.inner, name, value)

  def serialize(self):
    return tf_keras.optimizers.serialize(self.inner)

  def has_automatic_name(self):
    return False  # tf_keras's default names are not made unique.


FAMILY = TfKerasFamily
