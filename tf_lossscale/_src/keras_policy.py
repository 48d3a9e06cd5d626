"""Keras dtype policies: today's Keras 3 objects and TF 2.4's deprecated experimental API.

`tf.keras.mixed_precision.{Policy, global_policy, set_global_policy}` are
re-exported as they are in Keras 3 (`keras.mixed_precision.*`), the same
objects. tf_keras users who want tf_keras's policies use tf_keras's own
(`tf_keras.mixed_precision.*`).

TF 2.4's deprecated `tf.keras.mixed_precision.experimental` API is rebuilt on
top of Keras 3:

- `Policy(name, loss_scale='auto')` subclasses Keras 3's `DTypePolicy`, so it
  is accepted wherever Keras 3 takes a dtype policy (a layer's `dtype`,
  `keras.config.set_dtype_policy`), and adds TF 2.4's `loss_scale`.
- `set_policy` makes a policy Keras 3's global one, with TF 2.4's checks.
- `global_policy` is Keras 3's (TF 2.4's was the non-experimental function
  too); `get_layer_policy` returns a layer's policy.
- `wrap_optimizer_for_policy` does what TF 2.4's `Model.compile` did with the
  policy's loss scale, which Keras 3's `Model.compile` cannot be made to do.
"""

import contextlib
import importlib
import os
import sys
import threading
import weakref

import keras
import tensorflow as tf

from tf_lossscale._src import framework_internals, keras_experimental, keras_optimizer
from tf_lossscale._src import loss_scale as loss_scale_module

# Today's Keras objects, re-exported as they are.
KerasPolicy = keras.mixed_precision.Policy
global_policy = keras.mixed_precision.global_policy
set_global_policy = keras.mixed_precision.set_global_policy

_logger = tf.get_logger()

_MIXED_NAMES = ("mixed_float16", "mixed_bfloat16")

# Each tf_keras global policy `set_policy` set, to the experimental `Policy` it
# set beside it (a tf_keras layer built then has that one as its
# `dtype_policy`), else None.
_SET_TF_KERAS_POLICIES = weakref.WeakKeyDictionary()

# The names TF 2.3 removed, with the policy TF 2.4's error message suggested.
_REMOVED_POLICY_ADVICE = {
  "infer_float32_vars": " Please use the 'mixed_float16' or 'mixed_bfloat16' policy instead.",
  "infer_with_float32_vars": " Please use the 'mixed_float16' or 'mixed_bfloat16' policy instead.",
  "float16_with_float32_vars": " Please use the 'mixed_float16' policy instead.",
  "bfloat16_with_float32_vars": " Please use the 'mixed_bfloat16' policy instead.",
}


def _canonical_name(name):
  """`name` checked (`_check_policy_name`), a dtype alias TF 2.4 took
  (`'half'`, `'float'`, `'double'`) as its dtype's name, which Keras 3 takes."""
  _check_policy_name(name)
  return name if name in _MIXED_NAMES else tf.as_dtype(name).name


def _check_policy_name(name):
  """Raises TF 2.4's error for a name no TF 2.4 policy had.

  Args:
    name: The `name` passed to a policy.

  Raises:
    TypeError: If `name` is not a string.
    ValueError: If `name` is neither a mixed policy nor a dtype name.
  """
  if isinstance(name, tf.dtypes.DType):
    raise TypeError(
      f"'name' must be a string, not a DType. Instead, pass DType.name. Got: {name.name}"
    )
  if not isinstance(name, str):
    raise TypeError(f"'name' must be a string, but got: {name}")
  if name.endswith("_float32_vars"):
    raise ValueError(
      "Policies ending in '_float32_vars' have been removed from TensorFlow."
      + _REMOVED_POLICY_ADVICE.get(name, "")
      + f" Got policy name: '{name}'"
    )
  if name in _MIXED_NAMES:
    return
  try:
    tf.as_dtype(name)
  except TypeError:
    raise ValueError(
      f"Cannot convert value {name} to a mixed precision Policy. Valid policies "
      "include 'mixed_float16', 'mixed_bfloat16', and the name of any dtype such "
      "as 'float32'."
    ) from None


