"""Every inner optimizer steps as it does unwrapped, to the bit.

Each optimizer class of Keras 3, tf_keras (its new optimizers and the legacy
OptimizerV2 ones) and `tf.compat.v1.train`, and the options that change what an
apply does (EMA, weight decay, clipping, learning-rate schedules), wrapped in
ours and fed the same unscaled gradients as a plain instance: on finite steps
every variable and every optimizer variable comes out bit for bit as the plain
one's; a step with an Inf moves nothing but the step counter, as TF 2.4's
wrapper (the plain instance only counts it). Eagerly, in a `tf.function`,
under XLA, under MirroredStrategy, in `fit` and, for compat.v1 and tf_keras's
legacy optimizers, in a TF1 graph; with dense gradients and with sparse ones
(`tf.IndexedSlices`, as an embedding's). Under XLA on a GPU, where the skip
is a select fused with the update, a step within 2 ulp (`_xla_ulp`); a GPU
runs the tests with deterministic kernels (conftest.py).

A speed-up kept the apply's If a call of its branch functions in a
`tf.function` on a CPU: Grappler's arithmetic optimizer then did not rewrite
the update as in a plain step, and RMSprop, Adadelta, Ftrl and Adafactor came
out 1-2 ulps apart from it.
"""

import contextlib
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
from tf_lossscale._src import fast_paths
from tf_lossscale.compat.v1.mixed_precision import MixedPrecisionLossScaleOptimizer
from tf_lossscale.keras.mixed_precision import LossScaleOptimizer

SHAPES = [(4, 3), (3,), (2, 2, 2, 3)]
SKIPPED = 3  # The step whose gradient holds an Inf.


# Options where the defaults leave part of an update untried.
_OPTIONS = {
  "Adadelta": {"learning_rate": 1.0},
  "RMSprop": {"momentum": 0.5, "centered": True},
  "SGD": {"momentum": 0.9, "nesterov": True},
}


def _keras3_cases():
  names = ["Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "Ftrl", "Lamb"]
  names += ["Lion", "Muon", "Nadam", "RMSprop", "SGD"]
  schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5)
  return [(n, n, _OPTIONS.get(n, {})) for n in names] + [
    ("Adam-ema", "Adam", {"use_ema": True, "ema_overwrite_frequency": 3}),
    ("Adam-weight_decay", "Adam", {"weight_decay": 0.05}),
    ("SGD-clipnorm", "SGD", {"momentum": 0.9, "clipnorm": 0.5}),
    ("Adam-global_clipnorm", "Adam", {"global_clipnorm": 0.5}),
    ("SGD-clipvalue", "SGD", {"clipvalue": 0.01}),
    ("Adam-schedule", "Adam", {"learning_rate": schedule}),
  ]


def _tf_keras_cases(module):
  names = ["Adadelta", "Adagrad", "Adam", "Adamax", "Ftrl", "Nadam", "RMSprop", "SGD"]
  if module is tf_keras.optimizers:
    names.append("AdamW")
  return [(n, n, _OPTIONS.get(n, {})) for n in names]


_V1 = tf.compat.v1.train
V1_CASES = [
  pytest.param(cls, options, id=cls.__name__)
  for cls, options in [
    (_V1.AdadeltaOptimizer, {"learning_rate": 1.0}),
    (_V1.AdagradOptimizer, {"learning_rate": 0.1}),
    (_V1.AdamOptimizer, {}),
    (_V1.FtrlOptimizer, {"learning_rate": 0.1}),
    (_V1.RMSPropOptimizer, {"learning_rate": 0.01, "momentum": 0.5, "centered": True}),
    (_V1.MomentumOptimizer, {"learning_rate": 0.1, "momentum": 0.9, "use_nesterov": True}),
  ]
]

