"""The legacy `LossScale` classes of `tf.compat.v1.mixed_precision`.

`LossScale` is the abstract base (trackable, subclassable by users),
`FixedLossScale` a constant, `DynamicLossScale` the algorithm of
`algorithm.py` held in two variables, `current_loss_scale` and `good_steps`
(the checkpoint keys TF used). The optimizers of this package keep their
dynamic scale in a `DynamicLossScale` too and update it through
`dynamic_state`.
"""

import abc
import itertools
import math
import numbers
import weakref
from typing import Any

import tensorflow as tf

from tf_lossscale._src import algorithm, framework_internals, scale_state, validation

_GRAPH_KEYS = weakref.WeakKeyDictionary()
_NEXT_GRAPH_KEY = itertools.count()


def _graph_key():
  """Weights are kept per graph, so one object can serve several TF1 graphs.

  The key of the outermost graph: inside a function, the weights of the graph
  (or eager context) it is called from are the ones meant.
  """
  if tf.compat.v1.executing_eagerly_outside_functions():
    return None
  graph = tf.compat.v1.get_default_graph()
  while getattr(graph, "outer_graph", None) is not None:
    graph = graph.outer_graph
  if graph not in _GRAPH_KEYS:
    _GRAPH_KEYS[graph] = next(_NEXT_GRAPH_KEY)
  return _GRAPH_KEYS[graph]


class LossScale(framework_internals.Trackable, metaclass=abc.ABCMeta):
  """Base class of the legacy (TF1-style) loss scales.

  Calling a `LossScale` returns the current loss scale as a float32 scalar;
  `update(grads)` adjusts it from the gradients of one step and says whether
  that step should be applied. Use `FixedLossScale` or `DynamicLossScale`, or
  subclass this class (create variables with `_add_weight` so that they are
  checkpointed):

  >>> class HalvingLossScale(LossScale):
  ...   def __init__(self):
  ...     super().__init__()
  ...     self._scale = self._add_weight('scale', 1024.)
  ...   def __call__(self):
  ...     return tf.convert_to_tensor(self._scale)
  ...   def update(self, grads):
  ...     return self._scale.assign(self._scale / 2), True
  ...   def get_config(self):
  ...     return {}
  >>> loss_scale = HalvingLossScale()
  >>> _ = loss_scale.update([])
  >>> float(loss_scale())
  512.0
  """

  def __init__(self):
    self._weights = {}

  @abc.abstractmethod
  def __call__(self) -> tf.Tensor:
    """Returns the current loss scale as a scalar float32 tensor."""

  @abc.abstractmethod
  def update(self, grads: Any) -> tuple[Any, Any]:
    """Updates the loss scale from one step's unscaled gradients.

    Under a `tf.distribute` strategy, call it in a cross-replica context.

    Args:
      grads: Nested structure of unscaled gradients; `None` entries ignored.

    Returns:
      `(update_op, should_apply_gradients)`: the op that updates the scale
      (None when eager) and a bool (or scalar bool tensor) that is False when
      this step's gradients must not be applied.
    """

  @abc.abstractmethod
  def get_config(self) -> dict[str, Any]:
    """Returns the constructor arguments of this loss scale as a dict."""

  @classmethod
  def from_config(cls, config: dict[str, Any]) -> "LossScale":
    """Creates a loss scale from `get_config()`'s output."""
    return cls(**config)

  def _add_weight(self, name, initial_value, dtype=None):
    """Creates a non-trainable variable checkpointed under `name`.

    Args:
      name: Variable name and checkpoint key.
      initial_value: Its initial value.
      dtype: Its dtype, inferred from `initial_value` when None.

    Returns:
      The variable: mirrored under a `tf.distribute` strategy
      (`synchronization=AUTO`, `aggregation=NONE`).

    Raises:
      RuntimeError: If this object already has a weight `name` in this graph.
    """
    key = (name, _graph_key())
    if key in self._weights:
      raise RuntimeError(f"Duplicate variables detected. {key}")
    variable = tf.compat.v1.Variable(
      initial_value,
      name=name,
      dtype=dtype,
      trainable=False,
      use_resource=True,
      synchronization=tf.VariableSynchronization.AUTO,
      aggregation=tf.VariableAggregation.NONE,
    )
    self._weights[key] = variable
    framework_internals.restore_deferred(self, name, variable)
    framework_internals.tf_keras_track_variable(variable)
    return variable

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    graph_key = _graph_key()
    # Sort by name only: graph keys mix None (eager) and ints, which do not compare.
    children = dict(sorted((name, v) for (name, g), v in self._weights.items() if g == graph_key))
    children.update(super()._trackable_children(save_type, **kwargs))
    return children

  def _lookup_dependency(self, name, cached_dependencies=None):
    found = super()._lookup_dependency(name, cached_dependencies)
    if found is not None:
      return found
    return self._weights.get((name, _graph_key()))


