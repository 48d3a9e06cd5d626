"""Training scenarios for the distributed tests, and the per-worker program.

Each scenario trains a linear model `y = x @ kernel + bias` (mean squared
error, SGD with momentum where the API has one) for `STEPS` steps through one
loss-scaling API, under whatever `tf.distribute` strategy is current. Replica
`BAD_REPLICA` makes its loss NaN at step `NAN_STEP`; every other number is
finite. Replica `r` trains on its own slice of `global_batch(step, ...)`, so a scenario gives
the same numbers under MirroredStrategy over two logical CPUs in one process
as under MultiWorkerMirroredStrategy over two worker processes.

Imported by the tests (nothing runs on import). Run as a script it is one
worker of a MultiWorkerMirroredStrategy cluster: it reads `TF_CONFIG`, runs
the scenarios named on the command line and writes what every step did and
the final state of every variable to `<out>/worker<index>.json`.
`run_workers` starts such a cluster on 127.0.0.1 and always kills it.

  python tests/multi_worker_job.py --out /tmp/result keras3 fit_tf_keras
"""

import argparse
import dataclasses
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

ROOT_TESTS = os.path.dirname(os.path.abspath(__file__))
STEPS = 6
NAN_STEP = 2
BAD_REPLICA = 1
CHECKPOINT_AFTER = 3  # Checkpointed once steps 0..3 are done.
INITIAL_SCALE = 16.0
GROWTH_STEPS = 2
LEARNING_RATE = 0.1
MOMENTUM = 0.9
REPLICA_BATCH = 4
FEATURES = 3
MAX_REPLICAS = 4
INITIAL_KERNEL = np.array([[0.1], [-0.2], [0.3]], np.float32)

# (scale, counter) after each step: grows at step 1 (two good steps), halves
# at the NaN step, grows again two good steps later.
EXPECTED_SCALES = [(16.0, 1), (32.0, 0), (16.0, 0), (16.0, 1), (32.0, 0), (32.0, 1)]

CUSTOM_LOOP_SCENARIOS = ("legacy", "keras3", "tf_keras", "experimental", "compat_v1")
FIT_SCENARIOS = ("fit_keras3", "fit_tf_keras", "fit_experimental")
SCENARIOS = CUSTOM_LOOP_SCENARIOS + FIT_SCENARIOS
# Keras 3's model.fit does not support MultiWorkerMirroredStrategy, with or
# without loss scaling (keras-team/keras#20585, tensorflow/tensorflow#72388).
MULTI_WORKER_SCENARIOS = tuple(name for name in SCENARIOS if name != "fit_keras3")

_rng = np.random.default_rng(0)
_X = _rng.normal(size=(STEPS, MAX_REPLICAS, REPLICA_BATCH, FEATURES)).astype(np.float32)
_Y = (_X @ np.array([[1.0], [2.0], [-1.0]], np.float32) + 0.5).astype(np.float32)


def global_batch(step, num_replicas):
  """The batch of all replicas at `step`, replica 0 first."""
  return _X[step, :num_replicas].reshape(-1, FEATURES), _Y[step, :num_replicas].reshape(-1, 1)


def keras3_fit_divides_loss():
  """Whether Keras 3's `Model.fit` gives the optimizer each replica's share of the
  global loss (its batch's mean divided by the replicas in sync): Keras >= 3.8.

  Earlier fit hands over each replica's own batch mean, so the summed gradients
  are the replicas' count times the global batch's, with or without loss
  scaling (upstream; plain Keras 3.5 to 3.7 take that step, Keras < 3.5 does
  not all-reduce at all and the wrapper sums as 3.5 to 3.7 do).
  """
  import keras  # noqa: PLC0415

  return tuple(int(part) for part in keras.version().split(".")[:2]) >= (3, 8)


