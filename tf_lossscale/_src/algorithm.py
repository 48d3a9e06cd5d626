"""The dynamic loss-scale algorithm, plainly, on one screen.

One training step, as every API of this package does it::

    finite = no element of any gradient, on any replica, is Inf or NaN
    if finite:
      apply the gradients
      counter = max(counter, 0) + 1  # a run of non-finite steps ends
      if counter == growth_steps:
        counter = 0
        if scale * multiplier is finite: scale = min(scale * multiplier, max_scale)
    else:
      skip the step: no variable or slot changes
      skipped_steps += 1
      run = max(-counter, 0) + 1  # consecutive non-finite steps, this one included
      if run >= hysteresis:
        scale = max(scale / multiplier, min_scale)
      counter = -min(run, hysteresis - 1)

With TF 2.4's settings (`min_scale` 1, `max_scale` Inf, `hysteresis` 1) this is
exactly TF 2.4's algorithm: the counter never goes below 0, a non-finite step
resets it to 0 and halves the scale (not below 1). The counter is the one
checkpointed variable (`good_steps`): at or above 0 it counts the finite steps
since the scale last changed; below 0 (only with `hysteresis` > 1) it is minus
the number of consecutive non-finite steps so far, at most `hysteresis - 1`
of them, so that every non-finite step from the `hysteresis`-th on shrinks the
scale. `skipped_steps` is not checkpointed (TF 2.4's checkpoints have no such
key).

This module holds it without speed-ups: the settings (`ScaleSettings`), the
pure transition (`next_scale_and_counter`), TF 2.4's element-wise check
(`all_finite`), one decision for all replicas (`replicas_all_finite`) and the
update of the state variables (`update_scale_variables`). `fast_paths.py`
computes the same numbers faster; `scale_state.py` chooses between the two.
Nothing here needs AutoGraph: it runs as is eagerly, in `tf.function` and in
TF1 graphs.
"""

import dataclasses
import math

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class ScaleSettings:
  """The settings of a dynamic loss scale, shared by every API.

  The last three are beyond TF 2.4, whose behaviour their defaults give.

  Attributes:
    initial_scale: The scale before the first step.
    growth_steps: Consecutive finite steps after which the scale grows.
    multiplier: The growth and shrink factor.
    min_scale: The scale never shrinks below it.
    max_scale: The scale never grows above it (Inf: unbounded).
    hysteresis: The number of consecutive non-finite steps at which the scale
      shrinks; every further one of the same run shrinks it too.
  """

  initial_scale: float = 2.0**15
  growth_steps: int = 2000
  multiplier: float = 2.0
  min_scale: float = 1.0
  max_scale: float = float("inf")
  hysteresis: int = 1


def _is_inf(value):
  return isinstance(value, (int, float)) and math.isinf(value)


@tf.autograph.experimental.do_not_convert
def next_scale_and_counter(scale, counter, finite, settings):
  """The pure transition: the next `(scale, counter)` after one step.

  Args:
    scale: float32 scalar, the current loss scale.
    counter: int64 scalar: finite steps since the scale last changed, or
      below 0 minus the consecutive non-finite steps so far (see the module
      docstring).
    finite: bool scalar, whether this step's gradients were all finite.
    settings: A `ScaleSettings` (its fields may be scalar tensors).

  Returns:
    `(next_scale, next_counter)`, float32 and int64 scalar tensors.

  >>> settings = ScaleSettings(growth_steps=2)
  >>> s, c = next_scale_and_counter(8., 1, True, settings)
  >>> float(s), int(c)
  (16.0, 0)
  >>> s, c = next_scale_and_counter(8., 1, False, settings)
  >>> float(s), int(c)
  (4.0, 0)

  With a hysteresis of 2 the first non-finite step of a run only counts:

  >>> settings = ScaleSettings(growth_steps=2, hysteresis=2)
  >>> s, c = next_scale_and_counter(8., 1, False, settings)
  >>> float(s), int(c)
  (8.0, -1)
  >>> s, c = next_scale_and_counter(s, c, False, settings)
  >>> float(s), int(c)
  (4.0, -1)
  """
  scale = tf.convert_to_tensor(scale, tf.float32)
  counter = tf.convert_to_tensor(counter, tf.int64)
  multiplier = tf.cast(settings.multiplier, tf.float32)
  hysteresis = tf.cast(settings.hysteresis, tf.int64)
  zero = tf.zeros_like(counter)
  good = tf.maximum(counter, zero) + 1
  grows = good >= tf.cast(settings.growth_steps, tf.int64)
  # Multiplied only on a step that grows the scale, as in TF 2.4: another
  # product may overflow, which `tf.debugging.enable_check_numerics` refuses.
  grown = tf.where(tf.logical_and(finite, grows), scale, tf.ones_like(scale)) * multiplier
  grown = tf.where(tf.math.is_finite(grown), grown, scale)
  if not _is_inf(settings.max_scale):  # No bound, no op (check-numerics refuses an Inf constant).
    grown = tf.minimum(grown, tf.cast(settings.max_scale, tf.float32))
  run = tf.maximum(-counter, zero) + 1
  shrinks = run >= hysteresis
  shrunk = tf.maximum(scale / multiplier, tf.cast(settings.min_scale, tf.float32))
  next_scale = tf.where(finite, tf.where(grows, grown, scale), tf.where(shrinks, shrunk, scale))
  next_counter = tf.where(finite, tf.where(grows, zero, good), -tf.minimum(run, hysteresis - 1))
  return next_scale, next_counter


def gradient_values(grad):
  """The tensor of a gradient: its values for `tf.IndexedSlices`."""
  if isinstance(grad, tf.IndexedSlices):
    return grad.values
  return tf.convert_to_tensor(grad)


