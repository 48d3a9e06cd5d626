"""Inner-optimizer families: how the Keras `LossScaleOptimizer` drives each kind.

The wrapper (`keras_optimizer.LossScaleOptimizer`) holds all the loss-scaling
logic and, for its inner optimizer, one adapter: an instance of a `Family`
subclass, which knows that kind of optimizer. A family also names its
`optimizer_api`: a class of its framework that the wrapper's concrete class
inherits from (after `LossScaleOptimizer`), so the wrapper passes that
framework's `isinstance` checks (`Model.compile`, its `mixed_float16`
wrapping) and answers the framework's optimizer API from the inner optimizer.

Families, one module each:

* `keras3`: Keras 3 optimizers (`tf.keras.optimizers.*` on TF >= 2.16).
* `tf_keras_legacy`: tf_keras's OptimizerV2 (`tf_keras.optimizers.legacy.*`).
* `tf_keras`: tf_keras's newer optimizers (`tf_keras.optimizers.*`).

tf_keras is optional and slow to import: its families are only considered
once the user has imported tf_keras (none of its optimizers can exist
before), or for a tf_keras optimizer config.

Adding a family, a checklist:

1. A module here with a `Family` subclass implementing every abstract method
   (a missing one raises `TypeError` when the module is imported) and its
   `optimizer_api` class: a subclass of the framework's optimizer base (and
   of its loss-scale-optimizer base, if it has one) that overrides what the
   framework calls on an optimizer and answers it from `self._optimizer`,
   the inner optimizer. Its constructor is never run.
2. Its entry in `_family_modules` below, in the order families are tried.
3. Any use of the framework's non-public parts in
   `framework_internals.py`, with its fallback.
4. Tests: the family in the parametrizations of tests/test_keras_lso*.py
   (default strategy and MirroredStrategy, eager and tf.function, `fit`,
   checkpoints), and an entry in BUILD.
"""

import importlib
import sys

import keras

from tf_lossscale._src import framework_internals
from tf_lossscale._src.families import keras3
from tf_lossscale._src.families.base import (
  Family,
  is_keras3_variable,
  overwritten_with_gradient,
  written_by_tf_keras,
)

__all__ = ["Family", "families", "for_config", "for_optimizer", "register_public_class"]
__all__ += ["is_keras3_variable", "overwritten_with_gradient", "registration"]


# The FrameworkChangedError that keeps the tf_keras families out, once one was raised.
_TF_KERAS_CHANGED = []


def _family_modules():
  """The modules of the families to try, in order: Keras 3 first."""
  modules = [keras3]
  if sys.modules.get("tf_keras") is not None and not _TF_KERAS_CHANGED:
    # Imported only now: tf_keras is optional, and slow to import.
    try:
      modules += [
        importlib.import_module(f"{__name__}.{n}") for n in ("tf_keras_legacy", "tf_keras")
      ]
    except framework_internals.FrameworkChangedError as error:
      # A tf_keras we cannot wrap safely: its optimizers are refused (with
      # this error), the other families work.
      _TF_KERAS_CHANGED.append(error)
  return modules


def _raise_if_tf_keras_changed(optimizer=None):
  tf_keras = sys.modules.get("tf_keras")
  if not _TF_KERAS_CHANGED or tf_keras is None:
    return
  kinds = (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
  if optimizer is None or isinstance(optimizer, kinds):
    raise _TF_KERAS_CHANGED[0]


# Registered name -> (public wrapper class, the class its configs deserialize as).
_PUBLIC_CLASSES = {}
_REGISTERED = set()  # (family, name) pairs done.


def register_public_class(public_class, name, deserialized_class=None):
  """Registers a public wrapper class with every framework's serialization,
  now for the families loaded and later for those loaded later.

  Args:
    public_class: The class whose objects serialize under `name`.
    name: The registered name (the framework prefixes it `tf_lossscale>`).
    deserialized_class: The class `name` deserializes as; `public_class`
      when None. (TF 2.4 deserialized its experimental class as the
      non-experimental one.)
  """
  _PUBLIC_CLASSES[name] = (public_class, deserialized_class or public_class)
  for module in _family_modules():
    _register_all(module.FAMILY)


def registration(public_class):
  """`(name, deserialized_class)` as `public_class`, or the nearest class it
  inherits from (a user's subclass, e.g. Horovod's), was registered; `name`
  is the full one, `'tf_lossscale>...'`."""
  for klass in public_class.__mro__:
    for name, (registered, deserialized_class) in _PUBLIC_CLASSES.items():
      if registered is klass:
        return f"tf_lossscale>{name}", deserialized_class
  raise ValueError(f"{public_class} is no subclass of a registered LossScaleOptimizer class")


def _register_all(family):
  for name, (public_class, deserialized_class) in _PUBLIC_CLASSES.items():
    if (family, name) not in _REGISTERED:
      family.register_serializable(public_class, f"tf_lossscale>{name}", deserialized_class)
      _REGISTERED.add((family, name))


def families():
  """The `Family` subclasses that can take an optimizer now, in order."""
  found = [module.FAMILY for module in _family_modules()]
  for family in found:
    _register_all(family)
  return found


def for_optimizer(optimizer):
  """The family of `optimizer`, or None."""
  for family in families():
    if family.accepts(optimizer):
      return family
  _raise_if_tf_keras_changed(optimizer)
  return None


def _named_class(config, custom_objects):
  """The class of a serialized optimizer as the frameworks loaded find it
  (`custom_objects`, their registrations and custom-object scopes), or None."""
  savings = [keras.saving]
  if sys.modules.get("tf_keras") is not None:
    savings.append(sys.modules["tf_keras"].saving)
  for name in (config.get("registered_name"), config.get("class_name")):
    for saving in savings if isinstance(name, str) else ():
      klass = saving.get_registered_object(name, custom_objects)
      if isinstance(klass, type):
        return klass
  return None


def for_config(config, custom_objects=None):
  """The family that deserializes a serialized inner optimizer: the one that wrote it.

  A user's class (which Keras 3 and tf_keras both write with its own module,
  or None) is looked up where the frameworks would find it. A tf_keras
  config imports tf_keras, to load its families. A config of Keras 2 (TF <=
  2.12, no `module`) needs tf_keras too; without it, Keras 3 rebuilds the
  optimizer (see `Keras3Family.deserialize`).
  """
  if not str(config.get("module")).startswith("keras."):
    klass = _named_class(config, custom_objects)
    for family in families() if klass is not None else ():
      if family.accepts_class(klass):
        return family
  if written_by_tf_keras(config):
    try:
      importlib.import_module("tf_keras")
    except ImportError as error:
      if "module" in config:
        raise ModuleNotFoundError(
          f"This optimizer config was written by tf_keras (module {config['module']!r}), which "
          "is not installed: pip install 'tf-lossscale[tf-keras]' (tf_keras must have your "
          "TensorFlow's minor version)",
          name="tf_keras",
        ) from error
      return keras3.FAMILY
    families()
    _raise_if_tf_keras_changed()
  for family in families():
    if family.claims_config(config):
      return family
  raise ValueError(f"No inner-optimizer family can deserialize the optimizer config {config!r}")
