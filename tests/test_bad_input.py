"""Bad input (issue 19): a clear error before anything changes.

Each row gives an API a bad argument or bad gradients and asserts the error
type, that the message names the value passed and what is allowed, and that
nothing changed: variables, slots, the loss scale and its counter,
`iterations` / `global_step`, under the default strategy and MirroredStrategy,
eagerly, in a tf.function (where the error comes at trace time) and in TF1
graphs. Then the inputs that look odd but must keep working.

TF 2.4 accepted every bad constructor argument below (and TF's and tf_keras's
classes still do: `test_tf_classes_accept_what_we_reject`); those errors are
deliberate differences.
"""

import contextlib
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from tensorflow.python.training.experimental import loss_scale as tf_loss_scale
from test_keras_lso import FAMILIES, count, locals_of, make_inner, shared_strategy

import helpers
import tf_lossscale
from tf_lossscale import loss_scale
from tf_lossscale.keras import mixed_precision

NAN = float("nan")
INF = float("inf")
HUGE = 1e39  # A finite Python float, Inf as a float32 (the scale's dtype).
LSO = mixed_precision.LossScaleOptimizer
ExperimentalLSO = mixed_precision.experimental.LossScaleOptimizer
MPLSO = tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGIES = ["default", "mirrored"]


def _positive(name, value):
  if value == HUGE:
    return f"{name} must be at most the float32 maximum, 3.4028234663852886e+38, got 1e+39"
  return f"{name} must be a finite number > 0, got {value!r}"


def _exactly(message):
  return f"^{re.escape(message)}$"


# --- Constructors -------------------------------------------------------------

KERAS_ROWS = {
  "dynamic_initial_scale_nan": (dict(initial_scale=NAN), _positive("initial_scale", NAN)),
  "dynamic_initial_scale_inf": (dict(initial_scale=INF), _positive("initial_scale", INF)),
  "dynamic_initial_scale_huge": (dict(initial_scale=HUGE), _positive("initial_scale", HUGE)),
  "dynamic_initial_scale_zero": (dict(initial_scale=0), _positive("initial_scale", 0)),
  "dynamic_initial_scale_negative": (dict(initial_scale=-8.0), _positive("initial_scale", -8.0)),
  "fixed_scale_zero": (dict(dynamic=False, initial_scale=0), _positive("initial_scale", 0)),
  "fixed_scale_nan": (dict(dynamic=False, initial_scale=NAN), _positive("initial_scale", NAN)),
  "fixed_scale_inf": (dict(dynamic=False, initial_scale=INF), _positive("initial_scale", INF)),
  "fixed_scale_huge": (dict(dynamic=False, initial_scale=HUGE), _positive("initial_scale", HUGE)),
  "fixed_scale_negative": (dict(dynamic=False, initial_scale=-1), _positive("initial_scale", -1)),
}
EXPERIMENTAL_ROWS = {f"loss_scale_{v!r}": v for v in (0, NAN, INF, -2.0, HUGE)}


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("row", KERAS_ROWS)
def test_keras_constructor_rejects(row, family, strategy_name):
  kwargs, message = KERAS_ROWS[row]
  with shared_strategy(strategy_name).scope():
    inner = make_inner(family)
    with pytest.raises(ValueError, match=_exactly(message)):
      LSO(inner, **kwargs)
    LSO(inner)  # The refused wrapper left no mark on the inner optimizer.


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("row", EXPERIMENTAL_ROWS)
def test_experimental_constructor_rejects(row, family, strategy_name):
  value = EXPERIMENTAL_ROWS[row]
  with shared_strategy(strategy_name).scope():
    inner = make_inner(family)
    with pytest.raises(ValueError, match=_exactly(_positive("loss_scale", value))):
      ExperimentalLSO(inner, value)
    ExperimentalLSO(inner, "dynamic")


def _backend_message(backend):
  return (
    f"LossScaleOptimizer needs Keras's TensorFlow backend, but Keras {keras.__version__} runs "
    f"on its '{backend}' backend (chosen by the KERAS_BACKEND environment variable or "
    "keras.json), so <keras"
  )


@pytest.mark.parametrize("make", [LSO, lambda inner: ExperimentalLSO(inner, "dynamic")])
def test_keras_of_another_backend_is_refused_before_anything_changes(make, monkeypatch):
  """Under KERAS_BACKEND=jax (say), Keras 3's optimizers update jax arrays: no
  TensorFlow op can skip their step."""
  inner = keras.optimizers.SGD(0.1)
  with monkeypatch.context() as patched:
    patched.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(TypeError, match=re.escape(_backend_message("jax"))):
      make(inner)
  make(inner)


