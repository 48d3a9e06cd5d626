"""Every use of TensorFlow's, Keras 3's and tf_keras's non-public parts.

Those three packages release independently of tf_lossscale and may rename or
drop any private member in any release. Nothing else in tf_lossscale imports
`tensorflow.python`, `keras.src` or `tf_keras.src`, touches another
package's private attribute (ruff's SLF001 enforces it everywhere but here),
or calls a private method inherited from their classes (tests/test_structure.py).
Each use sits behind one small function whose docstring says what it relies
on, since when, and what happens when it is gone:

* a speed-up whose internal is missing falls back to the public-API path
  (slower, same numbers);
* a correctness-critical one raises `FrameworkChangedError` naming the
  package and version, when the optimizer is built (for tf_keras's, when a
  tf_keras optimizer is wrapped; for the checkpoint protocol, on import;
  for Keras 3's weight averages and built-for variables, at the first step
  or `apply` that needs them): never a silent change of behaviour (such as
  gradients all-reduced twice).

What our subclasses override is not a use: the Trackable protocol's hooks
(below) and OptimizerV2's (`_V2_MEMBERS`, checked when one is wrapped).
The fallbacks are tested with their internal gone (tests/test_structure.py;
the mixed-precision flags' in tests/test_graph_rewrite.py).

`tf.__internal__` is TensorFlow's namespace for its own libraries (Keras,
tf_keras): not covered by its API guarantees, so its uses are here too.
"""

import re
import sys

import keras
import tensorflow as tf

# Imported here, not where used, so that each use below is one look-up; a
# module that is gone sends its uses to the fallback their docstrings describe.
try:
  from keras.src.backend.common.variables import KerasVariable as _KerasVariable
except ImportError:
  _KerasVariable = None
try:
  from tensorflow.python.framework import op_callbacks
except ImportError:
  op_callbacks = None
try:
  from tensorflow.python.ops import control_flow_util
except ImportError:
  control_flow_util = None
try:
  from tensorflow.python.training.experimental import (
    mixed_precision_global_state as _global_state,
  )
except ImportError:
  _global_state = None


class FrameworkChangedError(RuntimeError):
  """A TensorFlow/Keras internal that correctness depends on has changed."""


def _version(module_name):
  try:
    return __import__(module_name).__version__
  except (ImportError, AttributeError):
    return "unknown"


def _changed(package, what):
  return FrameworkChangedError(
    f"tf_lossscale cannot work safely with {package} {_version(package)}: {what} "
    "Please report this with the versions of tensorflow, keras and tf_keras you use."
  )


# The Trackable protocol our checkpointed classes implement (TF >= 2.5; TF's
# own Keras and tf_keras rely on it too): they override `_trackable_children`
# and `_lookup_dependency`, and call `_track_trackable` and
# `_handle_deferred_dependencies` (through `track_child` and
# `restore_deferred` below).
_TRACKABLE_PROTOCOL = (
  "_trackable_children",
  "_lookup_dependency",
  "_track_trackable",
  "_handle_deferred_dependencies",
)


def _tracking_base(name):
  """`tf.__internal__.tracking.<name>`, a base of our checkpointed classes.

  Raises:
    FrameworkChangedError: If it, or a member of the protocol above, is gone
      (nothing could be checkpointed: raised when tf_lossscale is imported).
  """
  base = getattr(getattr(getattr(tf, "__internal__", None), "tracking", None), name, None)
  missing = [m for m in _TRACKABLE_PROTOCOL if base is not None and not hasattr(base, m)]
  if base is None or missing:
    gone = f"`tf.__internal__.tracking.{name}`" + (f" lost {', '.join(missing)}" if missing else "")
    raise _changed("tensorflow", f"{gone}, which checkpointing needs, is gone.")
  return base


Trackable = _tracking_base("Trackable")
DelegatingTrackableMixin = _tracking_base("DelegatingTrackableMixin")


def track_child(parent, child, name, overwrite=False):
  """Makes `child` the checkpoint dependency `name` of `parent`."""
  parent._track_trackable(child, name, overwrite=overwrite)


def restore_deferred(parent, name, child):
  """Gives `child`, just made as `parent`'s dependency `name`, what a checkpoint
  restored into `parent` before `child` existed holds for it."""
  parent._handle_deferred_dependencies(name=name, trackable=child)


