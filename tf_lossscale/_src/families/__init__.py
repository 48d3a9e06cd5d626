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

from tf_lossscale._src.families import keras3
from tf_lossscale._src.families.base import Family, tf24_hyperparameters, written_by_tf_keras

__all__ = ["Family", "families", "for_config", "for_optimizer", "register_public_class"]
__all__ += ["registered_name", "tf24_hyperparameters", "written_by_tf_keras"]


def _family_modules():
  """The modules of the families to try, in order: Keras 3 first."""
  modules = [keras3]
  if "tf_keras" in sys.modules:
    # Imported only now: tf_keras is optional, and slow to import.
    modules += [importlib.import_module(f"{__name__}.{n}") for n in ("tf_keras_legacy", "tf_keras")]
  return modules


_PUBLIC_CLASSES = {}  # Registered name -> public wrapper class.
_REGISTERED = set()  # (family, name) pairs done.


def register_public_class(public_class, name):
  """Registers a public wrapper class with every framework's serialization,
  now for the families loaded and later for those loaded later."""
  _PUBLIC_CLASSES[name] = public_class
  for module in _family_modules():
    _register_all(module.FAMILY)


def registered_name(public_class):
  """The name `public_class` was registered under."""
  (name,) = [n for n, c in _PUBLIC_CLASSES.items() if c is public_class]
  return name


def _register_all(family):
  for name, public_class in _PUBLIC_CLASSES.items():
    if (family, name) not in _REGISTERED:
      family.register_serializable(public_class, name)
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
  return None


def for_config(config):
  """The family that wrote a serialized inner optimizer.

  A tf_keras config imports tf_keras, to load its families.
  """
  if written_by_tf_keras(config):
    importlib.import_module("tf_keras")
  for family in families():
    if family.claims_config(config):
      return family
  raise ValueError(f"No inner-optimizer family can deserialize the optimizer config {config!r}")