def _multiplier_message(value):
  if value == HUGE:
    return "multiplier must be at most the float32 maximum, 3.4028234663852886e+38, got 1e+39"
  return f"multiplier must be a finite number > 1, got {value!r}"


_HUGE_FIXED = (
  "loss_scale_value must be at most the float32 maximum, 3.4028234663852886e+38. Got: 1e+39"
)

# (constructor of a legacy module's class, its error message)
LEGACY_ROWS = {
  **{
    f"dynamic_initial_{v!r}": (
      lambda m, v=v: m.DynamicLossScale(initial_loss_scale=v),
      _positive("initial_loss_scale", v),
    )
    for v in (NAN, INF, 0, -1.0, HUGE)
  },
  **{
    f"dynamic_multiplier_{v!r}": (
      lambda m, v=v: m.DynamicLossScale(multiplier=v),
      _multiplier_message(v),
    )
    for v in (1, 0.5, 0, -2.0, NAN, INF, HUGE)
  },
  # The `< 1` check of TF 2.4 let NaN through; its message is kept.
  "fixed_nan": (lambda m: m.FixedLossScale(NAN), "loss_scale_value must be at least 1. Got: nan"),
  "fixed_inf": (lambda m: m.FixedLossScale(INF), "loss_scale_value must be finite. Got: inf"),
  "fixed_huge": (lambda m: m.FixedLossScale(HUGE), _HUGE_FIXED),
}
# compat.v1 takes anything `loss_scale.get` takes: a number is a FixedLossScale.
COMPAT_V1_ROWS = {
  "nan": (NAN, "loss_scale_value must be at least 1. Got: nan"),
  "inf": (INF, "loss_scale_value must be finite. Got: inf"),
  "huge": (HUGE, _HUGE_FIXED),
  "below_one_as_tf": (0.5, "loss_scale_value must be at least 1. Got: 0.5"),
}


def _in_mode(mode, strategy_name):
  """A context running in a fresh TF1 graph ("graph") or eagerly, in the strategy's scope."""
  stack = contextlib.ExitStack()
  if mode == "graph":
    stack.enter_context(tf.Graph().as_default())
    strategy = helpers.make_strategy(strategy_name)
  else:
    strategy = shared_strategy(strategy_name)
  stack.enter_context(strategy.scope())
  return stack


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("row", LEGACY_ROWS)
def test_legacy_loss_scale_constructor_rejects(row, strategy_name, mode):
  build, message = LEGACY_ROWS[row]
  with _in_mode(mode, strategy_name):
    with pytest.raises(ValueError, match=_exactly(message)):
      build(loss_scale)
    if mode == "graph":
      assert tf.compat.v1.global_variables() == []  # No scale variable half-made.


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("row", COMPAT_V1_ROWS)
def test_compat_v1_constructor_rejects(row, strategy_name, mode):
  value, message = COMPAT_V1_ROWS[row]
  with _in_mode(mode, strategy_name):
    with pytest.raises(ValueError, match=_exactly(message)):
      MPLSO(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), value)
    if mode == "graph":
      assert tf.compat.v1.global_variables() == []


@pytest.mark.parametrize("row", [*LEGACY_ROWS, *(f"keras_{r}" for r in KERAS_ROWS)])
def test_tf_classes_accept_what_we_reject(row):
  """TF's legacy classes and tf_keras's LossScaleOptimizer: no error (TF 2.4 neither)."""
  if row.startswith("keras_"):
    kwargs, _ = KERAS_ROWS[row.removeprefix("keras_")]
    tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(), **kwargs)
  else:
    LEGACY_ROWS[row][0](tf_loss_scale)


@pytest.mark.parametrize("name", ["FixedLossScale", "DynamicLossScale"])
def test_tensorflow_own_loss_scales_are_named_as_such(name):
  """Code migrated in part: TF 2.4's message, and what to pass instead."""
  tf_object = getattr(tf_loss_scale, name)(8)
  hint = re.escape(
    f". It is TensorFlow's own {name}, which tf_lossscale does not take: use "
    f"tf_lossscale.mixed_precision.experimental.{name}, with the same arguments"
  )
  with pytest.raises(ValueError, match=f"^Invalid value passed to loss_scale.*{hint}"):
    ExperimentalLSO(keras.optimizers.SGD(), tf_object)
  with pytest.raises(ValueError, match=f"^Could not interpret loss scale identifier.*{hint}"):
    MPLSO(tf.compat.v1.train.GradientDescentOptimizer(0.1), tf_object)


# --- Constructor inputs that must keep working --------------------------------

COEFFS = np.array([1.0, -2.0], np.float32)


