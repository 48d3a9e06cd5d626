"""What TensorFlow's and tf_keras's own test suites expect of these classes (issue 18).

One test per behaviour, run side by side with TF's own legacy classes
(`tensorflow.python.training.experimental.loss_scale`) and tf_keras's
`LossScaleOptimizer` where those still exist, in every mode, strategy and
inner-optimizer family the behaviour applies to.
"""

import contextlib
import copy
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from tensorflow.python.training.experimental import loss_scale as tf_loss_scale
from test_keras_lso import count, make_inner, shared_strategy
from tf_keras.src.mixed_precision import loss_scale_optimizer as tf_keras_lso

import helpers
from tf_lossscale import loss_scale
from tf_lossscale.keras import mixed_precision

NAN = float("nan")
INF = float("inf")
LSO = mixed_precision.LossScaleOptimizer
ExperimentalLSO = mixed_precision.experimental.LossScaleOptimizer
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _local(strategy, value):
  """Replica 0's copy of `value` (a variable or a tensor), eagerly."""
  return strategy.experimental_local_results(value)[0]


# --- Legacy DynamicLossScale.update -------------------------------------------

UPDATE_GRADS = [1.0, 1.0, NAN, INF, 1.0]


def _update_op_fetched(module, strategy_name, mode):
  """Evaluates `tf.identity(update_op)` once per value of UPDATE_GRADS.

  Returns the loss scale after each step, and the shapes evaluated.
  """
  scales, shapes = [], set()
  if mode == "graph":
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      strategy = helpers.make_strategy(strategy_name)
      with strategy.scope():
        ls = module.DynamicLossScale(initial_loss_scale=4.0, increment_period=2)
        grad = tf.compat.v1.placeholder(tf.float32, [2])
        update_op, _ = ls.update([grad, None])
        fetched = tf.identity(update_op)
        scale = ls()
      sess.run(tf.compat.v1.global_variables_initializer())
      for value in UPDATE_GRADS:
        shapes.add(np.shape(sess.run(fetched, {grad: [value, 1.0]})))
        scales.append(float(sess.run(scale)))
    return scales, shapes
  strategy = shared_strategy(strategy_name)
  with strategy.scope():
    ls = module.DynamicLossScale(initial_loss_scale=4.0, increment_period=2)
    fetch = tf.function(lambda grad: tf.identity(ls.update([grad, None])[0]))
    for value in UPDATE_GRADS:
      shapes.add(np.shape(fetch(tf.constant([value, 1.0]))))
      scales.append(float(ls()))
  return scales, shapes


@pytest.mark.parametrize("mode", ["graph", "function"])
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_update_op_is_usable_as_a_tensor(strategy_name, mode):
  """TF's update op is a scalar tensor: evaluating `tf.identity` of it runs the update.

  (Its value is an artifact of TF's nested conds, True only on a step that
  grew the scale; it is not pinned.)
  """
  ours = _update_op_fetched(loss_scale, strategy_name, mode)
  assert ours == _update_op_fetched(tf_loss_scale, strategy_name, mode)
  assert ours == ([4.0, 8.0, 4.0, 2.0, 2.0], {()})


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_update_op_is_none_eagerly(strategy_name):
  """As TF documented. (TF's class returned the counter's assign on some steps.)"""
  strategy = shared_strategy(strategy_name)
  with strategy.scope():
    ls = loss_scale.DynamicLossScale(initial_loss_scale=4.0)
    update_op, should_apply = ls.update([tf.constant(1.0)])
  assert update_op is None and bool(should_apply)


# Gradients as a tf.cond branch or a user may give them: Python and NumPy numbers.
PYTHON_GRADS = [
  [1.0, 2.0],
  [NAN, 1.0],
  [0.5, np.float32(2.0)],
  [INF],
  [None, 3.0],
  [np.array([1.0])],
]


