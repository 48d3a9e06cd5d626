"""Explicit all-reduce in the user's loop, clipping around it, no double scaling.

Reproduces the TensorFlow Model Garden `grad_utils` pattern (and the custom
loop of keras-team/keras#19308): scale the loss, all-reduce the scaled
gradients yourself (in float16 to halve the traffic), unscale, clip, and
apply with aggregation turned off; and keras-team/keras#21233, where an inner
optimizer's own `loss_scale_factor` divided the gradients a second time.

The user's loop must give exactly the numbers of the automatic path (the
wrapper all-reducing itself), with no second reduction and no second scaling.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import helpers
from field import common
from tf_lossscale.keras import mixed_precision

LSO = mixed_precision.LossScaleOptimizer
CLIP_NORM = 3.0


def _train(family, strategy, explicit, precision, clip):
  """Three steps (NaN on the last replica in the second); returns var and optimizer.

  Replica r's loss is sum(var * c_r) with small integer c_r, so its scaled
  gradients are exact in float16.
  """
  inner_kwargs = {"global_clipnorm": CLIP_NORM} if (clip == "after" and not explicit) else {}
  with strategy.scope():
    var = tf.Variable([1.0, -1.0, 0.5])
    opt = LSO(
      common.make_inner(family, learning_rate=0.5, momentum=0.5, **inner_kwargs),
      initial_scale=2.0**10,
    )
  last = strategy.num_replicas_in_sync - 1

  @tf.function
  def step(bad):
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      coefficients = tf.constant([1.0, 2.0, -4.0]) * tf.cast(
        ctx.replica_id_in_sync_group + 1, tf.float32
      )
      with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(tf.reduce_sum(var * coefficients))
      (grad,) = tape.gradient(scaled, [var])
      grad = tf.cond(bad, lambda: helpers.replica_nan(grad, last), lambda: grad)
      if clip == "before":  # per replica, on scaled gradients: the threshold scales too
        grad = tf.clip_by_norm(grad, CLIP_NORM * opt.loss_scale)
      if not explicit:
        (grad,) = opt.get_unscaled_gradients([grad])
        opt.apply_gradients([(grad, var)])
        return
      grad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(grad, precision))
      (grad,) = opt.get_unscaled_gradients([tf.cast(grad, tf.float32)])
      if clip == "after":
        (grad,), _ = tf.clip_by_global_norm([grad], CLIP_NORM)
      opt.apply_gradients([(grad, var)], experimental_aggregate_gradients=False)

    strategy.run(replica_fn)

  for bad in (False, True, False):
    step(tf.constant(bad))
  return var, opt


@pytest.mark.parametrize(
  "precision, clip", [("float16", None), ("float32", "before"), ("float32", "after")]
)
def test_user_all_reduce_equals_the_automatic_path(family, strategy, precision, clip):
  var, opt = _train(family, strategy, True, precision, clip)
  automatic_var, automatic_opt = _train(family, strategy, False, precision, clip)
  tolerance = {"rtol": 1e-6} if clip == "after" else {}  # two implementations of the clip
  common.assert_on_every_replica(
    strategy, var, common.replica_values(strategy, automatic_var)[0], **tolerance
  )
  if not clip:  # exact sums: the gradient was applied once, neither doubled nor rescaled
    replicas = strategy.num_replicas_in_sync
    summed = np.array([1.0, 2.0, -4.0]) * replicas * (replicas + 1) / 2
    velocity_2 = -0.5 * summed * 1.5  # momentum 0.5: steps 1 and 3 (step 2 skipped)
    common.assert_on_every_replica(
      strategy, var, np.array([1.0, -1.0, 0.5]) - 0.5 * summed + velocity_2
    )
  assert float(opt.loss_scale) == float(automatic_opt.loss_scale) == 2.0**9
  assert common.as_int(opt.iterations) == 3


def test_tf_keras_new_spelling_skip_gradients_aggregation():
  strategy = common.strategy("mirrored")
  with strategy.scope():
    var = tf.Variable([1.0])
    opt = LSO(common.make_inner("tf_keras_new", learning_rate=1.0), initial_scale=4)

  @tf.function
  def step():
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      grad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant([1.0]))
      opt.apply_gradients([(grad, var)], skip_gradients_aggregation=True)

    strategy.run(replica_fn)

  step()
  common.assert_on_every_replica(strategy, var, [-1.0])  # applied once, not reduced again


@common.needs_keras3_option("loss_scale_factor")
@pytest.mark.parametrize("path", ["custom_loop", "fit"])
def test_an_inner_loss_scale_factor_is_not_applied_twice(path):
  inner = keras.optimizers.SGD(0.5, loss_scale_factor=4.0)
  opt = LSO(inner, initial_scale=8)
  if path == "custom_loop":
    var = keras.Variable([1.0])
    with tf.GradientTape() as tape:
      scaled = opt.get_scaled_loss(tf.reduce_sum(var.value * 3.0))
    opt.apply_gradients(zip(opt.get_unscaled_gradients(tape.gradient(scaled, [var.value])), [var]))
    kernel = var.numpy()
  else:
    model = keras.Sequential(
      [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
    )
    model.compile(opt, loss=lambda y, p: 3.0 * tf.reduce_sum(p, axis=-1))
    model.fit(np.ones((1, 1)), np.zeros((1, 1)), verbose=0)
    kernel = model.layers[0].kernel.numpy()
  np.testing.assert_array_equal(np.reshape(kernel, -1), [1.0 - 0.5 * 3.0])
