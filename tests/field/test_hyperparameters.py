"""Learning rates, schedules and hyperparameters through the wrapper.

Reproduces keras-team/keras#16218: with a `LearningRateSchedule` and a
`LossScaleOptimizer`, reading the current learning rate failed
(`'LossScaleOptimizer' object has no attribute '_hypers_created'`), and the
learning-rate callbacks of `fit` need `lr` / `learning_rate` through the wrapper.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
from field import common
from tf_lossscale.keras import mixed_precision

LSO = mixed_precision.LossScaleOptimizer


def _apply_step(strategy, opt, var):
  """step(bad): every replica applies gradient [1, 2] (NaN on the last one when `bad`)."""
  last = strategy.num_replicas_in_sync - 1

  @tf.function
  def step(bad):
    def replica_fn():
      with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(var * [1.0, 2.0]))
      (grad,) = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
      ctx = tf.distribute.get_replica_context()
      bad_here = tf.logical_and(bad, tf.equal(ctx.replica_id_in_sync_group, last))
      grad = tf.where(bad_here, float("nan"), grad)
      opt.apply_gradients([(grad, var)])

    strategy.run(replica_fn)

  return lambda bad=False: step(tf.constant(bad))


def _value(lr):
  return float(tf.convert_to_tensor(lr))


def test_lr_and_learning_rate_are_read_and_set_through_the_wrapper(family, strategy):
  with strategy.scope():
    var = tf.Variable([1.0, 1.0])
    inner = common.make_inner(family, learning_rate=0.5)
    opt = LSO(inner, initial_scale=8)
  step = _apply_step(strategy, opt, var)
  grad = np.array([1.0, 2.0]) * strategy.num_replicas_in_sync
  assert _value(opt.lr) == _value(opt.learning_rate) == 0.5
  step()
  expected = 1 - 0.5 * grad
  common.assert_on_every_replica(strategy, var, expected)

  opt.lr = 0.25
  assert _value(inner.learning_rate) == _value(opt.learning_rate) == 0.25
  step()
  expected = expected - 0.25 * grad
  common.assert_on_every_replica(strategy, var, expected)

  opt.learning_rate = 0.125
  assert _value(inner.learning_rate) == _value(opt.lr) == 0.125
  step()
  common.assert_on_every_replica(strategy, var, expected - 0.125 * grad)


_PER_REPLICA_RATE = "using a PerReplica object while not inside a replica context"


@functools.cache
def _plain_keras3_schedule_step_under_mirrored():
  """One step of a plain Keras 3 SGD with a schedule under MirroredStrategy: the error or None."""
  strategy = common.strategy("mirrored")
  with strategy.scope():
    var = tf.Variable([1.0, 1.0])
    opt = keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(1.0, 1, 0.5))
    opt.build([var])
  return helpers.plain_step_outcome(strategy, opt, var, [1.0, 2.0])


def test_plain_keras3_schedule_under_mirrored_strategy():
  """Keras 3.0.5 and 3.2.0 (not 3.0.0, not 3.4) cannot step with a schedule under
  MirroredStrategy, even without loss scaling: each replica computes the rate and the
  cross-replica update gets a PerReplica value it cannot use (upstream)."""
  error, value = _plain_keras3_schedule_step_under_mirrored()
  if error is None:
    # Learning rate 1: one replica's gradient (Keras < 3.5) or both summed.
    assert value == ([-1.0, -3.0] if helpers.keras3_all_reduces() else [0.0, -1.0])
  else:
    assert _PER_REPLICA_RATE in error


def test_a_schedule_sees_every_step_skipped_ones_included(family, strategy):
  """As TF 2.4: `iterations` counts a skipped step, and the schedule follows `iterations`."""
  if family == "keras3" and strategy.num_replicas_in_sync > 1:
    if _plain_keras3_schedule_step_under_mirrored()[0]:
      pytest.skip(
        "this Keras 3 cannot step with a schedule under MirroredStrategy, even without us"
      )
  schedule = common.schedules(family).ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
  with strategy.scope():
    var = tf.Variable([1.0, 1.0])
    inner = common.make_inner(family, learning_rate=schedule)
    opt = LSO(inner, initial_scale=8)
  step = _apply_step(strategy, opt, var)
  grad = np.array([1.0, 2.0]) * strategy.num_replicas_in_sync
  step()  # learning rate 1
  step(bad=True)  # skipped, but counted: the next step is iteration 2
  step()  # learning rate 0.25
  step()  # learning rate 0.125
  common.assert_on_every_replica(strategy, var, 1 - (1 + 0.25 + 0.125) * grad)
  assert common.as_int(opt.iterations) == 4 and float(opt.loss_scale) == 4.0
  theirs, ours = inner.learning_rate, opt.learning_rate
  if isinstance(theirs, common.schedules(family).LearningRateSchedule):
    assert ours is theirs  # OptimizerV2 returns the schedule object itself
  else:
    assert _value(ours) == _value(theirs)


def test_keras3_own_lso_schedule_does_not_count_skipped_steps():
  """Documented difference: Keras 3's wrapper does not count a skipped step."""
  schedule = keras.optimizers.schedules.ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
  opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(schedule), initial_scale=8)
  var = keras.Variable([1.0, 1.0])
  # Keras 3's wrapper takes gradients of the scaled loss.
  for scaled in ([8.0, 16.0], [float("nan"), 8.0], [4.0, 8.0], [4.0, 8.0]):
    opt.apply_gradients([(tf.constant(scaled), var)])
  # Learning rates 1, (skipped), 0.5, 0.25: the skipped step did not advance the schedule.
  np.testing.assert_array_equal(var.numpy(), 1 - (1 + 0.5 + 0.25) * np.array([1.0, 2.0]))
  assert int(opt.inner_optimizer.iterations.numpy()) == 3


