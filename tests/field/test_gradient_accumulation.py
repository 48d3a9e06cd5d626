"""Gradient accumulation: Keras 3's `gradient_accumulation_steps`, hand-written loops.

Reproduces keras-team/keras#14829 (gradient accumulation could not be combined
with mixed precision: an accumulating optimizer inside the loss-scale
optimizer). The issue also lists keras-team/keras PR #19998, which could not be
read here; the window semantics tested are those of the installed Keras 3's
`gradient_accumulation_steps` (every N-th `apply` updates the variables with
the mean of the window's gradients).

Order matters. With the loss-scale optimizer outside the accumulation (Keras
3's `gradient_accumulation_steps` on the inner optimizer), every micro-step is
checked on its own, so a non-finite micro-batch never reaches the accumulator.
A hand-written loop that accumulates unscaled gradients and applies every N
micro-batches feeds one check per window: a non-finite micro-batch poisons its
own window only, which is skipped as a whole (one halving of the scale) and
reset by the loop. Keras 3's accumulation cannot run under MirroredStrategy
(its own optimizers fail there: `merge_call` inside its `cond`), so those
tests use the default strategy; the hand-written loop runs under both.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import helpers
from field import common
from tf_lossscale.keras import mixed_precision

LSO = mixed_precision.LossScaleOptimizer
NAN = float("nan")


def _accumulator(inner, var):
  (accumulator,) = [
    acc
    for acc in inner._accumulated_gradients
    if acc.shape == var.shape  # pylint: disable=protected-access
  ]
  return accumulator.numpy()


@common.needs_keras3_option("gradient_accumulation_steps")
def test_keras3_accumulation_a_nan_micro_step_never_reaches_the_accumulator():
  var = keras.Variable([1.0, 2.0])
  inner = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
  opt = LSO(inner, initial_scale=8)
  opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
  np.testing.assert_array_equal(_accumulator(inner, var), [1.0, 1.0])
  opt.apply_gradients([(tf.constant([NAN, 1.0]), var)])
  np.testing.assert_array_equal(_accumulator(inner, var), [1.0, 1.0])
  np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])
  assert float(opt.loss_scale) == 4.0


@common.needs_keras3_option("gradient_accumulation_steps")
@pytest.mark.parametrize("bad_position", [0, 1], ids=["opening", "closing"])
def test_keras3_accumulation_a_skipped_micro_step_leaves_the_window_open(bad_position):
  """The window holds N finite micro-batches, as Keras 3's own wrapper keeps it.

  The skipped micro-step is dropped: it neither counts in `iterations` (which
  counts what the plain optimizer counts: windows from Keras 3.5, micro-steps
  before) nor moves the window, wherever it falls; the scale
  still halves and `skipped_steps` counts it.
  """
  var, plain_var = keras.Variable([1.0, 2.0]), keras.Variable([1.0, 2.0])
  inner = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
  plain = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
  opt = LSO(inner, initial_scale=8)
  grads = [[1.0, 1.0], [2.0, 2.0]]
  for grad in grads:
    plain.apply_gradients([(tf.constant(grad), plain_var)])
  grads.insert(bad_position, [NAN, 1.0])
  for grad in grads:
    opt.apply_gradients([(tf.constant(grad), var)])
  np.testing.assert_array_equal(var.numpy(), [1.0 - 1.5, 2.0 - 1.5])  # mean of 1 and 2
  np.testing.assert_array_equal(_accumulator(inner, var), [0.0, 0.0])
  # `iterations` as the plain optimizer's after the two finite micro-steps: one
  # window (Keras >= 3.5) or two micro-steps (before, where it counts those).
  assert int(opt.iterations.numpy()) == int(plain.iterations.numpy()) in (1, 2)
  assert int(opt.skipped_steps.numpy()) == 1
  assert float(opt.loss_scale) == 4.0
  for grad in ([4.0, 4.0], [8.0, 8.0]):
    opt.apply_gradients([(tf.constant(grad), var)])
    plain.apply_gradients([(tf.constant(grad), plain_var)])
  np.testing.assert_array_equal(var.numpy(), [1.0 - 1.5 - 6.0, 2.0 - 1.5 - 6.0])
  np.testing.assert_array_equal(var.numpy(), plain_var.numpy())
  assert int(opt.iterations.numpy()) == int(plain.iterations.numpy()) in (2, 4)


@common.needs_keras3_option("gradient_accumulation_steps")
def test_keras3_own_lso_a_skipped_micro_step_leaves_the_window_open():
  """The peer's behaviour the test above asks for (it takes scaled gradients)."""
  var = keras.Variable([1.0, 2.0])
  inner = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
  opt = keras.optimizers.LossScaleOptimizer(inner, initial_scale=8)
  for scaled in ([8.0, 8.0], [NAN, 4.0], [8.0, 8.0]):  # 1 at scale 8; skipped; 2 at scale 4
    opt.apply_gradients([(tf.constant(scaled), var)])
  np.testing.assert_array_equal(var.numpy(), [1.0 - 1.5, 2.0 - 1.5])
  # The step counter (`_iterations` from Keras 3.5; `iterations` before) counts 2 micro-steps.
  counter = getattr(inner, "_iterations", inner.iterations)  # pylint: disable=protected-access
  assert int(counter.numpy()) == 2