def _update_with_python_gradients(module, strategy_name, mode):
  """[(should_apply, scale, good steps)] after `update` with each of PYTHON_GRADS."""
  results = []
  if mode == "graph":
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      strategy = helpers.make_strategy(strategy_name)
      with strategy.scope():
        ls = module.DynamicLossScale(initial_loss_scale=4.0, increment_period=2)
        steps = [ls.update(grads) for grads in PYTHON_GRADS]
        state = [ls(), ls._num_good_steps]
      sess.run(tf.compat.v1.global_variables_initializer())
      for update_op, should_apply in steps:
        _, applied = sess.run([update_op, should_apply])
        scale, good_steps = sess.run(state)
        results.append((bool(applied), float(scale), int(good_steps)))
    return results
  strategy = shared_strategy(strategy_name)
  with strategy.scope():
    ls = module.DynamicLossScale(initial_loss_scale=4.0, increment_period=2)
    for grads in PYTHON_GRADS:

      def update(grads=grads):
        return ls.update(grads)[1]

      applied = tf.function(update)() if mode == "function" else update()
      results.append((bool(applied), float(ls()), count(ls._num_good_steps)))
  return results


@pytest.mark.parametrize("mode", ["graph", "eager", "function"])
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_update_converts_python_number_gradients(strategy_name, mode):
  ours = _update_with_python_gradients(loss_scale, strategy_name, mode)
  assert ours == _update_with_python_gradients(tf_loss_scale, strategy_name, mode)
  assert ours == [
    (True, 4.0, 1),
    (False, 2.0, 0),
    (True, 2.0, 1),
    (False, 1.0, 0),
    (True, 1.0, 1),
    (True, 2.0, 0),
  ]


# --- Keras LossScaleOptimizer.from_config with configs of TF <= 2.3 ------------


def _tf23_sgd(learning_rate_key="learning_rate"):
  """An OptimizerV2 SGD config as TF 2.3 wrote it: no `module`, `decay` included."""
  return {
    "class_name": "SGD",
    "config": {
      "name": "SGD",
      learning_rate_key: 0.5,
      "decay": 0.1,
      "momentum": 0.25,
      "nesterov": False,
    },
  }


OLD_CONFIGS = {
  # TF 2.4's LossScaleOptimizer.get_config(), the inner SGD as TF 2.3/2.4 wrote it.
  "tf24": {
    "inner_optimizer": _tf23_sgd(),
    "dynamic": True,
    "initial_scale": 4.0,
    "dynamic_growth_steps": 2,
  },
  # TF 2.3's experimental class.
  "tf23_experimental": {
    "optimizer": _tf23_sgd(),
    "loss_scale": {
      "class_name": "DynamicLossScale",
      "config": {"initial_loss_scale": 4.0, "increment_period": 2, "multiplier": 2.0},
    },
  },
  # `lr`, the name OptimizerV2 still accepted for `learning_rate`.
  "lr_key": {
    "inner_optimizer": _tf23_sgd("lr"),
    "dynamic": True,
    "initial_scale": 4.0,
    "dynamic_growth_steps": 2,
  },
}
COEFFS = np.array([1.0, -2.0], np.float32)
TRAIN_STEPS = 3


def _train_from_config(cls, config, strategy_name, mode):
  """Rebuilds an optimizer with `cls.from_config` and minimizes sum(var * COEFFS).

  Returns (the inner optimizer, [var, lr, decay, momentum, iterations, loss
  scale] after TRAIN_STEPS steps, replica 0's values, as lists and numbers).
  """
  graph = tf.Graph() if mode == "graph" else None
  with graph.as_default() if graph else contextlib.nullcontext():
    strategy = helpers.make_strategy(strategy_name) if graph else shared_strategy(strategy_name)
    with strategy.scope():
      opt = cls.from_config(copy.deepcopy(config))
      var = tf.Variable([1.0, 2.0])

    def step():
      return strategy.run(lambda: opt.minimize(lambda: tf.reduce_sum(var * COEFFS), [var]))

    def read():
      tracked = [var, opt.lr, opt.decay, opt.momentum, opt.iterations, opt.loss_scale]
      return [tf.convert_to_tensor(_local(strategy, x)) for x in tracked]

    if graph is None:
      # An OptimizerV2's step is an Operation, which a tf.function cannot return.
      run = tf.function(lambda: [step()][:0]) if mode == "function" else step
      for _ in range(TRAIN_STEPS):
        run()
      values = read()
    else:
      with strategy.scope():
        train_op = tf.group(strategy.experimental_local_results(step()))
        reading = read()
      with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(TRAIN_STEPS):
          sess.run(train_op)
        values = sess.run(reading)
  return opt.inner_optimizer, [np.asarray(v).tolist() for v in values]


