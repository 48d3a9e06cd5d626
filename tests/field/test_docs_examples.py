"""The python examples of README.md, docs/monitoring.md and docs/migration.md run,
and do what their pages say.

Each page's blocks run in order in one namespace, as a reader would paste them,
each after a prelude that gives what the page takes as the reader's own (a model,
data, a loss function; never a tf_lossscale name) and before checks of what the
page says the block does. One fresh process runs every page, in a temporary
folder (the examples write TensorBoard logs to `logs`).
(docs/custom_training_loops.md has a test of its own, test_custom_loop_docs.py.)
"""

import pathlib

import pytest

import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _data(rows, policy="float32"):
  """The reader's data and model (a model built under `policy`), as code."""
  return f"""
import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).normal(size=({rows}, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
tf.keras.mixed_precision.set_global_policy({policy!r})
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
"""


# What the TensorBoard logs of a run hold: the tags under logs/train.
_TAGS = """
def logged_tags():
  tags = set()
  for name in tf.io.gfile.glob("logs/train/events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(name):
      tags.update(value.tag for value in event.summary.value)
  tf.io.gfile.rmtree("logs")
  return tags
"""

# page -> [(prelude, checks)], one per python block of the page, in order.
EXAMPLES = {
  "README.md": [
    (
      "",
      # One step of SGD(0.25) on var**2 from 1: the gradient 2 unscaled exactly.
      """
assert float(var) == 0.5, float(var)
assert float(opt.loss_scale) == 2**15 and int(opt.skipped_steps) == 0
""",
    ),
    (
      _data(64) + _TAGS,
      """
assert len(history.history["loss_scale"]) == len(history.history["skipped_steps"]) == 5
assert sum(history.history["skipped_steps"]) == int(opt.skipped_steps)
assert history.history["skipped_steps_total"][-1] == int(opt.skipped_steps)
assert {"epoch_loss_scale", "epoch_skipped_steps"} <= logged_tags()
""",
    ),
  ],
  "docs/monitoring.md": [
    (
      # 10 batches an epoch: the monitor's update_freq=100 is reached once.
      _data(320) + _TAGS,
      """
assert isinstance(model.optimizer, LossScaleOptimizer), model.optimizer
assert int(model.optimizer.iterations.numpy()) == 100
tags = logged_tags()
assert {"loss_scale", "skipped_steps", "epoch_loss_scale"} <= tags, tags
""",
    ),
    (
      """
opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.01))
loss_fn = tf.keras.losses.MeanSquaredError()
""",
      """
before = [v.numpy() for v in model.trainable_variables]
assert not bool(train_step(x * np.nan, y))  # skipped: nothing moved
assert int(opt.skipped_steps) == 1 and float(opt.loss_scale) == 2**14
for old, new in zip(before, model.trainable_variables, strict=True):
  np.testing.assert_array_equal(old, new.numpy())
assert bool(train_step(x, y))
assert int(opt.skipped_steps) == 1 and int(opt.iterations.numpy()) == 2  # skipped steps count, as in TF 2.4
""",
    ),
    (
      "",
      """
assert opt.get_config()["min_loss_scale"] == 2**-8 and opt.hysteresis == 2
assert legacy.get_config()["hysteresis"] == 2 and legacy.min_loss_scale == 1
""",
    ),
  ],
  "docs/migration.md": [
    (
      # The reader's model, built under the mixed_float16 policy the block sets.
      _data(64, "mixed_float16"),
      # Keras 3's compile keeps our optimizer: no Keras 3 LossScaleOptimizer around it.
      """
assert isinstance(model.optimizer, mixed_precision.LossScaleOptimizer), model.optimizer
assert type(model.optimizer.inner_optimizer) is tf.keras.optimizers.SGD
assert model.optimizer.dynamic and float(model.optimizer.loss_scale) == 2**15
model.fit(x, y, epochs=1, verbose=0)
assert int(model.optimizer.iterations.numpy()) == 2
tf.keras.mixed_precision.set_global_policy("float32")
""",
    ),
  ],
}

_RUNNER = """
import json, sys
for page, steps in json.load(open(sys.argv[1])):
  namespace = {}
  for number, (prelude, block, checks) in enumerate(steps, 1):
    name = f"{page} block {number}"
    print(f"--- {name}", flush=True)
    exec(compile(prelude, f"<prelude of {name}>", "exec"), namespace)
    exec(compile(block, name, "exec"), namespace)
    exec(compile(checks, f"<checks of {name}>", "exec"), namespace)
print("--- all pages ran", flush=True)
"""


@pytest.mark.parametrize("page", sorted(EXAMPLES))
def test_every_python_block_has_its_checks(page):
  blocks = helpers.python_blocks((ROOT / page).read_text())
  assert len(blocks) == len(EXAMPLES[page]), f"{page}: {len(blocks)} python blocks"


@pytest.mark.slow
def test_the_examples_run(tmp_path):
  steps = []
  for page, examples in EXAMPLES.items():
    blocks = helpers.python_blocks((ROOT / page).read_text())
    pairs = zip(examples, blocks, strict=True)
    steps.append((page, [(prelude, block, checks) for (prelude, checks), block in pairs]))
  result = helpers.run_script(tmp_path, _RUNNER, steps)
  output = result.stdout + result.stderr
  assert result.returncode == 0 and "--- all pages ran" in result.stdout, output[-5000:]
