"""`tf_lossscale.keras.callbacks.LossScaleMonitor` in Keras 3's and tf_keras's `fit`.

A model whose inputs are NaN on chosen steps (every row of those batches)
makes exactly those steps non-finite. From an initial scale of 8 with growth
every 2 finite steps, two epochs of the pattern finite, NaN, NaN, finite give,
step by step, `SCALES` and `SKIPPED`.
"""

import copy
import glob
import json
import os
import pickle
import re
import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
from tf_lossscale._src import framework_internals, keras_callbacks
from tf_lossscale.keras import callbacks
from tf_lossscale.keras.mixed_precision import LossScaleOptimizer

NAN = float("nan")
EPOCH_PATTERN = [1.0, NAN, NAN, 1.0]
EPOCHS = 2
# After each of the 8 steps: the scale and the skipped steps in all.
SCALES = [8.0, 4.0, 2.0, 2.0, 4.0, 2.0, 1.0, 1.0]
SKIPPED = [0, 1, 2, 2, 2, 3, 4, 4]
_STRATEGIES = {"default": tf.distribute.get_strategy()}


def shared_strategy(name):
  """No strategy, or one MirroredStrategy over two logical CPUs for this module."""
  if name not in _STRATEGIES:
    _STRATEGIES[name] = helpers.make_strategy(name)
  return _STRATEGIES[name]


FRAMEWORKS = {
  "keras3": (keras, keras.optimizers.SGD),
  "tf_keras": (tf_keras, tf_keras.optimizers.legacy.SGD),
}


