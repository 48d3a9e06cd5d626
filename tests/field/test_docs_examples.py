"""The python examples of README.md, docs/index.md, docs/monitoring.md and
docs/migration.md run, and do what their pages say.

Each page's blocks run in order in one namespace, as a reader would paste them,
each after a prelude that gives what the page takes as the reader's own (a model,
data, a loss function; never a tf_lossscale name) and before checks of what the
page says the block does. A block that only illustrates (the before and after of a
rewrite) has None instead, and is not run. One fresh process runs every page, in a
temporary folder (the examples write TensorBoard logs to `logs`).
(docs/custom_training_loops.md has a test of its own, test_custom_loop_docs.py.)
"""

import pathlib

import keras
import pytest
import tensorflow as tf

import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
_KERAS3_WRAPPER_CHECKPOINTS = issubclass(
  keras.mixed_precision.LossScaleOptimizer, tf.__internal__.tracking.Trackable
)


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

# page -> [(prelude, checks) or None], one per python block of the page, in order.
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
  "docs/index.md": [
    (
      "",
      # Not vacuous: another inner learning rate still compares unequal.
      """
assert opt1.comparable_config() != LossScaleOptimizer(tf.keras.optimizers.SGD(0.5)).comparable_config()
""",
    ),
    (
      # The reader's data, and the function building their model.
      """
import numpy as np
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
def build_model():
  return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
""",
      # The experimental class with the policy's fixed 1024; Keras 3's compile adds no
      # wrapper of its own under the mixed_float16 policy.
      """
from tf_lossscale.keras.mixed_precision.experimental import LossScaleOptimizer as Experimental
assert isinstance(opt, Experimental) and model.optimizer is opt, model.optimizer
assert type(opt.inner_optimizer) is tf.keras.optimizers.SGD
assert model.layers[0].compute_dtype == "float16"
assert not opt.dynamic and float(opt.loss_scale) == 1024
model.fit(x, y, epochs=1, verbose=0)
assert model.optimizer is opt and int(opt.iterations.numpy()) == 2
assert float(opt.loss_scale) == 1024
mixed_precision.set_policy("float32")
""",
    ),
  ],
  "docs/migration.md": [
    None,  # "before" and "after" of an import rewrite, side by side: no program.
    None,  # the same, one above the other; `opt` is the reader's.
    None,  # the same, for a private module's import.
    (
      "",
      # One eager step of SGD(0.1) on var**2 from 1: the gradient 2 unscaled exactly
      # (the custom scale's `update` says apply), the scale halved, and the
      # `_add_weight` variable checkpointed under the optimizer's `loss_scale`.
      """
import numpy as np
var = tf.Variable(1.0)
opt.minimize(lambda: var**2, var_list=[var])
assert var.numpy() == np.float32(0.8), var.numpy()
(scale,) = opt.variables()
assert float(scale) == 512, float(scale)
saved = tf.train.Checkpoint(optimizer=opt).write("halving/ckpt")
assert "optimizer/loss_scale/scale/.ATTRIBUTES/VARIABLE_VALUE" in dict(tf.train.list_variables(saved))
""",
    ),
    (
      # The reader's data (and tf); the block builds its model after set_policy.
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
    None  # Keras 3.0's wrapper cannot be checkpointed: nothing to restore.
    if not _KERAS3_WRAPPER_CHECKPOINTS
    else (
      # A checkpoint of Keras 3's wrapper after 2 epochs of 4 steps, two skipped (x[2]
      # is Inf), growth every 3 good steps; the reader's model is a fresh one.
      _data(8)
      + """
import keras
x[2] = np.inf
keras.utils.set_random_seed(0)
peer = keras.mixed_precision.LossScaleOptimizer(
  tf.keras.optimizers.Adam(0.1), dynamic_growth_steps=3)
model.compile(peer, "mse")
model.fit(x, y, batch_size=2, epochs=2, verbose=0)
path = tf.train.Checkpoint(model=model, optimizer=peer).save("keras3/ckpt")
trained = [v.numpy() for v in model.variables]
keras.utils.set_random_seed(1)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
""",
      # The scale, the good steps, the inner optimizer's slots and iterations and
      # the model are Keras 3's wrapper's; saved again, in TF 2.4's layout.
      """
assert float(opt.loss_scale) == float(peer.dynamic_scale.numpy()) == 2.0**14
assert int(opt.dynamic_counter.numpy()) == int(peer.step_counter.numpy()) == 1
assert int(opt.iterations.numpy()) == 6
for ours, theirs in zip(opt.inner_optimizer.variables, peer.inner_optimizer.variables, strict=True):
  np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
for value, restored in zip(trained, model.variables, strict=True):
  np.testing.assert_array_equal(value, restored.numpy())
saved = tf.train.Checkpoint(optimizer=opt).save("tf24/ckpt")
assert "optimizer/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE" in dict(tf.train.list_variables(saved))
""",
    ),
  ],
}

_RUNNER = """
import json, sys
for page, steps in json.load(open(sys.argv[1])):
  namespace = {}
  for number, prelude, block, checks in steps:
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
    numbered = enumerate(zip(examples, blocks, strict=True), 1)
    run = [(n, ex[0], block, ex[1]) for n, (ex, block) in numbered if ex is not None]
    steps.append((page, run))
  result = helpers.run_script(tmp_path, _RUNNER, steps)
  output = result.stdout + result.stderr
  assert result.returncode == 0 and "--- all pages ran" in result.stdout, output[-5000:]
