"""A small mixed_float16 training run that shows the dynamic loss scale moving.

The scale starts far too high (2**24): the first steps overflow in float16,
are skipped, and halve the scale; then every `dynamic_growth_steps` good steps
it doubles, until a step overflows again. `--plot out.png` draws the loss
scale and the skipped steps over the run (needs matplotlib:
`pip install tf-lossscale[plot]`).
"""

import argparse

import tensorflow as tf

from tf_lossscale.keras.mixed_precision import LossScaleOptimizer


def train(steps, growth_steps):
  """Runs the demo; prints and returns, per step, (step, loss, the scale it used, the
  scale after it, the counter after it, the steps skipped so far)."""
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
    tf.keras.optimizers.SGD(0.01), initial_scale=2**24, dynamic_growth_steps=growth_steps
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
  records = []
  for step in range(steps):
    used, skipped_before = float(opt.loss_scale), int(opt.skipped_steps)
    loss = float(train_step())
    skipped = int(opt.skipped_steps)
    scale, counter = float(opt.loss_scale), int(opt.dynamic_counter)
    result = "skipped" if skipped > skipped_before else "applied"
    print(f"{step:5d} {loss:9.4f} {scale:12.0f} {counter:8d}  {result}")
    records.append((step, loss, used, scale, counter, skipped))
  return records


def plot(records, path):
  """Draws the loss scale and the skipped steps of `records` (see `train`) to `path`."""
  try:
    import matplotlib  # noqa: PLC0415 (optional: only --plot needs it)
  except ImportError as e:
    raise SystemExit("--plot needs matplotlib: pip install tf-lossscale[plot]") from e
  matplotlib.use("Agg")
  from matplotlib import pyplot  # noqa: PLC0415

  steps = [r[0] for r in records]
  skipped = [r[5] for r in records]
  figure, (top, bottom) = pyplot.subplots(
    2, 1, sharex=True, figsize=(6.4, 3.6), dpi=80, gridspec_kw={"height_ratios": [2, 1]}
  )
  top.step(steps, [r[2] for r in records], where="post", color="tab:blue")
  top.set_yscale("log", base=2)
  top.set_ylabel("loss scale")
  for i, step in enumerate(steps):
    if skipped[i] > (skipped[i - 1] if i else 0):
      top.axvspan(step, step + 1, color="tab:red", alpha=0.25, linewidth=0)
  bottom.step(steps, skipped, where="post", color="tab:red")
  bottom.set_ylabel("skipped steps")
  bottom.set_xlabel("step (red: skipped, Inf or NaN gradients)")
  top.set_title("scripts/demo: the loss scale each step used (mixed_float16)")
  figure.tight_layout()
  figure.savefig(path)
  pyplot.close(figure)
  print(f"wrote {path}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--growth-steps", type=int, default=5)
  parser.add_argument("--plot", metavar="PNG", help="draw the loss scale and skipped steps")
  args = parser.parse_args(argv)
  records = train(args.steps, args.growth_steps)
  if args.plot:
    plot(records, args.plot)


if __name__ == "__main__":
  main()