def delegate_tracking(wrapper, trackable):
  """Makes a `DelegatingTrackableMixin` subclass checkpoint as `trackable`.

  The mixin delegates every tracking method to its attribute `_trackable`
  (TF >= 2.5), normally set by its constructor, which the wrapper does not
  run (its other bases' constructors must not run either).

  Returns:
    Whether `trackable` is a TensorFlow `Trackable`. Keras 3.0's optimizers are
    not (Keras 3.1 made them trackable): there is nothing to delegate to, the
    wrapper must not track anything, and `tf.train.Checkpoint` refuses it as
    it refuses a plain Keras 3.0 optimizer.
  """
  object.__setattr__(wrapper, "_trackable", trackable)
  return isinstance(trackable, Trackable)


def keras_release():
  """Keras's release as `(major, minor, patch)` (a pre-release as its release)."""
  numbers = re.findall(r"\d+", keras.__version__)[:3]
  return tuple(int(n) for n in numbers) + (0,) * (3 - len(numbers))


# --- TensorFlow -----------------------------------------------------------------


def in_xla_context(graph):
  """Whether ops added to `graph` now are compiled by XLA (a `jit_compile`
  function or one of its nested functions).

  Relies on `tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext`
  (TF >= 2.0). Missing: None, and callers take their plain path (every speed-up
  that depends on it is off).
  """
  check = getattr(control_flow_util, "GraphOrParentsInXlaContext", None)
  return None if check is None else bool(check(graph))


def op_callbacks_active():
  """Whether TensorFlow hands the ops made now, in this thread, to op callbacks
  (`tf.debugging.enable_check_numerics`, tfdbg's `enable_dump_debug_info`),
  which see every output: check-numerics raises at any float op whose output
  is not finite.

  Relies on `tensorflow.python.framework.op_callbacks.should_invoke_op_callbacks`
  (TF >= 2.2). Missing: None, and callers take their plain path.
  """
  check = getattr(op_callbacks, "should_invoke_op_callbacks", None)
  return None if check is None else bool(check())


def in_v1_control_flow(graph):
  """Whether ops added to `graph` now go into a TF1 control-flow context (a
  TF1 `cond` or `while_loop` body).

  Relies on `Graph._get_control_flow_context` (TF 1.x to today). Missing:
  None, and callers take their plain path.
  """
  get_context = getattr(graph, "_get_control_flow_context", None)
  if get_context is None:
    return None
  return get_context() is not None


def call_concrete_function(concrete, tensors):
  """Calls a concrete function with a flat list of tensors.

  Relies on `ConcreteFunction._call_flat(tensors, captured_inputs)` (TF >= 2.0),
  which skips the Python argument binding of a call (with hundreds of
  arguments, that binding cost more than the ops). Missing: the public call.
  """
  call_flat = getattr(concrete, "_call_flat", None)
  if call_flat is None:
    return concrete(*tensors)
  return call_flat(list(tensors), concrete.captured_inputs)


def v1_optimizer_use_locking(optimizer):
  """A `tf.compat.v1.train.Optimizer`'s `use_locking` constructor argument.

  Relies on its `_use_locking` attribute (TF 1.x to today). Missing: False,
  the default of every TF1 optimizer.
  """
  return getattr(optimizer, "_use_locking", False)


# --- TensorFlow's process-wide mixed-precision flags ----------------------------
#
# TensorFlow's process-wide mixed-precision flags, shared with TF's own API and tf_keras.
#
# TensorFlow keeps three flags in the private module
# `tensorflow.python.training.experimental.mixed_precision_global_state`:
#
# - "the graph rewrite is enabled": `tf.compat.v1.Session` reads it when it is
#   created and then switches the `auto_mixed_precision` grappler rewrite on in
#   the `ConfigProto` it was given (unless that proto switches it off). TF's
#   `enable_mixed_precision_graph_rewrite` and tf_keras's `set_global_policy`
#   read it too.
# - "a Keras mixed-precision policy is in use": set by tf_keras's
#   `set_global_policy`; TF's `enable_mixed_precision_graph_rewrite` refuses to
#   run while it is set.
# - "a Session without the rewrite was created": set by `tf.compat.v1.Session`.
#
# Sharing them makes our graph rewrite and our experimental `set_policy` refuse
# each other, and TF's and tf_keras's, exactly as TF 2.4's functions did. Each
# accessor below falls back to public behaviour when the private module is
# gone (TF has had it and these functions since 2.4; checked on 2.21): the getters answer
# from public state or False, the setters do what the public API can.