@common.needs_keras3_option("gradient_accumulation_steps")
def test_keras3_fit_with_gradient_accumulation_matches_the_plain_optimizer():
  weights, iterations = [], []
  for wrap in (lambda inner: inner, lambda inner: LSO(inner, initial_scale=2.0**10)):
    model = common.dense_model(keras)
    inner = keras.optimizers.SGD(0.1, momentum=0.5, gradient_accumulation_steps=2)
    model.compile(wrap(inner), loss="mse")
    model.fit(common.X, common.Y, batch_size=2, epochs=2, shuffle=False, verbose=0)
    weights.append(model.get_weights())
    iterations.append(int(model.optimizer.iterations.numpy()))
  for ours, theirs in zip(*weights, strict=True):
    np.testing.assert_array_equal(ours, theirs)
  # 8 micro-steps, 2 per update: Keras >= 3.5 counts updates, earlier Keras micro-steps.
  assert iterations[1] == iterations[0] in (4, 8)


MICRO_BATCHES = 2


def _hand_written_accumulation(family, strategy, loss_scaled, windows):
  """Accumulates unscaled micro-batch gradients per replica, applies their mean per window.

  `windows` lists, per window, which micro-batches have a NaN gradient on the
  last replica. The plain reference does not apply a window with a NaN.
  """
  with strategy.scope():
    var = tf.Variable([1.0, -1.0])
    # Replica-local accumulators: each replica sums its own micro-batches.
    accumulator = tf.Variable(
      [0.0, 0.0],
      trainable=False,
      synchronization=tf.VariableSynchronization.ON_READ,
      aggregation=tf.VariableAggregation.SUM,
    )
    opt = common.make_inner(family, learning_rate=0.5, momentum=0.5)
    opt = LSO(opt, initial_scale=2.0**10) if loss_scaled else common.built(opt, [var])
  scaling = opt if loss_scaled else common.NoScaling
  last = strategy.num_replicas_in_sync - 1

  @tf.function
  def micro_step(x, bad):
    def replica_fn():
      with tf.GradientTape() as tape:
        loss = scaling.get_scaled_loss(tf.reduce_sum(var**2 * x))
      (grad,) = scaling.get_unscaled_gradients(tape.gradient(loss, [var]))
      grad = tf.cond(bad, lambda: helpers.replica_nan(grad, last), lambda: grad)
      accumulator.assign_add(grad)

    strategy.run(replica_fn)

  @tf.function
  def apply_and_reset(apply):
    def replica_fn():
      if apply:
        opt.apply_gradients([(accumulator.read_value() / MICRO_BATCHES, var)])
      accumulator.assign(tf.zeros_like(accumulator))

    strategy.run(replica_fn)

  for w, bad_micro_batches in enumerate(windows):
    for m, bad in enumerate(bad_micro_batches):
      micro_step(tf.constant([1.0 + w, 0.5 * m]), tf.constant(bad))
    apply_and_reset(loss_scaled or not any(bad_micro_batches))
  return var, opt, accumulator


def test_hand_written_accumulation_skips_only_the_poisoned_window(family, strategy):
  if family == "keras3":
    helpers.need_plain_keras3_all_reduce(strategy)
  windows = [[False, False], [False, True], [False, False]]
  var, opt, accumulator = _hand_written_accumulation(family, strategy, True, windows)
  plain_var, _, _ = _hand_written_accumulation(family, strategy, False, windows)
  common.assert_on_every_replica(strategy, var, common.replica_values(strategy, plain_var)[0])
  common.assert_on_every_replica(strategy, accumulator, [0.0, 0.0])
  # One halving for the poisoned window, whatever its number of micro-batches.
  assert float(opt.loss_scale) == 2.0**9 and common.as_int(opt.dynamic_counter) == 1
  assert common.as_int(opt.iterations) == 3
