"""The Keras 3 family: `tf.keras.optimizers.*` / `keras.optimizers.*`.

The wrapper subclasses Keras 3's own `keras.optimizers.LossScaleOptimizer`
only so that it is a `keras.optimizers.Optimizer` (which `Model.compile`
requires) and so that `Model.compile` under a `mixed_float16` policy, which
wraps every optimizer that is not a Keras `LossScaleOptimizer`, leaves it
alone. None of Keras 3's loss-scaling code runs: its constructor is not
called and `Keras3OptimizerApi` and `LossScaleOptimizer` override every
method that would reach it.

Keras 3's TensorFlow optimizer all-reduces the gradients inside `apply`
whenever it runs in a replica context. The wrapper reduces them earlier,
once, so that its finiteness decision sees every replica's gradients; while
it applies those reduced gradients through the inner optimizer, the inner
optimizer's reduction passes them through (`framework_internals.keras3_reduce_once`).
"""

import inspect
import numbers
import re
import threading

import keras
import tensorflow as tf

from tf_lossscale._src import framework_internals
from tf_lossscale._src.families import base

# id()s of inner optimizers currently applying already-reduced gradients, per
# thread: MirroredStrategy runs each replica function in its own thread.
_APPLYING_REDUCED = threading.local()


def _applying_reduced():
  if not hasattr(_APPLYING_REDUCED, "value"):
    _APPLYING_REDUCED.value = set()
  return _APPLYING_REDUCED.value


def _snake_case(name):
  """`SGD` -> `sgd`, `AdamW` -> `adam_w`: Keras 3's default optimizer names."""
  name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
  return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def _from_keras2_config(config):
  """A Keras 2 optimizer config with its legacy keys in Keras 3's terms."""
  inner = dict(config.get("config", {}))
  inner.pop("is_legacy_optimizer", None)
  if "lr" in inner:
    inner["learning_rate"] = inner.pop("lr")
  decay = inner.pop("decay", 0.0)
  if decay and isinstance(inner.get("learning_rate"), numbers.Real):
    inner["learning_rate"] = keras.optimizers.schedules.InverseTimeDecay(
      inner["learning_rate"], decay_steps=1, decay_rate=decay
    )
  elif decay:
    inner["decay"] = decay  # Over a schedule: Keras 3 warns that it ignores it.
  return dict(config, config=inner)


class Keras3OptimizerApi(keras.optimizers.LossScaleOptimizer):
  """Keras 3's optimizer API of the wrapper, on the inner optimizer's state."""

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

  def set_weights(self, weights):
    """Sets the inner optimizer's variables (what a legacy `.h5` model file restores)."""
    self._optimizer.set_weights(weights)

  def exclude_from_weight_decay(self, var_list=None, var_names=None):
    """Excludes variables from the inner optimizer's weight decay."""
    self._optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

  def apply(self, grads, trainable_variables=None):
    """`apply_gradients(zip(grads, trainable_variables))`, Keras 3's spelling.

    Without `trainable_variables`, those the inner optimizer was built for.
    """
    grads = list(grads)
    if trainable_variables is None:
      if not self._optimizer.built:
        raise ValueError(
          "When passing `grads` without `trainable_variables`, the inner "
          f"{type(self._optimizer).__name__} must already be built on a list of variables: "
          "call `optimizer.build(trainable_variables)` first"
        )
      trainable_variables = framework_internals.keras3_trainable_variables(self._optimizer)
    trainable_variables = list(trainable_variables)
    if len(grads) != len(trainable_variables):
      raise ValueError(
        f"apply got {len(grads)} gradients for {len(trainable_variables)} trainable "
        "variables; pass one gradient (or None) per variable"
      )
    return self.apply_gradients(zip(grads, trainable_variables))

  def stateless_apply(self, optimizer_variables, grads, trainable_variables):
    """Not supported: always raises ValueError, as Keras 3's optimizers do.

    The loss scale and its counter are `tf.Variable`s updated in place by a
    `tf.distribute` cross-replica update, not tensors among the
    `optimizer_variables` a stateless call passes (`variables` holds only the
    inner optimizer's). Keras 3's TensorFlow optimizers refuse it too.

    Raises:
      ValueError: Always.
    """
    raise ValueError(
      "stateless_apply is not supported with the TensorFlow backend: LossScaleOptimizer "
      "updates its loss scale in tf.distribute variables"
    )

  def __reduce__(self):
    """Pickles as Keras 3 pickles its optimizers (by its saving format), by a
    class pickle can find: the wrapper's own is made at run time."""
    return framework_internals.keras3_reduce_as(super().__reduce__(), Keras3OptimizerApi)

  def finalize_variable_values(self, var_list):
    """The inner optimizer's (e.g. its EMA of the weights), at the end of `fit`."""
    self._optimizer.finalize_variable_values(var_list)

  def save_own_variables(self, store):
    """Saves the loss-scale state (the inner optimizer saves its own)."""
    if self.dynamic:
      store["0"] = self._state.scale.numpy()
      store["1"] = self._state.counter.numpy()

  def load_own_variables(self, store):
    """Restores what `save_own_variables` saved."""
    if self.dynamic and len(store.keys()) == 2:
      self._state.scale.assign(store["0"])
      self._state.counter.assign(store["1"])