@pytest.mark.parametrize("mode", ["graph", "eager", "function"])
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
@pytest.mark.parametrize("config_name", OLD_CONFIGS)
def test_config_of_tf23_rebuilds_optimizer_v2(config_name, strategy_name, mode):
  """With tf_keras installed, the optimizer that wrote the config: an OptimizerV2."""
  config = OLD_CONFIGS[config_name]
  inner, ours = _train_from_config(LSO, config, strategy_name, mode)
  assert isinstance(inner, tf_keras.optimizers.legacy.SGD)
  _, theirs = _train_from_config(tf_keras_lso.LossScaleOptimizer, config, strategy_name, mode)
  assert ours == theirs
  var, lr, decay, momentum, iterations, scale = ours
  assert (lr, decay, momentum, iterations, scale) == (0.5, pytest.approx(0.1), 0.25, 3, 8.0)
  assert var != [1.0, 2.0]


_FROM_CONFIG_SCRIPT = """
import json, sys

class _NotInstalled:
  def find_spec(self, name, path=None, target=None):
    if name == "tf_keras" or name.startswith("tf_keras."):
      raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return None

if sys.argv[2] == "absent":
  sys.meta_path.insert(0, _NotInstalled())
import numpy as np
import tensorflow as tf
from tf_lossscale.keras import mixed_precision

runs = {}
for name, config in json.loads(sys.argv[1]).items():
  opt = mixed_precision.LossScaleOptimizer.from_config(config)
  var = tf.Variable([1.0, 2.0])

  def step():
    opt.minimize(lambda: tf.reduce_sum(var * np.array([1.0, -2.0], np.float32)), [var])

  step()
  tf.function(step)()
  step()
  inner = type(opt.inner_optimizer)
  runs[name] = {
    "inner": inner.__module__ + "." + inner.__name__,
    "var": var.numpy().tolist(),
    "lr": float(opt.lr),
    "iterations": int(tf.convert_to_tensor(opt.iterations)),
  }
print(json.dumps(runs))
"""


def _from_config_in_fresh_process(tf_keras_state):
  """Each of OLD_CONFIGS rebuilt and trained in a new process; tf_keras `absent` or not imported."""
  return helpers.program_output(_FROM_CONFIG_SCRIPT, json.dumps(OLD_CONFIGS), tf_keras_state)


def _optimizer_v2_variables(config_name):
  _, reference = _train_from_config(
    tf_keras_lso.LossScaleOptimizer, OLD_CONFIGS[config_name], "default", "eager"
  )
  return reference[0]


@pytest.mark.slow
def test_config_of_tf23_imports_tf_keras_when_installed_but_not_imported():
  for name, run in _from_config_in_fresh_process("not_imported").items():
    assert run["inner"].startswith("tf_keras.") and ".legacy." in run["inner"], name
    np.testing.assert_allclose(run["var"], _optimizer_v2_variables(name), rtol=1e-6)


@pytest.mark.slow
def test_config_of_tf23_without_tf_keras_builds_keras3_with_legacy_keys_translated():
  """Decided: a Keras 3 optimizer; `lr` is `learning_rate`, `decay` an InverseTimeDecay.

  OptimizerV2 divided the learning rate by (1 + decay * iterations); a Keras 3
  `InverseTimeDecay(lr, decay_steps=1, decay_rate=decay)` schedule does the
  same, so the variables follow the OptimizerV2 that wrote the config.
  """
  runs = _from_config_in_fresh_process("absent")
  assert set(runs) == set(OLD_CONFIGS)
  for name, run in runs.items():
    assert run["inner"] == "keras.src.optimizers.sgd.SGD", name
    np.testing.assert_allclose(run["var"], _optimizer_v2_variables(name), rtol=1e-6)
    assert run["iterations"] == TRAIN_STEPS
    assert run["lr"] == pytest.approx(0.5 / (1 + 0.1 * TRAIN_STEPS))


# --- What apply_gradients and minimize return ----------------------------------

NEW_FAMILIES = ["keras3", "tf_keras_new"]


