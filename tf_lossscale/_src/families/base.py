"""The contract every inner-optimizer family implements, and what families share."""

import abc

import keras
import tensorflow as tf

from tf_lossscale._src import framework_internals

# The hyperparameters TF 2.4's OptimizerV2 of each kind exposed (`_set_hyper`),
# by class name. For optimizers without `_hyper` (Keras 3, new tf_keras) these
# names are delegated when the inner optimizer has such an attribute.
_TF24_HYPERPARAMETERS = {
  "SGD": ("momentum", "decay"),
  "Adam": ("beta_1", "beta_2", "decay"),
  "Adamax": ("beta_1", "beta_2", "decay"),
  "Nadam": ("beta_1", "beta_2", "decay"),
  "RMSprop": ("rho", "momentum", "decay"),
  "Adadelta": ("rho", "decay"),
  "Adagrad": ("decay",),
  "Ftrl": (
    "learning_rate_power",
    "l1_regularization_strength",
    "l2_regularization_strength",
    "beta",
    "decay",
  ),
}


def overwritten_with_gradient(variable):
  """Whether Keras 3 assigns `variable` its "gradient" instead of applying it
  (`overwrite_with_gradient`: float8 training's scales; no other variable has it)."""
  return bool(getattr(variable, "overwrite_with_gradient", False))


def is_keras3_variable(variable):
  """Whether `variable` is a Keras 3 variable (a Keras 3 layer's or model's)."""
  return isinstance(variable, framework_internals.keras3_variable_class())


def tf24_hyperparameters(optimizer, classes):
  """Names of `optimizer`'s attributes that TF 2.4 treated as hyperparameters.

  Args:
    optimizer: An optimizer without `_hyper` (Keras 3, new tf_keras).
    classes: The module holding its framework's optimizer classes, e.g.
      `keras.optimizers`; subclasses (Keras 3's AdamW of Adam) count too.

  Returns:
    A set of names, `learning_rate` included.

  >>> sorted(tf24_hyperparameters(tf.keras.optimizers.Adam(), tf.keras.optimizers))
  ['beta_1', 'beta_2', 'learning_rate']
  """
  names = {"learning_rate"}
  for class_name, hypers in _TF24_HYPERPARAMETERS.items():
    cls = getattr(classes, class_name, None)
    if cls is not None and isinstance(optimizer, cls):
      names.update(h for h in hypers if hasattr(optimizer, h))
  return names


