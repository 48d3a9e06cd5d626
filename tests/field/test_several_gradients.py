"""Several gradients per step: gradient penalty, two losses, two optimizers.

Reproduces tensorflow/tensorflow#48662: a Wasserstein GAN with gradient penalty
(WGAN-GP) under mixed precision, where the penalty's inner gradient (of the
critic's output with respect to its input, taken inside the outer tape)
underflows unless it is computed from a scaled output (then the norm's
gradient at 0 is NaN, every step is skipped and the loss scale collapses).
The GAN's two optimizers share a model: the generator's gradients flow
through the critic, whose variables only the critic's optimizer updates.

The recipe tested here (and documented in docs/custom_training_loops.md):
scale the critic output before the inner gradient and divide that gradient
by `loss_scale` before using it; scale the total loss once more for the outer
gradient and unscale those gradients with `get_unscaled_gradients`. The loss
scale does not change within a step, so scaling several losses or tapes with
it is consistent. Power-of-two scales are exact in float32: every run must equal
the same training with plain optimizers bit for bit.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
from field import common
from tf_lossscale.keras import mixed_precision

LSO = mixed_precision.LossScaleOptimizer

REAL = tf.constant([[1.0, 2.0], [-1.0, 0.5], [0.25, -2.0], [3.0, 1.0]])
NOISE = tf.constant([[0.5, -0.5], [1.0, 1.5], [-1.0, 0.25], [2.0, -3.0]])
EPS = tf.constant([[0.25], [0.5], [0.75], [0.125]])


def _models(family, output_weight=1.0):
  fw = common.framework(family)
  critic = fw.Sequential(
    [
      fw.Input((2,)),
      fw.layers.Dense(3, activation="tanh", kernel_initializer=fw.initializers.Constant(0.5)),
      # The critic's output in float32 under mixed_float16, as the mixed-precision guide says.
      fw.layers.Dense(
        1, kernel_initializer=fw.initializers.Constant(output_weight), dtype="float32"
      ),
    ]
  )
  generator = fw.Sequential(
    [fw.Input((2,)), fw.layers.Dense(2, kernel_initializer=fw.initializers.Constant(0.25))]
  )
  return critic, generator


def input_gradient(critic, scaler, x):
  """The critic's gradient with respect to its input, from a scaled output, unscaled."""
  with tf.GradientTape() as inner_tape:
    inner_tape.watch(x)
    scaled_output = scaler.get_scaled_loss(tf.reduce_sum(critic(x)))
  grad = inner_tape.gradient(scaled_output, x)
  return tf.cast(grad, tf.float32) / scaler.loss_scale


def gradient_penalty(critic, scaler, real, fake):
  """WGAN-GP's penalty on points between real and fake samples."""
  grad = input_gradient(critic, scaler, EPS * real + (1.0 - EPS) * fake)
  return tf.reduce_mean((tf.norm(grad, axis=1) - 1.0) ** 2)


def _train_gan(family, strategy, loss_scaled, bad_generator_steps):
  """A WGAN-GP run: per step a critic step with gradient penalty, then a generator step.

  On a step listed in `bad_generator_steps` the last replica's generator
  gradients are NaN: the loss-scaled generator step must be skipped, which
  the plain reference reproduces by not applying it.
  """
  with strategy.scope():
    critic, generator = _models(family)
    d_opt, g_opt = (common.make_inner(family, learning_rate=0.05) for _ in range(2))
    if loss_scaled:
      d_opt, g_opt = LSO(d_opt, initial_scale=2.0**12), LSO(g_opt, initial_scale=2.0**12)
  d_scaling, g_scaling = (d_opt, g_opt) if loss_scaled else (common.NoScaling, common.NoScaling)
  last = strategy.num_replicas_in_sync - 1

  @tf.function
  def step(bad_generator):
    def replica_fn():
      fake = generator(NOISE)
      with tf.GradientTape() as tape:
        critic_loss = tf.reduce_mean(critic(fake)) - tf.reduce_mean(critic(REAL))
        critic_loss += 10.0 * gradient_penalty(critic, d_scaling, REAL, fake)
        scaled = d_scaling.get_scaled_loss(critic_loss)
      grads = d_scaling.get_unscaled_gradients(tape.gradient(scaled, critic.trainable_variables))
      d_opt.apply_gradients(zip(grads, critic.trainable_variables, strict=True))

      with tf.GradientTape() as tape:
        scaled = g_scaling.get_scaled_loss(-tf.reduce_mean(critic(generator(NOISE))))
      grads = g_scaling.get_unscaled_gradients(tape.gradient(scaled, generator.trainable_variables))
      if loss_scaled:
        grads = tf.cond(
          bad_generator, lambda: [helpers.replica_nan(g, last) for g in grads], lambda: grads
        )
      elif bad_generator:
        return
      g_opt.apply_gradients(zip(grads, generator.trainable_variables, strict=True))

    strategy.run(replica_fn)

  for i in range(3):
    bad = i in bad_generator_steps
    step(tf.constant(bad) if loss_scaled else bad)
  return critic, generator, d_opt, g_opt