def reference_history(num_replicas, momentum=MOMENTUM, steps=STEPS, gradient_factor=1):
  """(kernel, bias) after each step, in float64 numpy, skipping `NAN_STEP`.

  What training on the global batch gives when the NaN step is skipped and
  nothing else changes (each gradient times `gradient_factor`): the oracle for
  every scenario.
  """
  kernel, bias = INITIAL_KERNEL.astype(np.float64), np.zeros(1)
  velocity_k, velocity_b = np.zeros_like(kernel), np.zeros_like(bias)
  history = []
  for step in range(steps):
    if step != NAN_STEP:
      x, y = global_batch(step, num_replicas)
      error = x @ kernel + bias - y
      grad_k = gradient_factor * 2 * x.T @ error / len(x)
      grad_b = gradient_factor * 2 * error.sum(axis=0) / len(x)
      velocity_k = momentum * velocity_k - LEARNING_RATE * grad_k
      velocity_b = momentum * velocity_b - LEARNING_RATE * grad_b
      kernel, bias = kernel + velocity_k, bias + velocity_b
    history.append((kernel.copy(), bias.copy()))
  return history


def momentum_of(name):
  """The momentum of scenario `name`'s optimizer (the legacy one is plain SGD)."""
  return 0.0 if name == "legacy" else MOMENTUM


def check_history(history, num_replicas, name):
  """Checks `train`'s history: one skip at `NAN_STEP`, the oracle's numbers elsewhere.

  Args:
    history: [(scale, counter, kernel, bias)] after each step (arrays or lists).
    num_replicas: Replicas in sync (sets the global batch of the oracle).
    name: The scenario (sets the momentum of the oracle).

  Raises:
    AssertionError: Naming the step and the number that differs.
  """
  scales = [(float(s), int(c)) for s, c, _, _ in history]
  if scales != EXPECTED_SCALES:
    raise AssertionError(f"(scale, counter) per step: {scales}, expected {EXPECTED_SCALES}")
  params = [(np.asarray(k, np.float32), np.asarray(b, np.float32)) for _, _, k, b in history]
  before = [(INITIAL_KERNEL, np.zeros(1, np.float32))] + params[:-1]
  for step, ((kernel, bias), (kernel0, bias0)) in enumerate(zip(params, before, strict=True)):
    unchanged = np.array_equal(kernel, kernel0) and np.array_equal(bias, bias0)
    if unchanged != (step == NAN_STEP):
      raise AssertionError(f"step {step}: variables {'un' if unchanged else ''}changed")
  fit_sum = name == "fit_keras3" and not keras3_fit_divides_loss()
  reference = reference_history(
    num_replicas, momentum_of(name), gradient_factor=num_replicas if fit_sum else 1
  )
  for step, ((kernel, bias), (ref_kernel, ref_bias)) in enumerate(
    zip(params, reference, strict=True)
  ):
    np.testing.assert_allclose(
      kernel, ref_kernel, rtol=1e-5, atol=1e-6, err_msg=f"kernel, step {step}"
    )
    np.testing.assert_allclose(bias, ref_bias, rtol=1e-5, atol=1e-6, err_msg=f"bias, step {step}")


def check_state(state, name):
  """Checks the final state of one replica: scale, counter and slots where expected.

  Args:
    state: {checkpoint path: value} (see `variables_of`).
    name: The scenario.

  Raises:
    AssertionError: If the scale or counter is not where a checkpoint keeps it
      (`.../loss_scale/current_loss_scale`, `.../loss_scale/good_steps`) with
      the expected value, or a momentum slot is missing.
  """
  final_scale, final_counter = EXPECTED_SCALES[-1]
  for key, expected in (("current_loss_scale", final_scale), ("good_steps", final_counter)):
    found = {p: float(np.asarray(v)) for p, v in state.items() if p.endswith(f"loss_scale/{key}")}
    if list(found.values()) != [expected]:
      raise AssertionError(f"{key}: expected one variable holding {expected}, found {found}")
  kernels = [p for p, v in state.items() if np.shape(v) == INITIAL_KERNEL.shape]
  expected_kernels = 1 if momentum_of(name) == 0.0 else 2  # The kernel and its momentum.
  if len(kernels) != expected_kernels:
    raise AssertionError(f"kernel-shaped variables {kernels}, expected {expected_kernels}")


# --- Scenarios -------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
  """A built scenario: call `step(i)` for i in range(STEPS), or `fit()`."""

  name: str
  strategy: object
  kernel: object
  bias: object
  optimizer: object
  scale: object  # () -> float
  counter: object  # () -> int
  roots: dict  # What a checkpoint holds, and where state is compared.
  extra_variables: object  # () -> slots that the object graph does not reach.
  step: object = None  # step(i): one custom-loop step.
  fit: object = None  # fit(steps) -> [(scale, counter, kernel, bias)] per step.
  # What fit's LossScaleMonitor showed: its History keys and the scalars it wrote.
  monitor: dict = dataclasses.field(default_factory=dict)


