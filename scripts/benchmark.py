"""Times one training step with loss scaling: tf_lossscale against its peers.

For every workload, execution mode and kind of inner optimizer (`--optimizer`:
SGD with momentum 0.9 and Adam by default, plain SGD on request), three
optimizer families are timed in the same process, interleaved round by round:

* keras3: `keras.optimizers.SGD` / `Adam` plain, wrapped in Keras 3's own
  `keras.mixed_precision.LossScaleOptimizer` (peer) and in ours.
* tf_keras: `tf_keras.optimizers.legacy.SGD` / `Adam` plain, wrapped in
  tf_keras's `tf_keras.mixed_precision.LossScaleOptimizer` (peer) and in ours.
* v1: `tf.compat.v1.train.GradientDescentOptimizer` / `MomentumOptimizer` /
  `AdamOptimizer` plain, wrapped in TF's
  `tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` (peer) and in
  ours.

A step is the whole training step: forward pass, loss, loss scaling,
gradients, unscaling, finiteness check, scale update and apply. The overhead
of loss scaling is a step's median time divided by the plain optimizer's.
Two lower bounds are timed beside them: `floor` (a constant scale, the
unscale and one read of every gradient, which the apply waits for; under XLA
the apply takes the check's verdict as data, or XLA would compile the check
away) and `floor+cond` (the same with the apply in a conditional, which an
exact skip needs; eagerly a Python `if`).

With `--fit`, real models are also trained with `fit` under the
`mixed_float16` policy (a ResNet-style CNN, a Transformer encoder): Keras 3's
`compile`, which wraps the optimizer in its own LossScaleOptimizer (peer),
against ours; tf_keras's `compile`, which wraps an OptimizerV2 in tf_keras's
(peer), against ours. Each framework's defaults: Keras 3 compiles the train
step with XLA where it can, tf_keras does not.

Prints markdown tables and, with `--json PATH`, writes every measurement.
Configurations that fail (or are not implemented yet) are reported, not fatal.
"""

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

MODES = ("function", "eager", "xla", "graph")
FAMILIES = ("keras3", "tf_keras", "v1")
OPTIMIZERS = ("sgd", "momentum", "adam")  # SGD with momentum 0.9 for "momentum".
IMPLS = ("plain", "floor", "gated", "peer", "ours")
FLOORS = ("floor", "gated")  # Lower bounds (see _floor_grads).
PEER_NAMES = {
  "keras3": "Keras 3 LSO",
  "tf_keras": "tf_keras LSO",
  "v1": "TF compat.v1 MPLSO",
}
QUICK = {
  "workloads": "mlp1m,vars100",
  "fit": "",
  "modes": "function,eager,xla,graph",
  "skip": "vars100:eager,vars100:xla",
  "rounds": 5,
  "block_seconds": 0.05,
  "first_calls": 1,
  "processes": False,
}
FULL = {
  "workloads": "mlp1m,mlp16m,vars500,cnn",
  "fit": "resnet,transformer",
  "modes": ",".join(MODES),
  "skip": "",
  "rounds": 9,
  "block_seconds": 0.25,
  "first_calls": 3,
  "processes": True,
}


# Workloads: each builds its variables and loss in the current graph (or
# eagerly) and returns them.


def _mlp(sizes, batch):
  def build():
    rng = np.random.default_rng(0)
    variables = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
      w = rng.normal(0.0, (2.0 / fan_in) ** 0.5, (fan_in, fan_out)).astype(np.float32)
      variables += [tf.Variable(w), tf.Variable(np.zeros(fan_out, np.float32))]
    x = tf.constant(rng.normal(size=(batch, sizes[0])).astype(np.float32))
    y = tf.constant(rng.normal(size=(batch, sizes[-1])).astype(np.float32))

    def loss_fn():
      h = x
      for i in range(0, len(variables), 2):
        h = tf.matmul(h, variables[i]) + variables[i + 1]
        if i + 2 < len(variables):
          h = tf.nn.relu(h)
      return tf.reduce_mean(tf.square(h - y))

    return variables, loss_fn

  return build


def _many_vars(count, size):
  def build():
    rng = np.random.default_rng(0)
    variables = [tf.Variable(rng.normal(0.0, 0.1, size).astype(np.float32)) for _ in range(count)]
    target = tf.constant(rng.normal(size=count * size).astype(np.float32))

    def loss_fn():
      return 0.5 * tf.reduce_mean(tf.square(tf.concat(variables, 0) - target))

    return variables, loss_fn

  return build


def _cnn(batch):
  def build():
    if not tf.executing_eagerly():
      raise NotApplicable("Keras 3 models do not build in a TF1 graph")
    model = tf.keras.applications.MobileNetV2(
      input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10, classifier_activation=None
    )
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(batch, 32, 32, 3)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, batch))
    # The tf.Variables behind the Keras variables: every family can update them.
    variables = [v.value for v in model.trainable_variables]

    def loss_fn():
      logits = model(x, training=True)
      return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    return variables, loss_fn

  return build


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  description: str
  build: object


WORKLOADS = {
  w.name: w
  for w in (
    Workload(
      "mlp1m",
      "MLP 512-1024-512-16, 1.06M params in 6 vars, batch 64",
      _mlp((512, 1024, 512, 16), 64),
    ),
    Workload("mlp16m", "MLP 2048x5, 16.8M params in 8 vars, batch 32", _mlp((2048,) * 5, 32)),
    Workload("vars500", "500 vars x 1k floats, one concat + mean square", _many_vars(500, 1000)),
    Workload("vars100", "100 vars x 1k floats, one concat + mean square", _many_vars(100, 1000)),
    Workload("cnn", "Keras 3 MobileNetV2 alpha 0.35, 32x32x3, batch 16, weights=None", _cnn(16)),
    Workload("tiny", "MLP 8-8-1, 4 vars, batch 4 (for smoke tests)", _mlp((8, 8, 1), 4)),
  )
}


class NotApplicable(Exception):
  """A configuration that this benchmark does not run, with the reason."""


# Real models trained with `fit` under mixed_float16. `K` is the framework's
# module (keras or tf_keras): both have these layers.