def test_decayed_lr_of_an_optimizer_v2_through_the_wrapper():
  schedule = tf_keras.optimizers.schedules.ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
  inner = tf_keras.optimizers.legacy.SGD(schedule)
  opt = LSO(inner)
  var = tf.Variable(1.0)
  opt.apply_gradients([(tf.constant(1.0), var)])
  opt.apply_gradients([(tf.constant(1.0), var)])
  assert float(inner._decayed_lr(tf.float32)) == 0.25  # pylint: disable=protected-access
  assert float(opt._decayed_lr(tf.float32)) == 0.25  # pylint: disable=protected-access


def _learning_rate_setups(fw):
  return {
    "scheduler_callback": (0.1, [fw.callbacks.LearningRateScheduler(lambda epoch: 0.1 / 2**epoch)]),
    "plateau_callback": (
      0.1,
      [fw.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e3)],
    ),
    "schedule_object": (
      fw.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5),
      [],
    ),
  }


def _fit_plain_and_wrapped(family, strategy, setup):
  """Weights, final learning rate and logs of `fit` with the plain optimizer, then ours."""
  fw = common.framework(family)
  runs = []
  for wrap in (lambda inner: inner, lambda inner: LSO(inner, initial_scale=2.0**10)):
    learning_rate, callbacks = _learning_rate_setups(fw)[setup]
    with strategy.scope():
      model = common.dense_model(fw)
      model.compile(wrap(common.make_inner(family, learning_rate=learning_rate)), loss="mse")
    history = model.fit(
      common.X, common.Y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=callbacks
    )
    final_lr = model.optimizer.learning_rate
    if not isinstance(final_lr, fw.optimizers.schedules.LearningRateSchedule):
      final_lr = _value(final_lr)
    runs.append((model.get_weights(), final_lr, history.history))
  (plain_weights, plain_lr, plain_logs), (weights, lr, logs) = runs
  for ours, theirs in zip(weights, plain_weights, strict=True):
    np.testing.assert_array_equal(ours, theirs)
  return plain_lr, lr, plain_logs, logs


def test_fit_learning_rate_scheduler_matches_the_plain_optimizer(family, strategy):
  """The callback reads and sets the learning rate through the wrapper every epoch."""
  if family == "keras3":
    helpers.need_plain_keras3_all_reduce(strategy)
  plain_lr, lr, plain_logs, logs = _fit_plain_and_wrapped(family, strategy, "scheduler_callback")
  lr_key = "learning_rate" if "learning_rate" in plain_logs else "lr"
  np.testing.assert_allclose(plain_logs[lr_key], [0.1, 0.05])
  np.testing.assert_array_equal(logs[lr_key], plain_logs[lr_key])
  assert lr == plain_lr == pytest.approx(0.05)


@pytest.mark.parametrize("setup", ["plateau_callback", "schedule_object"])
def test_fit_plateau_callback_and_schedule_object_match_the_plain_optimizer(
  family, strategy, setup
):
  """Weights, every epoch's logs and the final learning rate are the plain optimizer's."""
  if family == "keras3":
    helpers.need_plain_keras3_all_reduce(strategy)
    if setup == "schedule_object" and strategy.num_replicas_in_sync > 1:
      if _plain_keras3_schedule_step_under_mirrored()[0]:
        pytest.skip(
          "this Keras 3 cannot step with a schedule under MirroredStrategy, even without us"
        )
  plain_lr, lr, plain_logs, logs = _fit_plain_and_wrapped(family, strategy, setup)
  assert set(plain_logs) <= set(logs) and "loss" in plain_logs
  for key, values in plain_logs.items():
    np.testing.assert_array_equal(logs[key], values, err_msg=key)
  if setup == "plateau_callback":  # the second epoch did not improve by 1000: halved
    assert lr == plain_lr == pytest.approx(0.05)
