"""Two-worker MultiWorkerMirroredStrategy training with a dynamic loss scale.

Starts two worker processes on 127.0.0.1 (free ports, one TF_CONFIG each),
which train one float16 model together with the Keras `LossScaleOptimizer`.
The scale starts far too high (2**20), so the first steps overflow and halve
it; at `--nan-step` worker 1 alone makes its loss NaN. Each worker prints its
own loss scale after every step: the two columns never differ, because the
gradients are all-reduced before the finiteness check and every worker takes
the same skip-or-apply decision. Each worker takes a GPU of its own where
there is one per worker, and the CPU otherwise (two processes on one GPU would
split its memory, and NCCL refuses two ranks on one device).

  scripts/distributed_demo --steps 14 --nan-step 5
"""

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from multi_worker_job import run_workers  # noqa: E402 (the launcher of the tests)


def own_device(tf, index, num_workers):
  """Makes worker `index` see only its own GPU, or none when there are fewer
  GPUs than workers; returns the device's name."""
  gpus = tf.config.list_physical_devices("GPU")
  mine = gpus[index : index + 1] if len(gpus) >= num_workers else []
  tf.config.set_visible_devices(mine, "GPU")
  return mine[0].name.replace("/physical_device:", "") if mine else "CPU"


def worker(steps, nan_step, growth_steps):
  """One worker: trains and prints `step scale counter applied|skipped` lines."""
  import tensorflow as tf  # noqa: PLC0415 (only the workers need TensorFlow)

  from tf_lossscale.keras.mixed_precision import LossScaleOptimizer  # noqa: PLC0415

  config = json.loads(os.environ["TF_CONFIG"])
  index = config["task"]["index"]
  print(f"device {own_device(tf, index, len(config['cluster']['worker']))}", flush=True)
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  tf.keras.mixed_precision.set_global_policy("mixed_float16")
  tf.keras.utils.set_random_seed(0)
  with strategy.scope():
    model = tf.keras.Sequential(
      [
        tf.keras.Input((16,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(1, dtype="float32"),
      ]
    )
    opt = LossScaleOptimizer(
      tf.keras.optimizers.SGD(0.01), initial_scale=2**20, dynamic_growth_steps=growth_steps
    )
  # Each worker trains on its own half of the global batch.
  x = tf.random.stateless_normal((64, 16), seed=[index, 0])
  y = tf.reduce_sum(x[:, :4], axis=1, keepdims=True)

  @tf.function
  def train_step(step):
    def replica_step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y)) / strategy.num_replicas_in_sync
        poison = tf.logical_and(tf.equal(step, nan_step), tf.equal(index, 1))
        loss *= tf.where(poison, float("nan"), 1.0)
        scaled_loss = opt.get_scaled_loss(loss)
      variables = model.trainable_variables
      grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
      opt.apply_gradients(zip(grads, variables, strict=True))

    strategy.run(replica_step)

  for step in range(steps):
    before = float(opt.loss_scale)
    train_step(tf.constant(step))
    after = float(opt.loss_scale)
    applied = "skipped" if after < before else "applied"
    print(f"{step} {after:.0f} {int(opt.dynamic_counter.numpy())} {applied}", flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--steps", type=int, default=14)
  parser.add_argument("--nan-step", type=int, default=5, help="worker 1's loss is NaN here")
  parser.add_argument("--growth-steps", type=int, default=4)
  parser.add_argument("--timeout", type=int, default=300, help="seconds for the whole run")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args.steps, args.nan_step, args.growth_steps)
    return

  command = [sys.executable, os.path.abspath(__file__), "--worker"]
  command += ["--steps", str(args.steps), "--nan-step", str(args.nan_step)]
  command += ["--growth-steps", str(args.growth_steps)]
  print(f"starting 2 workers on 127.0.0.1 ({args.steps} steps, NaN on worker 1 at {args.nan_step})")
  with tempfile.TemporaryDirectory() as logs:
    try:
      outputs = run_workers(command, logs, num_workers=2, timeout=args.timeout)
    except RuntimeError as e:
      sys.exit(f"distributed demo failed: {e}")
  columns = [[line.split() for line in out.splitlines() if line[:1].isdigit()] for out in outputs]
  devices = [
    line.split()[1] for out in outputs for line in out.splitlines() if line.startswith("device ")
  ]
  print(f"worker 0 on {devices[0]}, worker 1 on {devices[1]}")
  print(" step   worker 0 scale  counter   worker 1 scale  counter  step")
  for row0, row1 in zip(*columns, strict=True):
    note = " (NaN on worker 1)" if int(row0[0]) == args.nan_step else ""
    print(f"{row0[0]:>5} {row0[1]:>16} {row0[2]:>8} {row1[1]:>16} {row1[2]:>8}  {row0[3]}{note}")
  if [r[1:] for r in columns[0]] != [r[1:] for r in columns[1]]:
    sys.exit("the workers disagree on the loss scale")


if __name__ == "__main__":
  main()