def _minimize_once(opt, strategy, var, grad_scale=1.0):
  """One step on sum(var * COEFFS * grad_scale); returns replica 0's variable."""
  strategy.run(
    lambda: opt.minimize(lambda: tf.reduce_sum(var * COEFFS * grad_scale), var_list=[var])
  )
  return strategy.experimental_local_results(var)[0].numpy()


KERAS_VALID = {
  "dynamic_half": (dict(initial_scale=0.5), 0.5),
  "dynamic_int": (dict(initial_scale=8), 8.0),
  "dynamic_numpy": (dict(initial_scale=np.float32(4.0)), 4.0),
  "fixed_half": (dict(dynamic=False, initial_scale=0.5), 0.5),
  "fixed_one": (dict(dynamic=False, initial_scale=1), 1.0),
  "fixed_int": (dict(dynamic=False, initial_scale=3), 3.0),
}


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", KERAS_VALID)
def test_keras_odd_but_valid_scales_train(case, family, strategy_name):
  kwargs, scale = KERAS_VALID[case]
  strategy = shared_strategy(strategy_name)
  with strategy.scope():
    opt = LSO(make_inner(family, learning_rate=1.0), **kwargs)
    var = tf.Variable([1.0, 2.0])
  assert opt.initial_scale == scale and isinstance(opt.initial_scale, float)
  applied = _minimize_once(opt, strategy, var)
  np.testing.assert_allclose(applied, [1.0, 2.0] - strategy.num_replicas_in_sync * COEFFS)
  assert float(opt.loss_scale) == scale
  if opt.dynamic:
    _minimize_once(opt, strategy, var, grad_scale=NAN)
    assert float(opt.loss_scale) == max(scale / 2, 1.0)  # TF 2.4's floor of 1