def _resnet(K, blocks=(16, 32, 64)):
  """A small ResNet: a stem, two residual blocks per width, 10 classes."""
  layers = K.layers
  inputs = K.Input((32, 32, 3))
  x = layers.Conv2D(blocks[0], 3, padding="same", use_bias=False)(inputs)
  x = layers.ReLU()(layers.BatchNormalization()(x))
  for i, width in enumerate(blocks):
    for j in range(2):
      stride = 2 if i > 0 and j == 0 else 1
      shortcut = x
      y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
      y = layers.ReLU()(layers.BatchNormalization()(y))
      y = layers.Conv2D(width, 3, padding="same", use_bias=False)(y)
      y = layers.BatchNormalization()(y)
      if stride != 1 or shortcut.shape[-1] != width:
        shortcut = layers.Conv2D(width, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = layers.BatchNormalization()(shortcut)
      x = layers.ReLU()(layers.Add()([y, shortcut]))
  x = layers.GlobalAveragePooling2D()(x)
  outputs = layers.Dense(10, dtype="float32")(x)  # Logits in float32, as mixed precision advises.
  return K.Model(inputs, outputs)


def _transformer(K, depth=8, width=64, heads=4, length=32, vocab=1000):
  """A Transformer encoder classifying token sequences (16 variables a layer)."""
  layers = K.layers
  inputs = K.Input((length,), dtype="int32")
  x = layers.Embedding(vocab, width)(inputs)
  for _ in range(depth):
    attention = layers.MultiHeadAttention(heads, width // heads)(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, attention]))
    hidden = layers.Dense(2 * width, activation="relu")(x)
    x = layers.LayerNormalization()(layers.Add()([x, layers.Dense(width)(hidden)]))
  x = layers.GlobalAveragePooling1D()(x)
  outputs = layers.Dense(10, dtype="float32")(x)
  return K.Model(inputs, outputs)


def _tiny_model(K):
  inputs = K.Input((8,))
  return K.Model(inputs, K.layers.Dense(10, dtype="float32")(K.layers.Dense(8)(inputs)))


def _features(batch):
  return np.random.default_rng(0).normal(size=(batch, 8)).astype(np.float32)


def _images(batch):
  rng = np.random.default_rng(0)
  return rng.normal(size=(batch, 32, 32, 3)).astype(np.float32)


def _tokens(batch):
  return np.random.default_rng(0).integers(0, 1000, (batch, 32)).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class FitWorkload:
  name: str
  description: str
  build: object  # build(K) -> an uncompiled model.
  inputs: object  # inputs(count) -> numpy inputs.
  batch: int
  steps: int  # Steps per epoch.


FIT_WORKLOADS = {
  w.name: w
  for w in (
    FitWorkload(
      "resnet",
      "ResNet-style CNN (3 widths x 2 residual blocks, 16-64 filters), 32x32x3, batch 32",
      _resnet,
      _images,
      32,
      8,
    ),
    FitWorkload(
      "transformer",
      "Transformer encoder, 8 layers of width 64, 4 heads, 32 tokens, batch 32",
      _transformer,
      _tokens,
      32,
      8,
    ),
    FitWorkload("tinyfit", "MLP 8-8-10, batch 4 (for smoke tests)", _tiny_model, _features, 4, 2),
  )
}
FIT_FAMILIES = ("keras3", "tf_keras")
FIT_PEERS = {
  "keras3": "Keras 3 compile's own LSO",
  "tf_keras": "tf_keras compile's own LSO",
}


# Optimizers.


_MOMENTUM = 0.9


def _inner(family, optimizer, lr):
  import keras
  import tf_keras

  if family == "v1":
    v1 = tf.compat.v1.train
    if optimizer == "momentum":
      return v1.MomentumOptimizer(lr, _MOMENTUM)
    return {"sgd": v1.GradientDescentOptimizer, "adam": v1.AdamOptimizer}[optimizer](lr)
  classes = keras.optimizers if family == "keras3" else tf_keras.optimizers.legacy
  if optimizer == "adam":
    return classes.Adam(lr)
  return classes.SGD(lr, momentum=_MOMENTUM if optimizer == "momentum" else 0.0)


def _make_optimizer(family, impl, optimizer, lr):
  inner = _inner(family, optimizer, lr)
  if impl in ("plain", *FLOORS):
    return inner
  if family == "v1":
    if impl == "peer":
      wrapper = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
    else:
      from tf_lossscale.compat.v1.mixed_precision import MixedPrecisionLossScaleOptimizer as wrapper
    return wrapper(inner, "dynamic")
  if impl == "peer":
    if family == "keras3":
      import keras

      return keras.mixed_precision.LossScaleOptimizer(inner)
    import tf_keras

    return tf_keras.mixed_precision.LossScaleOptimizer(inner)
  from tf_lossscale.keras.mixed_precision import LossScaleOptimizer

  return LossScaleOptimizer(inner)


# The floor: the work any exact loss scaling adds to a plain step, with nothing
# else: the loss times a constant scale, each gradient times its reciprocal,
# and one read of every gradient for the finiteness check (the cheapest we
# know: tf_lossscale's own, `fast_paths.quick_and_exact`: sums, small
# same-shaped gradients added first; under XLA its element-wise check alone),
# which the apply waits for. No scale state, no conditional.
#
# "gated" (floor+cond) adds the one thing an exact skip needs on top: the apply
# inside a conditional on that check (tf_lossscale's `cond`, as ours gates
# its apply: an If lowered as any `tf.cond`'s in a function, one Switch in a
# TF1 graph, a Python `if` eagerly). Eagerly both run op by op, the simplest way.
_FLOOR_SCALE = 2.0**15


def _floor_grads(impl, grads):
  from tf_lossscale._src import fast_paths

  grads = [g * (1 / _FLOOR_SCALE) for g in grads]
  finite, _ = fast_paths.quick_and_exact(grads)
  if impl == "floor" and fast_paths._in_xla():
    # XLA drops control dependencies between computations: without a use of
    # its result the check would be compiled away, and the floor with it.
    # Times 1.0 on a finite step: the apply waits for the check, as any
    # exact skip's must. The verdict goes through a reduction, which XLA
    # computes once: as a scalar expression it was recomputed in every
    # apply's fusion, and with 100 gradients compiled twice as slowly. (In
    # floor+cond the conditional uses it.)
    keep = tf.reduce_min(tf.cast(tf.stack([finite, finite]), tf.float32))
    grads = [g * tf.cast(keep, g.dtype) for g in grads]
  return grads, finite


def _floor_apply(impl, finite, apply):
  from tf_lossscale._src import fast_paths

  if impl == "gated":

    def apply_and_return_nothing():  # What apply returns differs by optimizer.
      apply()

    return fast_paths.cond(finite, apply_and_return_nothing, lambda: None)
  with tf.control_dependencies([finite]):
    return apply()


def _floor_v1(impl, opt, variables, loss_fn, tensor_loss=False):
  # `tensor_loss` in a TF1 graph, as `minimize(loss_fn())` there (tf.gradients, not a tape).
  loss = lambda: loss_fn() * _FLOOR_SCALE  # noqa: E731
  pairs = opt.compute_gradients(loss() if tensor_loss else loss, var_list=variables)
  grads, finite = _floor_grads(impl, [g for g, _ in pairs])
  return _floor_apply(impl, finite, lambda: opt.apply_gradients(zip(grads, variables, strict=True)))


def _make_step(family, impl, opt, variables, loss_fn):
  """Returns a function running one training step, in the API `impl` uses."""
  if family == "v1":

    def step():
      if impl in FLOORS:
        _floor_v1(impl, opt, variables, loss_fn)
      else:
        opt.minimize(loss_fn, var_list=variables)

    return step

  def step():
    with tf.GradientTape() as tape:
      loss = loss_fn()
      if impl in FLOORS:
        loss = loss * _FLOOR_SCALE
      elif impl == "peer" and family == "keras3":
        loss = opt.scale_loss(loss)  # Keras 3's LSO unscales inside apply.
      elif impl != "plain":
        loss = opt.get_scaled_loss(loss)
    grads = tape.gradient(loss, variables)
    if impl in FLOORS:
      grads, finite = _floor_grads(impl, grads)
      _floor_apply(impl, finite, lambda: opt.apply_gradients(zip(grads, variables, strict=True)))
      return
    if impl != "plain" and not (impl == "peer" and family == "keras3"):
      grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, variables, strict=True))

  return step