def _model(framework, strategy="default", pattern=EPOCH_PATTERN, **lso_kwargs):
  """A compiled Dense(1) model, and its inputs: batch i is `pattern[i]` (every row)."""
  module, sgd = FRAMEWORKS[framework]
  with shared_strategy(strategy).scope():
    model = module.Sequential(
      [module.Input((1,)), module.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
    )
    lso_kwargs = {"initial_scale": 8, "dynamic_growth_steps": 2, **lso_kwargs}
    model.compile(optimizer=LossScaleOptimizer(sgd(0.01), **lso_kwargs), loss="mse")
  batch = 2  # One row per replica under MirroredStrategy.
  x = np.repeat(np.array(pattern, "float32"), batch)[:, None]
  return model, x, np.zeros_like(x), batch


def _fit(model, x, y, batch, callback_list, **kwargs):
  kwargs = {"epochs": EPOCHS, **kwargs}
  return model.fit(
    x, y, batch_size=batch, shuffle=False, verbose=0, callbacks=callback_list, **kwargs
  )


def _series(log_dir):
  """{tag: {step: value}} of every event file under `log_dir`."""
  series = {}
  for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag in ("loss_scale", "skipped_steps"):
          series.setdefault(value.tag, {})[event.step] = tf.make_ndarray(value.tensor).item()
  return series


def _expected(steps):
  return {
    "loss_scale": {s: SCALES[s - 1] for s in steps},
    "skipped_steps": {s: SKIPPED[s - 1] for s in steps},
  }


def _tensorboard(framework, log_dir, **kwargs):
  module, _ = FRAMEWORKS[framework]
  return module.callbacks.TensorBoard(log_dir, write_graph=False, profile_batch=0, **kwargs)


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_fit_writes_the_series_to_tensorboard_and_the_epochs_to_history(
  framework, strategy, tmp_path
):
  model, x, y, batch = _model(framework, strategy)
  tensorboard = _tensorboard(framework, str(tmp_path))
  monitor = callbacks.LossScaleMonitor(update_freq=1, tensorboard=tensorboard)
  history = _fit(model, x, y, batch, [tensorboard, monitor])
  assert _series(str(tmp_path / "train")) == _expected(range(1, 9))
  assert history.history["loss_scale"] == [2.0, 1.0]
  assert history.history["skipped_steps"] == [2, 2]
  assert history.history["skipped_steps_total"] == [2, 4]
  assert int(model.optimizer.iterations.numpy()) == 8


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_epoch_granularity_writes_at_each_epochs_last_step(framework, tmp_path):
  model, x, y, batch = _model(framework)
  _fit(model, x, y, batch, [callbacks.LossScaleMonitor(tensorboard=str(tmp_path))])
  assert _series(str(tmp_path / "train")) == _expected([4, 8])


def test_with_steps_per_execution_it_writes_at_most_once_per_execution(tmp_path):
  model, x, y, batch = _model("keras3")
  model.compile(optimizer=model.optimizer, loss="mse", steps_per_execution=2)
  monitor = callbacks.LossScaleMonitor(update_freq=3, tensorboard=str(tmp_path))
  history = _fit(model, x, y, batch, [monitor])
  # Executions end at steps 2, 4, 6, 8: the first at or after 3 and after 6.
  assert _series(str(tmp_path / "train")) == _expected([4, 6])
  assert history.history["loss_scale"] == [2.0, 1.0]
  assert history.history["skipped_steps"] == [2, 2]


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_a_tensorboard_callback_writing_batches_is_found_through_its_default_writer(
  framework, tmp_path
):
  model, x, y, batch = _model(framework)
  tensorboard = _tensorboard(framework, str(tmp_path), update_freq=1)
  _fit(model, x, y, batch, [tensorboard, callbacks.LossScaleMonitor(update_freq=2)])
  assert _series(str(tmp_path / "train")) == _expected([2, 4, 6, 8])


def test_a_default_summary_writer_receives_the_series(tmp_path):
  model, x, y, batch = _model("keras3")
  writer = tf.summary.create_file_writer(str(tmp_path))
  with writer.as_default():
    _fit(model, x, y, batch, [callbacks.LossScaleMonitor(update_freq=4)])
  writer.flush()
  assert _series(str(tmp_path)) == _expected([4, 8])


def test_epoch_logs_reach_a_tensorboard_callback_listed_after_it(tmp_path):
  model, x, y, batch = _model("keras3")
  tensorboard = _tensorboard("keras3", str(tmp_path))
  _fit(model, x, y, batch, [callbacks.LossScaleMonitor(), tensorboard])
  epoch_scales = {}
  for path in glob.glob(str(tmp_path / "train" / "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "epoch_loss_scale":
          epoch_scales[event.step] = tf.make_ndarray(value.tensor).item()
  assert epoch_scales == {0: 2.0, 1: 1.0}


def test_a_fixed_scale_logs_its_value_and_no_skipped_steps():
  model, x, y, batch = _model("keras3", pattern=[1.0] * 4, dynamic=False, dynamic_growth_steps=None)
  history = _fit(model, x, y, batch, [callbacks.LossScaleMonitor()])
  assert history.history["loss_scale"] == [8.0, 8.0]
  assert history.history["skipped_steps_total"] == [0, 0]


# --- The minimum ---------------------------------------------------------------

# From 4 with a minimum of 0.5, every step NaN: 2, 1, 0.5 after step 3, which ran
# at 1; step 4 is the first to run at the minimum: a run of 3 at step 6.
ALL_NAN = dict(pattern=[NAN] * 4, initial_scale=4, min_loss_scale=0.5)


def test_warns_once_with_the_numbers_when_the_scale_sits_at_its_minimum():
  model, x, y, batch = _model("keras3", **ALL_NAN)
  monitor = callbacks.LossScaleMonitor(min_scale_patience=3)
  with pytest.warns(callbacks.LossScaleMinimumWarning) as caught:
    history = _fit(model, x, y, batch, [monitor])
  # Only ours: some Keras releases warn of their own during `fit` (3.12: NumPy's
  # `__array__` copy keyword).
  ours = [w for w in caught if issubclass(w.category, callbacks.LossScaleMinimumWarning)]
  assert len(ours) == 1
  message = str(ours[0].message)
  assert "minimum (0.5, min_loss_scale) through the last 3 training steps" in message
  assert "(at step 6; 6 steps skipped in all)" in message
  assert history.history["loss_scale"] == [0.5, 0.5]


def _minimum_warnings(caught):
  return [w for w in caught if issubclass(w.category, callbacks.LossScaleMinimumWarning)]


@pytest.mark.parametrize("steps, warned", [(12, False), (13, True)])
def test_the_default_patience_is_ten_training_steps(steps, warned):
  # Run at the minimum from step 4: a run of 10 at step 13.
  model, x, y, batch = _model("keras3", **{**ALL_NAN, "pattern": [NAN] * steps})
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _fit(model, x, y, batch, [callbacks.LossScaleMonitor()], epochs=1)
  messages = [str(w.message) for w in _minimum_warnings(caught)]
  assert len(messages) == warned, messages
  if warned:
    assert "through the last 10 training steps" in messages[0]
    assert "(at step 13; 13 steps skipped in all)" in messages[0]


@pytest.mark.parametrize("action", ["always", "default"])
def test_warns_again_in_the_next_fit(action):
  """Under Python's default filter too, which shows a text once per place."""
  monitor = callbacks.LossScaleMonitor(min_scale_patience=3)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter(action)
    for _ in range(2):  # The same training twice: the same text.
      model, x, y, batch = _model("keras3", **ALL_NAN)
      _fit(model, x, y, batch, [monitor])
  messages = [str(w.message) for w in _minimum_warnings(caught)]
  assert len(messages) == 2 and messages[0] == messages[1]


def test_raise_stops_fit_at_the_patience():
  model, x, y, batch = _model("keras3", **ALL_NAN)
  monitor = callbacks.LossScaleMonitor(min_scale_patience=2, on_min_scale="raise")
  with pytest.raises(RuntimeError, match=r"through the last 2 training steps.*at step 5"):
    _fit(model, x, y, batch, [monitor])
  assert int(model.optimizer.iterations.numpy()) == 5


def test_raise_closes_the_summary_writer(tmp_path):
  model, x, y, batch = _model("keras3", **ALL_NAN)
  monitor = callbacks.LossScaleMonitor(
    min_scale_patience=2, on_min_scale="raise", tensorboard=str(tmp_path)
  )
  with pytest.raises(RuntimeError, match=r"^The loss scale has sat at its minimum"):
    _fit(model, x, y, batch, [monitor])
  assert monitor._writer is None  # pylint: disable=protected-access (fit calls no on_train_end)


def test_ignore_and_a_finite_step_keep_quiet():
  pattern = [NAN, NAN, NAN, 1.0]  # Runs at the minimum of 1 and 3 (epoch 2 starts there).
  model, x, y, batch = _model("keras3", pattern=pattern, initial_scale=4, min_loss_scale=1)
  with warnings.catch_warnings():
    warnings.simplefilter("error", callbacks.LossScaleMinimumWarning)
    _fit(model, x, y, batch, [callbacks.LossScaleMonitor(min_scale_patience=4)])
  model, x, y, batch = _model("keras3", **ALL_NAN)
  with warnings.catch_warnings():
    warnings.simplefilter("error", callbacks.LossScaleMinimumWarning)
    # The same monitor with on_min_scale="warn" warns in this fit.
    _fit(
      model, x, y, batch, [callbacks.LossScaleMonitor(min_scale_patience=1, on_min_scale="ignore")]
    )


# --- Chief, frameworks, arguments ------------------------------------------------


def _resolver(cluster, task_type, task_id):
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id
  )


WORKERS = {"worker": ["localhost:1", "localhost:2"]}
WITH_CHIEF = {"chief": ["localhost:0"], **WORKERS}


@pytest.mark.parametrize(
  "cluster, task_type, task_id, expected",
  [
    (WORKERS, "worker", 0, True),
    (WORKERS, "worker", 1, False),
    (WITH_CHIEF, "chief", 0, True),
    (WITH_CHIEF, "worker", 0, False),
    ({**WITH_CHIEF, "evaluator": ["localhost:3"]}, "evaluator", 0, False),
  ],
)
def test_is_chief_of_a_cluster(cluster, task_type, task_id, expected):
  strategy = types.SimpleNamespace(cluster_resolver=_resolver(cluster, task_type, task_id))
  assert keras_callbacks.is_chief(strategy) is expected


def test_is_chief_without_a_cluster():
  assert keras_callbacks.is_chief(None)
  assert keras_callbacks.is_chief(shared_strategy("mirrored"))


def test_a_worker_that_is_not_the_chief_logs_but_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.setattr(keras_callbacks, "is_chief", lambda strategy: False)
  model, x, y, batch = _model("keras3")
  monitor = callbacks.LossScaleMonitor(update_freq=1, tensorboard=str(tmp_path))
  history = _fit(model, x, y, batch, [monitor])
  assert history.history["loss_scale"] == [2.0, 1.0]
  assert not os.path.exists(tmp_path / "train")


def test_one_monitor_is_a_callback_of_both_frameworks():
  monitor = callbacks.LossScaleMonitor()
  assert isinstance(monitor, keras.callbacks.Callback)
  assert isinstance(monitor, tf_keras.callbacks.Callback)
  assert isinstance(monitor, callbacks.LossScaleMonitor)
  assert type(monitor).__name__ == "LossScaleMonitor"
  assert type(callbacks.LossScaleMonitor()) is type(monitor)


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_monitor_pickles_and_copies_as_keras_callbacks_do(protocol):
  monitor = callbacks.LossScaleMonitor(update_freq=5, min_scale_patience=4)
  for copied in (pickle.loads(pickle.dumps(monitor, protocol)), copy.deepcopy(monitor)):
    assert type(copied) is type(monitor)
    assert (copied.update_freq, copied.min_scale_patience) == (5, 4)


@pytest.mark.parametrize(
  "hooks",
  [
    (),
    ("on_epoch_end",),
    ("on_batch_begin",),
    ("on_train_batch_end",),
    ("on_test_batch_begin",),
    ("on_predict_batch_end", "on_test_batch_end"),
  ],
)
def test_a_keras3_callback_answers_tf_keras_as_its_own_callbacks_do(hooks):
  methods = {hook: lambda self, *args, **kwargs: None for hook in hooks}
  ours = type("Ours", (keras.callbacks.Callback, framework_internals.TfKerasBatchHooks), methods)
  theirs = type("Theirs", (tf_keras.callbacks.Callback,), methods)
  for mode in ("train", "test", "predict"):
    asks = f"_implements_{mode}_batch_hooks"
    assert getattr(ours(), asks)() == getattr(theirs(), asks)(), (hooks, mode)


def test_a_monitor_made_before_tf_keras_is_imported_runs_in_a_tf_keras_fit(tmp_path):
  source = """
import json, sys
import numpy as np
from tf_lossscale.keras.callbacks import LossScaleMonitor
from tf_lossscale.keras.mixed_precision import LossScaleOptimizer

assert "tf_keras" not in sys.modules
monitor = LossScaleMonitor(update_freq=1, tensorboard="logs")
import tf_keras

model = tf_keras.Sequential(
  [tf_keras.Input((1,)), tf_keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
)
optimizer = LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(0.01), initial_scale=8,
                               dynamic_growth_steps=2)
model.compile(optimizer=optimizer, loss="mse")
x = np.array(json.load(open(sys.argv[1])), "float32")[:, None]
history = model.fit(x, np.zeros_like(x), batch_size=1, epochs=2, shuffle=False, verbose=0,
                    callbacks=[monitor])
print(json.dumps([isinstance(monitor, tf_keras.callbacks.Callback), history.history]))
"""
  done = helpers.run_script(tmp_path, source, EPOCH_PATTERN)
  assert done.returncode == 0, done.stderr[-3000:]
  is_tf_keras_callback, logs = json.loads(done.stdout.strip().splitlines()[-1])
  assert not is_tf_keras_callback
  assert logs["loss_scale"] == [2.0, 1.0]
  assert logs["skipped_steps"] == [2, 2]
  assert logs["skipped_steps_total"] == [2, 4]
  assert _series(str(tmp_path / "logs" / "train")) == _expected(range(1, 9))


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_a_model_without_our_optimizer_is_refused(framework):
  module, sgd = FRAMEWORKS[framework]
  model = module.Sequential([module.Input((1,)), module.layers.Dense(1)])
  model.compile(optimizer=sgd(), loss="mse")
  with pytest.raises(ValueError, match="needs a model compiled with a tf_lossscale"):
    model.fit(np.ones((2, 1)), np.ones((2, 1)), verbose=0, callbacks=[callbacks.LossScaleMonitor()])


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (
      {"update_freq": "step"},
      "update_freq must be 'epoch', 'batch' or an integer of at least 1, but got: 'step'",
    ),
    (
      {"update_freq": 0},
      "update_freq must be 'epoch', 'batch' or an integer of at least 1, but got: 0",
    ),
    (
      {"update_freq": True},
      "update_freq must be 'epoch', 'batch' or an integer of at least 1, but got: True",
    ),
    (
      {"update_freq": 2.0},
      "update_freq must be 'epoch', 'batch' or an integer of at least 1, but got: 2.0",
    ),
    (
      {"tensorboard": 3},
      "tensorboard must be a TensorBoard callback, a log directory or None, but got: 3",
    ),
    (
      {"min_scale_patience": np.int64(0)},
      f"min_scale_patience must be an integer of at least 1, but got: {np.int64(0)!r}",
    ),
    (
      {"on_min_scale": "stop"},
      "on_min_scale must be one of ('warn', 'raise', 'ignore'), but got: 'stop'",
    ),
  ],
  ids=repr,
)
def test_argument_errors(kwargs, message):
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    callbacks.LossScaleMonitor(**kwargs)