@pytest.mark.parametrize("value", [0.5, 1, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_experimental_odd_but_valid_scales_train(family, value):
  opt = ExperimentalLSO(make_inner(family, learning_rate=1.0), value)
  assert (opt.dynamic, opt.initial_scale) == (False, float(value))
  var = tf.Variable([1.0, 2.0])
  np.testing.assert_allclose(
    _minimize_once(opt, tf.distribute.get_strategy(), var), [1.0, 2.0] - COEFFS
  )


LEGACY_VALID = {
  "dynamic_half": dict(initial_loss_scale=0.5, increment_period=2),
  "dynamic_int": dict(initial_loss_scale=3, increment_period=1, multiplier=3),
  "dynamic_multiplier_1_5": dict(initial_loss_scale=4.0, increment_period=1, multiplier=1.5),
}


@pytest.mark.parametrize("case", LEGACY_VALID)
def test_legacy_odd_but_valid_dynamic_scales_follow_tf(case):
  runs = []
  for module in (loss_scale, tf_loss_scale):
    ls = module.DynamicLossScale(**LEGACY_VALID[case])
    history = []
    for grad in [1.0, 1.0, NAN, 1.0, INF, INF]:
      _, applied = ls.update([tf.constant(grad)])
      history.append((bool(applied), float(ls()), count(ls._num_good_steps)))
    runs.append(history)
  assert runs[0] == runs[1]


@pytest.mark.parametrize("value", [1, 3, 2.5])
def test_legacy_fixed_scales_at_least_one_work(value):
  ls = loss_scale.FixedLossScale(value)
  assert float(ls()) == float(value) and repr(ls) == f"FixedLossScale({float(value)})"
  assert ls.update([tf.constant(NAN)])[1] is True


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize(
  "make_scale",
  [lambda: 1, lambda: loss_scale.DynamicLossScale(0.5)],
  ids=["fixed_1", "dynamic_half"],
)
def test_compat_v1_odd_but_valid_scales_train(make_scale, strategy_name):
  strategy = shared_strategy(strategy_name)
  with strategy.scope():
    opt = MPLSO(tf.compat.v1.train.GradientDescentOptimizer(1.0), make_scale())
    var = tf.Variable([1.0, 2.0])
  applied = _minimize_once(opt, strategy, var)
  np.testing.assert_allclose(applied, [1.0, 2.0] - strategy.num_replicas_in_sync * COEFFS)


# --- Bad gradients ------------------------------------------------------------

GRADIENT_FAMILIES = [*FAMILIES, "compat_v1"]
# Keras 3 and the new tf_keras optimizers do not run in TF1 graphs.
MODES = {
  "keras3": ["eager", "function"],
  "tf_keras": ["eager", "function", "graph"],
  "tf_keras_new": ["eager", "function"],
  "compat_v1": ["eager", "function", "graph"],
}


class Trainer:
  """Variables a, b, c (float32, shape [2]) and an optimizer with momentum slots.

  The optimizer has taken one step on a and b (its slots exist; c is new to
  it). `apply` runs `apply_gradients` on every replica eagerly, in a
  tf.function or through a TF1 Session; `state` reads everything a step may
  change.
  """

  def __init__(self, family, strategy_name, mode):
    self.family, self.mode = family, mode
    self.graph = tf.Graph() if mode == "graph" else None
    with self._context():
      self.strategy = (
        helpers.make_strategy(strategy_name) if self.graph else shared_strategy(strategy_name)
      )
      with self.strategy.scope():
        self.vars = {n: tf.Variable(np.ones(2, np.float32), name=n) for n in "abc"}
        if family == "compat_v1":
          self.step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
          )
          self.opt = MPLSO(
            tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
            loss_scale.DynamicLossScale(8.0, increment_period=100),
          )
        else:
          self.opt = LSO(
            make_inner(family, learning_rate=0.1, momentum=0.9),
            initial_scale=8.0,
            dynamic_growth_steps=100,
          )
      if self.graph:
        self.sess = tf.compat.v1.Session(graph=self.graph)
        self.sess.run(tf.compat.v1.global_variables_initializer())
    self.apply(lambda v: [(tf.ones([2]), v["a"]), (tf.ones([2]), v["b"])])

  def _context(self):
    return self.graph.as_default() if self.graph else contextlib.nullcontext()

  def apply(self, grads_and_vars):
    """`apply_gradients(grads_and_vars(self.vars))` on every replica."""

    def replica_fn():
      pairs = grads_and_vars(self.vars)
      if self.family == "compat_v1":
        return self.opt.apply_gradients(pairs, global_step=self.step)
      return self.opt.apply_gradients(pairs)

    if self.mode == "eager":
      self.strategy.run(replica_fn)
    elif self.mode == "function":
      tf.function(lambda: [self.strategy.run(replica_fn)][:0])()
    else:
      with self._context(), self.strategy.scope():
        known = set(map(id, tf.compat.v1.global_variables()))
        op = tf.group(self.strategy.experimental_local_results(self.strategy.run(replica_fn)))
        new = [v for v in tf.compat.v1.global_variables() if id(v) not in known]
        self.sess.run(tf.compat.v1.variables_initializer(new))
      self.sess.run(op)

  def _tracked(self):
    opt = self.opt
    if self.family == "compat_v1":
      scale = opt._loss_scale
      return [*opt.variables(), scale(), scale._num_good_steps, self.step]
    inner = opt.inner_optimizer
    slots = inner.variables() if self.family == "tf_keras" else list(inner.variables)
    return [*slots, opt.loss_scale, opt.dynamic_counter, opt.iterations]

  def state(self):
    """Every replica's value of the variables, the optimizer's variables
    (slots, iterations), scale, counter and step; and the number of
    optimizer variables."""
    with self._context():
      tracked = [*self.vars.values(), *self._tracked()]
      values = [x.value if isinstance(x, keras.Variable) else x for x in tracked]
      components = [c for x in values for c in self.strategy.experimental_local_results(x)]
      if self.graph:
        read = self.sess.run([tf.convert_to_tensor(c) for c in components])
      else:
        read = [tf.convert_to_tensor(c).numpy() for c in components]
      return [np.asarray(r).tolist() for r in read], len(self._tracked())


def _names(*keys):
  return lambda v: [re.escape(v[k].name) for k in keys]


SHAPES_NAMED = [re.escape("(3,)"), re.escape("(2,)")]
PAIRS_NAMED = [re.escape("(gradient, variable) pairs"), "Tensor"]
# row: (families, gradients, error type, regexes the message must match)
GRADIENT_ROWS = {
  "shape_mismatch_second_pair": (
    GRADIENT_FAMILIES,
    lambda v: [(tf.ones([2]), v["a"]), (tf.ones([3]), v["b"])],
    ValueError,
    lambda v: [*_names("b")(v), *SHAPES_NAMED],
  ),
  "sparse_values_shape_mismatch": (
    GRADIENT_FAMILIES,
    lambda v: [
      (tf.ones([2]), v["a"]),
      (tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([2])), v["b"]),
    ],
    ValueError,
    lambda v: [*_names("b")(v), "IndexedSlices", re.escape("(1, 2)"), re.escape("(2,)")],
  ),
  "unknown_variable": (
    ["keras3", "tf_keras_new"],  # OptimizerV2 and compat.v1 make slots for it
    lambda v: [(tf.ones([2]), v["c"])],
    ValueError,
    lambda v: [*_names("c")(v), "buil[dt]"],
  ),
  "bare_gradients": (
    GRADIENT_FAMILIES,
    lambda v: [tf.ones([2]), tf.ones([2])],
    TypeError,
    lambda v: PAIRS_NAMED,
  ),
  "bare_scalar_gradient": (
    GRADIENT_FAMILIES,
    lambda v: [tf.ones([])],
    TypeError,
    lambda v: PAIRS_NAMED,
  ),
  "tensor_for_variable": (
    GRADIENT_FAMILIES,
    lambda v: [(tf.ones([2]), v["a"]), (tf.ones([2]), tf.ones([2]))],
    TypeError,
    lambda v: [
      re.escape("(gradient, variable) pairs"),
      "second item is a .*Tensor, not a variable",
    ],
  ),
  "triple": (
    GRADIENT_FAMILIES,
    lambda v: [(tf.ones([2]), v["a"], tf.ones([2]))],
    TypeError,
    lambda v: PAIRS_NAMED,
  ),
  # A list or a number has a shape too: it was applied to the first variable
  # before its own failed (tf_keras's wrapper counted the step as well).
  "python_list_shape_mismatch_second_pair": (
    GRADIENT_FAMILIES,
    lambda v: [(tf.ones([2]), v["a"]), ([1.0, 1.0, 1.0], v["b"])],
    ValueError,
    lambda v: [*_names("b")(v), *SHAPES_NAMED],
  ),
  "python_number_second_pair": (
    GRADIENT_FAMILIES,
    lambda v: [(tf.ones([2]), v["a"]), (1.0, v["b"])],
    ValueError,
    lambda v: [*_names("b")(v), re.escape("shape ()"), re.escape("(2,)")],
  ),
  # Keras 3 takes any dtype: a string one failed deep in the check.
  "string_gradient_second_pair": (
    GRADIENT_FAMILIES,
    lambda v: [(tf.ones([2]), v["a"]), (tf.constant(["x", "y"]), v["b"])],
    TypeError,
    lambda v: [*_names("b")(v), "string", "tensor of numbers"],
  ),
  "float64_gradient_second_pair": (
    ["tf_keras", "tf_keras_new"],  # compat_v1: see test_compat_v1_float64_gradient_*
    lambda v: [(tf.ones([2]), v["a"]), (tf.ones([2], tf.float64), v["b"])],
    TypeError,
    lambda v: [*_names("b")(v), "float64", "float32"],
  ),
  "empty": (
    ["keras3"],  # The others take an empty list as TF 2.4 did: see below.
    lambda v: [],
    ValueError,
    lambda v: ["No gradients provided for any variable"],
  ),
  "empty_compat_v1": (["compat_v1"], lambda v: [], ValueError, lambda v: ["No variables provided"]),
  "all_none": (
    GRADIENT_FAMILIES,
    lambda v: [(None, v["a"]), (None, v["b"])],
    ValueError,
    lambda v: ["No gradients provided for any variable", *_names("a", "b")(v)],
  ),
}