def _step_result(opt, strategy, mode, method):
  """What one step returns through `strategy.run`, eagerly or from a tf.function."""
  with strategy.scope():
    var = tf.Variable([1.0, 2.0])

  def replica_fn():
    if method == "minimize":
      return opt.minimize(lambda: tf.reduce_sum(var * COEFFS), [var])
    return opt.apply_gradients([(tf.constant(COEFFS), var)])

  def step():
    return strategy.run(replica_fn)

  result = tf.function(step)() if mode == "function" else step()
  replicas = strategy.num_replicas_in_sync
  np.testing.assert_allclose(_local(strategy, var), [1.0, 2.0] - 0.5 * replicas * COEFFS)
  return result


@pytest.mark.parametrize("method", ["apply_gradients", "minimize"])
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_step_result_can_be_returned_from_tf_function(family, strategy_name, mode, method):
  """Decided: None, as tf_keras's LossScaleOptimizer for these optimizers returns.

  (TF 2.4 returned None eagerly too; Keras 3's own optimizers return their
  `iterations` variable, see the deliberate differences in the docs.)
  """
  strategy = shared_strategy(strategy_name)
  with strategy.scope():
    opt = LSO(make_inner(family, learning_rate=0.5))
  assert _step_result(opt, strategy, mode, method) is None
  if family == "tf_keras_new":
    with strategy.scope():
      reference = tf_keras.mixed_precision.LossScaleOptimizer(make_inner(family, learning_rate=0.5))
    assert _step_result(reference, strategy, mode, method) is None


def test_minimize_takes_keras3_variables():
  """Not an issue-18 row: Keras 3 models' weights are `keras.Variable`s."""
  var = keras.Variable([1.0, 2.0])
  opt = LSO(keras.optimizers.SGD(0.5))
  opt.minimize(lambda: tf.reduce_sum(var * COEFFS), [var])
  np.testing.assert_allclose(var.numpy(), [1.0, 2.0] - 0.5 * COEFFS)


# --- Inner optimizers whose apply_gradients takes fewer arguments --------------


class _NewSGDWithoutName(tf_keras.optimizers.SGD):
  """A new tf_keras optimizer whose apply_gradients takes no `name` (as in tf_keras's tests)."""

  def apply_gradients(self, grads_and_vars, skip_gradients_aggregation=False):
    return super().apply_gradients(
      grads_and_vars, skip_gradients_aggregation=skip_gradients_aggregation
    )


class _NewSGDPairsOnly(tf_keras.optimizers.SGD):
  """Takes the pairs only: it must then aggregate the gradients itself."""

  def apply_gradients(self, grads_and_vars):
    return super().apply_gradients(grads_and_vars)


class _Keras3SGDPairsOnly(keras.optimizers.SGD):
  def apply_gradients(self, grads_and_vars):
    return super().apply_gradients(grads_and_vars)


NARROW_INNERS = {
  "tf_keras_new_without_name": (_NewSGDWithoutName, tf_keras.optimizers.SGD),
  "tf_keras_new_pairs_only": (_NewSGDPairsOnly, tf_keras.optimizers.SGD),
  "keras3_pairs_only": (_Keras3SGDPairsOnly, keras.optimizers.SGD),
}


def _two_steps(opt, strategy, mode):
  """Applies replica-dependent gradients twice; returns replica 0's variable."""
  with strategy.scope():
    var = tf.Variable([1.0, 2.0])

  def replica_fn():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    opt.apply_gradients([(tf.constant(COEFFS) * tf.cast(replica + 1, tf.float32), var)])

  def step():
    strategy.run(replica_fn)

  run = tf.function(step) if mode == "function" else step
  run()
  run()
  return _local(strategy, var).numpy()


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
@pytest.mark.parametrize("inner", NARROW_INNERS)
def test_inner_apply_gradients_gets_only_the_arguments_it_takes(inner, strategy_name, mode):
  """Same variables as the unwrapped optimizer (gradients summed over replicas once)."""
  subclass, base = NARROW_INNERS[inner]
  strategy = shared_strategy(strategy_name)
  if inner.startswith("keras3"):
    helpers.need_plain_keras3_all_reduce(strategy)
  with strategy.scope():
    opt = LSO(subclass(learning_rate=0.5, momentum=0.5))
    plain = base(learning_rate=0.5, momentum=0.5)
  # Eagerly: Keras 3's momentum SGD cannot run in a tf.function under MirroredStrategy.
  expected = _two_steps(plain, strategy, "eager")
  np.testing.assert_allclose(_two_steps(opt, strategy, mode), expected)
  assert count(opt.dynamic_counter) == 2
  if inner == "tf_keras_new_without_name":  # tf_keras's own class works with it
    with strategy.scope():
      reference = tf_keras.mixed_precision.LossScaleOptimizer(subclass(0.5, momentum=0.5))
    np.testing.assert_allclose(_two_steps(reference, strategy, mode), expected)