def _tf():
  import tensorflow as tf  # noqa: PLC0415 (the launcher does not need TensorFlow)

  return tf


def _poisoned(value, step):
  """`value`, times NaN on replica `BAD_REPLICA` (0 if alone) at step `NAN_STEP`."""
  tf = _tf()
  ctx = tf.distribute.get_replica_context()
  if ctx is None:  # Keras building the model in the cross-replica context.
    return value
  bad = tf.logical_and(
    tf.equal(tf.cast(step, tf.int64), NAN_STEP),
    tf.equal(ctx.replica_id_in_sync_group, BAD_REPLICA % ctx.num_replicas_in_sync),
  )
  return value * tf.where(bad, tf.constant(float("nan"), value.dtype), tf.ones([], value.dtype))


def _replica_loss(predict, step):
  """This replica's share of the global mean squared error, NaN where planned."""
  tf = _tf()
  ctx = tf.distribute.get_replica_context()
  x = tf.gather(tf.constant(_X), step)[ctx.replica_id_in_sync_group]
  y = tf.gather(tf.constant(_Y), step)[ctx.replica_id_in_sync_group]
  global_size = REPLICA_BATCH * ctx.num_replicas_in_sync
  loss = tf.reduce_sum(tf.square(predict(x) - y)) / global_size
  return _poisoned(loss, step)


def _child(obj, *path):
  for name in path:
    obj = obj._trackable_children()[name]  # pylint: disable=protected-access
  return obj


def _step_function(strategy, replica_step):
  tf = _tf()

  @tf.function
  def step(i):
    strategy.run(replica_step, args=(i,))

  return lambda i: step(tf.constant(i, tf.int64))


def _build_legacy(strategy):
  """Legacy `DynamicLossScale` with plain SGD applied by hand, as TF1 code did."""
  tf = _tf()
  from tf_lossscale import DynamicLossScale  # noqa: PLC0415

  with strategy.scope():
    kernel = tf.Variable(INITIAL_KERNEL, name="kernel")
    bias = tf.Variable(tf.zeros([1]), name="bias")
    loss_scale = DynamicLossScale(INITIAL_SCALE, GROWTH_STEPS)
  variables = [kernel, bias]

  def apply(strategy, grads):
    reduced = strategy.extended.batch_reduce_to(
      tf.distribute.ReduceOp.SUM, list(zip(grads, variables, strict=True))
    )
    update_scale, should_apply = loss_scale.update(grads)

    def sgd():
      return tf.group(
        [
          strategy.extended.update(v, lambda v, g: v.assign_sub(LEARNING_RATE * g), args=(g,))
          for v, g in zip(variables, reduced, strict=True)
        ]
      )

    return tf.group(tf.cond(should_apply, sgd, tf.no_op), update_scale)

  def replica_step(step):
    with tf.GradientTape() as tape:
      scaled_loss = _replica_loss(lambda x: x @ kernel + bias, step) * loss_scale()
    grads = [g / loss_scale() for g in tape.gradient(scaled_loss, variables)]
    tf.distribute.get_replica_context().merge_call(apply, args=(grads,))

  return Run(
    name="legacy",
    strategy=strategy,
    kernel=kernel,
    bias=bias,
    optimizer=loss_scale,
    scale=lambda: float(loss_scale()),
    counter=lambda: int(_child(loss_scale, "good_steps").numpy()),
    roots={"kernel": kernel, "bias": bias, "loss_scale": loss_scale},
    extra_variables=list,
    step=_step_function(strategy, replica_step),
  )


def _keras(family):
  """(keras module, optimizer module) of an inner-optimizer family."""
  tf = _tf()
  if family == "tf_keras":
    import tf_keras  # noqa: PLC0415

    return tf_keras, tf_keras.optimizers.legacy
  return tf.keras, tf.keras.optimizers