# Measurement.


def _rss_kb(field):
  with open("/proc/self/status") as f:
    return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def _cpu_allocator_counts():
  """Whether TensorFlow's CPU allocator keeps statistics: its BFC allocator
  does (`TF_CPU_ALLOCATOR_USE_BFC=true`); the default one reports zeros."""
  with tf.init_scope():  # eagerly, also when called under a graph
    probe = tf.zeros([1024])  # noqa: F841 - alive while the statistics are read
    return tf.config.experimental.get_memory_info("CPU:0")["current"] > 0


class PeakMemory:
  """Peak memory of a block of steps, above what was in use before it.

  On a GPU, and on a CPU whose allocator keeps statistics
  (`TF_CPU_ALLOCATOR_USE_BFC=true`): TensorFlow's allocator statistics, XLA's
  temporaries included, counted in the allocator's chunks (up to twice a
  request; docs/benchmarks.md, "How it measures"). Otherwise: the process's resident-set high-water
  mark, reset before the block (Linux `clear_refs`), minus the resident set
  before it.
  """

  def __init__(self):
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
      self.device, self.kind = gpus[0].name, "GPU allocator peak"
    elif _cpu_allocator_counts():
      self.device, self.kind = "CPU:0", "CPU allocator peak"
    else:
      self.device, self.kind = None, "RSS high-water"
    self.available = bool(self.device) or os.path.exists("/proc/self/clear_refs")

  def start(self):
    if not self.available:
      return
    if self.device:
      tf.config.experimental.reset_memory_stats(self.device)
      self._base = tf.config.experimental.get_memory_info(self.device)["current"]
    else:
      try:
        with open("/proc/self/clear_refs", "w") as f:
          f.write("5")
      except OSError:
        self.available = False
        return
      self._base = _rss_kb("VmRSS") * 1024

  def stop(self):
    """Returns the peak in MiB, or None where it cannot be measured."""
    if not self.available:
      return None
    if self.device:
      peak = tf.config.experimental.get_memory_info(self.device)["peak"]
    else:
      peak = _rss_kb("VmHWM") * 1024
    return max(0, peak - self._base) / 2**20


@dataclasses.dataclass
class Config:
  workload: str
  mode: str
  family: str
  impl: str
  optimizer: str = "sgd"
  status: str = "ok"  # ok, n/a, fail
  reason: str = ""
  clock: str = "wall"
  first_call_s: float | None = None
  first_calls_s: list = dataclasses.field(default_factory=list)
  wall_ms: list = dataclasses.field(default_factory=list)
  cpu_ms: list = dataclasses.field(default_factory=list)
  peak_mib: float | None = None
  # TensorFlow ops one step runs, in a function or TF1 graph (`_ops_run`).
  ops: int | None = None
  steps_per_block: int = 0
  run: object = dataclasses.field(default=None, repr=False)
  # Waits for what the steps queued on a device (a GPU runs behind the host).
  wait: object = dataclasses.field(default=None, repr=False)

  @property
  def times_ms(self):
    """The mean step time of each round, in the chosen clock."""
    return self.wall_ms if self.clock == "wall" else self.cpu_ms

  @property
  def median_ms(self):
    """Median over rounds of the mean step time, in the chosen clock."""
    return statistics.median(self.times_ms) if self.times_ms else None

  def fail(self, exc):
    if isinstance(exc, NotApplicable):
      self.status, self.reason = "n/a", str(exc)
    elif isinstance(exc, NotImplementedError):
      self.status, self.reason = "n/a", "not implemented yet"
    else:
      self.status = "fail"
      first_line = (str(exc).strip().splitlines() or [""])[0]
      self.reason = f"{type(exc).__name__}: {first_line[:120]}"
    self.run = self.wait = None

  def steps(self, count=1):
    """Runs `count` steps, and waits until the device has run them too."""
    for _ in range(count):
      self.run()
    if self.wait is not None:
      self.wait()

  def to_json(self):
    callables = ("run", "wait")
    out = {
      f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in callables
    }
    out["median_ms"] = self.median_ms
    return out