def _check_fixed_value(loss_scale_value):
  """`FixedLossScale`'s argument check: TF 2.4's, with NaN and Inf (a float32
  Inf too) refused."""
  if not isinstance(loss_scale_value, (int, float)):
    raise ValueError(
      "loss_scale_value must be a Python int or float. "
      f"Got: {loss_scale_value!r} of type {type(loss_scale_value).__name__}"
    )
  if not loss_scale_value >= 1:
    raise ValueError(f"loss_scale_value must be at least 1. Got: {loss_scale_value!r}")
  if math.isinf(loss_scale_value):
    raise ValueError(f"loss_scale_value must be finite. Got: {loss_scale_value!r}")
  if validation.float32_overflows(loss_scale_value):
    raise ValueError(
      f"loss_scale_value must be at most the float32 maximum, {validation.FLOAT32_MAX!r}. "
      f"Got: {loss_scale_value!r}"
    )


class FixedLossScale(LossScale):
  """A loss scale that never changes.

  >>> loss_scale = FixedLossScale(128)
  >>> loss_scale
  FixedLossScale(128.0)
  >>> float(loss_scale())
  128.0
  >>> loss_scale.update([tf.constant(float('nan'))])[1]
  True
  """

  def __init__(self, loss_scale_value: float) -> None:
    """Creates the fixed loss scale.

    Args:
      loss_scale_value: Python int or float, at least 1 and at most the
        float32 maximum.

    Raises:
      ValueError: If `loss_scale_value` is not a Python number, is below 1 or
        NaN (TF 2.4's check let NaN through), or is above the float32 maximum
        (TF 2.4 took it, and scaled losses to Inf).
    """
    super().__init__()
    _check_fixed_value(loss_scale_value)
    self._loss_scale_value = float(loss_scale_value)

  def __call__(self):
    return tf.convert_to_tensor(self._loss_scale_value)

  def update(self, grads):
    """Does nothing: gradients are always applied.

    Returns:
      `(update_op, True)`: `update_op` is a no-op in a graph, None eagerly.
    """
    del grads
    return tf.no_op(), True

  def __repr__(self):
    return f"FixedLossScale({self._loss_scale_value})"

  def get_config(self):
    return {"loss_scale_value": self._loss_scale_value}