CASES = [
  pytest.param(family, name, options, id=f"{family}-{case}")
  for family, cases in [
    ("keras3", _keras3_cases()),
    ("tf_keras", _tf_keras_cases(tf_keras.optimizers)),
    ("tf_keras_legacy", _tf_keras_cases(tf_keras.optimizers.legacy)),
  ]
  for case, name, options in cases
]
# Each class with its own options only: their sparse updates differ, the
# other options' do not.
CLASS_CASES = [c for c in CASES if c.id.endswith(f"-{c.values[1]}")]
MODULES = {
  "keras3": keras.optimizers,
  "tf_keras": tf_keras.optimizers,
  "tf_keras_legacy": tf_keras.optimizers.legacy,
}


@functools.cache
def _muon_steps_on_tensorflow():
  """Whether this Keras's Muon steps at all on the TensorFlow backend (before
  Keras 3.13 it read a `path` its TensorFlow variables lack: upstream)."""
  try:
    keras.optimizers.Muon().apply_gradients([(tf.ones((2, 2)), keras.Variable(tf.ones((2, 2))))])
  except AttributeError:
    return False
  return True


def _need_working(name):
  if not hasattr(MODULES["keras3"], name):
    pytest.skip(f"this Keras has no {name}")
  if name == "Muon" and not _muon_steps_on_tensorflow():
    pytest.skip("this Keras's Muon cannot step on the TensorFlow backend (upstream)")


def _gradients():
  rng = np.random.default_rng(0)
  steps = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(6)]
  steps[SKIPPED][1][0] = np.inf
  return steps


def _initial_values():
  rng = np.random.default_rng(1)
  return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _values(optimizer):
  variables = optimizer.variables
  return [np.asarray(v.numpy()) for v in (variables() if callable(variables) else variables)]


def _xla_ulp():
  """The ulps a step of ours may differ by under XLA: on a GPU the skip is a
  select XLA fuses with the update (`fast_paths`), whose multiply-adds then
  round apart from the plain step's (1 ulp on an H200, where the same steps
  in a `tf.function` matched bit for bit: docs/benchmarks.md, fifteenth
  section). On a CPU none."""
  return 0 if fast_paths._cpu_only() else 2  # pylint: disable=protected-access


def _assert_same(ours, plain, max_ulp=0):
  assert len(ours) == len(plain)
  for a, b in zip(ours, plain, strict=True):
    if max_ulp:
      np.testing.assert_array_max_ulp(a, b, maxulp=max_ulp)
    else:
      np.testing.assert_array_equal(a, b)


def _plain_step_or_skip(step, grads, name):
  """Runs the plain optimizer's step; skips the test where TensorFlow has no
  kernel for it on this machine (on a GPU, tf_keras's legacy centered RMSprop
  with sparse gradients: its sparse update runs on CPUs only)."""
  try:
    step(grads)
  except tf.errors.InvalidArgumentError as exc:
    if fast_paths._cpu_only() or "Cannot assign a device" not in str(exc):  # pylint: disable=protected-access
      raise
    pytest.skip(f"the plain {name} cannot step on this machine: {str(exc).splitlines()[0][:200]}")


def _dense(grads, skipped):
  del skipped  # The Inf is in the second gradient already.
  return [tf.constant(g) for g in grads]