def check_bad_gradients(row, family, strategy_name, mode):
  """Asserts that row `row` raises its error and leaves every state as it was."""
  _, grads_and_vars, error, patterns = GRADIENT_ROWS[row]
  trainer = Trainer(family, strategy_name, mode)
  before = trainer.state()
  with pytest.raises(error) as raised:
    trainer.apply(grads_and_vars)
  message = str(raised.value)
  for pattern in patterns(trainer.vars):
    assert re.search(pattern, message), f"{pattern!r} not in the message: {message}"
  assert trainer.state() == before


def _gradient_cases():
  for row, (families, *_) in GRADIENT_ROWS.items():
    for family in families:
      for mode in MODES[family]:
        for strategy_name in STRATEGIES:
          yield pytest.param(
            row, family, strategy_name, mode, id=f"{row}-{family}-{strategy_name}-{mode}"
          )


@pytest.mark.parametrize("row, family, strategy_name, mode", _gradient_cases())
def test_bad_gradients_raise_before_anything_changes(row, family, strategy_name, mode):
  check_bad_gradients(row, family, strategy_name, mode)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("family", ["tf_keras", "tf_keras_new"])
def test_a_keras3_model_s_variable_for_a_tf_keras_inner_is_refused_before_anything_changes(
  family, strategy_name
):
  """tf_keras's optimizers fail deep inside on a Keras 3 variable (tf_keras's own
  wrapper too), under MirroredStrategy in TensorFlow's all-reduce."""
  with shared_strategy(strategy_name).scope():
    layer = keras.layers.Dense(1, kernel_initializer="ones")
    layer.build((None, 2))
    opt = LSO(make_inner(family))
  before = layer.kernel.numpy().tolist()
  message = (
    f"apply_gradients got the Keras 3 variable '{layer.kernel.path}', which the inner SGD, a "
    "tf_keras optimizer, cannot update: for a Keras 3 model wrap a Keras 3 optimizer"
  )
  grads = [(tf.ones([2, 1]), layer.kernel), (tf.ones([1]), layer.bias)]
  with pytest.raises(TypeError, match=re.escape(message)):
    shared_strategy(strategy_name).run(opt.apply_gradients, args=(grads,))
  assert layer.kernel.numpy().tolist() == before
  assert (count(opt.iterations), float(opt.loss_scale)) == (0, 32768.0)