def _prepare(cfg, args, variables, loss_fn):
  """Builds cfg.run for tf.function, eager and XLA modes."""
  opt = _make_optimizer(cfg.family, cfg.impl, cfg.optimizer, args.lr)
  if cfg.family == "keras3" and hasattr(opt, "build"):
    opt.build(variables)  # Keras 3 creates its variables up front.
  step = _make_step(cfg.family, cfg.impl, opt, variables, loss_fn)
  if cfg.mode == "function":
    step = tf.function(step)
  elif cfg.mode == "xla":
    step = tf.function(step, jit_compile=True)
  cfg.run = step
  cfg.wait = lambda: variables[-1].numpy()  # Read after the last step's update.


def _prepare_graph(cfg, args, workload):
  """Builds cfg.run as a TF1 Session running the compat.v1 train op."""
  graph = tf.Graph()
  with graph.as_default():
    variables, loss_fn = workload.build()
    opt = _make_optimizer(cfg.family, cfg.impl, cfg.optimizer, args.lr)
    if cfg.impl in FLOORS:
      train_op = _floor_v1(cfg.impl, opt, variables, loss_fn, tensor_loss=True)
    else:
      train_op = opt.minimize(loss_fn(), var_list=variables)
    init = tf.compat.v1.global_variables_initializer()
  session = tf.compat.v1.Session(graph=graph)
  session.run(init)
  cfg.run = lambda: session.run(train_op)


class _Policy:
  """The framework's global dtype policy set to `name` inside the block."""

  def __init__(self, K, name):
    self.K, self.name = K, name

  def __enter__(self):
    self.previous = self.K.mixed_precision.global_policy().name
    self.K.mixed_precision.set_global_policy(self.name)

  def __exit__(self, *exc):
    self.K.mixed_precision.set_global_policy(self.previous)


def _fit_framework(family):
  import keras
  import tf_keras

  return keras if family == "keras3" else tf_keras


def compiled_fit_model(family, impl, optimizer, lr, workload):
  """The workload's model of `family`'s framework, compiled under
  mixed_float16 with that framework's automatic wrapping (`impl` "peer") or
  with ours."""
  K = _fit_framework(family)
  with _Policy(K, "mixed_float16"):
    K.utils.set_random_seed(0)
    model = workload.build(K)
    # OptimizerV2 for tf_keras: the optimizers of TF 2.4, which ours wraps.
    inner = _inner(family, optimizer, lr)
    if impl == "ours":
      from tf_lossscale.keras.mixed_precision import LossScaleOptimizer

      inner = LossScaleOptimizer(inner)  # compile keeps it.
    model.compile(optimizer=inner, loss=K.losses.SparseCategoricalCrossentropy(from_logits=True))
  wrapped = type(model.optimizer).__name__
  if "LossScale" not in wrapped:
    raise NotApplicable(f"compile did not wrap the optimizer ({wrapped})")
  return model


def _prepare_fit(cfg, args, workload):
  """Builds cfg.run as one epoch of `fit` (see `compiled_fit_model`)."""
  model = compiled_fit_model(cfg.family, cfg.impl, cfg.optimizer, args.lr, workload)
  count = workload.batch * workload.steps
  x = workload.inputs(count)
  y = np.random.default_rng(1).integers(0, 10, count).astype(np.int32)

  def epoch():
    model.fit(x, y, batch_size=workload.batch, epochs=1, shuffle=False, verbose=0)

  cfg.run = epoch
  cfg.wait = lambda: np.asarray(model.trainable_variables[-1])
  cfg.steps_per_block = 1


def run_fit_workload(workload, optimizer, args, log):
  """Times one epoch of `fit` per family x (peer, ours), interleaved; the
  first epoch (trace, compile, steps) apart. Times are per step."""
  configs = [
    Config(workload.name, "fit", f, i, optimizer=optimizer, clock=args.clock)
    for f in args.families
    if f in FIT_FAMILIES
    for i in ("peer", "ours")
  ]
  # A first epoch is one measurement, which moves by seconds between runs:
  # each is taken `args.first_epochs` times on a new model, in alternating
  # order, and the median kept. The last model of each is the one timed.
  for repeat in range(args.first_epochs):
    for cfg in configs if repeat % 2 == 0 else configs[::-1]:
      if cfg.status != "ok":
        continue
      try:
        _prepare_fit(cfg, args, workload)
        cfg.first_calls_s.append(_timed(cfg.steps))
        cfg.first_call_s = statistics.median(cfg.first_calls_s)
        log(f"  {cfg.family:8s} {cfg.impl:5s} first epoch {cfg.first_calls_s[-1]:7.2f}s")
      except Exception as exc:  # noqa: BLE001 - reported in the table
        cfg.fail(exc)
        log(f"  {cfg.family:8s} {cfg.impl:5s} {cfg.status}: {cfg.reason}")
        if args.verbose and cfg.status == "fail":
          traceback.print_exc()
  _measure([c for c in configs if c.run is not None], args, per=workload.steps)
  for cfg in configs:
    cfg.run = cfg.wait = None
  return configs


def _measure(live, args, per=None):
  """Runs `args.rounds` rounds of every config's block, in a new random
  order each round; records the time per step and the peak memory."""
  memory = PeakMemory()
  order = random.Random(0)
  for _ in range(args.rounds):
    order.shuffle(live)
    for cfg in live:
      memory.start()
      cpu_start = time.process_time()
      try:
        elapsed = _timed(lambda cfg=cfg: cfg.steps(cfg.steps_per_block))
      except Exception as exc:  # noqa: BLE001 - reported in the table
        cfg.fail(exc)
        continue
      cpu = time.process_time() - cpu_start
      peak = memory.stop()
      if peak is not None:
        cfg.peak_mib = max(cfg.peak_mib or 0.0, peak)
      steps = cfg.steps_per_block * (per or 1)
      cfg.wall_ms.append(elapsed / steps * 1e3)
      cfg.cpu_ms.append(cpu / steps * 1e3)
    live = [c for c in live if c.run is not None]


def _maps_left():
  """How many more memory maps this process may create, or None if unknown.

  XLA on a CPU keeps every function it compiled for the life of the process,
  in about a thousand memory maps for a model like `cnn`; past the kernel's
  limit (`vm.max_map_count`, 65,530 by default) the next compilation crashes
  the process. A run that would get near it is better split: one process per
  workload, family or optimizer, the results merged with `--from-json`.
  """
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      limit = int(f.read())
    with open("/proc/self/maps") as f:
      return limit - sum(1 for _ in f)
  except (OSError, ValueError):
    return None