def scale_options(initial_scale, min_loss_scale=1.0, max_loss_scale=None, hysteresis=1):
  """Checks the options beyond TF 2.4 of a dynamic scale.

  Args:
    initial_scale: The initial loss scale, which `max_loss_scale` may not be
      below.
    min_loss_scale: A finite number greater than 0 (may be below 1).
    max_loss_scale: None or Inf (unbounded), or a number at least
      `min_loss_scale`.
    hysteresis: An int of at least 1.

  Returns:
    `(min_scale, max_scale, hysteresis)` as `float`, `float` (Inf when
    unbounded) and `int`.

  Raises:
    ValueError: Naming the argument, what was passed and what is allowed.

  >>> scale_options(2.**15, max_loss_scale=2.**20)
  (1.0, 1048576.0, 1)
  >>> scale_options(2.**15, hysteresis=0)
  Traceback (most recent call last):
  ...
  ValueError: hysteresis must be an int of at least 1, but got: 0
  """

  def is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)

  if not (is_number(min_loss_scale) and math.isfinite(min_loss_scale) and min_loss_scale > 0):
    raise ValueError(
      f"min_loss_scale must be a finite number greater than 0, but got: {min_loss_scale!r}"
    )
  if min_loss_scale < validation.FLOAT32_TINY or validation.float32_overflows(min_loss_scale):
    raise ValueError(
      "min_loss_scale must be a float32 between the smallest normal one, "
      f"{validation.FLOAT32_TINY!r}, and the largest, {validation.FLOAT32_MAX!r}, "
      f"but got: {min_loss_scale!r}"
    )
  max_scale = math.inf if max_loss_scale is None else max_loss_scale
  if not (is_number(max_scale) and max_scale >= min_loss_scale):
    raise ValueError(
      "max_loss_scale must be None (unbounded) or a number at least min_loss_scale "
      f"({float(min_loss_scale)}), but got: {max_loss_scale!r}"
    )
  if math.isfinite(max_scale) and validation.float32_overflows(max_scale):
    raise ValueError(
      "max_loss_scale must be None or Inf (unbounded) or at most the float32 maximum, "
      f"{validation.FLOAT32_MAX!r}, but got: {max_loss_scale!r}"
    )
  if max_scale < initial_scale:
    raise ValueError(
      f"max_loss_scale must be at least the initial loss scale ({float(initial_scale)}), "
      f"but got: {max_loss_scale!r}"
    )
  if not (isinstance(hysteresis, numbers.Integral) and not isinstance(hysteresis, bool)) or (
    hysteresis < 1
  ):
    raise ValueError(f"hysteresis must be an int of at least 1, but got: {hysteresis!r}")
  if hysteresis > validation.INT64_MAX:
    raise ValueError(f"hysteresis must be an int from 1 to 2**63 - 1, but got: {hysteresis!r}")
  return float(min_loss_scale), float(max_scale), int(hysteresis)


def _check_dynamic_settings(initial_loss_scale, multiplier):
  """`DynamicLossScale`'s argument check, before any variable is created."""
  validation.check_finite_above("initial_loss_scale", initial_loss_scale, 0)
  validation.check_finite_above("multiplier", multiplier, 1)