def _make_lso(family, experimental):
  from tf_lossscale import DynamicLossScale  # noqa: PLC0415
  from tf_lossscale.keras import mixed_precision  # noqa: PLC0415

  _, optimizers = _keras(family)
  inner = optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
  if experimental:
    return mixed_precision.experimental.LossScaleOptimizer(
      inner, DynamicLossScale(INITIAL_SCALE, GROWTH_STEPS)
    )
  return mixed_precision.LossScaleOptimizer(
    inner, initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS
  )


def _make_model(family, optimizer=None):
  """Dense(1) from `INITIAL_KERNEL`; with `optimizer`, NaN-poisoned for fit."""
  keras, _ = _keras(family)
  layers = [
    keras.Input((FEATURES,)),
    keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(INITIAL_KERNEL)),
  ]
  if optimizer is not None:

    class PoisonAtNanStep(keras.layers.Layer):
      """Multiplies by NaN on `BAD_REPLICA` when `iterations == NAN_STEP`."""

      def call(self, x):
        return _poisoned(x, optimizer.iterations)

      def compute_output_shape(self, input_shape):
        return input_shape

    layers.append(PoisonAtNanStep())
  return keras.Sequential(layers)


def _optimizer_variables(optimizer):
  """The inner optimizer's variables (slots included), of either family."""
  variables = optimizer.inner_optimizer.variables
  return list(variables() if callable(variables) else variables)


def _keras_run(name, strategy, model, optimizer, **kwargs):
  dense = model.layers[0]
  return Run(
    name=name,
    strategy=strategy,
    kernel=dense.kernel,
    bias=dense.bias,
    optimizer=optimizer,
    scale=lambda: float(optimizer.loss_scale),
    counter=lambda: int(optimizer.dynamic_counter.numpy()),
    roots={"model": model, "optimizer": optimizer},
    extra_variables=lambda: _optimizer_variables(optimizer),
    **kwargs,
  )


def _build_keras(strategy, family, experimental=False):
  """Keras `LossScaleOptimizer` in a custom loop: scale, unscale, apply."""
  tf = _tf()
  with strategy.scope():
    model = _make_model(family)
    optimizer = _make_lso(family, experimental)

  def replica_step(step):
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
      loss = _replica_loss(lambda x: model(x, training=True), step)
      scaled_loss = optimizer.get_scaled_loss(loss)
    grads = optimizer.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
    optimizer.apply_gradients(zip(grads, variables, strict=True))

  name = "experimental" if experimental else family
  return _keras_run(name, strategy, model, optimizer, step=_step_function(strategy, replica_step))


def _build_fit(strategy, family, experimental=False):
  """Keras `LossScaleOptimizer` in `model.compile` + `model.fit`."""
  tf = _tf()
  keras, _ = _keras(family)
  with strategy.scope():
    optimizer = _make_lso(family, experimental)
    model = _make_model(family, optimizer)
    model.compile(optimizer=optimizer, loss="mse")
  dense = model.layers[0]

  class Record(keras.callbacks.Callback):
    def __init__(self):
      super().__init__()
      self.history = []

    def on_train_batch_end(self, batch, logs=None):
      self.history.append(
        (
          float(optimizer.loss_scale),
          int(optimizer.dynamic_counter.numpy()),
          np.array(dense.kernel.numpy()),
          np.array(dense.bias.numpy()),
        )
      )

  monitored = {}

  def fit(steps=STEPS):
    from tf_lossscale.keras.callbacks import LossScaleMonitor  # noqa: PLC0415

    replicas = strategy.num_replicas_in_sync
    batches = [global_batch(step, replicas) for step in range(steps)]
    dataset = tf.data.Dataset.from_tensor_slices(
      (np.stack([x for x, _ in batches]), np.stack([y for _, y in batches]))
    )
    options = tf.data.Options()
    # Every worker reads every global batch; the strategy gives each replica its slice.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    record = Record()
    # Each process its own folder: only the chief may write there.
    log_dir = tempfile.mkdtemp()
    monitor = LossScaleMonitor(update_freq=1, tensorboard=log_dir)
    # No `steps_per_epoch`: the dataset ends after `steps` batches anyway, and
    # with it Keras 3.5 and 3.6 build the model from the epoch's first batch,
    # which the epoch then skips (their `_maybe_symbolic_build`).
    history = model.fit(
      dataset.with_options(options),
      epochs=1,
      verbose=0,
      callbacks=[record, monitor],
    ).history
    monitored.update({key: history[key] for key in ("loss_scale", "skipped_steps")})
    monitored["summaries"] = summaries(os.path.join(log_dir, "train"))
    return record.history

  name = "fit_experimental" if experimental else f"fit_{family}"
  return _keras_run(name, strategy, model, optimizer, fit=fit, monitor=monitored)