class _DeviceCheck:
  """Logs once per process how well this machine runs `mixed_float16`, as TF 2.4 did."""

  _PREFIX = "Mixed precision compatibility check (mixed_float16): "
  _SUFFIX = (
    "If you will use compatible GPU(s) not attached to this host, e.g. by running a "
    "multi-worker model, you can ignore this warning. This message will only be logged once"
  )
  logged = False

  @classmethod
  def log_once(cls):
    if cls.logged:
      return
    cls.logged = True
    details = [
      tf.config.experimental.get_device_details(gpu)
      for gpu in tf.config.list_physical_devices("GPU")
    ]
    cls.log(details)

  @classmethod
  @contextlib.contextmanager
  def heard_once(cls):
    """Drops tf_keras's copy of the check (same logger, same words) logged in
    this thread once ours is."""
    thread = threading.get_ident()

    def is_new(record):
      other = record.thread != thread or not record.getMessage().startswith(cls._PREFIX)
      return other or not cls.logged

    _logger.addFilter(is_new)
    try:
      yield
    finally:
      _logger.removeFilter(is_new)

  @classmethod
  def log(cls, gpu_details):
    """Logs the verdict for GPUs described as `get_device_details` does."""
    fast, slow = [], []
    for details in gpu_details:
      name = details.get("device_name", "Unknown GPU")
      capability = details.get("compute_capability")
      if not capability:
        slow.append(f"{name}, no compute capability (probably not an Nvidia GPU)")
        continue
      described = f"{name}, compute capability {capability[0]}.{capability[1]}"
      (fast if tuple(capability) >= (7, 0) else slow).append(described)
    if not fast and not slow:
      _logger.warning(
        f"{cls._PREFIX}WARNING\nThe dtype policy mixed_float16 may run slowly because "
        "this machine does not have a GPU. Only Nvidia GPUs with compute capability "
        f"of at least 7.0 run quickly with mixed_float16.\n{cls._SUFFIX}"
      )
    elif slow:
      if fast:
        verdict = (
          "Some of your GPUs may run slowly with dtype policy mixed_float16 because "
          "they do not all have compute capability of at least 7.0. Your GPUs:\n"
        )
      elif len(slow) == 1:
        verdict = (
          "Your GPU may run slowly with dtype policy mixed_float16 because it does "
          "not have compute capability of at least 7.0. Your GPU:\n"
        )
      else:
        verdict = (
          "Your GPUs may run slowly with dtype policy mixed_float16 because they do "
          "not have compute capability of at least 7.0. Your GPUs:\n"
        )
      listing = "".join(f"  {device}\n" for device in _count_repeats(fast + slow))
      _logger.warning(
        f"{cls._PREFIX}WARNING\n{verdict}{listing}See https://developer.nvidia.com/cuda-gpus "
        f"for a list of GPUs and their compute capabilities.\n{cls._SUFFIX}"
      )
    elif len(fast) == 1:
      _logger.info(
        f"{cls._PREFIX}OK\nYour GPU will likely run quickly with dtype policy "
        f"mixed_float16 as it has compute capability of at least 7.0. Your GPU: {fast[0]}"
      )
    else:
      _logger.info(
        f"{cls._PREFIX}OK\nYour GPUs will likely run quickly with dtype policy "
        "mixed_float16 as they all have compute capability of at least 7.0"
      )


def _count_repeats(devices):
  """Merges runs of one device description: `['A', 'A', 'B']` -> `['A (x2)', 'B']`."""
  merged = []
  for device in devices:
    if merged and merged[-1][0] == device:
      merged[-1][1] += 1
    else:
      merged.append([device, 1])
  return [device if count == 1 else f"{device} (x{count})" for device, count in merged]


# Keras 3.3 (3.3.3 checked) parses a policy's name only in `FloatDTypePolicy`:
# its `DTypePolicy` gives every subclass `floatx()` dtypes. Newer releases
# parse in `DTypePolicy` and keep `FloatDTypePolicy` as a subclass of it;
# Keras < 3.3 has neither `keras.dtype_policies` nor `FloatDTypePolicy`.
_NAME_PARSING_POLICY = getattr(
  getattr(keras, "dtype_policies", None), "FloatDTypePolicy", KerasPolicy
)