class DynamicLossScale(LossScale):
  """A loss scale that adapts to the gradients.

  The scale starts at `initial_loss_scale`. After `increment_period`
  consecutive steps with finite gradients it is multiplied by `multiplier`;
  on a step with any Inf or NaN gradient it is divided by `multiplier` (not
  below 1) and that step's gradients are not applied.

  >>> loss_scale = DynamicLossScale(initial_loss_scale=4, increment_period=2)
  >>> _ = loss_scale.update([tf.constant(1.)])
  >>> _ = loss_scale.update([tf.constant(1.)])
  >>> float(loss_scale())
  8.0
  >>> _, should_apply = loss_scale.update([tf.constant(float('inf'))])
  >>> bool(should_apply), float(loss_scale())
  (False, 4.0)
  >>> loss_scale
  DynamicLossScale(current_loss_scale=4.0, num_good_steps=0, initial_loss_scale=4.0, increment_period=2, multiplier=2.0)

  Beyond TF 2.4, keyword-only options bound the scale and delay its
  reduction (their defaults are TF 2.4's behaviour, and they are in
  `get_config()` only when set), and `skipped_steps` counts the skipped
  steps:

  >>> loss_scale = DynamicLossScale(4, 2, min_loss_scale=0.5, hysteresis=2)
  >>> scales = []
  >>> for _ in range(5):  # Five non-finite steps: the first one only counts.
  ...   _ = loss_scale.update([tf.constant(float('nan'))])
  ...   scales.append(float(loss_scale()))
  >>> scales
  [4.0, 2.0, 1.0, 0.5, 0.5]
  >>> int(loss_scale.skipped_steps)
  5
  >>> loss_scale.get_config()
  {'initial_loss_scale': 4.0, 'increment_period': 2, 'multiplier': 2.0, 'min_loss_scale': 0.5, 'hysteresis': 2}
  """

  def __init__(
    self,
    initial_loss_scale: float = 2**15,
    increment_period: int = 2000,
    multiplier: float = 2.0,
    *,
    min_loss_scale: float = 1.0,
    max_loss_scale: float | None = None,
    hysteresis: int = 1,
  ) -> None:
    """Creates the dynamic loss scale.

    Args:
      initial_loss_scale: Python float > 0, the starting scale. Start high: a
        scale that is too high falls within a few steps, one that is too low
        rises only every `increment_period` steps. The default 2**15 is about
        half the largest float16.
      increment_period: Python int, consecutive finite steps before the scale
        grows.
      multiplier: Python float, the growth and shrink factor, greater than 1.
      min_loss_scale: Keyword-only, beyond TF 2.4: the scale never shrinks
        below it. A finite number greater than 0; below 1 lets the scale
        shrink under 1 (for losses whose gradients overflow even unscaled).
        Defaults to 1, as in TF 2.4. Above `initial_loss_scale` it is a
        floor the scale is lifted to at its first shrink (as TF 2.4 lifted a
        scale below 1 to 1).
      max_loss_scale: Keyword-only, beyond TF 2.4: the scale never grows
        above it. None (the default, as in TF 2.4: unbounded, but never Inf)
        or a number at least `min_loss_scale` and `initial_loss_scale`.
      hysteresis: Keyword-only, beyond TF 2.4: the number of consecutive
        non-finite steps at which the scale shrinks; every further
        non-finite step of the same run shrinks it too, and a finite step
        ends the run. Non-finite steps are skipped either way. Defaults to 1,
        as in TF 2.4. While a run is shorter, `good_steps` holds minus its
        length (so checkpoints keep TF 2.4's keys).

    Raises:
      ValueError: If `initial_loss_scale` is not a finite number > 0,
        `multiplier` not a finite number > 1 (TF 2.4 accepted them, and then
        trained with a scale stuck or growing on overflow, or NaN weights), or
        an option is outside what is allowed above.
      TypeError, ValueError or OverflowError: If `increment_period` is not an
        int (`int()`'s own error for it, as TF 2.4), or ValueError if it is
        outside int64.
    """
    super().__init__()
    _check_dynamic_settings(initial_loss_scale, multiplier)
    self._settings = algorithm.ScaleSettings(
      float(initial_loss_scale),
      validation.int64("increment_period", increment_period),
      float(multiplier),
      *scale_options(float(initial_loss_scale), min_loss_scale, max_loss_scale, hysteresis),
    )
    self._current_loss_scale = self._add_weight(
      "current_loss_scale", self._settings.initial_scale, tf.float32
    )
    self._num_good_steps = self._add_weight("good_steps", 0, tf.int64)
    self._skipped_steps = None
    if tf.compat.v1.executing_eagerly_outside_functions():
      # Not a weight: not checkpointed (TF's checkpoints have no such key),
      # and never made in a TF1 graph, whose default Saver saves every global
      # variable.
      self._skipped_steps = tf.Variable(
        0,
        dtype=tf.int64,
        name="skipped_steps",
        trainable=False,
        synchronization=tf.VariableSynchronization.AUTO,
        aggregation=tf.VariableAggregation.NONE,
      )
    self._register_state()

  def _register_state(self):
    _DYNAMIC_STATES[self] = scale_state.DynamicState(
      self._settings, self._current_loss_scale, self._num_good_steps, self._skipped_steps
    )

  def __setstate__(self, state):
    # A copy (`copy.copy`: the original's variables; `copy.deepcopy`: its own)
    # updates as TF's class's copies do.
    self.__dict__.update(state)
    self._register_state()

  @property
  def initial_loss_scale(self) -> float:
    """The scale it starts at (2**15 unless set).

    >>> DynamicLossScale().initial_loss_scale
    32768.0
    """
    return self._settings.initial_scale

  @property
  def increment_period(self) -> int:
    """Consecutive finite steps at which the scale grows (2000 unless set).

    >>> DynamicLossScale().increment_period
    2000
    """
    return self._settings.growth_steps

  @property
  def multiplier(self) -> float:
    """The factor the scale grows and shrinks by (2 unless set).

    >>> DynamicLossScale().multiplier
    2.0
    """
    return self._settings.multiplier

  @property
  def min_loss_scale(self) -> float:
    """The scale never shrinks below it (1 unless set).

    >>> DynamicLossScale().min_loss_scale
    1.0
    """
    return self._settings.min_scale

  @property
  def max_loss_scale(self) -> float:
    """The scale never grows above it (Inf, unbounded, unless set).

    >>> DynamicLossScale(max_loss_scale=2.**16).max_loss_scale
    65536.0
    """
    return self._settings.max_scale

  @property
  def hysteresis(self) -> int:
    """Consecutive non-finite steps at which the scale shrinks (1 unless set).

    >>> DynamicLossScale().hysteresis
    1
    """
    return self._settings.hysteresis

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    children = super()._trackable_children(save_type, **kwargs)
    if save_type == "savedmodel" and self._skipped_steps is not None:
      # A traced update captures it, so a SavedModel holds it; checkpoints
      # keep TF's keys.
      children["skipped_steps"] = self._skipped_steps
    return children

  @property
  def skipped_steps(self) -> tf.Variable | None:
    """The number of steps skipped so far, an int64 variable; None in a TF1 graph.

    Every `update` with a non-finite gradient adds one, in the same
    cross-replica update as the scale (so under a strategy every replica
    holds the same count). It counts the updates of this object since it was
    created: it is not checkpointed, so a restore leaves it as it was (an
    object made anew counts from 0).
    In a TF1 graph (`tf.compat.v1.Session`) there is no such variable (a
    default `Saver` would save it); use the `should_apply_gradients` tensor
    `update` returns.

    >>> loss_scale = DynamicLossScale()
    >>> _ = loss_scale.update([tf.constant(float('nan'))])
    >>> _ = loss_scale.update([tf.constant(1.)])
    >>> int(loss_scale.skipped_steps)
    1
    """
    return self._skipped_steps

  def __call__(self):
    return tf.convert_to_tensor(self._current_loss_scale)

  def update(self, grads):
    """Updates the scale; see `LossScale.update`.

    Under a strategy every replica's gradients are checked and one non-finite
    replica makes all replicas skip.
    """
    replica = tf.distribute.get_replica_context()
    if tf.distribute.has_strategy() and replica is not None:
      raise RuntimeError(
        "DynamicLossScale.update() must be called in a cross-replica context, where it "
        "checks every replica's gradients at once; it was called in replica "
        f"{replica.replica_id_in_sync_group} of {type(tf.distribute.get_strategy()).__name__} "
        "(inside `strategy.run`). There, call it through "
        "`tf.distribute.get_replica_context().merge_call(lambda _, g: loss_scale.update(g), "
        "args=(grads,))`."
      )
    scale_state.reserve_tf24_update_cond()
    update_op, should_apply_gradients = _DYNAMIC_STATES[self].update(grads)
    if update_op is not None:
      # In a graph, a tensor, as TF's: it can be fetched, returned from a
      # tf.function or passed to tf.identity.
      with tf.control_dependencies([update_op]):
        update_op = tf.identity(should_apply_gradients)
    return update_op, should_apply_gradients

  def __repr__(self):
    settings = (
      f"initial_loss_scale={self.initial_loss_scale}, "
      f"increment_period={self.increment_period}, multiplier={self.multiplier}"
    )
    settings += "".join(f", {k}={v}" for k, v in options_config(self).items())
    if tf.executing_eagerly():
      return (
        # str(), as TF's '%s': a float32 with the digits float32 needs.
        f"DynamicLossScale(current_loss_scale={self._current_loss_scale.numpy()!s}, "
        f"num_good_steps={self._num_good_steps.numpy()!s}, {settings})"
      )
    return f"DynamicLossScale({settings})"

  def get_config(self):
    return {
      "initial_loss_scale": self.initial_loss_scale,
      "increment_period": self.increment_period,
      "multiplier": self.multiplier,
      **options_config(self),
    }