def summaries(log_dir):
  """{tag: [[step, value], ...]} of the scalar summaries in `log_dir`'s event files."""
  tf = _tf()
  found = {}
  paths = sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*")))
  for event in (e for path in paths for e in tf.compat.v1.train.summary_iterator(path)):
    for value in event.summary.value:
      found.setdefault(value.tag, []).append([event.step, tf.make_ndarray(value.tensor).item()])
  return found


def _build_compat_v1(strategy):
  """compat.v1 `MixedPrecisionLossScaleOptimizer` around MomentumOptimizer."""
  tf = _tf()
  from tf_lossscale import DynamicLossScale, MixedPrecisionLossScaleOptimizer  # noqa: PLC0415

  with strategy.scope():
    kernel = tf.Variable(INITIAL_KERNEL, name="kernel")
    bias = tf.Variable(tf.zeros([1]), name="bias")
    loss_scale = DynamicLossScale(INITIAL_SCALE, GROWTH_STEPS)
    optimizer = MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM), loss_scale
    )
  variables = [kernel, bias]

  def replica_step(step):
    optimizer.minimize(lambda: _replica_loss(lambda x: x @ kernel + bias, step), var_list=variables)

  return Run(
    name="compat_v1",
    strategy=strategy,
    kernel=kernel,
    bias=bias,
    optimizer=optimizer,
    scale=lambda: float(loss_scale()),
    counter=lambda: int(_child(loss_scale, "good_steps").numpy()),
    roots={"kernel": kernel, "bias": bias, "optimizer": optimizer},
    extra_variables=lambda: [optimizer.get_slot(v, "momentum") for v in variables],
    step=_step_function(strategy, replica_step),
  )


def build(name, strategy):
  """Builds scenario `name` (one of `SCENARIOS`) under `strategy`."""
  builders = {
    "legacy": lambda s: _build_legacy(s),
    "keras3": lambda s: _build_keras(s, "keras3"),
    "tf_keras": lambda s: _build_keras(s, "tf_keras"),
    "experimental": lambda s: _build_keras(s, "keras3", experimental=True),
    "compat_v1": lambda s: _build_compat_v1(s),
    "fit_keras3": lambda s: _build_fit(s, "keras3"),
    "fit_tf_keras": lambda s: _build_fit(s, "tf_keras"),
    "fit_experimental": lambda s: _build_fit(s, "tf_keras", experimental=True),
  }
  return builders[name](strategy)


def as_variable(obj):
  """The `tf.Variable` of `obj` (itself, or what a Keras 3 variable wraps), else None."""
  tf = _tf()
  if isinstance(obj, tf.Variable):
    return obj
  value = getattr(obj, "value", None)
  return value if isinstance(value, tf.Variable) else None


def _checkpoint_children(obj):
  """{name: child} of `obj` in a checkpoint's object graph.

  Keras 3.0's optimizers are no TF trackables (a checkpoint refuses them, and
  a wrapper of one): their state is their `variables`, and a wrapper's is its
  inner optimizer's and its loss scale, named as later Keras checkpoints them.
  """
  tf = _tf()
  if isinstance(obj, tf.__internal__.tracking.Trackable):
    return obj._trackable_children(save_type="checkpoint")  # pylint: disable=protected-access
  inner = getattr(obj, "inner_optimizer", None)
  if inner is None:
    return {f"variables/{index}": v for index, v in enumerate(obj.variables)}
  children = _checkpoint_children(inner)
  if obj.dynamic:
    children["loss_scale"] = obj._loss_scale  # pylint: disable=protected-access
  return children