# --- Serializing the experimental class ----------------------------------------

# What TF 2.4 did: `tf.keras.optimizers.serialize` wrote the experimental class
# under its class name 'LossScaleOptimizerV1' and `tf.keras.optimizers.deserialize`
# mapped that name to the non-experimental LossScaleOptimizer ("LossScaleOptimizerV1
# will be removed soon but deserializing it will still be supported"), while
# `experimental.LossScaleOptimizer.from_config` itself still built the experimental class.
SERIALIZERS = {
  "keras3": (keras.optimizers.serialize, keras.optimizers.deserialize),
  "tf_keras": (
    tf_keras.optimizers.serialize,
    lambda c: tf_keras.optimizers.deserialize(c, use_legacy_optimizer=True),
  ),
  "tf_keras_new": (tf_keras.optimizers.serialize, tf_keras.optimizers.deserialize),
}


@pytest.mark.parametrize("family", SERIALIZERS)
def test_experimental_class_deserializes_as_the_non_experimental_class(family):
  serialize, deserialize = SERIALIZERS[family]
  opt = ExperimentalLSO(make_inner(family, name="sgd", learning_rate=0.5), loss_scale=16)
  serialized = serialize(opt)
  assert serialized["registered_name"] == "tf_lossscale>LossScaleOptimizerV1"
  restored = deserialize(serialized)
  assert isinstance(restored, LSO) and not isinstance(restored, ExperimentalLSO)
  assert restored.get_config() == opt.get_config()
  assert (restored.dynamic, restored.initial_scale) == (False, 16.0)
  # The non-experimental class keeps its own name and class.
  plain = LSO(make_inner(family, name="sgd"))
  assert serialize(plain)["registered_name"] == "tf_lossscale>LossScaleOptimizer"
  assert type(deserialize(serialize(plain))) is type(plain)


@pytest.mark.parametrize("family", SERIALIZERS)
def test_experimental_from_config_still_builds_the_experimental_class(family):
  """As TF 2.4's `LossScaleOptimizerV1.from_config` (tf_keras has no such class left):
  the experimental class, with the loss scale and the inner optimizer of the config."""
  restored = []
  for make in (lambda: 16, lambda: loss_scale.DynamicLossScale(64, increment_period=7)):
    opt = ExperimentalLSO(make_inner(family, name="sgd", learning_rate=0.5), loss_scale=make())
    clone = ExperimentalLSO.from_config(opt.get_config())
    assert type(clone) is type(opt) and clone.get_config() == opt.get_config()
    assert float(np.asarray(clone.learning_rate)) == 0.5
    restored.append((clone.dynamic, clone.initial_scale, clone.dynamic_growth_steps))
  assert restored == [(False, 16.0, None), (True, 64.0, 7)]


# --- Name-based checkpoints (Saver) of graphs ------------------------------------