def options_config(loss_scale):
  """The options beyond TF 2.4 of a `DynamicLossScale` that are not at their
  defaults, as constructor keywords (empty for TF 2.4's behaviour)."""
  defaults = algorithm.ScaleSettings()
  options = {
    "min_loss_scale": (loss_scale.min_loss_scale, defaults.min_scale),
    "max_loss_scale": (loss_scale.max_loss_scale, defaults.max_scale),
    "hysteresis": (loss_scale.hysteresis, defaults.hysteresis),
  }
  return {name: value for name, (value, default) in options.items() if value != default}


# The state behind each DynamicLossScale, for the optimizers of this package
# (which hand it their apply, to run in the same conditional as the check).
_DYNAMIC_STATES = weakref.WeakKeyDictionary()


def dynamic_state(loss_scale):
  """The `scale_state.DynamicState` a `DynamicLossScale` updates itself with.

  Args:
    loss_scale: Any `LossScale`.

  Returns:
    The state, or None when `loss_scale` is not a `DynamicLossScale` or is a
    subclass with its own `update` (which must then be called instead).
  """
  if type(loss_scale).update is not DynamicLossScale.update:
    return None
  return _DYNAMIC_STATES.get(loss_scale)


_BUILTIN = {"FixedLossScale": FixedLossScale, "DynamicLossScale": DynamicLossScale}