def variables_of(run):
  """{path: variable} for every variable of `run`: model, slots, scale, counter.

  Walks the checkpoint object graph from `run.roots` (so the scale and counter
  appear under the paths a checkpoint uses), then adds `run.extra_variables`
  (slots of optimizers whose slots are not graph children) by position.
  """
  found, seen = {}, set()

  def walk(obj, path):
    variable = as_variable(obj)
    key = id(variable if variable is not None else obj)
    if key in seen:
      return
    seen.add(key)
    if variable is not None:
      found[path] = variable
      return
    for name, child in sorted(_checkpoint_children(obj).items()):
      walk(child, f"{path}/{name}")

  for name, root in run.roots.items():
    walk(root, name)
  extras = [as_variable(v) for v in run.extra_variables()]
  if any(v is None for v in extras):
    raise AssertionError(f"{run.name}: a slot is missing: {run.extra_variables()}")
  for index, variable in enumerate(v for v in extras if id(v) not in seen):
    found[f"extra/{index}"] = variable
  return found


def replica_values(run):
  """{path: [numpy value on each local replica]} for `variables_of(run)`."""
  return {
    path: [np.array(v.numpy()) for v in run.strategy.experimental_local_results(variable)]
    for path, variable in variables_of(run).items()
  }


def train(run, checkpoint_prefix=None, start=0):
  """Runs steps `start`..STEPS-1; returns [(scale, counter, kernel, bias)] after each.

  With `checkpoint_prefix`, a custom loop writes a `tf.train.Checkpoint` of
  `run.roots` after step `CHECKPOINT_AFTER` and returns its path too.
  """
  tf = _tf()
  if run.fit is not None:
    return run.fit(), None
  history, path = [], None
  for step in range(start, STEPS):
    run.step(step)
    history.append((run.scale(), run.counter(), run.kernel.numpy(), run.bias.numpy()))
    if step == CHECKPOINT_AFTER and checkpoint_prefix is not None:
      path = tf.train.Checkpoint(**run.roots).write(checkpoint_prefix)
  return history, path


# --- The worker program ------------------------------------------------------------------


def jsonable_history(history):
  """`train`'s history as JSON-ready dicts (float32 values convert exactly)."""
  return [
    {"scale": s, "counter": c, "kernel": k.tolist(), "bias": b.tolist()} for s, c, k, b in history
  ]


def _run_scenario(name, strategy, out_dir, task_index):
  """Trains one scenario; returns its JSON record (status 'ok' or 'error')."""
  try:
    run = build(name, strategy)
    # Only the chief's checkpoint is kept; the others must write too (to a
    # private place) because saving takes part in the cluster's collectives.
    where = out_dir if task_index == 0 else tempfile.mkdtemp(dir=out_dir)
    history, checkpoint = train(run, os.path.join(where, f"ckpt_{name}"))
    state = {path: values[0].tolist() for path, values in replica_values(run).items()}
    return {
      "status": "ok",
      "history": jsonable_history(history),
      "state": state,
      "monitor": run.monitor,
      # Relative: the test may move the folder.
      "checkpoint": os.path.relpath(checkpoint, out_dir)
      if checkpoint and task_index == 0
      else None,
    }
  except Exception as e:  # noqa: BLE001 (reported to the test, which fails on it)
    return {
      "status": "error",
      "message": f"{type(e).__name__}: {e}",
      "traceback": traceback.format_exc(),
    }


def worker_main(argv=None):
  """One worker: trains `scenarios` under MultiWorkerMirroredStrategy from TF_CONFIG."""
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--out", required=True, help="folder for worker<index>.json and checkpoints")
  parser.add_argument("scenarios", nargs="*", default=list(MULTI_WORKER_SCENARIOS))
  parser.add_argument(
    "--parameter-server", action="store_true", help="run `parameter_server_main` instead"
  )
  args = parser.parse_args(argv)
  if args.parameter_server:
    parameter_server_main(args.out)
    return
  tf = _tf()
  task_index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  results = {"num_replicas_in_sync": strategy.num_replicas_in_sync}
  for name in args.scenarios:
    results[name] = _run_scenario(name, strategy, args.out, task_index)
    print(f"worker {task_index}: {name}: {results[name]['status']}", flush=True)
  path = os.path.join(args.out, f"worker{task_index}.json")
  with open(path + ".tmp", "w") as f:
    json.dump(results, f)
  os.replace(path + ".tmp", path)


