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


def _values(grad):
  return grad.values if isinstance(grad, tf.IndexedSlices) else grad


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
  """
  flags = [tf.reduce_all(tf.math.is_finite(_values(g))) for g in grads if g is not None]
  if not flags:
    return tf.constant(True)
  if len(flags) == 1:
    return flags[0]
  return tf.reduce_all(tf.stack(flags))


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