class Policy(_NAME_PARSING_POLICY):
  """A deprecated dtype policy for a Keras layer, with a loss scale (TF 2.4).

  Warning: This class is deprecated. Please use the non-experimental
  `tf_lossscale.keras.mixed_precision.Policy` (Keras 3's `DTypePolicy`)
  instead.

  It is a Keras 3 `DTypePolicy` (pass it as a layer's `dtype`, or make it
  the global policy with `set_policy`) that also has a `loss_scale`. In
  TF 2.4, `Model.compile` wrapped the optimizer in a `LossScaleOptimizer`
  with the model's policy's loss scale. Keras 3's `Model.compile` does not
  look at it (under `'mixed_float16'` it wraps the optimizer in Keras 3's
  own dynamic loss scale optimizer instead); wrap the optimizer with
  `wrap_optimizer_for_policy` to get TF 2.4's result.

  The name sets the compute and variable dtypes: any dtype name (both
  dtypes are that dtype), `'mixed_float16'` or `'mixed_bfloat16'` (compute
  in float16 or bfloat16, variables in float32).

  >>> from tf_lossscale.keras.mixed_precision import experimental as mixed_precision
  >>> policy = mixed_precision.Policy('mixed_float16')
  >>> policy.compute_dtype, policy.variable_dtype
  ('float16', 'float32')
  >>> policy.loss_scale
  DynamicLossScale(current_loss_scale=32768.0, num_good_steps=0, initial_loss_scale=32768.0, increment_period=2000, multiplier=2.0)
  >>> print(mixed_precision.Policy('mixed_bfloat16').loss_scale)
  None
  >>> layer = tf.keras.layers.Dense(2, dtype=mixed_precision.Policy('mixed_float16', 128))
  >>> layer.dtype_policy.loss_scale
  FixedLossScale(128.0)

  Args:
    name: The policy name: a dtype name such as `'float32'`, or
      `'mixed_float16'` or `'mixed_bfloat16'`. An alias TF 2.4 took
      (`'half'`, `'float'`, `'double'`) becomes its dtype's name.
    loss_scale: `'auto'` (the default): a dynamic loss scale for
      `'mixed_float16'`, none otherwise. Otherwise a
      `tf_lossscale.mixed_precision.experimental.LossScale`, an int or float
      (a `FixedLossScale`), the string `'dynamic'` (a `DynamicLossScale()`),
      a serialized loss scale, or None (no loss scale). A loss scale on a
      policy whose compute dtype is not float16 is allowed but logs a
      warning.

  Raises:
    TypeError: If `name` is not a string, or `loss_scale` is a serialized
      loss scale whose `config` has keys that are not the class's arguments,
      as in TF 2.4.
    ValueError: If `name` is not a policy name, or `loss_scale` cannot be
      interpreted.
  """

  __signature__ = keras_optimizer.InitSignature()

  def __new__(cls, *args, **kwargs):
    parent_new = super().__new__
    if parent_new is object.__new__:
      return parent_new(cls)
    # Keras 3.2's `DTypePolicy.__new__` takes the name alone (a copy passes it
    # too) and checks it with its own wording: check it first, as TF 2.4 did.
    return parent_new(cls, _canonical_name(args[0] if args else kwargs["name"]))

  def __init__(self, name, loss_scale="auto"):
    name = _canonical_name(name)
    super().__init__(name)
    if name == "mixed_float16":
      _DeviceCheck.log_once()
    self._loss_scale_is_default = isinstance(loss_scale, str) and loss_scale == "auto"
    if self._loss_scale_is_default:
      loss_scale = "dynamic" if name == "mixed_float16" else None
    if loss_scale and self.compute_dtype != "float16":
      _logger.warning(
        "Creating a Policy with a loss scale is only useful for float16 policies. "
        f"You passed loss_scale={loss_scale!r} for policy {name}. Consider not passing "
        "any loss_scale instead."
      )
    self._policy_loss_scale = loss_scale_module.get(loss_scale)

  @property
  def loss_scale(self):
    """The loss scale of this policy: a legacy `LossScale`, or None.

    >>> Policy('float32', loss_scale=64).loss_scale
    FixedLossScale(64.0)
    """
    return self._policy_loss_scale

  # TF 2.4's policies were equal only to themselves, and hashable (dict keys,
  # sets); Keras 3 compares by name, loss scale aside, and cannot hash.
  __eq__ = object.__eq__
  __hash__ = object.__hash__

  def __repr__(self):
    return f'<PolicyV1 "{self.name}", loss_scale={self.loss_scale}>'

  def get_config(self):
    """The policy's name, and its loss scale unless it is the `'auto'` one.

    >>> Policy('mixed_float16').get_config()
    {'name': 'mixed_float16'}
    >>> Policy('mixed_float16', loss_scale=8).get_config()
    {'name': 'mixed_float16', 'loss_scale': {'class_name': 'FixedLossScale', 'config': {'loss_scale_value': 8.0}}}
    """
    config = {"name": self.name}
    if not self._loss_scale_is_default:
      # Only a chosen loss scale is written: TF 2.4 kept configs of the
      # default loss scale free of its serialization format.
      config["loss_scale"] = (
        None if self.loss_scale is None else loss_scale_module.serialize(self.loss_scale)
      )
    return config

  @classmethod
  def from_config(cls, config, custom_objects=None):
    """Creates a policy from `get_config()`'s output.

    Args:
      config: The config dict.
      custom_objects: Optional dict of user-defined `LossScale` classes.

    Returns:
      A new `Policy`.

    >>> Policy.from_config({'name': 'float32', 'loss_scale': 'dynamic'}).loss_scale
    DynamicLossScale(current_loss_scale=32768.0, num_good_steps=0, initial_loss_scale=32768.0, increment_period=2000, multiplier=2.0)
    """
    config = dict(config)
    if isinstance(config.get("loss_scale"), dict):
      config["loss_scale"] = loss_scale_module.deserialize(
        config["loss_scale"], custom_objects=custom_objects
      )
    return cls(**config)