# Kept free for one more compilation: `cnn` under XLA took 1,200-3,000 maps.
_MAPS_RESERVE = 8000


def _timed(fn):
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def _ops_run(step):
  """The ops one call of `step` runs (a function's or a TF1 graph's), from a
  trace of TensorFlow's profiler (`_count_ops`); None where there is no trace
  to read."""
  try:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
  except ImportError:
    return None
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    try:
      step()
    finally:
      tf.profiler.experimental.stop()
    traces = [
      os.path.join(d, f) for d, _, fs in os.walk(logdir) for f in fs if f.endswith(".xplane.pb")
    ]
    if len(traces) != 1:
      return None
    space = xplane_pb2.XSpace()
    with open(traces[0], "rb") as f:
      space.ParseFromString(f.read())
  return _count_ops(space)


def _count_ops(space):
  """The ops in a profiler trace (an `XSpace`): those the executor ran on the
  host, an event "name:Type" each on its tf_Compute threads, and the kernels
  and copies a GPU ran, an event each on its stream lines (the host's event
  of an op run on a GPU names its kernel instead). The host pays for each op
  and each kernel launch, whatever its size. None where the trace holds neither."""
  count = 0
  for plane in space.planes:
    names = {k: v.name for k, v in plane.event_metadata.items()}
    on_gpu = plane.name.startswith("/device:GPU:")
    for line in plane.lines:
      if on_gpu and line.name.startswith("Stream"):
        count += len(line.events)
      elif line.name.startswith("tf_Compute"):
        count += sum(
          1 for e in line.events if re.fullmatch(r"[^:]+:\w+", names.get(e.metadata_id, ""))
        )
  return count or None


def _families_in(mode, families):
  """The families of `families` that `mode` runs: TF1 Sessions run compat.v1 only."""
  return [f for f in families if mode != "graph" or f == "v1"]


def run_workload_mode(workload, mode, optimizer, args, log):
  """Measures every family x impl of one workload in one mode with one kind of
  inner optimizer, interleaved."""
  families = _families_in(mode, args.families)
  configs = [
    Config(workload.name, mode, f, i, optimizer=optimizer, clock=args.clock)
    for f in families
    for i in IMPLS
  ]
  if mode != "graph":
    try:
      variables, loss_fn = workload.build()
    except Exception as exc:  # noqa: BLE001 - reported in the table
      for cfg in configs:
        cfg.fail(exc)
      return configs
  # A first call is one measurement, and it moves by tenths of its time
  # between runs and with what ran before it: each is taken
  # `args.first_calls` times on a new optimizer and function, in alternating
  # order, and the median kept. The last one of each is the one timed.
  for repeat in range(args.first_calls):
    for cfg in configs if repeat % 2 == 0 else configs[::-1]:
      if cfg.status != "ok":
        continue
      try:
        left = _maps_left() if mode == "xla" else None
        if left is not None and left < _MAPS_RESERVE:
          raise NotApplicable(
            f"{left} memory maps left to this process, fewer than {_MAPS_RESERVE} (XLA keeps "
            "what it compiled): run fewer workloads, families or optimizers per process"
          )
        if mode == "graph":
          _prepare_graph(cfg, args, workload)
        else:
          _prepare(cfg, args, variables, loss_fn)
        gc.collect()  # Not charged the garbage of the configurations before it.
        cfg.first_calls_s.append(_timed(cfg.steps))
        cfg.first_call_s = statistics.median(cfg.first_calls_s)
      except Exception as exc:  # noqa: BLE001 - reported in the table
        cfg.fail(exc)
        cfg.run = None
        log(f"  {cfg.family:8s} {cfg.impl:5s} {cfg.status}: {cfg.reason}")
        if args.verbose and cfg.status == "fail":
          traceback.print_exc()
  for cfg in configs:
    if cfg.status != "ok":
      continue
    try:
      second = _timed(cfg.steps)
    except Exception as exc:  # noqa: BLE001 - reported in the table
      cfg.fail(exc)
      cfg.run = None
      log(f"  {cfg.family:8s} {cfg.impl:5s} {cfg.status}: {cfg.reason}")
      continue
    cfg.steps_per_block = max(1, min(args.max_steps, round(args.block_seconds / max(second, 1e-6))))
    if mode in ("function", "graph"):
      cfg.ops = _ops_run(cfg.steps)
    firsts = ", ".join(f"{t:.2f}" for t in cfg.first_calls_s)
    log(f"  {cfg.family:8s} {cfg.impl:5s} first call {firsts} s, step {second * 1e3:8.2f} ms")
  _measure([c for c in configs if c.run is not None], args)
  for cfg in configs:
    cfg.run = cfg.wait = None
  return configs