@pytest.mark.parametrize(
  "update_freq, steps", [("batch", range(1, 9)), (np.int64(4), [4, 8]), (np.uint8(3), [3, 6])]
)
def test_update_freq_takes_batch_as_keras_s_tensorboard_does_and_any_integer(
  update_freq, steps, tmp_path
):
  model, x, y, batch = _model("keras3")
  monitor = callbacks.LossScaleMonitor(
    update_freq=update_freq, tensorboard=str(tmp_path), min_scale_patience=np.int32(3)
  )
  assert (monitor.update_freq, monitor.min_scale_patience) == (steps[0], 3)
  _fit(model, x, y, batch, [monitor])
  assert _series(str(tmp_path / "train")) == _expected(steps)


# --- Sharing a TensorBoard callback's run ------------------------------------------


@pytest.mark.parametrize("monitor_first", [True, False], ids=["monitor_first", "tensorboard_first"])
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_the_series_goes_into_the_tensorboard_callback_s_own_event_file(
  framework, monitor_first, tmp_path
):
  """A second event file in `<log_dir>/train` would hide the callback's scalars
  from a running TensorBoard, which reads only the newest file of a run."""
  model, x, y, batch = _model(framework)
  tensorboard = _tensorboard(framework, str(tmp_path))
  monitor = callbacks.LossScaleMonitor(update_freq=1, tensorboard=tensorboard)
  _fit(model, x, y, batch, [monitor, tensorboard] if monitor_first else [tensorboard, monitor])
  (path,) = glob.glob(str(tmp_path / "train" / "events.out.tfevents.*"))
  tags = {v.tag for event in tf.compat.v1.train.summary_iterator(path) for v in event.summary.value}
  assert {"epoch_loss", "loss_scale", "skipped_steps"} <= tags
  assert _series(str(tmp_path / "train")) == _expected(range(1, 9))