class Family(abc.ABC):
  """The contract of an inner-optimizer family (see the module docstring).

  An instance is the adapter of one wrapped optimizer, `self.inner`.

  Attributes (class attributes, each must be set):
    optimizer_api: The framework class the wrapper inherits.
    gradient_dtype_must_match: Whether the inner optimizer needs each
      gradient in its variable's dtype (one that casts gradients does not):
      `apply_gradients` then refuses other dtypes before anything changes.
    returns_step_op: Whether `apply_gradients` and `minimize` return the
      step's op outside eager execution, as this framework's optimizers do
      (TF1 graphs run it); else they return None, which a `tf.function` can
      return too.
    applies_no_gradients: Whether the framework's `apply_gradients` takes an
      empty list (a step with nothing to apply; tf_keras's `fit` of a model
      with no trainable variable sends one): TF 2.4's wrapper then ran a
      finite step of the scale. Else an empty list is refused as TF 2.4
      refused a list of None gradients.
    built_in_apply_conditional: Whether the family's own wrapper made the
      inner optimizer's variables in its apply's conditional under a dynamic
      scale (TF 2.4's, for an OptimizerV2): in a graph they are then named
      as there (`scale_state.tf24_apply_name_scope`), for a name-based `Saver`.
    updates_keras3_variables: Whether the inner optimizer can update Keras 3
      variables (`keras.Variable`, a Keras 3 model's): else `apply_gradients`
      refuses them before anything changes (tf_keras's fail deep inside).
  """

  optimizer_api = None
  gradient_dtype_must_match = None
  returns_step_op = None
  applies_no_gradients = None
  built_in_apply_conditional = None
  updates_keras3_variables = None

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    missing = sorted(
      name
      for name in Family.__abstractmethods__
      if getattr(getattr(cls, name), "__isabstractmethod__", False)
    )
    unset = [
      name
      for name in (
        "optimizer_api",
        "gradient_dtype_must_match",
        "returns_step_op",
        "applies_no_gradients",
        "built_in_apply_conditional",
        "updates_keras3_variables",
      )
      if getattr(cls, name) is None
    ]
    if missing or unset:
      raise TypeError(
        f"Inner-optimizer family {cls.__name__} must implement {missing or ''}"
        f"{' and set ' + ', '.join(unset) if unset else ''}"
      )

  def __init__(self, inner):
    self.inner = inner

  # --- What the family takes, and how it is (de)serialized -----------------

  @classmethod
  def accepts(cls, optimizer):
    """Whether `optimizer` is an optimizer of this family."""
    return cls.accepts_class(type(optimizer))

  @classmethod
  @abc.abstractmethod
  def accepts_class(cls, klass):
    """Whether `klass`, a class, makes optimizers of this family."""

  @classmethod
  @abc.abstractmethod
  def is_loss_scale_optimizer(cls, optimizer):
    """Whether `optimizer` is a loss scale optimizer of this framework (which
    must not be wrapped: TF 2.4 raised TypeError)."""

  @classmethod
  @abc.abstractmethod
  def register_serializable(cls, serialized_class, name, deserialized_class):
    """Registers with this framework's serialization: objects of
    `serialized_class` serialize under `name` (`'package>name'`), which
    deserializes with `deserialized_class.from_config`, so that saved models
    and configs load."""

  @classmethod
  @abc.abstractmethod
  def registered_name(cls, klass):
    """The name (`'package>name'`) `klass` itself, not a class it inherits
    from, is registered under with this framework's serialization, or None."""

  @classmethod
  @abc.abstractmethod
  def claims_config(cls, config):
    """Whether a serialized inner optimizer (`{'class_name', 'config', ...}`)
    was written by this family."""

  @classmethod
  @abc.abstractmethod
  def deserialize(cls, config, custom_objects):
    """Rebuilds an inner optimizer from `serialize()`'s output."""

  @classmethod
  @abc.abstractmethod
  def init_wrapper(cls, wrapper):
    """Prepares a new wrapper, whose framework constructor is never run,
    before any attribute is set on it."""

  # --- Applying ----------------------------------------------------------------

  @abc.abstractmethod
  def build(self, grads_and_vars):
    """Creates the inner optimizer's slots for the variables of the
    `(gradient or None, variable)` pairs that its own `apply_gradients`
    would build for. Called at every apply, in replica context and maybe
    while a `tf.function` traces: it does nothing for variables already
    built, and makes variables out of any function (`tf.init_scope`), on
    every replica (in cross-replica context)."""

  @abc.abstractmethod
  def unknown_variables(self, variables):
    """After `build`: those of `variables` the inner optimizer cannot update
    (an optimizer that keeps state per variable only from its build), in
    order; empty when it takes new variables as they come."""

  @abc.abstractmethod
  def reduce_gradients(self, grads_and_vars):
    """In replica context: the pairs with gradients summed over replicas, as
    the inner optimizer itself would sum them."""

  @abc.abstractmethod
  def can_apply_reduced(self):
    """Whether, under the current strategy, the inner optimizer can apply
    gradients already reduced by `reduce_gradients` (else it must reduce
    them itself, and finiteness is decided on a plain sum of the replicas'
    gradients)."""

  @abc.abstractmethod
  def apply(self, grads, variables, name, aggregate):
    """In replica context: applies `grads` to `variables` through the inner
    optimizer, which all-reduces them only if `aggregate`; returns an op,
    None, or nothing that has to leave a `tf.cond` branch."""

  def compute_gradients(self, loss, var_list, grad_loss, tape):
    """The (gradient, variable) pairs of `loss` (already scaled: a tensor
    computed on `tape`, or a callable) for `var_list` (variables, or a
    callable returning them), for `minimize`. With the tape; a family whose
    optimizers compute gradients through hooks of their own overrides it."""
    with tape:
      if not callable(var_list):
        # A Keras 3 variable is watched through the TensorFlow variable holding its value.
        tape.watch(
          [v.value if isinstance(v, keras.Variable) else v for v in tf.nest.flatten(var_list)]
        )
      if callable(loss):
        loss = loss()
    if callable(var_list):
      var_list = var_list()
    var_list = tf.nest.flatten(var_list)
    return list(zip(tape.gradient(loss, var_list, grad_loss), var_list, strict=True))

  @abc.abstractmethod
  def count_skipped_step(self, skipped):
    """Adds `skipped` (a scalar bool tensor: this step was skipped) to the
    inner optimizer's step counter; returns an op or None.

    Runs in the skip branch of the step's conditional with True, or with a
    tensor after the conditional on every step: in the plain `algorithm`
    (fast paths off, or op callbacks active), and under XLA on a CPU, where
    a skip branch that writes a variable compiles as a select per variable
    and slot of the apply (several times the compile time), and an
    unconditional add of 0 or 1 to one instruction
    (`fast_paths._state_in_branches`). Eagerly, after a skipped apply only."""

  # --- Hyperparameters, config ---------------------------------------------------

  @abc.abstractmethod
  def hyperparameter_names(self):
    """The set of names the wrapper delegates (`learning_rate` and TF 2.4's
    hyperparameters of this kind of optimizer)."""

  @abc.abstractmethod
  def get_hyperparameter(self, name):
    """The inner optimizer's hyperparameter `name`."""

  @abc.abstractmethod
  def set_hyperparameter(self, name, value):
    """Sets the inner optimizer's hyperparameter `name`."""

  @abc.abstractmethod
  def serialize(self):
    """The inner optimizer, serialized with its framework."""

  @abc.abstractmethod
  def has_automatic_name(self):
    """Whether the inner optimizer's name was made up by its framework (and
    so differs between identically configured optimizers)."""