def run_in_child(name, mode, optimizer, families, args, log):
  """`run_workload_mode` for `families` (comma-separated), in a new process:
  what a process built and compiled stays until it ends (a full run in one
  process grew to 17 GB; for XLA see `_maps_left`)."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "child.json")
    argv = [sys.executable, os.path.abspath(__file__), f"--workloads={name}", f"--modes={mode}"]
    argv += [f"--optimizer={optimizer}", f"--families={families}", f"--json={path}", "--fit="]
    argv += [f"--rounds={args.rounds}", f"--block-seconds={args.block_seconds}"]
    argv += [f"--max-steps={args.max_steps}", f"--first-calls={args.first_calls}"]
    argv += [f"--clock={args.clock}", f"--lr={args.lr}", "--no-processes", "--child"]
    argv += ["--verbose"] if args.verbose else []
    child = subprocess.run(argv, stdout=subprocess.DEVNULL, check=False)
    try:
      with open(path) as f:
        rows = json.load(f)["results"]
    except (OSError, ValueError):
      rows = []
  if rows:
    return [Config(**{k: v for k, v in r.items() if k != "median_ms"}) for r in rows]
  configs = [
    Config(name, mode, family, i, optimizer=optimizer, clock=args.clock)
    for family in _families_in(mode, families.split(","))
    for i in IMPLS
  ]
  for cfg in configs:
    cfg.fail(RuntimeError(f"its process exited with status {child.returncode}"))
  log(f"  {families} fail: its process exited with status {child.returncode}")
  return configs


# Report.


def _find(configs, row, family, impl):
  for c in configs:
    if (c.workload, c.optimizer, c.mode, c.family, c.impl) == (*row, family, impl):
      return c
  return None


class Notes:
  """Numbered footnotes for the reasons of failed and skipped configurations."""

  def __init__(self):
    self.reasons = {}

  def cell(self, cfg):
    key = f"{cfg.status}: {cfg.reason}"
    number = self.reasons.setdefault(key, len(self.reasons) + 1)
    return f"{cfg.status} [{number}]"

  def text(self):
    return "\n".join(f"[{n}] {reason}" for reason, n in self.reasons.items())


def _ms(cfg, notes):
  if cfg is None:
    return "-"
  if cfg.status != "ok":
    return notes.cell(cfg)
  return f"{cfg.median_ms:.3g}"


def _ratio(a, b, notes):
  if a is None or b is None:
    return "-"
  for cfg in (a, b):
    if cfg.status != "ok":
      return notes.cell(cfg)
  return f"{a.median_ms / b.median_ms:.2f}x"


def _median_interval(values, level=0.95):
  """A distribution-free interval for the median of `values`, at `level`
  confidence: the k-th smallest and the k-th largest of them, for the largest
  k such that the median falls outside with a chance of at most 1 - level
  (twice a Binomial(n, 1/2) tail); with 8 values or fewer, their range
  (below 95% confidence under 6)."""
  n, x = len(values), sorted(values)
  k = 1
  while k < (n + 1) // 2 and 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= 1 - level:
    k += 1
  return x[k - 1], x[n - k]


def _against_peer(ours, peer):
  """ours/peer round by round (the two ran interleaved in each): their median
  with a 95% interval of it (`_median_interval`), and whether ours is at most
  the peer: "yes" when the median ratio is, "noise" when not but the interval
  reaches 1, else "no" (slower than the peer beyond the run's noise)."""
  if ours is None or peer is None or ours.status != "ok" or peer.status != "ok":
    return "-", "-"
  each = [o / p for o, p in zip(ours.times_ms, peer.times_ms, strict=False)]
  if len(each) < 2:
    return "-", "-"
  middle = statistics.median(each)
  low, high = _median_interval(each)
  if middle <= 1:
    verdict = "yes"
  else:
    verdict = "noise" if low <= 1 else "no"
  return f"{middle:.2f} ({low:.2f}–{high:.2f})", verdict


def _overhead(cfg, plain):
  if cfg is None or plain is None or cfg.status != "ok" or plain.status != "ok":
    return None
  return cfg.median_ms / plain.median_ms - 1


def _rows(configs):
  """The (workload, optimizer, mode) rows, in the order they were run."""
  seen = []
  for c in configs:
    if (c.workload, c.optimizer, c.mode) not in seen:
      seen.append((c.workload, c.optimizer, c.mode))
  return seen


def _label(row):
  return " · ".join(row)


def _verdict(peers, ours, floors):
  """The project's early goal for one row: every family's overhead at most half the
  best peer's. Where a family misses it, "floor > ½" (or "floor+cond > ½")
  says that family's own floor (with the conditional) already costs more."""
  peers = [p for p in peers if p is not None]
  if not peers or not ours or None in ours.values():
    return "-"
  half = max(min(peers), 0) / 2
  missing = [f for f, overhead in ours.items() if overhead > half]
  if not missing:
    return "yes"
  for impl, name in zip(FLOORS, ("floor", "floor+cond"), strict=True):
    bounds = [floors[f][impl] for f in missing]
    if None not in bounds and min(bounds) > half:
      return f"no, {name} > ½"
  return "no"


def summary_table(configs, families, notes):
  """Overhead (LSO step / plain step) per workload x mode, peers and ours.

  The floor columns are the lowest floor/plain and floor+cond/plain of the
  families (see `_floor_grads`); the last column is `_verdict`.
  """
  head = ["workload · optimizer · mode"]
  for f in families:
    head += [f"{PEER_NAMES[f]}", f"ours ({f})"]
  head += ["floor", "floor+cond", "ours ≤ ½ best peer"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for key in _rows(configs):
    row = [_label(key)]
    peers, ours, floors = [], {}, {}
    for f in families:
      found = {i: _find(configs, key, f, i) for i in IMPLS}
      plain = found["plain"]
      row += [_ratio(found["peer"], plain, notes), _ratio(found["ours"], plain, notes)]
      if plain is None:
        continue  # No such row for this family (graph mode is compat.v1 only).
      peers.append(_overhead(found["peer"], plain))
      ours[f] = _overhead(found["ours"], plain)
      floors[f] = {impl: _overhead(found[impl], plain) for impl in FLOORS}
    for impl in FLOORS:
      known = [x[impl] for x in floors.values() if x[impl] is not None]
      row.append(f"{1 + min(known):.2f}x" if known else "-")
    row.append(_verdict(peers, ours, floors))
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines)


def detail_table(configs, families, memory_kind, notes):
  head = [
    "workload · optimizer · mode · family",
    "plain ms",
    "floor ms",
    "floor+cond ms",
    "peer ms",
    "ours ms",
    "ours/plain",
    "ours/peer",
    "ours/peer per round: median (95% interval)",
    "ours ≤ peer",
    "first call s (plain/floor/floor+cond/peer/ours)",
    "first call ours/plain (each)",
    "first call floor/plain (each)",
    f"peak MiB, {memory_kind} (plain/peer/ours)",
    "ops run per step (plain/floor+cond/peer/ours)",
  ]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

  for key in _rows(configs):
    for f in families:
      plain, floor, gated, peer, ours = (_find(configs, key, f, i) for i in IMPLS)
      if plain is None:
        continue
      cells = [f"{_label(key)} · {f}", _ms(plain, notes)]
      cells += [_ms(floor, notes), _ms(gated, notes), _ms(peer, notes), _ms(ours, notes)]
      cells += [_ratio(ours, plain, notes), _ratio(ours, peer, notes), *_against_peer(ours, peer)]
      cells += [
        _num((plain, floor, gated, peer, ours), "first_call_s", ".2f"),
        _first_call_ratio(ours, plain),
        _first_call_ratio(floor, plain),
        _num((plain, peer, ours), "peak_mib", ".0f"),
        _num((plain, gated, peer, ours), "ops", "d"),
      ]
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _first_call_ratio(ours, plain):
  """The medians' ratio, then each repeat's (the n-th first call of each)."""
  if not (ours and plain and ours.status == plain.status == "ok" and plain.first_call_s):
    return "-"
  pairs = zip(ours.first_calls_s, plain.first_calls_s, strict=False)
  each = ", ".join(f"{o / p:.2f}" for o, p in pairs if p)
  return f"{ours.first_call_s / plain.first_call_s:.2f}x" + (f" ({each})" if each else "")


def _num(cfgs, attr, fmt):
  out = []
  for c in cfgs:
    value = getattr(c, attr) if c is not None and c.status == "ok" else None
    out.append("-" if value is None else format(value, fmt))
  return "/".join(out)


def fit_table(configs, memory_kind, notes):
  """`fit` under mixed_float16: ours against the framework's own wrapping."""
  head = [
    "model · optimizer · family",
    "peer ms/step",
    "ours ms/step",
    "ours/peer per round: median (95% interval)",
    "ours ≤ peer",
    "first epoch s (peer/ours)",
    "first epoch ours - peer s (each pair)",
    f"peak MiB, {memory_kind} (peer/ours)",
  ]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for key in _rows(configs):
    for f in FIT_FAMILIES:
      peer, ours = (_find(configs, key, f, i) for i in ("peer", "ours"))
      if peer is None:
        continue
      extra = "-"
      if peer.status == ours.status == "ok":
        pairs = zip(ours.first_calls_s, peer.first_calls_s, strict=False)
        each = ", ".join(f"{o - p:+.2f}" for o, p in pairs)
        extra = f"{ours.first_call_s - peer.first_call_s:+.2f} ({each})"
      cells = [f"{key[0]} · {key[1]} · {f}", _ms(peer, notes), _ms(ours, notes)]
      # No ratio of the medians: an epoch on a busy machine runs at one of
      # two speeds, whichever implementation runs, and the medians can fall
      # on different ones; the rounds pair them.
      cells += [*_against_peer(ours, peer), _num((peer, ours), "first_call_s", ".2f"), extra]
      cells.append(_num((peer, ours), "peak_mib", ".0f"))
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _versions():
  import keras

  out = {
    "python": platform.python_version(),
    "tensorflow": tf.__version__,
    "keras": keras.__version__,
  }
  try:
    import tf_keras

    out["tf_keras"] = tf_keras.__version__
  except ImportError:
    out["tf_keras"] = None
  return out


def parse_args(argv):
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--quick", action="store_true", help=f"a run of a few minutes: {QUICK}")
  parser.add_argument(
    "--workloads", help=f"comma-separated, from {','.join(WORKLOADS)}; default {FULL['workloads']}"
  )
  parser.add_argument("--modes", help=f"comma-separated, from {','.join(MODES)}; default all")
  parser.add_argument(
    "--fit",
    help=f"models trained with fit under mixed_float16, comma-separated, from "
    f"{','.join(FIT_WORKLOADS)}; default {FULL['fit']} when neither --workloads nor --modes "
    "is given, else none (none with --quick)",
  )
  parser.add_argument(
    "--fit-optimizer",
    default="adam",
    help=f"the inner optimizers of the fit runs, from {','.join(OPTIMIZERS)}; default %(default)s",
  )
  parser.add_argument(
    "--families", default=",".join(FAMILIES), help="comma-separated, from %(default)s"
  )
  parser.add_argument(
    "--skip", help="comma-separated workload:mode pairs not to run (e.g. vars500:xla)"
  )
  parser.add_argument("--rounds", type=int, help="interleaved rounds; medians are over rounds")
  parser.add_argument(
    "--block-seconds", type=float, help="target time of one config's block of steps per round"
  )
  parser.add_argument("--max-steps", type=int, default=1000, help="most steps in one block")
  parser.add_argument(
    "--first-epochs",
    type=int,
    default=3,
    help="first epochs of fit timed per configuration, each on a new model; the median is "
    "reported (default %(default)s)",
  )
  parser.add_argument(
    "--first-calls",
    type=int,
    help="first calls (trace, compile, one step) timed per configuration, each on a new "
    f"optimizer and function; the median is reported (default {FULL['first_calls']}, "
    f"{QUICK['first_calls']} with --quick)",
  )
  parser.add_argument(
    "--processes",
    action=argparse.BooleanOptionalAction,
    help="run each workload x mode x optimizer in its own process, and under XLA each "
    "family too (default; not with --quick): a process keeps what it built and compiled "
    "until it ends",
  )
  parser.add_argument(
    "--clock",
    choices=("wall", "cpu"),
    default="wall",
    help="what the tables compare: wall time, or the process's CPU time (all threads), "
    "steadier on a machine shared with other work; the JSON holds both",
  )
  parser.add_argument(
    "--optimizer",
    default="momentum,adam",
    help=f"comma-separated inner optimizers, from {','.join(OPTIMIZERS)} "
    "(momentum: SGD with momentum 0.9); default %(default)s",
  )
  parser.add_argument("--lr", type=float, default=1e-4)
  parser.add_argument(
    "--json", help="write all measurements to this file (rewritten as each workload x mode ends)"
  )
  parser.add_argument(
    "--from-json",
    help="print the tables of earlier (possibly incomplete) --json runs, comma-separated, "
    "as one; runs nothing",
  )
  parser.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
  # A run's own process under --processes: its parent logs the headers.
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  defaults = QUICK if args.quick else FULL
  if args.workloads is not None or args.modes is not None:
    defaults = {**defaults, "fit": ""}  # A chosen part of the matrix: no fit unless asked.
  for key, value in defaults.items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  args.workloads = [w for w in args.workloads.split(",") if w]
  args.modes = [m for m in args.modes.split(",") if m]
  args.families = [f for f in args.families.split(",") if f]
  args.optimizer = [o for o in args.optimizer.split(",") if o]
  args.fit = [w for w in args.fit.split(",") if w]
  args.fit_optimizer = [o for o in args.fit_optimizer.split(",") if o]
  args.skip = {tuple(s.split(":")) for s in args.skip.split(",") if s}
  for name, allowed in (
    ("workloads", WORKLOADS),
    ("modes", MODES),
    ("families", FAMILIES),
    ("optimizer", OPTIMIZERS),
    ("fit", FIT_WORKLOADS),
    ("fit_optimizer", OPTIMIZERS),
  ):
    unknown = set(getattr(args, name)) - set(allowed)
    if unknown:
      parser.error(f"unknown {name}: {sorted(unknown)}; allowed: {list(allowed)}")
  return args


def _results(args, configs, seconds, complete):
  return {
    "meta": {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "complete": complete,
      "versions": _versions(),
      "cpus": os.cpu_count(),
      "devices": [d.name for d in tf.config.list_logical_devices()],
      "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
      "memory": PeakMemory().kind,
      "seconds": round(seconds, 1),
      "args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()},
      "workloads": {n: WORKLOADS[n].description for n in args.workloads},
      "fit": {n: FIT_WORKLOADS[n].description for n in args.fit},
    },
    "results": [c.to_json() for c in configs],
  }


def _merged(runs):
  """Several runs' results as one: the first run's settings, every row, the
  seconds added up (see `_maps_left` for why a run is split)."""
  if len(runs) == 1:
    return runs[0]
  meta = dict(runs[0]["meta"])
  meta["seconds"] = round(sum(r["meta"]["seconds"] for r in runs), 1)
  meta["complete"] = all(r["meta"]["complete"] for r in runs)
  loads = [r["meta"]["loadavg"] for r in runs]
  meta["loadavg"] = [max(column) for column in zip(*loads, strict=True)] if all(loads) else None
  return {"meta": meta, "results": [row for r in runs for row in r["results"]]}


def _print_step_tables(configs, meta, notes, out):
  args = meta["args"]
  families = [f for f in FAMILIES if any(c.family == f for c in configs)]
  print(
    f"\nStep time of each LSO / the same optimizer's plain step (median of {args['rounds']} "
    f"interleaved rounds, {args['clock']} clock; momentum: SGD with momentum 0.9):\n",
    file=out,
  )
  print(summary_table(configs, families, notes), file=out)
  other = "cpu" if args["clock"] == "wall" else "wall"
  for cfg in configs:
    cfg.clock = other
  print(f"\nThe same in {other} time:\n", file=out)
  print(summary_table(configs, families, notes), file=out)
  for cfg in configs:
    cfg.clock = args["clock"]
  print(
    f"\nMedian step times, ratios, first call (trace + XLA compile + one step, median of"
    f" {args.get('first_calls', 1)}, each on a new optimizer and function) and peak memory:\n",
    file=out,
  )
  print(detail_table(configs, families, meta["memory"], notes), file=out)


def print_tables(results, out):
  """Prints the markdown tables of a run's results (as `main` returns them)."""
  meta = results["meta"]
  args = meta["args"]
  configs = []
  for row in results["results"]:
    row = {k: v for k, v in row.items() if k != "median_ms"}
    # Runs from before `--optimizer` took a list had one optimizer for all rows.
    row.setdefault("optimizer", args["optimizer"])
    configs.append(Config(**{**row, "clock": args["clock"]}))
  fits = [c for c in configs if c.mode == "fit"]
  configs = [c for c in configs if c.mode != "fit"]
  notes = Notes()
  if configs:
    _print_step_tables(configs, meta, notes, out)
  if fits:
    print(
      f"\nfit under mixed_float16 (median of {args['rounds']} interleaved epochs, time per step,"
      f" {args['clock']} clock; first epoch: trace, compile and the epoch's steps, median of"
      f" {args.get('first_epochs', 1)} on new models):\n",
      file=out,
    )
    print(fit_table(fits, meta["memory"], notes), file=out)
  if notes.reasons:
    print("\n" + notes.text(), file=out)
  versions = meta["versions"]
  print(
    f"\nTF {versions['tensorflow']}, Keras {versions['keras']}, tf_keras {versions['tf_keras']}, "
    f"{meta['cpus']} CPUs, load average (1/5/15 min) {meta['loadavg']}, {meta['seconds']} s"
    + ("" if meta["complete"] else " (incomplete run)")
    + ".",
    file=out,
  )


def main(argv=None, out=sys.stdout):
  """Runs the benchmark, prints its tables; returns the JSON-able results."""
  args = parse_args(argv)
  if args.from_json:
    runs = []
    for path in args.from_json.split(","):
      with open(path) as f:
        runs.append(json.load(f))
    results = _merged(runs)
    print_tables(results, out)
    return results

  def log(msg):
    print(msg, file=sys.stderr, flush=True)

  def save(results):
    if args.json:
      with open(args.json, "w") as f:
        json.dump(results, f, indent=1, default=list)

  start = time.perf_counter()
  # A process's first trace (and first XLA compilation) pays for setup that
  # later ones do not: the first configuration measured would look slow.
  # Each mode first runs the tiny workload once, thrown away (each child of
  # --processes does so itself).
  warm_up = argparse.Namespace(
    **{**vars(args), "rounds": 1, "block_seconds": 0.01, "first_calls": 1}
  )
  for mode in args.modes if args.workloads and not args.processes else ():
    run_workload_mode(WORKLOADS["tiny"], mode, args.optimizer[0], warm_up, lambda msg: None)
  configs = []
  for name in args.workloads:
    for mode in args.modes:
      if (name, mode) in args.skip:
        continue
      for optimizer in args.optimizer:
        if not args.child:
          log(f"{name} · {optimizer} · {mode}")
        if args.processes:
          # Under XLA a process per family (XLA's memory maps, `_maps_left`);
          # elsewhere the families stay interleaved in one.
          groups = args.families if mode == "xla" else [",".join(args.families)]
          for families in groups:
            configs += run_in_child(name, mode, optimizer, families, args, log)
        else:
          configs += run_workload_mode(WORKLOADS[name], mode, optimizer, args, log)
        save(_results(args, configs, time.perf_counter() - start, complete=False))
  for name in args.fit:
    for optimizer in args.fit_optimizer:
      log(f"{name} · {optimizer} · fit")
      configs += run_fit_workload(FIT_WORKLOADS[name], optimizer, args, log)
      save(_results(args, configs, time.perf_counter() - start, complete=False))
  results = _results(args, configs, time.perf_counter() - start, complete=True)
  save(results)
  print_tables(results, out)
  return results


if __name__ == "__main__":
  main()