def serialize(loss_scale: LossScale) -> dict[str, Any]:
  """Returns `{'class_name': ..., 'config': ...}` for a `LossScale`.

  >>> serialize(FixedLossScale(8))
  {'class_name': 'FixedLossScale', 'config': {'loss_scale_value': 8.0}}
  """
  return {"class_name": type(loss_scale).__name__, "config": loss_scale.get_config()}


def deserialize(config: dict[str, Any], custom_objects: dict[str, type] | None = None) -> LossScale:
  """Creates a `LossScale` from `serialize()`'s output.

  Args:
    config: Dict with `class_name` and `config`.
    custom_objects: Optional dict from class name to a `LossScale` subclass,
      for user-defined loss scales.

  Returns:
    A new `LossScale`.

  Raises:
    ValueError: If `config` is not a dict with keys `class_name` and
      `config`, names an unknown class, or holds a value the class refuses.
    TypeError: If `config['config']` is not a dict or has keys that are not
      the class's arguments (raised by its constructor, as in TF 2.4).

  >>> deserialize({'class_name': 'DynamicLossScale', 'config': {
  ...     'initial_loss_scale': 2., 'increment_period': 5, 'multiplier': 4.}})
  DynamicLossScale(current_loss_scale=2.0, num_good_steps=0, initial_loss_scale=2.0, increment_period=5, multiplier=4.0)
  """
  if not isinstance(config, dict) or "class_name" not in config or "config" not in config:
    raise ValueError(
      f"A serialized loss scale must be a dict with keys 'class_name' and 'config'. Got: {config!r}"
    )
  classes = dict(_BUILTIN, **(custom_objects or {}))
  cls = classes.get(config["class_name"])
  if cls is None:
    raise ValueError(
      f"Unknown loss scale: {config['class_name']}. Known: {sorted(classes)}; "
      "pass user-defined classes in `custom_objects`."
    )
  return cls.from_config(config["config"])


def get(identifier: Any) -> LossScale | None:
  """Turns a loss-scale identifier into a `LossScale` (or None).

  Args:
    identifier: None, the string `'dynamic'`, a Python int/float (a fixed
      scale), a `LossScale` (returned as is) or a dict from `serialize`.

  Returns:
    A `LossScale`, or None for None.

  Raises:
    ValueError: For a number that is not a valid fixed scale, for a dict
      `deserialize` refuses with a ValueError, and for anything else.
    TypeError: For a dict whose `config` is not a dict or has keys that are
      not the class's arguments (raised by its constructor, as in TF 2.4).

  >>> get(128)
  FixedLossScale(128.0)
  >>> get('dynamic').initial_loss_scale
  32768.0
  """
  if identifier is None:
    return None
  if isinstance(identifier, (int, float)):
    return FixedLossScale(identifier)
  if isinstance(identifier, str) and identifier == "dynamic":
    return DynamicLossScale()
  if isinstance(identifier, LossScale):
    return identifier
  if isinstance(identifier, dict):
    return deserialize(identifier)
  raise ValueError(
    f"Could not interpret loss scale identifier: {identifier}{tensorflow_class_hint(identifier)}"
  )


def tensorflow_class_hint(value):
  """For an error message: what to pass instead of TensorFlow's own loss
  scale classes (code migrated in part); else an empty string.

  >>> tensorflow_class_hint(tf.compat.v1.mixed_precision.FixedLossScale(8))[:40]
  ". It is TensorFlow's own FixedLossScale,"
  """
  name = type(value).__name__
  if not (type(value).__module__.startswith("tensorflow.") and name in _TF_CLASS_NAMES):
    return ""
  return (
    f". It is TensorFlow's own {name}, which tf_lossscale does not take: use "
    f"tf_lossscale.mixed_precision.experimental.{name}, with the same arguments "
    "(tf-lossscale-upgrade rewrites such names)"
  )


_TF_CLASS_NAMES = ("LossScale", "FixedLossScale", "DynamicLossScale")