def exported_classes(config, module, base):
  """{name: class} of the optimizer classes (subclasses of `base`) that a
  framework's `module` exports, for its `deserialize`, whose own table lacks
  some of them (it gave back their names, or raised "Unknown optimizer").
  Empty for a config of a user's class (its own module), which one of the
  same name must not replace."""
  if not str(config.get("module")).startswith("keras."):
    return {}
  return {
    name: klass
    for name, klass in vars(module).items()
    if isinstance(klass, type) and issubclass(klass, base)
  }


def registered_name(klass, saving):
  """`Family.registered_name` for a Keras-style `saving` module (Keras 3's
  `keras.saving`, `tf_keras.saving`): the name `klass` is registered under,
  when that name gives `klass` back (its own registration, not a base's)."""
  name = saving.get_registered_name(klass)
  if ">" in name and saving.get_registered_object(name) is klass:
    return name
  return None


def written_by_tf_keras(config):
  """Whether a serialized optimizer comes from tf_keras or the Keras 2 before it.

  Keras 3 and tf_keras both write module `keras.optimizers`; only tf_keras
  writes `is_legacy_optimizer`, and its OptimizerV2 `keras.optimizers.legacy`.
  Keras 2 (TF <= 2.12, and its legacy format later) wrote no `module` at all.
  """
  if "module" not in config:
    return True
  return is_optimizer_v2_config(config) or "is_legacy_optimizer" in config.get("config", {})


def is_optimizer_v2_config(config):
  """Whether a serialized optimizer is an OptimizerV2's (TF 2.4's kind).

  tf_keras writes module `keras.optimizers.legacy` for them. Keras 2 wrote no
  module; from TF 2.11 it marked its newer optimizers `is_legacy_optimizer:
  False`, and TF <= 2.10 had only OptimizerV2.
  """
  if "module" not in config:
    return config.get("config", {}).get("is_legacy_optimizer", True) is not False
  return str(config["module"]).startswith("keras.optimizers.legacy")