def set_graph_rewrite_flag(enabled):
  """Sets TF's "graph rewrite enabled" flag, which `tf.compat.v1.Session` reads.

  Relies on `mixed_precision_global_state.set_mixed_precision_graph_rewrite_enabled`.
  Without it, Sessions created without a `config` still get the rewrite
  (their default config carries the optimizer options set with
  `tf.config.optimizer.set_experimental_options`), but a Session given its
  own `ConfigProto` needs
  `config.graph_options.rewrite_options.auto_mixed_precision = 1` (ON).

  Args:
    enabled: Bool, the new value.

  Returns:
    True if the flag was set, False if this TensorFlow lacks it.
  """
  if _global_state is None:
    return False
  _global_state.set_mixed_precision_graph_rewrite_enabled(enabled)
  return True


def graph_rewrite_flag():
  """Whether TF's or our `enable_mixed_precision_graph_rewrite` is in effect.

  Relies on `mixed_precision_global_state.is_mixed_precision_graph_rewrite_enabled`
  (also exported as `tf.__internal__.train.is_mixed_precision_graph_rewrite_enabled`
  for tf_keras). Without it: whether the public optimizer option
  `auto_mixed_precision` is on.

  Returns:
    Bool.
  """
  if _global_state is None:
    options = tf.config.optimizer.get_experimental_options()
    return bool(options.get("auto_mixed_precision", False))
  return bool(_global_state.is_mixed_precision_graph_rewrite_enabled())


def non_mixed_precision_session_created():
  """Whether a `tf.compat.v1.Session` without the rewrite exists (TF's record of it).

  Relies on `mixed_precision_global_state.non_mixed_precision_session_created`.
  Without it: False (the warning that depends on it is not logged).

  Returns:
    Bool.
  """
  if _global_state is None:
    return False
  return bool(_global_state.non_mixed_precision_session_created())


def set_using_mixed_precision_policy(is_mixed):
  """Records in TF's flag whether our global policy is a mixed one.

  Relies on `mixed_precision_global_state.set_using_mixed_precision_policy`
  (also exported as `tf.__internal__.train.set_using_mixed_precision_policy`,
  which tf_keras's `set_global_policy` calls). Without it: nothing is
  recorded, and TF's own graph rewrite no longer refuses to run beside our
  policy (ours still does: it reads the global policies themselves).

  Args:
    is_mixed: Bool.
  """
  if _global_state is not None:
    _global_state.set_using_mixed_precision_policy(is_mixed)


# --- Keras 3 -------------------------------------------------------------------


def keras3_init_wrapper_attributes(wrapper):
  """Lets attributes be set on a Keras 3 optimizer whose constructor is not run.

  Keras 3's `Optimizer.__setattr__` refuses any attribute until its
  constructor has set `_lock` (Keras 3.0 to today). Our wrapper is a Keras 3
  optimizer without running that constructor (its state is the inner
  optimizer's), so it sets the flag itself. Without the check in a future
  Keras, the flag is an unused attribute.
  """
  object.__setattr__(wrapper, "_lock", False)


def keras3_reduce_once(inner, applying_reduced):
  """Makes a Keras 3 optimizer all-reduce gradients only when asked to.

  Keras 3's TensorFlow optimizer all-reduces the gradients inside `apply`
  whenever it runs in a replica context, through its method
  `_all_reduce_sum_gradients(grads_and_vars)` (Keras 3.2.1 to today). The
  LossScaleOptimizer reduces them first, to decide finiteness once for all
  replicas, and then applies the reduced gradients through `inner`: that
  apply must not reduce them again. This replaces the method on `inner` (the
  instance only) by one that passes gradients through while
  `applying_reduced(inner)` is True.

  Args:
    inner: The wrapped Keras 3 optimizer.
    applying_reduced: Callable taking `inner`, True while it applies
      already-reduced gradients.

  Returns:
    The original reduction, `reduce(grads_and_vars) -> grads_and_vars`.

  Keras 3.0 to 3.2.0 have no such method and do not all-reduce at all: there
  nothing is replaced and the returned reduction sums with the replica
  context's public `all_reduce`.

  Raises:
    FrameworkChangedError: If a later Keras has no such method: it may
      all-reduce another way, and a second reduction would multiply every
      gradient by the number of replicas.
  """
  reduce = getattr(inner, "_all_reduce_sum_gradients", None)
  if not callable(reduce):
    # Keras 3.0 to 3.2.0 apply each replica's gradients as they are (3.2.1
    # added the method): reduce them here, with the public replica context.
    # Decided by the release, not by other members, which later releases keep.
    if keras_release() < (3, 2, 1):
      return _all_reduce_sum
    raise _changed(
      "keras",
      "its TensorFlow optimizers no longer all-reduce gradients through "
      "`_all_reduce_sum_gradients`, so already-reduced gradients could be reduced again.",
    )

  def all_reduce_sum_gradients(grads_and_vars):
    if applying_reduced(inner):
      return list(grads_and_vars)
    return reduce(grads_and_vars)

  object.__setattr__(inner, "_all_reduce_sum_gradients", all_reduce_sum_gradients)
  return reduce