_SAVER_PROGRAM = """
import json, sys, tempfile
import tensorflow as tf
if sys.argv[1] == "tf1":
  tf.compat.v1.disable_v2_behavior()
import tf_keras
import tf_lossscale

CLASSES = {
  ("compat_v1", "theirs"): tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
  ("compat_v1", "ours"): tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
  ("keras", "theirs"): tf_keras.mixed_precision.LossScaleOptimizer,
  ("keras", "ours"): tf_lossscale.keras.mixed_precision.LossScaleOptimizer,
}
INNERS = {
  "compat_v1": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
  "keras": lambda: tf_keras.optimizers.legacy.Adam(0.1),
  "keras_new": lambda: tf_keras.optimizers.Adam(0.1),
}
SCOPES = {
  "none": lambda: tf.compat.v1.name_scope(None),
  "name_scope": lambda: tf.name_scope("train"),
  "variable_scope": lambda: tf.compat.v1.variable_scope("train"),
}

def train_op(family, kind, scope):
  var = tf.compat.v1.Variable([1.0, 2.0], name="var", use_resource=True)
  m = tf.compat.v1.placeholder(tf.float32, [])
  loss = lambda: m * tf.reduce_sum(var * [1.0, -2.0])
  with SCOPES[scope]():
    if family == "compat_v1":
      opt = CLASSES[family, kind](INNERS[family](), "dynamic")
      return opt.minimize(loss()), m
    opt = CLASSES["keras", kind](INNERS[family]())
    return opt.minimize(loss, var_list=[var]), m

def values(sess):
  return {v.op.name: sess.run(v).tolist() for v in tf.compat.v1.global_variables()}

results = {}
# tf_keras's wrapper of its new optimizers fails in a TF1 program.
for family in ("compat_v1", "keras") + (("keras_new",) if sys.argv[1] == "tf2" else ()):
  for scope in SCOPES:
    for writer, reader in [("theirs", "ours"), ("ours", "theirs")]:
      path = tempfile.mkdtemp() + "/model"
      with tf.Graph().as_default():
        op, m = train_op(family, writer, scope)
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          # tf_keras's new optimizers return no op to run (their wrapper's neither).
          for value in [1.0, float("nan"), 2.0] if op is not None else []:
            sess.run(op, {m: value})
          written = values(sess)
          tf.compat.v1.train.Saver().save(sess, path)
      with tf.Graph().as_default():
        train_op(family, reader, scope)
        with tf.compat.v1.Session() as sess:
          try:
            tf.compat.v1.train.Saver().restore(sess, path)
            restored = values(sess)
          except tf.errors.NotFoundError as e:
            restored = str(e).splitlines()[0]
      results[f"{family} {scope} {writer}->{reader}"] = [written, restored]
print(json.dumps(results))
"""


@pytest.mark.parametrize("control_flow", ["tf1", "tf2"])
def test_saver_checkpoints_of_graphs_cross_with_tf24_names(control_flow):
  """A `Saver` finds variables by name: the inner optimizer's variables made
  in the first apply take TF 2.4's names under a dynamic scale, in a TF1
  program (`cond_1/...`, TF 2.4's apply conditional) and in a graph with TF2
  control flow (top-level names, the apply's function graph's), under any
  scope: checkpoints of TF's compat.v1 class and tf_keras's wrapper restore
  into ours and back, 2 steps and a skipped one in. tf_keras's new optimizers
  are built before the conditional, by tf_keras's wrapper as by ours."""
  runs = helpers.program_output(_SAVER_PROGRAM, control_flow)
  assert len(runs) == (12 if control_flow == "tf1" else 18)
  for case, (written, restored) in runs.items():
    assert written == restored, case
  names = set(runs["compat_v1 name_scope theirs->ours"][0])
  keras_names = set(runs["keras name_scope theirs->ours"][0])
  apply_scope = "train/cond_1/" if control_flow == "tf1" else ""
  assert {apply_scope + "beta1_power", "var/Adam", "train/current_loss_scale"} <= names
  assert {apply_scope + "Adam/iter", apply_scope + "Adam/var/m"} <= keras_names
  if control_flow == "tf2":
    assert "train/m/var" in runs["keras_new name_scope theirs->ours"][0]


_FIXED_SCALE_NAMES_PROGRAM = """
import json, sys
import tensorflow as tf
if sys.argv[1] == "tf1":
  tf.compat.v1.disable_v2_behavior()
import tf_keras
import tf_lossscale

names = []
for cls in (
  tf_lossscale.keras.mixed_precision.LossScaleOptimizer,
  tf_keras.mixed_precision.LossScaleOptimizer,
):
  with tf.Graph().as_default():
    var = tf.compat.v1.Variable([1.0, 2.0], name="var", use_resource=True)
    opt = cls(tf_keras.optimizers.legacy.Adam(0.1), dynamic=False, initial_scale=8)
    opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    names.append(sorted(v.op.name for v in tf.compat.v1.global_variables()))
print(json.dumps(names))
"""


