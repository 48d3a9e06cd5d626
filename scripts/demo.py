"""A small mixed_float16 training run that shows the dynamic loss scale moving.

The scale starts far too high (2**24): the first steps overflow in float16,
are skipped, and halve the scale; then every `dynamic_growth_steps` good steps
it doubles, until a step overflows again.
"""

import argparse

import tensorflow as tf

from tf_lossscale.keras.mixed_precision import LossScaleOptimizer


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--growth-steps", type=int, default=5)
  args = parser.parse_args()

  tf.keras.mixed_precision.set_global_policy("mixed_float16")
  tf.keras.utils.set_random_seed(0)
  model = tf.keras.Sequential(
    [
      tf.keras.Input((16,)),
      tf.keras.layers.Dense(64, activation="relu"),
      tf.keras.layers.Dense(1, dtype="float32"),
    ]
  )
  opt = LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.01), initial_scale=2**24, dynamic_growth_steps=args.growth_steps
  )
  x = tf.random.normal((256, 16))
  y = tf.reduce_sum(x[:, :4], axis=1, keepdims=True)

  @tf.function
  def train_step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x) - y))
      scaled_loss = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  print(f"policy {tf.keras.mixed_precision.global_policy().name}, inner {opt.inner_optimizer.name}")
  print(" step      loss   loss scale  counter  result")
  for step in range(args.steps):
    before = float(opt.loss_scale)
    loss = float(train_step())
    after = float(opt.loss_scale)
    applied = "skipped" if after < before else "applied"
    print(f"{step:5d} {loss:9.4f} {after:12.0f} {int(opt.dynamic_counter):8d}  {applied}")


if __name__ == "__main__":
  main()
