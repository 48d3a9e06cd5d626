"""Loss scaling under MultiWorkerMirroredStrategy: two worker processes on 127.0.0.1.

One cluster of two fresh interpreters (`multi_worker_job.py`, one CPU device
each: they do not split their CPU) trains every scenario; worker 1 makes its
loss NaN at `NAN_STEP`. Both must skip that step, halve the scale once and end
with bit-identical variables, slots, scale and counter; the chief's
checkpoint must restore in this process and train on identically.
"""

import fcntl
import json
import os
import subprocess
import sys

import multi_worker_job as job
import numpy as np
import pytest
import tensorflow as tf
import test_distributed

import helpers

pytestmark = pytest.mark.slow

NUM_WORKERS = 2


def _once_per_session(tmp_path_factory, name, produce):
  """Runs `produce(folder)` once per test session, also across pytest-xdist workers.

  Every xdist worker would otherwise run its own copy of a module-scoped
  fixture: the first one to get here produces, the others wait and reuse.

  Returns:
    The folder `produce` filled.

  Raises:
    RuntimeError: If `produce` failed (here or in another xdist worker).
  """
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # This session's folder, shared by its xdist workers.
  out, error = root / name, root / f"{name}.error"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      if not out.exists() and not error.exists():
        folder = root / f"{name}.partial"
        folder.mkdir()
        try:
          produce(folder)
        except Exception as e:
          error.write_text(f"{type(e).__name__}: {e}")
          raise
        folder.rename(out)
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
  if error.exists():
    raise RuntimeError(error.read_text())
  return out


@pytest.fixture(scope="module")
def cluster_results(tmp_path_factory):
  """Runs all scenarios once on a two-worker cluster; returns each worker's JSON."""

  def produce(out):
    scenarios = [name for name in job.MULTI_WORKER_SCENARIOS if _runs(name)]
    command = [sys.executable, job.__file__, "--out", str(out), *scenarios]
    # On the CPU on any machine: the references they are compared with bit for
    # bit run on logical CPUs, and a GPU's kernels may round 1 ulp apart.
    cpu = {"CUDA_VISIBLE_DEVICES": "-1"}
    job.run_workers(command, str(out), num_workers=NUM_WORKERS, timeout=240, env=cpu)

  out = _once_per_session(tmp_path_factory, "multi_worker", produce)
  results = []
  for index in range(NUM_WORKERS):
    with open(out / f"worker{index}.json") as f:
      results.append(json.load(f))
  for record in results[0].values():
    if isinstance(record, dict) and record.get("checkpoint"):
      record["checkpoint"] = str(out / record["checkpoint"])
  return results


def _runs(name):
  """Whether scenario `name` runs here: its state is found, and saved, through
  `tf.train.Checkpoint`, which Keras 3.0's optimizers are no part of."""
  return helpers.KERAS3_OPTIMIZERS_CHECKPOINT or name not in ("keras3", "experimental")


def _scenario(cluster_results, name):
  if not _runs(name):
    helpers.need_tf_checkpoints("keras3")
  records = [worker[name] for worker in cluster_results]
  for index, record in enumerate(records):
    assert record["status"] == "ok", (
      f"worker {index}: {record['message']}\n{record.get('traceback', '')}"
    )
  return records


def _history(record):
  return [(h["scale"], h["counter"], h["kernel"], h["bias"]) for h in record["history"]]


# Not among them: Keras 3's `fit`. Keras 3's model.fit does not support
# MultiWorkerMirroredStrategy, even without loss scaling ("Attempt to convert a
# value (PerReplica...) with an unsupported type", keras-team/keras#20585). `fit` is
# covered with tf_keras here and with Keras 3 under MirroredStrategy in
# test_distributed.py; Keras 3 optimizers across workers in custom loops here.
@pytest.mark.parametrize("name", job.MULTI_WORKER_SCENARIOS)
def test_nan_on_one_worker_skips_the_step_on_both(cluster_results, name):
  assert [w["num_replicas_in_sync"] for w in cluster_results] == [NUM_WORKERS] * NUM_WORKERS
  records = _scenario(cluster_results, name)
  for record in records:
    job.check_history(_history(record), NUM_WORKERS, name)
  assert records[1]["history"] == records[0]["history"]
  states = [{path: np.asarray(v) for path, v in r["state"].items()} for r in records]
  assert sorted(states[1]) == sorted(states[0])
  for path, value in states[0].items():
    assert np.isfinite(value).all(), f"{path}: {value}"
    np.testing.assert_array_equal(states[1][path], value, err_msg=path)
  job.check_state(states[0], name)