def test_a_tensorboard_callback_outside_the_fit_lends_its_log_dir(tmp_path):
  """Its writer, closed at the end of its last `fit`, is not used: one of the
  monitor's own writes to `<log_dir>/train`."""
  model, x, y, batch = _model("keras3")
  tensorboard = _tensorboard("keras3", str(tmp_path))
  monitor = callbacks.LossScaleMonitor(update_freq=1, tensorboard=tensorboard)
  _fit(model, x, y, batch, [monitor, tensorboard], epochs=1)
  _fit(model, x, y, batch, [monitor], epochs=1)
  assert _series(str(tmp_path / "train")) == _expected(range(1, 9))
  assert monitor._writer is None  # pylint: disable=protected-access (closed at the end)


@pytest.mark.parametrize("update_freq, steps", [("epoch", [4, 8]), (1, range(1, 9))])
@pytest.mark.parametrize("given", ["callback", "directory"])
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_a_tensorboard_callback_s_batch_recording_condition_filters_none_of_the_series(
  framework, given, update_freq, steps, tmp_path
):
  """The callback records its batch-level summaries every 3 steps only; the
  series written where `tensorboard` says is complete."""
  model, x, y, batch = _model(framework)
  tensorboard = _tensorboard(framework, str(tmp_path / "tensorboard"), update_freq=3)
  log_dir = tmp_path / ("tensorboard" if given == "callback" else "monitor")
  monitor = callbacks.LossScaleMonitor(
    update_freq=update_freq, tensorboard=tensorboard if given == "callback" else str(log_dir)
  )
  _fit(model, x, y, batch, [tensorboard, monitor])
  assert _series(str(log_dir / "train")) == _expected(steps)


def test_skipped_steps_total_is_kept_by_a_restore_into_the_same_optimizer(tmp_path):
  """`skipped_steps` is not checkpointed: a restore leaves the optimizer's count
  as it was; only a new optimizer counts from 0 (docs/monitoring.md)."""
  helpers.need_tf_checkpoints("keras3")
  model, x, y, batch = _model("keras3")
  monitor = callbacks.LossScaleMonitor()
  _fit(model, x, y, batch, [monitor], epochs=1)
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / "checkpoint"))
  _fit(model, x, y, batch, [monitor], epochs=1)  # 4 skipped in all, the scale at 1.
  tf.train.Checkpoint(model=model).restore(path).assert_consumed()
  assert float(model.optimizer.loss_scale) == 2.0  # Restored.
  history = _fit(model, x, y, batch, [monitor], epochs=1)
  assert history.history["skipped_steps_total"] == [6]
  model, x, y, batch = _model("keras3")
  tf.train.Checkpoint(model=model).restore(path)
  assert _fit(model, x, y, batch, [monitor], epochs=1).history["skipped_steps_total"] == [2]