keras.saving.register_keras_serializable("tf_lossscale", "ExperimentalPolicy")(Policy)


def set_policy(policy):
  """Sets the global dtype policy (Keras 3's), with TF 2.4's checks.

  Layers and models built afterwards without a `dtype` use it. A string
  becomes a plain Keras 3 policy (no loss scale), as TF 2.4 made it a
  non-experimental `Policy`; None restores the `floatx()` policy.

  >>> from tf_lossscale.keras.mixed_precision import experimental as mixed_precision
  >>> mixed_precision.set_policy(mixed_precision.Policy('mixed_float16', 1024))
  >>> mixed_precision.global_policy()
  <PolicyV1 "mixed_float16", loss_scale=FixedLossScale(1024.0)>
  >>> tf.keras.layers.Dense(2).dtype_policy.loss_scale
  FixedLossScale(1024.0)
  >>> mixed_precision.set_policy('float32')

  Under `TF_USE_LEGACY_KERAS=1` (`tf.keras` is tf_keras), for a tf_keras
  `Policy`, and while tf_keras's global policy is one this function set (a
  `set_policy(None)` after a tf_keras `Policy`), tf_keras's global policy is
  set too, to a policy of that name.

  Args:
    policy: A `Policy` (experimental or Keras 3's; tf_keras's is taken by
      its name), a policy name, or None.

  Raises:
    ValueError: If `policy` is a mixed policy while the mixed precision graph
      rewrite is enabled, or if its compute dtype is not floating-point.
    TypeError: If `policy` is neither a policy, a string nor None.
  """
  made_by_tf_keras = _is_tf_keras_policy(policy)
  if policy is None:
    policy = KerasPolicy(keras.config.floatx())
  elif not isinstance(policy, KerasPolicy):
    if made_by_tf_keras:  # TF 2.4's non-experimental kind: its name
      policy = policy.name
    policy = KerasPolicy(_canonical_name(policy))
    if policy.name == "mixed_float16":  # TF 2.4's policy of that name logged it.
      if made_by_tf_keras:  # as tf_keras's did
        _DeviceCheck.logged = True
      else:
        _DeviceCheck.log_once()
  is_mixed = policy.compute_dtype != policy.variable_dtype
  if is_mixed and framework_internals.graph_rewrite_flag():
    raise ValueError(
      f'The global dtype policy cannot be set to "{policy.name}", because the '
      "mixed precision graph rewrite has already been enabled.\n"
      "At most, one of the following can be called:\n\n"
      "  1. tf.train.experimental.enable_mixed_precision_graph_rewrite() "
      "(You called this first)\n"
      "  2. tf.keras.mixed_precision.experimental.set_policy() with a mixed "
      "precision policy (You called this second)\n\n"
      "You called both functions, which is an error, because both functions "
      "enable you to use mixed precision. If in doubt which function to use, "
      "use the second, as it supports Eager execution and is more customizable."
    )
  if not tf.as_dtype(policy.compute_dtype).is_floating:
    raise ValueError(
      "set_policy can only be used to set the global policy to floating-point "
      'policies, such as "float32" and "mixed_float16", but got policy: '
      f"{policy.name}"
    )
  tf_keras_policy = None
  if _keras_2_is_tf_keras() or made_by_tf_keras or _tf_keras_policy_set_here():
    # tf_keras layers read tf_keras's global policy. Made first: a name
    # tf_keras refuses sets neither global policy.
    tf_keras = importlib.import_module("tf_keras")
    with _DeviceCheck.heard_once():
      tf_keras_policy = tf_keras.mixed_precision.Policy(policy.name)
    if policy.name == "mixed_float16":  # said once by now, by either
      _DeviceCheck.logged = True
  keras.mixed_precision.set_global_policy(policy)
  if tf_keras_policy is not None:
    tf_keras.mixed_precision.set_global_policy(tf_keras_policy)
    _SET_TF_KERAS_POLICIES[tf_keras_policy] = policy if isinstance(policy, Policy) else None
  # TF's flag is shared with tf_keras's `set_global_policy`: mixed if either is.
  framework_internals.set_using_mixed_precision_policy(is_mixed or _tf_keras_policy_is_mixed())
  if isinstance(policy, Policy) and not _compile_scales_as_tf24(policy):
    _warn_once_that_compile_ignores(policy)


