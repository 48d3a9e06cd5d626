"""The dynamic loss-scale algorithm, in one place.

Three layers, each usable on its own:

* `all_finite(grads)`: one scalar "every gradient is finite" decision.
* `next_scale_and_counter(...)`: the pure state transition, from the current
  (scale, counter) and that decision to the next (scale, counter).
* `update_scale_variables(...)`: applies the transition to the two state
  variables, deciding once for all replicas of a `tf.distribute` strategy.

The legacy `DynamicLossScale`, both Keras `LossScaleOptimizer` classes and the
compat.v1 `MixedPrecisionLossScaleOptimizer` all update their scale through
`update_scale_variables`.
"""

import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # No public way to ask "am I in XLA?".


def _values(grad):
  return grad.values if isinstance(grad, tf.IndexedSlices) else grad


# Gradients this small are handled together with the others of their shape:
# one op per group instead of one per gradient (eager and tf.function pay per
# op), for a temporary of at most this many elements per group...
_GROUPED_MAX_ELEMENTS = 1 << 16
# ...and, in the exact check, of at most this many elements per stacked chunk.
_STACKED_MAX_ELEMENTS = 1 << 20


def _grouped(values, group):
  """Splits `values` into lists of same-shaped small tensors and the others."""
  groups, others = {}, []
  for v in values:
    if group and v.shape.is_fully_defined() and v.shape.num_elements() <= _GROUPED_MAX_ELEMENTS:
      groups.setdefault(tuple(v.shape.as_list()), []).append(v)
    else:
      others.append(v)
  return list(groups.values()), others


def _all(flags):
  return flags[0] if len(flags) == 1 else tf.reduce_all(tf.stack(flags))