def _all_reduce_sum(grads_and_vars):
  """Sums gradients over the replicas of the current replica context."""
  grads_and_vars = list(grads_and_vars)
  present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
  summed = tf.distribute.get_replica_context().all_reduce(
    tf.distribute.ReduceOp.SUM, [grads_and_vars[i][0] for i in present]
  )
  for i, grad in zip(present, summed, strict=True):
    grads_and_vars[i] = (grad, grads_and_vars[i][1])
  return grads_and_vars


def keras3_reduce_as(reduced, cls):
  """Keras 3's `__reduce__` of an object with its loader bound to `cls`.

  Keras 3.4 to 3.15 (checked) pickle an object as `(type(obj)._unpickle_model,
  (buffer,))`: a class method that loads whatever the buffer holds, the class
  it is bound to aside; pickle finds that class by its name. Anything else
  (Keras 3.0 and 3.2, checked, have no such `__reduce__`): `reduced` unchanged.
  """
  loader = reduced[0] if isinstance(reduced, tuple) else None
  if getattr(loader, "__name__", None) != "_unpickle_model" or not hasattr(cls, "_unpickle_model"):
    return reduced
  return (cls._unpickle_model, *reduced[1:])


def keras3_variable_class():
  """The class of every Keras 3 variable.

  From Keras 3.9 (3.9 to 3.15 checked) that is `keras.Variable`. Before (3.0
  to 3.6 checked) `keras.Variable` is a subclass of it that only
  `keras.Variable(...)` makes, and a layer's variables are instances of
  `keras.src.backend.common.variables.KerasVariable` (gone by 3.15).
  Missing: `keras.Variable`.
  """
  return keras.Variable if _KerasVariable is None else _KerasVariable


def keras3_step_counter(inner):
  """The variable counting a Keras 3 optimizer's steps.

  From Keras 3.5 the variable is `_iterations`, and with
  `gradient_accumulation_steps` the public `iterations` is a tensor, the
  counter divided by the accumulation steps. Keras < 3.5 has no `_iterations`
  and `iterations` is the variable.
  """
  counter = getattr(inner, "_iterations", None)
  return inner.iterations if counter is None else counter


def keras3_ema_averages(inner):
  """A Keras 3 optimizer's `(variable, weight average)` pairs (`use_ema=True`).

  Relies on `_model_variables_moving_average`, built in the order of
  `_trainable_variables` (Keras 3.0 to today), None for a variable Keras
  overwrites with its gradient (float8 training's scales): those have none.

  Raises:
    FrameworkChangedError: If either is gone.
  """
  averages = getattr(inner, "_model_variables_moving_average", None)
  variables = getattr(inner, "_trainable_variables", None)
  if averages is None or variables is None:
    raise _changed("keras", "the optimizer no longer keeps its weight averages (`use_ema`).")
  return [(v, a) for v, a in zip(variables, averages, strict=True) if a is not None]


def keras3_trainable_variables(inner):
  """The variables a built Keras 3 optimizer was built for.

  Relies on `_trainable_variables` (Keras 3.0 to today); Keras 3's own
  `apply(grads)` uses it when no variables are given.

  Raises:
    FrameworkChangedError: If it is gone (then pass the variables to `apply`).
  """
  variables = getattr(inner, "_trainable_variables", None)
  if variables is None:
    raise _changed(
      "keras",
      "the optimizer no longer records the variables it was built for; "
      "pass `trainable_variables` to `apply`.",
    )
  return variables


def keras3_knows_variable(inner, variable):
  """Whether a built Keras 3 optimizer was built for `variable` (only those
  can it update: it raises `ValueError('Unknown variable')` mid-step else).

  Relies on `_var_key(variable)` and `_trainable_variables_indices`, the
  look-up Keras 3's own check uses (Keras 3.0 to today; `_var_key` sees
  through tf.distribute's and Keras's variable wrappers). Missing: True, and
  Keras 3 itself refuses an unknown variable, later in the step.
  """
  var_key = getattr(inner, "_var_key", None)
  known = getattr(inner, "_trainable_variables_indices", None)
  if var_key is None or known is None:
    return True
  return var_key(variable) in known