def test_a_keras_variable_given_to_a_function_as_an_argument_is_named():
  """It arrives as a tensor, and the pair was printed without a word why."""
  opt = LSO(keras.optimizers.SGD(0.1))
  variable = keras.Variable([1.0, 2.0])

  @tf.function
  def step(v):
    opt.apply_gradients([(tf.ones([2]), v)])

  with pytest.raises(TypeError, match="second item is a .*Tensor, not a variable.*capture it"):
    step(variable)
  with pytest.raises(TypeError) as eager:
    opt.apply_gradients([(tf.ones([2]), tf.ones([2]))])
  assert "capture" not in str(eager.value)  # no function there


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
@pytest.mark.parametrize("global_step", [5, "tensor"])
def test_compat_v1_global_step_not_a_variable_raises_before_anything_changes(mode, global_step):
  """TF's class (and ours) failed in the inner optimizer, after the variables,
  the slots and the scale had changed."""
  trainer = Trainer("compat_v1", "default", mode)
  with trainer._context():
    trainer.step = tf.constant(5, tf.int64) if global_step == "tensor" else global_step
  before = trainer.state()
  with pytest.raises(TypeError, match="global_step must be None or a variable"):
    trainer.apply(lambda v: [(tf.ones([2]), v["a"])])
  assert trainer.state() == before


@pytest.mark.parametrize("family", FAMILIES)
def test_unscaling_a_dict_of_gradients_names_it(family):
  """`tape.gradient(loss, {'w': w})` gives a dict: its keys were unscaled
  ("Cast float to string is not supported")."""
  opt = LSO(make_inner(family), dynamic=False, initial_scale=4)
  with pytest.raises(TypeError, match=re.escape("but got a dict (keys ['w'])")):
    opt.get_unscaled_gradients({"w": tf.ones([2])})


def _empty_list_cases():
  for family in ["tf_keras", "tf_keras_new"]:
    for mode in MODES[family]:
      for strategy_name in STRATEGIES:
        yield pytest.param(family, strategy_name, mode, id=f"{family}-{strategy_name}-{mode}")


@pytest.mark.parametrize("family, strategy_name, mode", _empty_list_cases())
def test_an_empty_list_is_a_finite_step_with_nothing_to_apply(family, strategy_name, mode):
  """As TF 2.4's wrapper of an OptimizerV2 (tf_keras's `fit` of a frozen
  model sends one): the scale counts a finite step, nothing else moves."""
  trainer = Trainer(family, strategy_name, mode)
  before, tracked = trainer.state()
  trainer.apply(lambda v: [])
  after, _ = trainer.state()
  replicas = trainer.strategy.num_replicas_in_sync
  counter = slice(len(before) - 2 * replicas, len(before) - replicas)  # scale, counter, iterations
  assert before[counter] == [1] * replicas and after[counter] == [2] * replicas
  after[counter] = before[counter]
  assert (after, tracked) == (before, tracked)


@pytest.mark.parametrize("kind", ["legacy", "new"])
def test_after_an_empty_list_the_next_step_applies(kind):
  """A frozen model's tf_keras `fit`, then the model unfrozen (the same
  optimizer): a new tf_keras optimizer built for no variable refused the
  next step's (the plain one builds on its first real step)."""
  module = tf_keras.optimizers.legacy if kind == "legacy" else tf_keras.optimizers
  var = tf.Variable([1.0, 2.0])
  plain, ours = module.SGD(0.5, momentum=0.9), LSO(module.SGD(0.5, momentum=0.9))
  results = []
  for opt in (plain, ours):
    var.assign([1.0, 2.0])
    opt.apply_gradients([])
    opt.apply_gradients([(tf.constant([1.0, -1.0]), var)])
    results.append(var.numpy().tolist())
  assert results == [[0.5, 2.5]] * 2


def test_an_empty_list_counts_as_tf_keras_wrapper_counts():
  peer = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.legacy.SGD())
  ours = LSO(tf_keras.optimizers.legacy.SGD())
  for opt in (peer, ours):
    opt.apply_gradients([])
  assert [(count(o.iterations), count(o.dynamic_counter)) for o in (peer, ours)] == [(0, 1)] * 2