def _sparse(grads, skipped):
  """The first gradient as IndexedSlices of three rows, one index twice (as
  an embedding's gradient); on the skipped step the Inf is in them alone."""
  values, others = grads[0][:3].copy(), [g.copy() for g in grads[1:]]
  if skipped:
    others[0][0], values[1, 0] = 0.5, np.inf
  rows = tf.IndexedSlices(tf.constant(values), tf.constant([0, 2, 0]), tf.constant(SHAPES[0]))
  return [rows, *(tf.constant(g) for g in others)]


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize(("family", "name", "options"), CASES)
def test_steps_as_the_plain_optimizer(family, name, options, mode):
  max_ulp = _xla_ulp() if mode == "xla" else 0
  _steps_as_the_plain_optimizer(family, name, options, mode, _dense, max_ulp)


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize(("family", "name", "options"), CLASS_CASES)
def test_steps_with_sparse_gradients_as_the_plain_optimizer(family, name, options, mode):
  if family == "tf_keras_legacy" and mode == "xla" and name not in ("Adam", "Adamax", "Nadam"):
    pytest.skip("XLA cannot compile this optimizer's sparse update, unwrapped either (upstream)")
  # Under XLA a step's rounding follows how XLA fuses it (unwrapped, Keras 3's
  # sparse RMSprop and Adadelta steps differ from their tf.function numbers by
  # 1 ulp in about 30 elements); before TensorFlow 2.20 XLA fused those updates
  # otherwise inside a conditional, Keras 3's own wrapper's too: 1 ulp apart.
  version = tuple(int(x) for x in tf.__version__.split(".")[:2])
  loose = mode == "xla" and family == "keras3" and name in ("RMSprop", "Adadelta")
  max_ulp = max(1 if loose and version < (2, 20) else 0, _xla_ulp() if mode == "xla" else 0)
  _steps_as_the_plain_optimizer(family, name, options, mode, _sparse, max_ulp)


def _steps_as_the_plain_optimizer(family, name, options, mode, to_tensors, max_ulp=0):
  cls = getattr(MODULES[family], name, None)
  if family == "keras3":
    _need_working(name)
    # Keras 3 variables: Muon reads their paths, Adafactor their names.
    ours_vars = [keras.Variable(x, name=f"a{i}") for i, x in enumerate(_initial_values())]
    plain_vars = [keras.Variable(x, name=f"b{i}") for i, x in enumerate(_initial_values())]
  else:
    ours_vars = [tf.Variable(x) for x in _initial_values()]
    plain_vars = [tf.Variable(x) for x in _initial_values()]
  ours = LossScaleOptimizer(cls(**options), initial_scale=16.0, dynamic_growth_steps=2)
  plain = cls(**options)

  def step_ours(grads):
    ours.apply_gradients(zip(grads, ours_vars, strict=True))

  def step_plain(grads):
    plain.apply_gradients(zip(grads, plain_vars, strict=True))

  if mode != "eager":
    step_ours = tf.function(step_ours, jit_compile=mode == "xla")
    step_plain = tf.function(step_plain, jit_compile=mode == "xla")
  for i, grads in enumerate(_gradients()):
    if i == SKIPPED:
      plain.iterations.assign_add(1)
    else:
      _plain_step_or_skip(step_plain, to_tensors(grads, False), name)
    step_ours(to_tensors(grads, i == SKIPPED))
  if options.get("use_ema"):
    ours.finalize_variable_values(ours_vars)
    plain.finalize_variable_values(plain_vars)
  _assert_same([v.numpy() for v in ours_vars], [v.numpy() for v in plain_vars], max_ulp)
  _assert_same(_values(ours.inner_optimizer), _values(plain), max_ulp)
  # Doubled after steps 0 and 1, halved by the skip (step 3), doubled after 4 and 5.
  assert float(ours.loss_scale) == 32.0