@pytest.mark.parametrize("name", ["fit_tf_keras", "fit_experimental"])
def test_loss_scale_monitor_shows_one_set_of_numbers_and_only_the_chief_writes(
  cluster_results, name
):
  chief, other = (record["monitor"] for record in _scenario(cluster_results, name))
  scales = [scale for scale, _ in job.EXPECTED_SCALES]
  for monitor in (chief, other):
    assert monitor["loss_scale"] == [scales[-1]] and monitor["skipped_steps"] == [1]
  # One point a step (steps count from 1), the NaN step skipped on both workers.
  skipped = [int(step >= job.NAN_STEP) for step in range(job.STEPS)]
  assert chief["summaries"] == {
    "loss_scale": [[step + 1, scale] for step, scale in enumerate(scales)],
    "skipped_steps": [[step + 1, count] for step, count in enumerate(skipped)],
  }
  assert other["summaries"] == {}


@pytest.mark.parametrize("name", job.CUSTOM_LOOP_SCENARIOS)
def test_chief_checkpoint_restores_in_one_process_and_trains_on_identically(cluster_results, name):
  chief = _scenario(cluster_results, name)[0]
  assert chief["checkpoint"] and os.path.exists(chief["checkpoint"] + ".index")
  # Two logical CPUs stand in for the two workers: same replicas, same data.
  run = job.build(name, test_distributed.mirrored(2))
  if name == "compat_v1":
    # TF1 optimizers cannot create slots from a checkpoint under MirroredStrategy
    # (TensorFlow's own MomentumOptimizer fails to place the graph too): make
    # them with one step, then let the restore overwrite every variable.
    run.step(0)
  elif name in ("keras3", "experimental"):
    # Keras 3 optimizers must be built before a restore (restored lazily, the
    # slots get the checkpoint's value on replica 0 only).
    with run.strategy.scope():
      run.optimizer.build(run.roots["model"].trainable_variables)
  tf.train.Checkpoint(**run.roots).read(chief["checkpoint"]).assert_existing_objects_matched()
  restored = (run.scale(), run.counter())
  assert restored == job.EXPECTED_SCALES[job.CHECKPOINT_AFTER]
  history, _ = job.train(run, start=job.CHECKPOINT_AFTER + 1)
  assert (
    _history({"history": job.jsonable_history(history)})
    == _history(chief)[job.CHECKPOINT_AFTER + 1 :]
  )
  state = test_distributed.assert_replicas_identical(run)
  assert sorted(state) == sorted(chief["state"])
  for path, value in state.items():
    np.testing.assert_array_equal(value, np.asarray(chief["state"][path], value.dtype), path)


@pytest.fixture(scope="module")
def parameter_server_results(tmp_path_factory):
  """What each API raised under a TF2 ParameterServerStrategy (fresh process, own cluster)."""

  def produce(out):
    command = [sys.executable, job.__file__, "--out", str(out), "--parameter-server"]
    env = helpers.subprocess_env(TF_CPP_MIN_LOG_LEVEL="3")
    # subprocess.run kills the process on timeout or any other exception.
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
      raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])

  out = _once_per_session(tmp_path_factory, "parameter_server", produce)
  with open(out / "parameter_server.json") as f:
    return json.load(f)


@pytest.mark.parametrize("api", ["keras3", "tf_keras", "compat_v1"])
def test_parameter_server_strategy_is_refused_by_name(parameter_server_results, api):
  error = parameter_server_results[api]
  assert error.startswith("ValueError: "), error
  assert (
    "Loss scaling is not supported with the tf.distribute.Strategy: ParameterServerStrategyV2"
    in error
  ), error


def test_distributed_demo_prints_one_scale_per_step_for_both_workers():
  demo = os.path.join(os.path.dirname(job.ROOT_TESTS), "scripts", "distributed_demo.py")
  command = [sys.executable, demo, "--steps", "8", "--nan-step", "5", "--growth-steps", "4"]
  env = helpers.subprocess_env()
  done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  rows = [line.split() for line in done.stdout.splitlines() if line.strip()[:1].isdigit()]
  assert [int(row[0]) for row in rows] == list(range(8))
  for row in rows:
    assert row[1:3] == row[3:5], row  # Worker 0's (scale, counter) is worker 1's.
  scales = [float(row[1]) for row in rows]
  # The NaN step is skipped on both and halves the scale; 2**20 overflows float16 first.
  assert rows[5][5:] == ["skipped", "(NaN", "on", "worker", "1)"]
  assert scales[5] == scales[4] / 2
  assert scales[0] == 2.0**19
  # A GPU each where there is one per worker, else the CPU for both.
  gpus = len(tf.config.list_physical_devices("GPU"))
  devices = ("GPU:0", "GPU:1") if gpus >= 2 else ("CPU", "CPU")
  assert f"worker 0 on {devices[0]}, worker 1 on {devices[1]}" in done.stdout, done.stdout