def _is_tf_keras_policy(policy):
  tf_keras = sys.modules.get("tf_keras")
  return tf_keras is not None and isinstance(policy, tf_keras.mixed_precision.Policy)


def _tf_keras_policy_set_here():
  tf_keras = sys.modules.get("tf_keras")
  return tf_keras is not None and tf_keras.mixed_precision.global_policy() in _SET_TF_KERAS_POLICIES


def _keras_2_is_tf_keras():
  """Whether `tf.keras` is tf_keras: TensorFlow's switch, `TF_USE_LEGACY_KERAS`."""
  return os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")


def _tf_keras_policy_is_mixed():
  tf_keras = sys.modules.get("tf_keras")
  if tf_keras is None:
    return False
  policy = tf_keras.mixed_precision.global_policy()
  return policy.compute_dtype != policy.variable_dtype


def _compile_scales_as_tf24(policy):
  """Whether Keras 3's `compile` scales the loss as TF 2.4's did under `policy`:
  with a default `DynamicLossScale` for `'mixed_float16'`, else not at all."""
  if policy.name != "mixed_float16":
    return policy.loss_scale is None
  default = loss_scale_module.serialize(loss_scale_module.DynamicLossScale())
  return policy.loss_scale is not None and loss_scale_module.serialize(policy.loss_scale) == default


_compile_warning_logged = False


def _warn_once_that_compile_ignores(policy):
  global _compile_warning_logged
  if _compile_warning_logged:
    return
  _compile_warning_logged = True
  if _keras_2_is_tf_keras():  # tf_keras's `compile` has no `auto_scale_loss`.
    unscaled = (
      "`LossScaleOptimizer(optimizer, dynamic=False, initial_scale=1)` from "
      "tf_lossscale.keras.mixed_precision, which scales by 1: no scaling"
    )
  else:
    unscaled = "`optimizer` with `auto_scale_loss=False`"
  _logger.warning(
    f"Keras's `Model.compile` does not use the loss scale of the global policy {policy!r} "
    "(TF 2.4's did; under 'mixed_float16' Keras's adds its own dynamic one). To train as "
    "TF 2.4 did, pass `wrap_optimizer_for_policy(optimizer)` from "
    "tf_lossscale.keras.mixed_precision.experimental to `compile` (for a policy without "
    f"a loss scale, pass {unscaled})."
  )


def _is_layer(obj):
  if isinstance(obj, keras.layers.Layer):
    return True
  tf_keras = sys.modules.get("tf_keras")
  return tf_keras is not None and isinstance(obj, tf_keras.layers.Layer)


def _layer_policy(layer):
  """`layer.dtype_policy`, or for a tf_keras layer built under an experimental
  policy `set_policy` set, that policy."""
  policy = layer.dtype_policy
  if isinstance(layer, keras.layers.Layer):
    return policy
  return _SET_TF_KERAS_POLICIES.get(policy) or policy