def test_wgan_gp_with_two_optimizers_matches_plain_training(family, strategy):
  if family == "keras3":
    helpers.need_plain_keras3_all_reduce(strategy)
  critic, generator, d_opt, g_opt = _train_gan(family, strategy, True, bad_generator_steps={1})
  plain_critic, plain_generator, _, _ = _train_gan(family, strategy, False, {1})
  for ours, theirs in zip(
    critic.trainable_variables + generator.trainable_variables,
    plain_critic.trainable_variables + plain_generator.trainable_variables,
    strict=True,
  ):
    common.assert_on_every_replica(strategy, ours, common.replica_values(strategy, theirs)[0])
  # Each optimizer has its own scale: only the generator's step 2 was skipped.
  assert float(d_opt.loss_scale) == 2.0**12 and common.as_int(d_opt.dynamic_counter) == 3
  assert float(g_opt.loss_scale) == 2.0**11 and common.as_int(g_opt.dynamic_counter) == 1
  assert common.as_int(g_opt.iterations) == 3


@pytest.mark.parametrize("inner_scaled", [True, False], ids=["recipe", "unscaled_inner"])
def test_gradient_penalty_under_mixed_float16(family, mixed_float16, inner_scaled):
  """tensorflow#48662's symptom, and the recipe that avoids it.

  The critic's output weight (1e-8) makes its input gradient underflow in
  float16. Computed from the unscaled output, that gradient is 0, the norm's
  gradient at 0 is NaN, and every step is skipped: the scale collapses. With
  the recipe the input gradient is right and no step is skipped.
  """
  critic, _ = _models(family, output_weight=1e-8)
  opt = LSO(common.make_inner(family, learning_rate=0.01))
  inner_scaler = opt if inner_scaled else common.NoScaling

  hidden = np.tanh(0.5 * REAL.numpy().sum(axis=1, keepdims=True))
  exact = np.broadcast_to(3 * 1e-8 * 0.5 * (1 - hidden**2), (4, 2))
  if inner_scaled:
    np.testing.assert_allclose(input_gradient(critic, opt, REAL).numpy(), exact, rtol=1e-2)
  else:
    np.testing.assert_array_equal(input_gradient(critic, common.NoScaling, REAL).numpy(), 0.0)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      penalty = gradient_penalty(critic, inner_scaler, REAL, NOISE)
      loss = tf.reduce_mean(critic(NOISE)) - tf.reduce_mean(critic(REAL)) + 10.0 * penalty
      scaled = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, critic.trainable_variables))
    opt.apply_gradients(zip(grads, critic.trainable_variables, strict=True))

  for _ in range(3):
    step()
  if inner_scaled:
    assert float(opt.loss_scale) == 2.0**15 and common.as_int(opt.dynamic_counter) == 3
  else:
    assert float(opt.loss_scale) == 2.0**12 and common.as_int(opt.dynamic_counter) == 0


@pytest.mark.parametrize("bad", [False, True])
def test_two_losses_scaled_separately_give_one_decision(family, strategy, bad):
  """Two losses, each scaled and unscaled on its own: one step, one skip decision."""
  if family == "keras3":
    helpers.need_plain_keras3_all_reduce(strategy)
  runs = []
  for loss_scaled in (True, False):
    with strategy.scope():
      var = tf.Variable([1.0, -1.0])
      opt = common.make_inner(family, learning_rate=0.25, momentum=0.5)
      opt = LSO(opt, initial_scale=2.0**10) if loss_scaled else common.built(opt, [var])
    scaling = opt if loss_scaled else common.NoScaling
    last = strategy.num_replicas_in_sync - 1

    @tf.function
    def step(scaling=scaling, opt=opt, var=var, last=last):
      def replica_fn():
        with tf.GradientTape(persistent=True) as tape:
          first = scaling.get_scaled_loss(tf.reduce_sum(var**2))
          second = scaling.get_scaled_loss(tf.reduce_sum(tf.sin(var) * [3.0, 0.5]))
        grads_first = scaling.get_unscaled_gradients(tape.gradient(first, [var]))
        grads_second = scaling.get_unscaled_gradients(tape.gradient(second, [var]))
        if bad:
          grads_second = [helpers.replica_nan(grads_second[0], last)]
        total = grads_first[0] + grads_second[0]
        opt.apply_gradients([(total, var)])

      strategy.run(replica_fn)

    for _ in range(2):
      step()
    runs.append((var, opt))
  (var, opt), (plain_var, _) = runs
  if bad:  # both steps skipped: the second loss's NaN skips the whole update
    common.assert_on_every_replica(strategy, var, [1.0, -1.0])
    assert float(opt.loss_scale) == 2.0**8
  else:
    common.assert_on_every_replica(strategy, var, common.replica_values(strategy, plain_var)[0])
    assert float(opt.loss_scale) == 2.0**10