def _each_finite(values):
  """TF 2.4's element-wise check, on stacked chunks of same-shaped gradients."""
  groups, others = _grouped(values, group=True)
  flags = [tf.reduce_all(tf.math.is_finite(v)) for v in others]
  for same_shape in groups:
    per_chunk = max(1, _STACKED_MAX_ELEMENTS // max(1, same_shape[0].shape.num_elements()))
    for i in range(0, len(same_shape), per_chunk):
      chunk = same_shape[i : i + per_chunk]
      flags.append(
        tf.reduce_all(tf.math.is_finite(chunk[0] if len(chunk) == 1 else tf.stack(chunk)))
      )
  return _all(flags)


def _times_zero_finite(values):
  """Exact as well: finite * 0 is 0, Inf * 0 and NaN * 0 are NaN, and a sum of
  zeros cannot overflow. XLA fuses the multiply into the reduction."""
  sums = [tf.cast(tf.reduce_sum(v * tf.zeros([], v.dtype)), tf.float32) for v in values]
  return tf.math.is_finite(sums[0] if len(sums) == 1 else tf.add_n(sums))


def _sum_finite(values):
  """One read of every gradient (float32/float64 only).

  A sum that includes an Inf or a NaN is never finite, so a finite total
  proves every element finite. A non-finite total may also be an overflow of
  finite values; an exact check decides then, so a finite step is never
  skipped.
  """
  xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
  groups, others = _grouped(values, group=not xla)  # XLA compiles a wide add_n slowly.
  sums = [tf.reduce_sum(v) for v in others]
  sums += [tf.reduce_sum(g[0] if len(g) == 1 else tf.add_n(g)) for g in groups]
  total = sums[0] if len(sums) == 1 else tf.add_n(sums)
  exact = _times_zero_finite if xla else _each_finite
  return tf.cond(tf.math.is_finite(total), lambda: tf.constant(True), lambda: exact(values))


def all_finite(grads):
  """Returns a scalar bool tensor: True when no gradient holds an Inf or NaN.

  Args:
    grads: A flat list of gradients (tensors or `tf.IndexedSlices`); `None`
      entries are ignored.

  Returns:
    A scalar `tf.bool` tensor.

  >>> bool(all_finite([tf.constant([1., 2.]), None]))
  True
  >>> bool(all_finite([tf.constant([1., float("inf")])]))
  False
  >>> bool(all_finite([tf.constant([3e38, 3e38])]))  # finite; only the sum overflows
  True
  """
  values = [_values(g) for g in grads if g is not None]
  flags = []
  for dtype in sorted({v.dtype for v in values}, key=lambda d: d.name):
    same_dtype = [v for v in values if v.dtype == dtype]
    # float16 and bfloat16 sums overflow too often for the sum to pay off.
    summable = dtype in (tf.float32, tf.float64)
    flags.append(_sum_finite(same_dtype) if summable else _each_finite(same_dtype))
  return _all(flags) if flags else tf.constant(True)


def next_scale_and_counter(scale, counter, finite, growth_steps, multiplier):
  """The pure transition of the dynamic loss scale.

  A finite step counts one more good step; on reaching `growth_steps` the
  scale is multiplied by `multiplier` (kept as is if the product would be
  Inf) and the counter restarts at 0. A non-finite step divides the scale by
  `multiplier`, never going below 1, and restarts the counter.

  Args:
    scale: float32 scalar, the current loss scale.
    counter: int64 scalar, good steps since the scale last changed.
    finite: bool scalar, whether this step's gradients were all finite.
    growth_steps: Python int, good steps needed to grow the scale.
    multiplier: Python float, the growth and shrink factor.

  Returns:
    `(next_scale, next_counter)`, float32 and int64 scalar tensors.

  >>> s, c = next_scale_and_counter(8., 1, True, 2, 2.)
  >>> float(s), int(c)
  (16.0, 0)
  >>> s, c = next_scale_and_counter(8., 1, False, 2, 2.)
  >>> float(s), int(c)
  (4.0, 0)
  """
  scale = tf.convert_to_tensor(scale, tf.float32)
  counter = tf.convert_to_tensor(counter, tf.int64)
  grows = counter + 1 >= growth_steps
  grown = scale * multiplier
  grown = tf.where(tf.math.is_finite(grown), grown, scale)
  shrunk = tf.maximum(scale / multiplier, 1.0)
  next_scale = tf.where(finite, tf.where(grows, grown, scale), shrunk)
  zero = tf.zeros_like(counter)
  next_counter = tf.where(finite, tf.where(grows, zero, counter + 1), zero)
  return next_scale, next_counter


def replicas_all_finite(grads, grads_in_sync):
  """One finiteness decision shared by every replica and worker.

  Must be called in a cross-replica context (or with no strategy at all).

  Args:
    grads: Gradients as seen in the cross-replica context: per-replica values
      under a strategy, plain tensors otherwise.
    grads_in_sync: True when `grads` were already all-reduced, so that every
      replica sees the same values: replica 0's decision is then everyone's
      and no further communication is needed. False reduces the per-replica
      decisions so that one non-finite replica makes all of them skip.

  Returns:
    A scalar bool tensor (local to this worker, equal on every worker).
  """
  if not tf.distribute.has_strategy():
    return all_finite(grads)
  strategy = tf.distribute.get_strategy()
  if grads_in_sync:
    per_replica = strategy.extended.call_for_each_replica(all_finite, args=(grads,))
    return strategy.experimental_local_results(per_replica)[0]
  # Booleans cannot be all-reduced: count the finite replicas instead.
  per_replica = strategy.extended.call_for_each_replica(
    lambda g: tf.cast(all_finite(g), tf.float32), args=(grads,)
  )
  finite_count = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
  return tf.equal(finite_count, strategy.num_replicas_in_sync)


def update_scale_variables(
  scale_var, counter_var, grads, growth_steps, multiplier, grads_in_sync=False
):
  """Updates the scale state from `grads` and says whether to apply them.

  Call in a cross-replica context under a strategy: the variables are
  mirrored and are assigned once, from one decision (see
  `replicas_all_finite`).

  Args:
    scale_var: float32 scalar variable holding the loss scale.
    counter_var: int64 scalar variable holding the good-step counter.
    grads: Nested structure of unscaled gradients; `None` entries ignored.
    growth_steps: Python int.
    multiplier: Python float.
    grads_in_sync: See `replicas_all_finite`.

  Returns:
    `(update_op, should_apply_gradients)`: the assign op (None when eager)
    and a scalar bool tensor.
  """
  finite = replicas_all_finite(tf.nest.flatten(grads), grads_in_sync)
  next_scale, next_counter = next_scale_and_counter(
    scale_var, counter_var, finite, growth_steps, multiplier
  )
  update_op = tf.group(
    scale_var.assign(next_scale, read_value=False),
    counter_var.assign(next_counter, read_value=False),
  )
  return update_op, finite