# --- tf_keras (optional) ---------------------------------------------------------


def tf_keras_track_variable(variable):
  """Registers a variable made in a TF1 graph with tf_keras's session, which
  initializes the variables registered so before `Model.fit` runs a step
  (TF 2.4's Keras registered its loss scale's too; a variable left out is
  uninitialized there).

  Relies on `tf_keras.__internal__.backend.track_variable` (tf_keras 2.x to
  2.21), looked up only where tf_keras is imported already. Missing: nothing
  is registered, and a graph-mode tf_keras `fit` fails loudly on the first
  batch (uninitialized variable), as before.
  """
  tf_keras = sys.modules.get("tf_keras")
  backend = getattr(getattr(tf_keras, "__internal__", None), "backend", None)
  track = getattr(backend, "track_variable", None)
  if track is not None and not tf.executing_eagerly():
    track(variable)


def tf_keras_knows_variable(inner, variable):
  """Whether a built new tf_keras optimizer (`tf_keras.optimizers.*`, not
  `.legacy`) was built for `variable` (only those can it update: it raises
  `KeyError` mid-step else).

  Relies on `_var_key(variable)` and `_index_dict`, the look-up its own
  `_update_step` uses (TF 2.11's Keras to tf_keras 2.21; `_var_key` sees
  through tf.distribute's variable wrappers). Missing: True, and tf_keras
  itself refuses an unknown variable, later in the step.
  """
  var_key = getattr(inner, "_var_key", None)
  known = getattr(inner, "_index_dict", None)
  if var_key is None or known is None:
    return True
  return var_key(variable) in known


def tf_keras_base_loss_scale_optimizer():
  """tf_keras's `BaseLossScaleOptimizer`: every tf_keras loss scale optimizer.

  tf_keras's `Model.compile` under a `mixed_float16` policy wraps any
  optimizer that is not one (tf_keras 2.x to today); its public
  `LossScaleOptimizer` only dispatches to subclasses of it.

  Raises:
    FrameworkChangedError: If it is gone (the wrapper would be wrapped again).
  """
  try:
    from tf_keras.src.mixed_precision import loss_scale_optimizer  # pylint: disable=g-import-not-at-top

    return loss_scale_optimizer.BaseLossScaleOptimizer
  except (ImportError, AttributeError) as e:
    raise _changed("tf_keras", "`BaseLossScaleOptimizer` is gone.") from e


def mark_wrapped(inner):
  """Marks an optimizer as wrapped by a loss scale optimizer.

  tf_keras's own LossScaleOptimizer reads the attribute
  `_is_wrapped_by_loss_scale_optimizer` and refuses to wrap such an
  optimizer a second time (tf_keras 2.x to today); we read it as well.
  """
  object.__setattr__(inner, "_is_wrapped_by_loss_scale_optimizer", True)


def is_wrapped(inner):
  """Whether `mark_wrapped` (ours or tf_keras's) marked `inner`."""
  return bool(getattr(inner, "_is_wrapped_by_loss_scale_optimizer", False))


class TfKerasBatchHooks:
  """What tf_keras's `fit` asks of every callback, for a Keras 3 callback.

  tf_keras's `CallbackList` calls each callback's private
  `_implements_train_batch_hooks`, `_implements_test_batch_hooks` and
  `_implements_predict_batch_hooks` when it is made (tf_keras 2.x, and
  `tf.keras` from TF 2.4 to 2.15), to skip the batch hooks no callback
  overrides; a Keras 3 callback has none of them, and tf_keras's `fit` fails
  on it with an AttributeError. Mixed into a Keras 3 callback, these answer
  as tf_keras's own base class does: whether the class overrides one of
  that mode's batch hooks. If tf_keras stops asking, they go unused.
  """

  _BATCH_HOOKS = {
    "train": ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end"),
    "test": ("on_test_batch_begin", "on_test_batch_end"),
    "predict": ("on_predict_batch_begin", "on_predict_batch_end"),
  }

  def _overrides_batch_hooks(self, mode):
    base = keras.callbacks.Callback
    return any(
      getattr(type(self), hook) is not getattr(base, hook) for hook in self._BATCH_HOOKS[mode]
    )

  def _implements_train_batch_hooks(self):
    return self._overrides_batch_hooks("train")

  def _implements_test_batch_hooks(self):
    return self._overrides_batch_hooks("test")

  def _implements_predict_batch_hooks(self):
    return self._overrides_batch_hooks("predict")


