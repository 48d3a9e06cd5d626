"""`LossScaleOptimizer` family base for Keras 3 inner optimizers.

The concrete class is `(LossScaleOptimizer, Keras3Family)`. `Keras3Family`
subclasses Keras 3's own `keras.optimizers.LossScaleOptimizer` only so that
the wrapper is a `keras.optimizers.Optimizer` (which `Model.compile` requires)
and so that `Model.compile` under a `mixed_float16` policy, which wraps every
optimizer that is not a Keras `LossScaleOptimizer`, leaves ours alone. None of
Keras 3's loss-scaling code runs: its constructor is not called and every
method that would reach its update path is overridden here or in
`LossScaleOptimizer` (which comes first in the method resolution order).

Keras 3's TensorFlow optimizer all-reduces the gradients inside `apply`
whenever it runs in a replica context. `LossScaleOptimizer` reduces them
earlier, once, so that its finiteness decision sees every replica's
gradients; while it applies those reduced gradients through the inner
optimizer, a per-thread mark makes the inner optimizer's reduction (replaced
on the inner instance when it is wrapped) pass them through unchanged.
"""

import re
import threading

import keras
import tensorflow as tf
from keras.src.utils import naming

from tf_lossscale._src import keras_optimizer

# id()s of inner optimizers currently applying already-reduced gradients, per
# thread: MirroredStrategy runs each replica function in its own thread.
_APPLYING_REDUCED = threading.local()


def _applying_reduced():
  if not hasattr(_APPLYING_REDUCED, "value"):
    _APPLYING_REDUCED.value = set()
  return _APPLYING_REDUCED.value


class Keras3Family(keras.optimizers.LossScaleOptimizer):
  """Makes a `LossScaleOptimizer` a Keras 3 optimizer around a Keras 3 one."""

  @staticmethod
  def _accepts(inner_optimizer):
    return isinstance(inner_optimizer, keras.optimizers.Optimizer)

  @staticmethod
  def _is_loss_scale_optimizer(inner_optimizer):
    return isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer)

  @staticmethod
  def _register_serializable(concrete_class, name):
    keras.saving.register_keras_serializable("tf_lossscale", name)(concrete_class)

  def _init_family(self):
    # Keras 3's Optimizer.__setattr__ insists on this attribute.
    self._set_internal("_lock", False)
    self._set_internal("name", "loss_scale_optimizer")
    inner = self._optimizer
    reduce_gradients = inner._all_reduce_sum_gradients  # pylint: disable=protected-access

    def all_reduce_sum_gradients(grads_and_vars):
      if id(inner) in _applying_reduced():
        return list(grads_and_vars)
      return reduce_gradients(grads_and_vars)

    object.__setattr__(inner, "_all_reduce_sum_gradients", all_reduce_sum_gradients)
    self._set_internal("_reduce_once", reduce_gradients)

  # --- Hooks used by LossScaleOptimizer -------------------------------------

  def _build_inner(self, var_list):
    if self._optimizer.built:
      return

    def build(*_):
      with tf.init_scope():
        self._optimizer.build(var_list)

    # Built from a replica, a slot restored from a checkpoint would get the
    # checkpointed value on the first replica only: build in cross-replica
    # context, where a mirrored variable is initialized on every device.
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
      tf.distribute.get_replica_context().merge_call(build)
    else:
      build()

  def _reduce_gradients(self, grads_and_vars):
    if tf.distribute.get_replica_context() is None:
      return grads_and_vars
    return list(self._reduce_once(grads_and_vars))

  def _apply_inner(self, grads, wrapped_vars, name, aggregate):
    del name  # Keras 3 optimizers take none.
    grads_and_vars = list(zip(grads, wrapped_vars.value, strict=True))
    if aggregate:
      self._optimizer.apply_gradients(grads_and_vars)
      return
    applying = _applying_reduced()
    applying.add(id(self._optimizer))
    try:
      self._optimizer.apply_gradients(grads_and_vars)
    finally:
      applying.discard(id(self._optimizer))

  def _can_apply_reduced(self):
    return True

  def _count_skipped_step(self):
    self._optimizer._iterations.assign_add(1)  # pylint: disable=protected-access

  @staticmethod
  def _hyperparameter_names(optimizer):
    return keras_optimizer.tf24_hyperparameters(optimizer, keras.optimizers)

  def _get_hyperparameter(self, name):
    return getattr(self._optimizer, name)

  def _set_hyperparameter(self, name, value):
    setattr(self._optimizer, name, value)

  @staticmethod
  def _serialize_inner(optimizer):
    return keras.optimizers.serialize(optimizer)

  @staticmethod
  def _deserialize_family_inner(config, custom_objects):
    return keras.optimizers.deserialize(dict(config), custom_objects=custom_objects)

  @staticmethod
  def _has_automatic_name(optimizer):
    automatic = re.escape(naming.to_snake_case(type(optimizer).__name__))
    return re.fullmatch(f"{automatic}(_[0-9]+)?", optimizer.name) is not None

  # --- Keras 3 Optimizer API, on the inner optimizer's state ----------------

  @property
  def built(self):
    """Whether the inner optimizer has created its variables."""
    return self._optimizer.built

  @built.setter
  def built(self, value):
    del value  # The inner optimizer's state is the truth.

  def build(self, var_list):
    """Creates the inner optimizer's variables for `var_list`."""
    if not self._optimizer.built:
      self._optimizer.build(var_list)

  @property
  def variables(self):
    """The inner optimizer's variables (the loss scale's are not included)."""
    return self._optimizer.variables

  def apply(self, grads, trainable_variables=None):
    """`apply_gradients(zip(grads, trainable_variables))`, Keras 3's spelling."""
    if trainable_variables is None:
      trainable_variables = self._optimizer._trainable_variables  # pylint: disable=protected-access
    return self.apply_gradients(zip(grads, trainable_variables, strict=True))

  def stateless_apply(self, optimizer_variables, grads, trainable_variables):
    raise NotImplementedError(
      "LossScaleOptimizer does not support stateless_apply (it needs tf.distribute's variables)."
    )

  def finalize_variable_values(self, var_list):
    self._optimizer.finalize_variable_values(var_list)

  def save_own_variables(self, store):
    """Saves the loss-scale state (the inner optimizer saves its own)."""
    if self.dynamic:
      store["0"] = self._loss_scale._current_loss_scale.numpy()  # pylint: disable=protected-access
      store["1"] = self.dynamic_counter.numpy()

  def load_own_variables(self, store):
    """Restores what `save_own_variables` saved."""
    if self.dynamic and len(store.keys()) == 2:
      self._loss_scale._current_loss_scale.assign(store["0"])  # pylint: disable=protected-access
      self.dynamic_counter.assign(store["1"])