def parameter_server_main(out_dir):
  """Tries each API under a TF2 ParameterServerStrategy; writes what each raised.

  The cluster (one worker, one parameter server) runs in this process, on
  127.0.0.1; this process is the coordinator. Writes
  `<out_dir>/parameter_server.json`: {api: "<ExceptionType>: <message>" or "no error"}.
  """
  tf = _tf()
  import tf_keras  # noqa: PLC0415

  from tf_lossscale import MixedPrecisionLossScaleOptimizer  # noqa: PLC0415
  from tf_lossscale.keras.mixed_precision import LossScaleOptimizer  # noqa: PLC0415

  worker_port, ps_port = free_ports(2)
  cluster = tf.train.ClusterSpec(
    {"worker": [f"127.0.0.1:{worker_port}"], "ps": [f"127.0.0.1:{ps_port}"]}
  )
  servers = [  # noqa: F841 (they serve while referenced)
    tf.distribute.Server(cluster, job_name=job, task_index=0, protocol="grpc", start=True)
    for job in ("worker", "ps")
  ]
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
  strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  make = {
    "keras3": lambda: (tf.keras.Variable(1.0), LossScaleOptimizer(tf.keras.optimizers.SGD(1.0))),
    "tf_keras": lambda: (tf.Variable(1.0), LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(1.0))),
    "compat_v1": lambda: (
      tf.Variable(1.0),
      MixedPrecisionLossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), "dynamic"),
    ),
  }
  results = {}
  for api, build_api in make.items():
    try:
      with strategy.scope():
        var, opt = build_api()

      @tf.function
      def step(var=var, opt=opt):
        strategy.run(lambda: opt.apply_gradients([(tf.constant(1.0), var)]))

      coordinator.schedule(step)
      coordinator.join()
      results[api] = "no error"
    except Exception as e:  # noqa: BLE001 (the error is the result)
      results[api] = f"{type(e).__name__}: {e}"
  with open(os.path.join(out_dir, "parameter_server.json"), "w") as f:
    json.dump(results, f)


# --- The launcher --------------------------------------------------------------------------


def free_ports(count):
  """`count` distinct TCP ports free on 127.0.0.1 (bound to port 0, then released)."""
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(("127.0.0.1", 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def tf_config(ports, index):
  """The TF_CONFIG of worker `index` in a loopback cluster on `ports`."""
  return json.dumps(
    {
      "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
      "task": {"type": "worker", "index": index},
    }
  )


def run_workers(command, out_dir, num_workers=2, timeout=150, env=None):
  """Runs `command` (argv) as `num_workers` loopback workers; kills them all at the end.

  Args:
    command: argv of one worker; each gets its own TF_CONFIG.
    out_dir: Folder for the workers' logs (`worker<i>.log`).
    num_workers: Cluster size.
    timeout: Seconds every worker may take, in total.
    env: Environment variables to set for the workers, beside this process's.

  Returns:
    The logs, one string per worker.

  Raises:
    RuntimeError: If a worker fails or times out (with every worker's log tail).
  """
  ports = free_ports(num_workers)
  root = os.path.dirname(ROOT_TESTS)
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
  logs = [os.path.join(out_dir, f"worker{i}.log") for i in range(num_workers)]
  procs = []
  failure = None
  try:
    for i in range(num_workers):
      with open(logs[i], "w") as log:
        procs.append(
          subprocess.Popen(
            command,
            env=dict(env, TF_CONFIG=tf_config(ports, i)),
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
          )
        )
    deadline = time.monotonic() + timeout
    for i, proc in enumerate(procs):
      try:
        if proc.wait(timeout=max(deadline - time.monotonic(), 0.1)) != 0 and failure is None:
          failure = f"worker {i} exited with {proc.returncode}"
      except subprocess.TimeoutExpired:
        failure = failure or f"worker {i} still running after {timeout} s"
        break
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
      proc.wait()
  texts = []
  for path in logs:
    with open(path) as f:
      texts.append(f.read())
  if failure:
    tails = "\n".join(f"--- worker {i} ---\n{text[-3000:]}" for i, text in enumerate(texts))
    raise RuntimeError(f"{failure}\n{tails}")
  return texts


if __name__ == "__main__":
  sys.exit(worker_main())