@pytest.mark.parametrize("to_tensors", [_dense, _sparse], ids=["dense", "sparse"])
@pytest.mark.parametrize("name", ["RMSprop", "Adadelta", "Ftrl"])
def test_steps_as_the_plain_optimizer_under_mirrored_strategy(name, to_tensors):
  cls = getattr(keras.optimizers, name)
  mirrored_strategy = helpers.make_strategy("mirrored")
  helpers.need_plain_keras3_all_reduce(mirrored_strategy)
  with mirrored_strategy.scope():
    ours_vars = [tf.Variable(x) for x in _initial_values()]
    plain_vars = [tf.Variable(x) for x in _initial_values()]
    ours = LossScaleOptimizer(cls(), initial_scale=16.0, dynamic_growth_steps=2)
    plain = cls()
    # Built here: Keras 3 cannot make its slots in a replica function.
    ours.build(ours_vars)
    plain.build(plain_vars)

  for i, grads in enumerate(_gradients()):
    # Made in each replica (Keras 3 itself cannot all-reduce a function's
    # argument there): each replica's gradient is the same, their sum twice it.
    def replica_step(optimizer, variables, grads=grads, skipped=i == SKIPPED):
      optimizer.apply_gradients(zip(to_tensors(grads, skipped), variables, strict=True))

    if i == SKIPPED:
      plain.iterations.assign_add(1)
    else:
      try:
        tf.function(lambda: mirrored_strategy.run(replica_step, args=(plain, plain_vars)))()
      except ValueError as e:  # Keras < 3.10: "Cannot convert a partially known TensorShape".
        if i or to_tensors is _dense or "partially known" not in str(e):
          raise
        pytest.skip(f"this Keras's {name} cannot apply sparse gradients here (upstream)")
    tf.function(lambda: mirrored_strategy.run(replica_step, args=(ours, ours_vars)))()
  _assert_same([v.numpy() for v in ours_vars], [v.numpy() for v in plain_vars])
  _assert_same(_values(ours.inner_optimizer), _values(plain))


def _v1_state(optimizer, variables):
  """The variables, then each one's slots."""
  slots = [optimizer.get_slot(v, name) for name in optimizer.get_slot_names() for v in variables]
  return [*variables, *slots]


def _steps_in_a_session(ours, plain, ours_vars, plain_vars, fetches, plain_skip=None):
  """The steps of `_gradients()` in the default (TF1) graph, fed to both
  optimizers, but the skipped one to `ours` alone (`plain` runs the op of
  `plain_skip` then, if any); then what `fetches()` returns (called once the
  optimizers have made their slots), evaluated."""
  feeds = [tf.compat.v1.placeholder(tf.float32, s) for s in SHAPES]
  ours_op = ours.apply_gradients(list(zip(feeds, ours_vars, strict=True)))
  plain_op = plain.apply_gradients(list(zip(feeds, plain_vars, strict=True)))
  skip_op = plain_skip() if plain_skip else tf.no_op()
  with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    for i, grads in enumerate(_gradients()):
      feed = dict(zip(feeds, grads, strict=True))
      session.run(ours_op, feed)
      session.run(skip_op if i == SKIPPED else plain_op, feed)
    return session.run(fetches())


@pytest.mark.parametrize("mode", ["graph", "function", "xla"])
@pytest.mark.parametrize(("cls", "options"), V1_CASES)
def test_compat_v1_steps_as_the_plain_optimizer(cls, options, mode):
  graph = tf.Graph() if mode == "graph" else None
  with graph.as_default() if graph else contextlib.nullcontext():
    ours_vars = [tf.Variable(x) for x in _initial_values()]
    plain_vars = [tf.Variable(x) for x in _initial_values()]
    ours_inner, plain = cls(**options), cls(**options)
    ours = MixedPrecisionLossScaleOptimizer(ours_inner, "dynamic")
    if graph:
      ours_state, plain_state = _steps_in_a_session(
        ours,
        plain,
        ours_vars,
        plain_vars,
        fetches=lambda: [_v1_state(ours_inner, ours_vars), _v1_state(plain, plain_vars)],
      )
    else:

      @tf.function(jit_compile=mode == "xla")
      def step(grads, finite):
        ours.apply_gradients(list(zip(grads, ours_vars, strict=True)))
        if finite:
          plain.apply_gradients(list(zip(grads, plain_vars, strict=True)))

      for i, grads in enumerate(_gradients()):
        step([tf.constant(g) for g in grads], i != SKIPPED)
      ours_state = [v.numpy() for v in _v1_state(ours_inner, ours_vars)]
      plain_state = [v.numpy() for v in _v1_state(plain, plain_vars)]
  assert len(ours_state) > len(ours_vars)  # Each of these has slots.
  _assert_same(ours_state, plain_state, _xla_ulp() if mode == "xla" else 0)