def test_tf_keras_fit_of_a_frozen_model_runs_as_with_tf_keras_wrapper():
  results = []
  for wrap in (tf_keras.mixed_precision.LossScaleOptimizer, LSO):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(1)])
    model.trainable = False
    model.compile(wrap(tf_keras.optimizers.legacy.SGD()), "mse")
    x, y = np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)
    history = model.fit(x, y, epochs=2, verbose=0)
    results.append((history.history["loss"], count(model.optimizer.dynamic_counter)))
  assert results[1] == results[0]
  assert results[0][1] == 2


# A float64 gradient for a float32 variable makes TF's (Resource)ApplyMomentum
# kernel abort the process (a failed CHECK), with TF's own class too, in every
# mode: the check must come before the inner optimizer sees the gradient.
# Run apart, so that an abort fails this test only.
_FLOAT64_SCRIPT = """
import sys
import tensorflow as tf
tf.config.set_logical_device_configuration(
  tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path[:0] = [{root!r}, {tests!r}]
import test_bad_input as t
t.GRADIENT_ROWS["float64"] = (
  ["compat_v1"],
  lambda v: [(tf.ones([2]), v["a"]), (tf.ones([2], tf.float64), v["b"])],
  TypeError,
  lambda v: [*t._names("b")(v), "float64", "float32"],
)
for mode in t.MODES["compat_v1"]:
  for strategy_name in t.STRATEGIES:
    t.check_bad_gradients("float64", "compat_v1", strategy_name, mode)
    print("checked", mode, strategy_name, flush=True)
"""


@pytest.mark.slow
def test_compat_v1_float64_gradient_raises_before_anything_changes():
  script = _FLOAT64_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"))
  env = helpers.subprocess_env(TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
  )
  assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}{result.stderr[-3000:]}"
  checked = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("checked")]
  assert checked == [[m, s] for m in MODES["compat_v1"] for s in STRATEGIES]


# --- Gradients that must keep working -------------------------------------------


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("family", ["tf_keras", "compat_v1"])
def test_new_variable_gets_slots_and_is_applied_as_by_tf(family, strategy_name):
  """OptimizerV2 and compat.v1 optimizers take variables they have not seen.

  Two steps on the new variable c, gradient 2 on each of R replicas (summed:
  2R), lr 0.1, momentum 0.9. OptimizerV2: m = 0.9 m - 0.1 g, c += m, so
  m = -0.2R then -0.38R; compat.v1: a = 0.9 a + g, c -= 0.1 a, so a = 2R then
  3.8R; either way c = 1 - 0.2R, then 1 - 0.58R.
  """
  trainer = Trainer(family, strategy_name, "eager")
  replicas = trainer.strategy.num_replicas_in_sync
  c = trainer.vars["c"]
  for expected in (1.0 - 0.2 * replicas, 1.0 - 0.58 * replicas):
    trainer.apply(lambda v: [(tf.fill([2], 2.0), v["c"])])
    np.testing.assert_allclose(locals_of(trainer.strategy, c)[0], [expected] * 2, rtol=1e-6)
  slot = locals_of(trainer.strategy, trainer.opt.get_slot(c, "momentum"))[0]
  expected_slot = -0.38 * replicas if family == "tf_keras" else 3.8 * replicas
  np.testing.assert_allclose(slot, [expected_slot] * 2, rtol=1e-6)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_keras3_float64_gradient_is_cast_as_keras3_does(strategy_name):
  runs = []
  for dtype in (tf.float32, tf.float64):
    trainer = Trainer("keras3", strategy_name, "eager")
    trainer.apply(lambda v, dtype=dtype: [(tf.ones([2], dtype), v["a"])])
    runs.append(trainer.state())
  assert runs[0] == runs[1]
  # Plain Keras 3, the same two steps on a (the replicas' gradients summed).
  replicas = trainer.strategy.num_replicas_in_sync
  plain, var = make_inner("keras3", learning_rate=0.1, momentum=0.9), tf.Variable([1.0, 1.0])
  for dtype in (tf.float32, tf.float64):
    plain.apply_gradients([(tf.fill([2], tf.cast(replicas, dtype)), var)])
  assert var.dtype == tf.float32
  for replica in locals_of(trainer.strategy, trainer.vars["a"]):
    np.testing.assert_array_equal(replica, var.numpy())