def checked_values(grads):
  """The tensors the finiteness check reads: each gradient's values (a
  complex one's real and imaginary parts), but None, integer and bool
  gradients (always finite; Keras 3 applies them)."""
  checked = []
  for grad in grads:
    values = None if grad is None else gradient_values(grad)
    if values is not None and values.dtype.is_complex:
      checked += [tf.math.real(values), tf.math.imag(values)]
    elif values is not None and values.dtype.is_floating:
      checked.append(values)
  return checked


@tf.autograph.experimental.do_not_convert
def all_finite(grads):
  """TF 2.4's check: True when no element of any gradient is Inf or NaN.

  Args:
    grads: A flat list of gradients (tensors, `tf.IndexedSlices` or Python
      numbers); `None` entries are ignored.

  Returns:
    A scalar `tf.bool` tensor.

  >>> bool(all_finite([tf.constant([1., 2.]), None, 3.]))
  True
  >>> bool(all_finite([tf.constant([1., float("inf")])]))
  False
  """
  flags = [tf.reduce_all(tf.math.is_finite(v)) for v in checked_values(grads)]
  return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


@tf.autograph.experimental.do_not_convert
def replicas_all_finite(grads, grads_in_sync, check=all_finite):
  """One finiteness decision shared by every replica and worker.

  Call in a cross-replica context (or with no strategy at all).

  Args:
    grads: Flat list of gradients as seen in the cross-replica context:
      per-replica values under a strategy, plain tensors otherwise.
    grads_in_sync: True when `grads` were already all-reduced, so every
      replica sees the same values and replica 0's decision is everyone's.
      False reduces the per-replica decisions: one non-finite replica makes
      all of them skip.
    check: The single-replica check, `check(grads) -> bool tensor`.

  Returns:
    A scalar bool tensor (local to this worker, equal on every worker).
  """
  if not tf.distribute.has_strategy():
    return check(grads)
  strategy = tf.distribute.get_strategy()
  if grads_in_sync:
    # Replica 0's values, checked on its device: no replica threads needed.
    local = [None if g is None else strategy.experimental_local_results(g)[0] for g in grads]
    with tf.device(strategy.extended.worker_devices[0]):
      return check(local)
  # Booleans cannot be all-reduced: count the finite replicas instead.
  per_replica = strategy.extended.call_for_each_replica(
    lambda g: tf.cast(check(g), tf.float32), args=(grads,)
  )
  finite_count = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
  return tf.equal(finite_count, strategy.num_replicas_in_sync)


@tf.autograph.experimental.do_not_convert
def cond(pred, true_fn, false_fn):
  """`tf.cond`, decided in Python when `pred` is known (eagerly, a bool)."""
  static_pred = tf.get_static_value(pred)
  if static_pred is not None:
    return true_fn() if static_pred else false_fn()
  return tf.cond(pred, true_fn, false_fn)


@tf.autograph.experimental.do_not_convert
def assign_state(scale_var, counter_var, skipped_var, next_scale, next_counter, finite):
  """The assigns of one step: scale, counter and (if any) skipped-step count.

  Returns:
    A list of ops (their results when eager).
  """
  assigns = [
    scale_var.assign(next_scale, read_value=False),
    counter_var.assign(next_counter, read_value=False),
  ]
  if skipped_var is not None:
    skipped = tf.cast(tf.logical_not(finite), tf.int64)
    assigns.append(skipped_var.assign_add(skipped, read_value=False))
  return assigns


@tf.autograph.experimental.do_not_convert
def update_scale_variables(
  scale_var,
  counter_var,
  grads,
  settings,
  grads_in_sync=False,
  apply_fn=None,
  skip_fn=None,
  skipped_var=None,
  count_skip=None,
):
  """Decides one step: updates the state variables from `grads`.

  Under a strategy, call in a cross-replica context: the variables are
  mirrored and assigned once, from one decision (`replicas_all_finite`).

  Args:
    scale_var: float32 scalar variable holding the loss scale.
    counter_var: int64 scalar variable holding the counter (see
      `next_scale_and_counter`).
    grads: Nested structure of unscaled gradients; `None` entries ignored.
    settings: A `ScaleSettings`.
    grads_in_sync: See `replicas_all_finite`.
    apply_fn, skip_fn: Optional callables taking no arguments: `apply_fn`
      runs when the gradients are finite, `skip_fn` otherwise, and the
      returned op includes it.
    skipped_var: Optional int64 scalar variable, incremented on every
      non-finite step.
    count_skip: Optional callable taking a scalar bool tensor (the step was
      skipped) that adds it to a step counter of its own (an inner
      optimizer's `iterations`); called after the apply.

  Returns:
    `(update_op, finite)`: the op assigning the state (and running
    `apply_fn` or `skip_fn`; None when eager) and a scalar bool tensor.
  """
  finite = replicas_all_finite(tf.nest.flatten(grads), grads_in_sync)
  ops = []
  if apply_fn is not None:
    ops = [op for op in tf.nest.flatten(cond(finite, apply_fn, skip_fn)) if op is not None]
  next_scale, next_counter = next_scale_and_counter(scale_var, counter_var, finite, settings)
  assigns = assign_state(scale_var, counter_var, skipped_var, next_scale, next_counter, finite)
  if count_skip is not None:
    with tf.control_dependencies(ops):
      assigns.append(count_skip(tf.logical_not(finite)))
  update_op = tf.group(*[op for op in (*ops, *assigns) if op is not None])
  return (None if tf.executing_eagerly() else update_op), finite