def _start_averages_on_a_skipped_first_step(inner, skipped, counter):
  """Keras 3's weight average starts at its first step's variables, taken when
  `iterations` is 0 (its average variables start at 0); a skipped step counted
  there would leave it blending from 0, and `fit` would end by writing that
  into the model. A skipped step 0 starts it from the variables as they are, as
  tf_keras's average starts (the steps counted as TF 2.4 counted them)."""
  pairs = framework_internals.keras3_ema_averages(inner)

  def start():
    for variable, average in pairs:
      average.assign(variable)

  first = tf.logical_and(skipped, tf.equal(counter, 0))
  tf.cond(first, start, lambda: None)


class Keras3Family(base.Family):
  """Adapter of a Keras 3 inner optimizer."""

  optimizer_api = Keras3OptimizerApi
  gradient_dtype_must_match = False  # Keras 3 casts gradients to the variable's dtype.
  returns_step_op = False
  applies_no_gradients = False  # Keras 3's apply fails on one (not enough values to unpack).
  built_in_apply_conditional = False  # Keras 3's wrapper builds before.
  updates_keras3_variables = True

  def __init__(self, inner):
    backend = keras.backend.backend()
    if backend != "tensorflow":
      # Its optimizers update the backend's arrays, which no TensorFlow op reaches.
      raise TypeError(
        f"LossScaleOptimizer needs Keras's TensorFlow backend, but Keras {keras.__version__} "
        f"runs on its {backend!r} backend (chosen by the KERAS_BACKEND environment variable "
        f"or keras.json), so {inner} is no TensorFlow optimizer. Set "
        "KERAS_BACKEND=tensorflow before Keras or TensorFlow is imported."
      )
    super().__init__(inner)
    if getattr(inner, "loss_scale_factor", None) is not None:
      # Its `apply` would divide the gradients the wrapper unscaled once more
      # (keras-team/keras#21233); the wrapper's loss scale replaces it.
      tf.get_logger().warning(
        f"LossScaleOptimizer sets loss_scale_factor={inner.loss_scale_factor!r} of the inner "
        f"{type(inner).__name__} to None: the LossScaleOptimizer's loss scale replaces it."
      )
      inner.loss_scale_factor = None
    self._reduce = framework_internals.keras3_reduce_once(
      inner, lambda optimizer: id(optimizer) in _applying_reduced()
    )

  @classmethod
  def accepts_class(cls, klass):
    return issubclass(klass, keras.optimizers.Optimizer)

  @classmethod
  def is_loss_scale_optimizer(cls, optimizer):
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

  @classmethod
  def register_serializable(cls, serialized_class, name, deserialized_class):
    package, _, short_name = name.partition(">")
    keras.saving.register_keras_serializable(package, short_name)(serialized_class)
    # After the line above, which maps the name to `serialized_class` too.
    keras.saving.get_custom_objects()[name] = deserialized_class

  @classmethod
  def registered_name(cls, klass):
    return base.registered_name(klass, keras.saving)

  @classmethod
  def claims_config(cls, config):
    return not base.written_by_tf_keras(config)

  @classmethod
  def deserialize(cls, config, custom_objects):
    """Rebuilds a Keras 3 optimizer; a Keras 2 config (no `module`) too.

    Keras 2's OptimizerV2 wrote keys Keras 3 does not take: `lr` is
    `learning_rate`, `is_legacy_optimizer` is dropped, and `decay` (the
    learning rate divided by `1 + decay * iterations`) becomes the Keras 3
    schedule that computes the same, an `InverseTimeDecay` with
    `decay_steps=1`.
    """
    if "module" not in config:
      config = _from_keras2_config(config)
    # Keras 3's own `deserialize` does not know every class it exports (Lamb).
    public = base.exported_classes(config, keras.optimizers, keras.optimizers.Optimizer)
    return keras.optimizers.deserialize(
      dict(config), custom_objects={**public, **(custom_objects or {})}
    )

  @classmethod
  def init_wrapper(cls, wrapper):
    framework_internals.keras3_init_wrapper_attributes(wrapper)
    object.__setattr__(wrapper, "name", "loss_scale_optimizer")

  def build(self, grads_and_vars):
    # Every variable passed, None gradient or not, as Keras 3's apply builds.
    var_list = [v for _, v in grads_and_vars]
    if self.inner.built:
      return

    def build(*_):
      with tf.init_scope():
        self.inner.build(var_list)

    # Built from a replica, a slot restored from a checkpoint would get the
    # checkpointed value on the first replica only: build in cross-replica
    # context, where a mirrored variable is initialized on every device.
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
      tf.distribute.get_replica_context().merge_call(build)
    else:
      build()

  def unknown_variables(self, variables):
    return [v for v in variables if not framework_internals.keras3_knows_variable(self.inner, v)]

  def reduce_gradients(self, grads_and_vars):
    if tf.distribute.get_replica_context() is None:
      return grads_and_vars
    # A variable Keras 3 overwrites with its "gradient" (float8 training's
    # scales) takes it before Keras 3 reduces the others: never summed.
    pairs = list(grads_and_vars)
    summed = [i for i, (_, v) in enumerate(pairs) if not base.overwritten_with_gradient(v)]
    for i, pair in zip(summed, self._reduce([pairs[i] for i in summed]), strict=True):
      pairs[i] = pair
    return pairs

  def can_apply_reduced(self):
    return True

  def apply(self, grads, variables, name, aggregate):
    del name  # Keras 3 optimizers take none.
    grads_and_vars = list(zip(grads, variables, strict=True))
    if aggregate:
      self.inner.apply_gradients(grads_and_vars)
      return
    applying = _applying_reduced()
    applying.add(id(self.inner))
    try:
      self.inner.apply_gradients(grads_and_vars)
    finally:
      applying.discard(id(self.inner))

  def count_skipped_step(self, skipped):
    if getattr(self.inner, "gradient_accumulation_steps", None):
      # The counter also places each micro-step in its accumulation window:
      # a skipped micro-step is dropped, not counted, so the window still
      # averages that many finite micro-batches (as Keras 3's own wrapper).
      return
    counter = framework_internals.keras3_step_counter(self.inner)
    if getattr(self.inner, "use_ema", False):
      _start_averages_on_a_skipped_first_step(self.inner, skipped, counter)
    counter.assign_add(tf.cast(skipped, counter.dtype))

  def hyperparameter_names(self):
    return base.tf24_hyperparameters(self.inner, keras.optimizers)

  def get_hyperparameter(self, name):
    return getattr(self.inner, name)

  def set_hyperparameter(self, name, value):
    setattr(self.inner, name, value)

  def serialize(self):
    return keras.optimizers.serialize(self.inner)

  def has_automatic_name(self):
    # Keras <= 3.14 gives every optimizer of a class the same default name, the
    # constructor's (`SGD`, `adamw`); later Keras a unique one (`sgd`, `sgd_1`).
    name = inspect.signature(type(self.inner).__init__).parameters.get("name")
    if name is not None and isinstance(name.default, str):
      return self.inner.name == name.default
    automatic = re.escape(_snake_case(type(self.inner).__name__))
    return re.fullmatch(f"{automatic}(_[0-9]+)?", self.inner.name) is not None


FAMILY = Keras3Family