# tf_keras's newer optimizers take no list (`-gradient`), wrapped or not.
@pytest.mark.parametrize("family", ["keras3", "tf_keras"])
def test_a_gradient_given_as_a_list_of_tensors_is_applied_in_a_function(family):
  """Taken for a list of numbers by the shape check, it failed there
  ("Cannot convert a symbolic tf.Tensor to a numpy array")."""
  var = tf.Variable([1.0, 2.0])
  opt = LSO(make_inner(family, learning_rate=1.0), dynamic=False, initial_scale=1)
  if hasattr(opt, "build"):
    opt.build([var])
  step = tf.function(lambda a, b: [opt.apply_gradients([([a, b], var)])][:0])
  step(tf.constant(1.0), tf.constant(2.0))
  np.testing.assert_array_equal(var.numpy(), [0.0, 0.0])


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic"])
def test_bool_gradients_are_applied_as_keras3_applies_them(dynamic):
  """As 0 and 1: refused for a while, and before that they failed the
  finiteness check of a dynamic scale."""
  runs = []
  for opt in (keras.optimizers.SGD(1.0), LSO(keras.optimizers.SGD(1.0), dynamic, 4)):
    var = tf.Variable([1.0, 2.0])
    opt.apply_gradients([(tf.constant([True, False]), var)])
    runs.append(var.numpy().tolist())
  assert runs == [[0.0, 2.0], [0.0, 2.0]]


@pytest.mark.parametrize("family", ["tf_keras", "compat_v1"])
def test_complex_gradients_are_checked_by_their_parts(family):
  """`is_finite` takes no complex tensor: a dynamic scale failed on them (as
  Keras 3's wrapper does); an Inf in either part skips the step."""
  var = tf.Variable([1.0 + 1.0j, 2.0])
  if family == "compat_v1":
    scale = loss_scale.DynamicLossScale()
    opt = MPLSO(tf.compat.v1.train.GradientDescentOptimizer(1.0), scale)
  else:
    opt = LSO(tf_keras.optimizers.legacy.SGD(1.0))
    scale = lambda: opt.loss_scale  # noqa: E731
  opt.apply_gradients([(tf.constant([1.0 + 1.0j, 1.0]), var)])
  np.testing.assert_array_equal(var.numpy(), [0.0, 1.0])
  before = float(scale())
  opt.apply_gradients([(tf.constant([complex(1.0, INF), 1.0]), var)])
  np.testing.assert_array_equal(var.numpy(), [0.0, 1.0])
  assert float(scale()) == before / 2


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("family", ["tf_keras", "compat_v1"])
def test_variables_of_several_replicas_stepped_outside_their_strategy_are_refused(family, mode):
  """Outside `strategy.run` an OptimizerV2 or a TF1 optimizer updates one replica's
  copy (so do tf_keras's wrapper and TF's compat.v1 class): the replicas drifted apart.
  (Newer optimizers assign mirrored variables whole: test_distributed.py.)"""
  strategy = shared_strategy("mirrored")
  with strategy.scope():
    var = tf.Variable(1.0)
    if family == "compat_v1":
      opt = MPLSO(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), "dynamic")
    else:
      opt = LSO(make_inner(family, learning_rate=0.1, momentum=0.9))

  def step():
    opt.apply_gradients([(tf.constant(1.0), var)])

  message = (
    "apply_gradients got the variable 'Variable:0', mirrored over the 2 replicas of the "
    "_OwnKeysMirroredStrategy it was made under, outside that strategy: apply gradients "
    "inside `strategy.run(...)`"
  )
  with pytest.raises(ValueError, match=re.escape(message)):
    step() if mode == "eager" else tf.function(step)()
  assert [v.tolist() for v in locals_of(strategy, var)] == [1.0, 1.0]
  scale = opt._loss_scale() if family == "compat_v1" else opt.loss_scale
  assert float(scale) == 32768.0
  if family != "compat_v1":
    assert count(opt.iterations) == 0
  strategy.run(step)  # Where it belongs, it steps: both replicas, by the sum of their 1s.
  np.testing.assert_allclose(locals_of(strategy, var), [0.8, 0.8], rtol=1e-6)


@pytest.mark.parametrize("family", ["tf_keras", "compat_v1"])
def test_a_mirrored_variable_without_a_gradient_does_not_stop_a_step_outside_strategies(family):
  """A TF1 `minimize` without `var_list` pairs every trainable variable, another
  model's mirrored ones too: those get no gradient and no update (the plain
  optimizer's step works)."""
  with shared_strategy("mirrored").scope():
    tower = tf.Variable(1.0)
  head = tf.Variable(1.0)
  if family == "compat_v1":
    opt = MPLSO(tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic")
  else:
    opt = LSO(make_inner(family, learning_rate=0.1))
  opt.apply_gradients([(None, tower), (tf.constant(3.0), head)])
  assert (float(head.numpy()), float(tower.numpy())) == (np.float32(0.7), 1.0)