@pytest.mark.parametrize("control_flow", ["tf1", "tf2"])
def test_saver_names_under_a_fixed_scale_are_tf24s_plain_names(control_flow):
  """A fixed scale always applies: TF 2.4 applied outside any conditional, so
  an OptimizerV2's variables take no `cond_1/` scope, with either control flow."""
  ours, theirs = helpers.program_output(_FIXED_SCALE_NAMES_PROGRAM, control_flow)
  assert {"Adam/iter", "Adam/var/m", "Adam/var/v"} <= set(theirs)
  assert ours == theirs


# Check-numerics raises at any op whose float output is not finite: the quick
# check's sums (of a NaN gradient, or of finite ones that overflow), in a
# function an Inf constant, and a scale of 2**127 times 2 on a step that does
# not grow it would raise where the step must be skipped or applied. (A NaN
# gradient handed to a function raises at the all-reduce, an op even with one
# replica, with a tf_keras inner as with tf_keras's class, and with a Keras 3
# inner, where Keras 3's class checks before its all-reduce.) Run apart: the
# mode is process-wide.
_CHECK_NUMERICS_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
import keras
import tf_keras
import tf_lossscale
from tf_lossscale.compat.v1.mixed_precision import MixedPrecisionLossScaleOptimizer

tf.debugging.enable_check_numerics()
results = {}
steps = {"nan": [float("nan"), 1.0], "overflowing_sum": [3e38, 3e38]}


def keras_run(make, mode):
  opt, var = make(), tf.Variable([1.0, 2.0])

  def step(grad):
    opt.apply_gradients([(grad, var)])

  step = tf.function(step) if mode == "function" else step
  out = {}
  for name, grad in steps.items():
    if mode == "function" and name == "nan":
      continue
    step(tf.constant(grad))
    out[name] = [var.numpy().tolist(), float(opt.loss_scale), int(opt.iterations.numpy())]
  return out


makes = {
  "ours_keras3": lambda: tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.0)),
  "ours_tf_keras": lambda: tf_lossscale.LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(0.0)),
  "peer_tf_keras": lambda: tf_keras.mixed_precision.LossScaleOptimizer(
    tf_keras.optimizers.legacy.SGD(0.0)
  ),
}
for name, make in makes.items():
  for mode in ("eager", "function"):
    results[f"{name}_{mode}"] = keras_run(make, mode)
for name, cls in (("ours", tf_lossscale.DynamicLossScale),
                  ("peer", tf.compat.v1.mixed_precision.DynamicLossScale)):
  scale = cls()
  results[name + "_legacy"] = [bool(scale.update([tf.constant(g)])[1]) for g in steps.values()]
  huge = cls(initial_loss_scale=2.0**127, increment_period=1000)
  update = tf.function(lambda grad, huge=huge: huge.update([grad])[1])
  results[name + "_legacy_huge"] = [bool(update(tf.constant([1.0]))), float(huge())]
applied = []
for cls in (
  MixedPrecisionLossScaleOptimizer, tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
):
  with tf.Graph().as_default():
    var = tf.compat.v1.Variable([1.0, 2.0], use_resource=True)
    opt = cls(tf.compat.v1.train.GradientDescentOptimizer(1.0), "dynamic")
    step = opt.apply_gradients([(tf.constant(steps["overflowing_sum"]), var)])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(step)
      applied.append(session.run(var).tolist())
results["compat_v1"] = applied
print(json.dumps(results))
"""


def test_check_numerics_sees_a_skipped_step_as_the_peers_do():
  results = helpers.program_output(_CHECK_NUMERICS_SCRIPT)
  skipped_then_applied = {
    "nan": [[1.0, 2.0], 16384.0, 1],
    "overflowing_sum": [[1.0, 2.0], 16384.0, 2],
  }
  applied = {"overflowing_sum": [[1.0, 2.0], 32768.0, 1]}
  for name in ("peer_tf_keras", "ours_keras3", "ours_tf_keras"):
    assert results.pop(f"{name}_eager") == skipped_then_applied, name
    assert results.pop(f"{name}_function") == applied, name
  assert results.pop("ours_legacy") == results.pop("peer_legacy") == [False, True]
  assert results.pop("ours_legacy_huge") == results.pop("peer_legacy_huge") == [True, 2.0**127]
  ours, theirs = results.pop("compat_v1")
  assert ours == theirs and ours[0] < -1e38  # Applied.
  assert not results