@pytest.mark.parametrize(
  ("name", "options"),
  [pytest.param(n, o, id=n) for _, n, o in _tf_keras_cases(tf_keras.optimizers.legacy)],
)
def test_tf_keras_legacy_steps_as_the_plain_optimizer_in_a_tf1_graph(name, options):
  # There one Switch gates the apply: the update's ops wait on its pivot.
  cls = getattr(tf_keras.optimizers.legacy, name)
  with tf.Graph().as_default():
    ours_vars = [tf.Variable(x) for x in _initial_values()]
    plain_vars = [tf.Variable(x) for x in _initial_values()]
    ours = LossScaleOptimizer(cls(**options), initial_scale=16.0, dynamic_growth_steps=2)
    plain = cls(**options)
    ours_state, plain_state, scale = _steps_in_a_session(
      ours,
      plain,
      ours_vars,
      plain_vars,
      fetches=lambda: [
        [*ours_vars, *ours.inner_optimizer.variables()],
        [*plain_vars, *plain.variables()],
        ours.loss_scale,
      ],
      plain_skip=lambda: plain.iterations.assign_add(1),
    )
  assert len(ours_state) > len(ours_vars) + 1  # Slots, not just iterations.
  _assert_same(ours_state, plain_state)
  assert scale == 32.0


def _fit_weights(framework, optimizer, jit_compile):
  """A small model's weights after two epochs of `fit` with `optimizer`."""
  rng = np.random.default_rng(2)
  x, y = rng.random((32, 8), np.float32), rng.random((32, 4), np.float32)
  framework.utils.set_random_seed(1)
  layers = framework.layers
  model = framework.Sequential([framework.Input((8,)), layers.Dense(16), layers.Dense(4)])
  model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
  model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
  return [w.numpy() for w in model.weights]


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize(
  ("family", "name"),
  [("keras3", "RMSprop"), ("keras3", "Adam"), ("keras3", "Muon")]
  + [("tf_keras_legacy", "RMSprop"), ("tf_keras_legacy", "Ftrl"), ("tf_keras", "Adadelta")],
)
def test_fit_steps_as_the_plain_optimizer(family, name, jit_compile):
  # No step overflows at the default scale, 2**15: each scaled gradient is
  # exactly the plain one times the scale, and its unscale exact.
  if family == "keras3":
    _need_working(name)
  cls = getattr(MODULES[family], name)
  framework = keras if family == "keras3" else tf_keras
  ours = _fit_weights(framework, LossScaleOptimizer(cls()), jit_compile)
  _assert_same(ours, _fit_weights(framework, cls(), jit_compile))


def _every_class():
  for family, module in MODULES.items():
    base = tf_keras.optimizers.legacy.Optimizer if family == "tf_keras_legacy" else module.Optimizer
    for name, klass in sorted(vars(module).items()):
      if isinstance(klass, type) and issubclass(klass, base) and klass is not base:
        if not issubclass(klass, (keras.optimizers.LossScaleOptimizer, LossScaleOptimizer)):
          yield pytest.param(klass, id=f"{family}-{name}")


@pytest.mark.parametrize("klass", list(_every_class()))
def test_every_class_comes_back_from_its_config(klass):
  """tf_keras's `deserialize` knows neither Adafactor nor Lion: wrapped, they
  came back as their names ("must be an instance of Optimizer, got: Lion")."""
  try:
    inner = klass()
  except (TypeError, ValueError) as exc:  # One that needs arguments (MultiOptimizer).
    pytest.skip(f"{klass.__name__}() needs arguments: {exc}")
  config = LossScaleOptimizer(inner, initial_scale=8).get_config()
  for cls in (LossScaleOptimizer, type(LossScaleOptimizer(klass()))):
    clone = cls.from_config(config)
    assert type(clone.inner_optimizer) is klass
    assert clone.inner_optimizer.get_config() == inner.get_config()