def get_layer_policy(layer):
  """Returns the dtype policy of a layer.

  Warning: This function is deprecated. Use `layer.dtype_policy` instead.

  >>> from tf_lossscale.keras.mixed_precision import experimental as mixed_precision
  >>> policy = mixed_precision.get_layer_policy(tf.keras.layers.Dense(2, dtype='float64'))
  >>> policy.name, policy.compute_dtype, policy.variable_dtype
  ('float64', 'float64', 'float64')

  Args:
    layer: A Keras 3 (or tf_keras) layer.

  Returns:
    `layer.dtype_policy` (for a tf_keras layer built under an experimental
    policy that `set_policy` set, that policy).

  Raises:
    ValueError: If `layer` is not a layer.
  """
  if not _is_layer(layer):
    raise ValueError(f"get_policy can only be called on a layer, but got: {layer}")
  return _layer_policy(layer)


def _is_loss_scale_optimizer(optimizer):
  if isinstance(
    optimizer, (keras_optimizer.LossScaleOptimizer, keras.optimizers.LossScaleOptimizer)
  ):
    return True
  tf_keras = sys.modules.get("tf_keras")
  return tf_keras is not None and isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)


def wrap_optimizer_for_policy(optimizer, policy=None):
  """Wraps `optimizer` as TF 2.4's `Model.compile` did under `policy`.

  TF 2.4's `Model.compile` wrapped the optimizer in a `LossScaleOptimizer`
  chosen by the model's dtype policy: an experimental `Policy` gave its own
  `loss_scale` (none: no wrapping), any other `'mixed_float16'` policy a
  dynamic loss scale, every other policy no wrapping. An optimizer that
  already is a `LossScaleOptimizer` was left alone. Keras 3's `compile`
  cannot be made to do this, so pass its result to `compile` instead:

  >>> from tf_lossscale.keras.mixed_precision import experimental as mixed_precision
  >>> mixed_precision.set_policy(mixed_precision.Policy('mixed_float16', 256))
  >>> model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
  >>> opt = mixed_precision.wrap_optimizer_for_policy(tf.keras.optimizers.SGD(), model)
  >>> model.compile(optimizer=opt, loss='mse')
  >>> model.optimizer is opt, opt.dynamic, float(opt.loss_scale)
  (True, False, 256.0)
  >>> mixed_precision.set_policy('float32')

  As in TF 2.4, an experimental `Policy` with a loss scale (any: it holds a
  `LossScale`, `'dynamic'` and `'auto'` included) gives the deprecated
  experimental `LossScaleOptimizer`, a subclass of the non-experimental one,
  which logs a deprecation warning; a non-experimental `'mixed_float16'`
  policy gives the non-experimental one.
  An experimental `'mixed_float16'` policy whose loss scale is None gives
  the optimizer unchanged, and TF 2.4 trained without loss scaling there;
  Keras 3's `compile` would add its own: pass it `auto_scale_loss=False`.

  Args:
    optimizer: A Keras optimizer, or an optimizer identifier such as
      `'sgd'` (for `keras.optimizers.get`; tf_keras's for a tf_keras layer
      or model as `policy`, or, but for a Keras 3 one, under
      `TF_USE_LEGACY_KERAS=1`).
    policy: The dtype policy deciding the wrapping: a policy, a Keras layer
      or model (its `dtype_policy`, which TF 2.4's `compile` used), a policy
      name, or None for the global policy.

  Returns:
    `optimizer`, or a `LossScaleOptimizer` wrapping it.

  Raises:
    TypeError: If `policy` is none of those.
  """
  tf_keras_optimizers = _keras_2_is_tf_keras()
  if policy is None:
    policy = global_policy()
  elif isinstance(policy, str):
    policy = KerasPolicy(_canonical_name(policy))
  elif _is_layer(policy):
    tf_keras_optimizers = not isinstance(policy, keras.layers.Layer)
    policy = _layer_policy(policy)
  if not isinstance(getattr(policy, "name", None), str) or not hasattr(policy, "compute_dtype"):
    raise TypeError(
      "policy must be a dtype policy, a Keras layer or model, a policy name or None, "
      f"but got: {policy!r}"
    )
  if isinstance(policy, Policy):
    loss_scale = policy.loss_scale
  elif policy.name == "mixed_float16":
    loss_scale = "dynamic"
  else:
    loss_scale = None
  if isinstance(optimizer, (str, dict)):
    keras_module = importlib.import_module("tf_keras") if tf_keras_optimizers else keras
    optimizer = keras_module.optimizers.get(optimizer)
  if loss_scale is None or _is_loss_scale_optimizer(optimizer):
    return optimizer
  if isinstance(loss_scale, str):
    return keras_optimizer.LossScaleOptimizer(optimizer)
  return keras_experimental.LossScaleOptimizer(optimizer, loss_scale)