# tf_keras's OptimizerV2 (`tf_keras.optimizers.legacy.*`, the optimizers of
# TF 2.4) has no public way to create its slots, aggregate gradients, or
# read its hyperparameters by name; these are the members TF 2.4's own
# LossScaleOptimizer used (all present from TF 2.2 to tf_keras 2.21).
_V2_MEMBERS = (
  "_name",
  "_hyper",
  "_get_hyper",
  "_set_hyper",
  "_create_all_weights",
  "_transform_unaggregated_gradients",
  "_aggregate_gradients",
  "_create_or_restore_slot_variable",
  "_restore_slot_variable",
)


def v2_check_members(optimizer):
  """Raises `FrameworkChangedError` unless `optimizer` has the OptimizerV2
  members used below: checked when it is wrapped, not mid-training."""
  missing = [name for name in _V2_MEMBERS if not hasattr(optimizer, name)]
  if missing:
    raise _changed("tf_keras", f"its OptimizerV2 no longer has {', '.join(missing)}.")


def v2_create_all_weights(optimizer, var_list):
  """Creates an OptimizerV2's slots and hyperparameter variables."""
  with tf.name_scope(optimizer._name), tf.init_scope():
    optimizer._create_all_weights(var_list)


def v2_aggregate_gradients(optimizer, grads_and_vars):
  """An OptimizerV2's own all-reduce (with its gradient transformers)."""
  grads_and_vars = optimizer._transform_unaggregated_gradients(grads_and_vars)
  return optimizer._aggregate_gradients(grads_and_vars)


def v2_hyperparameter_names(optimizer):
  """The names an OptimizerV2 registered with `_set_hyper`."""
  return set(optimizer._hyper)


def v2_get_hyperparameter(optimizer, name):
  return optimizer._get_hyper(name)


def v2_set_hyperparameter(optimizer, name, value):
  optimizer._set_hyper(name, value)


def v2_create_or_restore_slot_variable(optimizer, slot_variable_position, slot_name, variable):
  """Checkpoint restore of a slot, answered by the optimizer owning it."""
  return optimizer._create_or_restore_slot_variable(slot_variable_position, slot_name, variable)


def v2_restore_slot_variable(optimizer, slot_name, variable, slot_variable):
  return optimizer._restore_slot_variable(slot_name, variable, slot_variable)


# --- What Horovod-style wrappers and users call on an OptimizerV2 -------


def v2_compute_gradients(optimizer, loss, var_list, grad_loss, tape):
  """An OptimizerV2's `_compute_gradients`: `minimize`'s first half, which
  TF 2.4's wrapper called on the scaled loss (tf_keras 2.x to today).

  Returns:
    Its (gradient, variable) pairs, or None when the member is gone (the
    caller then computes the gradients with the tape, as for other optimizers).
  """
  compute = getattr(optimizer, "_compute_gradients", None)
  if compute is None:
    return None
  return compute(loss, var_list=var_list, grad_loss=grad_loss, tape=tape)


def v2_decayed_lr(optimizer, var_dtype):
  """An OptimizerV2's `_decayed_lr(var_dtype)`, its current learning rate,
  which user code reads through the wrapper (tf_keras 2.x to today). Gone:
  `AttributeError`, as the optimizer itself would raise."""
  decayed_lr = getattr(optimizer, "_decayed_lr", None)
  if decayed_lr is None:
    raise AttributeError(f"{type(optimizer).__name__} has no `_decayed_lr`")
  return decayed_lr(var_dtype)


# --- Keras's TensorBoard callback ---------------------------------------------


def tensorboard_train_writer(callback):
  """The summary writer of a `TensorBoard` callback's training scalars.

  Relies on the `_train_writer` property of Keras 3's and tf_keras's
  `TensorBoard` (and TF's own `tf.keras` from 2.2): the writer of
  `<log_dir>/train`, made on first use, renewed when `fit` gives the callback
  its model and closed at the end of that `fit`; and on the writer's
  `_closed` flag (TensorFlow 2.x). None when the property is gone, when the
  callback has had no model (no `fit` yet), when its writer is closed (its
  last `fit` is over), or for None: the caller then uses a writer of its own.
  """
  writer = getattr(callback, "_train_writer", None)
  if writer is None or getattr(writer, "_closed", False):
    return None
  return writer
