"""Keras LossScaleOptimizer: constructor, attributes, delegation, config, experimental, checkpoints."""

import copy
import inspect
import json
import pickle
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from test_keras_lso import FAMILIES, count, make_inner, momentum_slot

import helpers
from tf_lossscale import loss_scale
from tf_lossscale._src import fast_paths, framework_internals
from tf_lossscale.keras import mixed_precision

LSO = mixed_precision.LossScaleOptimizer
ExperimentalLSO = mixed_precision.experimental.LossScaleOptimizer


@pytest.fixture(params=FAMILIES)
def family(request):
  return request.param


def test_one_public_class_per_family(family):
  opt = LSO(make_inner(family))
  assert isinstance(opt, LSO) and type(opt).__name__ == "LossScaleOptimizer"
  framework_optimizer = {
    "keras3": keras.optimizers.Optimizer,
    "tf_keras": tf_keras.optimizers.legacy.Optimizer,
    "tf_keras_new": tf_keras.optimizers.Optimizer,
  }[family]
  assert isinstance(opt, framework_optimizer)
  assert type(LSO(make_inner(family))) is type(opt)  # the concrete class is cached


def test_defaults_and_attributes(family):
  inner = make_inner(family)
  opt = LSO(inner)
  assert opt.inner_optimizer is inner and opt.dynamic is True
  assert opt.initial_scale == 32768.0 and opt.dynamic_growth_steps == 2000
  assert opt.loss_scale.dtype == tf.float32 and float(opt.loss_scale) == 32768.0
  assert count(opt.dynamic_counter) == 0
  fixed = LSO(make_inner(family), dynamic=False, initial_scale=3)
  assert fixed.initial_scale == 3.0 and fixed.dynamic_growth_steps is None
  assert fixed.dynamic_counter is None and float(fixed.loss_scale) == 3.0


def test_constructor_errors(family):
  with pytest.raises(
    TypeError,
    match=r'^"inner_optimizer" must be an instance of `tf.keras.optimizers.Optimizer`, but got: 1\.$',
  ):
    LSO(1)
  with pytest.raises(
    TypeError,
    match=r"^\"dynamic\" argument to LossScaleOptimizer.__init__ must be a bool, but got: 'dynamic'$",
  ):
    LSO(make_inner(family), "dynamic")
  inner = make_inner(family)
  LSO(inner)
  with pytest.raises(ValueError, match=r"already wrapped by a LossScaleOptimizer"):
    LSO(inner)
  with pytest.raises(
    ValueError, match=r'^"initial_scale" must be specified if "dynamic" is False$'
  ):
    LSO(make_inner(family), dynamic=False)
  with pytest.raises(
    ValueError, match=r'^"dynamic_growth_steps" must be None if "dynamic" is False, but got: 2$'
  ):
    LSO(make_inner(family), dynamic=False, initial_scale=2, dynamic_growth_steps=2)


OPTIONS = dict(min_loss_scale=0.25, max_loss_scale=1024.0, hysteresis=3)


def test_options_beyond_tf24_default_to_tf24_and_are_none_when_fixed(family):
  opt = LSO(make_inner(family))
  assert (opt.min_loss_scale, opt.max_loss_scale, opt.hysteresis) == (1.0, float("inf"), 1)
  assert count(opt.skipped_steps) == 0
  fixed = LSO(make_inner(family), dynamic=False, initial_scale=3)
  assert (fixed.min_loss_scale, fixed.max_loss_scale, fixed.hysteresis) == (None, None, None)
  assert fixed.skipped_steps is None


@pytest.mark.parametrize(
  "options, message",
  [
    (
      {"min_loss_scale": 0.0},
      "min_loss_scale must be a finite number greater than 0, but got: 0.0",
    ),
    (
      {"max_loss_scale": 16},
      "max_loss_scale must be at least the initial loss scale (32768.0), but got: 16",
    ),
    ({"hysteresis": 0}, "hysteresis must be an int of at least 1, but got: 0"),
    ({"max_loss_scale": 2.0**128}, "at most the float32 maximum, 3.4028234663852886e+38"),
    (
      {"dynamic_growth_steps": 2**63},
      "dynamic_growth_steps must be an int from -2**63 to 2**63 - 1 (an int64), "
      "but got: 9223372036854775808",
    ),
  ],
  ids=repr,
)
def test_option_errors(family, options, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    LSO(make_inner(family), **options)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_options_are_refused_with_a_fixed_scale(family, name):
  message = (
    f'"{name}" must be None if "dynamic" is False (a fixed loss scale never changes), '
    f"but got: {OPTIONS[name]!r}"
  )
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    LSO(make_inner(family), dynamic=False, initial_scale=2, **{name: OPTIONS[name]})


def test_a_floor_above_the_initial_scale_is_reached_at_the_first_skipped_step(family):
  # As TF 2.4's floor of 1 raised an initial scale below 1 (docs/monitoring.md).
  opt = LSO(make_inner(family), initial_scale=2, min_loss_scale=100)
  var = tf.Variable(1.0)
  opt.apply_gradients([(tf.constant(float("nan")), var)])
  assert (float(opt.loss_scale), float(var), int(opt.skipped_steps)) == (100.0, 1.0, 1)


def test_options_are_keyword_only(family):
  with pytest.raises(TypeError):
    LSO(make_inner(family), True, 8, 10, 0.5)


@pytest.mark.parametrize(
  "make_lso",
  [
    lambda: LSO(keras.optimizers.SGD()),
    lambda: LSO(tf_keras.optimizers.legacy.SGD()),
    lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
    lambda: tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.legacy.SGD()),
  ],
)
def test_cannot_wrap_a_loss_scale_optimizer(make_lso):
  with pytest.raises(TypeError, match="^LossScaleOptimizer cannot wrap another LossScaleOptimizer"):
    LSO(make_lso())


@pytest.mark.parametrize(
  "kind, kwargs, delegated",
  [
    ("SGD", {"momentum": 0.5}, {"momentum": 0.5}),
    ("Adam", {"beta_1": 0.8, "beta_2": 0.9}, {"beta_1": 0.8, "beta_2": 0.9}),
    ("RMSprop", {"rho": 0.8, "momentum": 0.1}, {"rho": 0.8, "momentum": 0.1}),
    ("Adadelta", {"rho": 0.8}, {"rho": 0.8}),
    ("Ftrl", {"l1_regularization_strength": 0.25}, {"l1_regularization_strength": 0.25}),
    ("Adamax", {"beta_1": 0.8, "beta_2": 0.9}, {"beta_1": 0.8, "beta_2": 0.9}),
    ("Nadam", {"beta_1": 0.8, "beta_2": 0.9}, {"beta_1": 0.8, "beta_2": 0.9}),
    (
      "Ftrl",
      {"learning_rate_power": -0.25, "l2_regularization_strength": 0.25, "beta": 0.5},
      {"learning_rate_power": -0.25, "l2_regularization_strength": 0.25, "beta": 0.5},
    ),
  ],
)
def test_hyperparameter_delegation(family, kind, kwargs, delegated):
  opt = LSO(make_inner(family, kind, learning_rate=0.5, **kwargs))
  for name, value in delegated.items():
    assert float(np.asarray(getattr(opt, name))) == pytest.approx(value)
    assert name in dir(opt)
    setattr(opt, name, 0.125)
    assert float(np.asarray(getattr(opt.inner_optimizer, name))) == 0.125
  assert float(np.asarray(opt.lr)) == 0.5 and float(np.asarray(opt.learning_rate)) == 0.5
  opt.lr = 0.25
  assert float(np.asarray(opt.inner_optimizer.learning_rate)) == 0.25
  assert {"lr", "learning_rate", "iterations", "clipnorm"} <= set(dir(opt))


def test_decay_of_an_optimizer_v2_is_delegated():
  """TF 2.4's OptimizerV2 of every kind had `decay` (tf_keras's legacy ones keep it)."""
  opt = LSO(tf_keras.optimizers.legacy.Adagrad(0.5, decay=0.25))
  assert float(np.asarray(opt.decay)) == 0.25 and "decay" in dir(opt)
  opt.decay = 0.125
  assert float(np.asarray(opt.inner_optimizer.decay)) == 0.125


@pytest.mark.parametrize("attr", ["clipnorm", "clipvalue", "global_clipnorm"])
def test_clipping_set_through_the_wrapper_clips_the_next_step(family, attr):
  """As tf_keras's wrapper: the setter reaches the inner optimizer."""
  inner = make_inner(family, learning_rate=1.0)
  opt, var = LSO(inner, initial_scale=8), tf.Variable([1.0, 1.0])
  setattr(opt, attr, 1.0)
  assert getattr(inner, attr) == 1.0
  opt.apply_gradients([(tf.constant([3.0, 4.0]), var)])
  np.testing.assert_allclose(var.numpy(), [0.0, 0.0] if attr == "clipvalue" else [0.4, 0.2])


def test_non_hyperparameters_are_not_delegated(family):
  opt = LSO(make_inner(family, "Adam", beta_1=0.8, epsilon=1e-5))
  assert float(np.asarray(opt.beta_1)) == pytest.approx(0.8)
  with pytest.raises(
    AttributeError, match=r"^'LossScaleOptimizer' object has no attribute 'epsilon'$"
  ):
    opt.epsilon  # noqa: B018
  assert "epsilon" not in dir(opt) and "beta_1" in dir(opt)
  opt.epsilon = 1e-4
  assert opt.epsilon == 1e-4 and opt.inner_optimizer.epsilon == 1e-5


# --- Experimental class -----------------------------------------------------


def test_experimental_isinstance_both_ways(family):
  exp = ExperimentalLSO(make_inner(family), "dynamic")
  assert isinstance(exp, LSO) and isinstance(exp, ExperimentalLSO)
  assert not isinstance(LSO(make_inner(family)), ExperimentalLSO)
  assert type(exp).__name__ == "LossScaleOptimizer"


@pytest.mark.parametrize(
  "loss_scale_arg, expected",
  [
    ("dynamic", (True, 32768.0, 2000)),
    (123, (False, 123.0, None)),
    (4.5, (False, 4.5, None)),
    (loss_scale.FixedLossScale(7), (False, 7.0, None)),
    (loss_scale.DynamicLossScale(2048, 500), (True, 2048.0, 500)),
    (loss_scale.serialize(loss_scale.FixedLossScale(8)), (False, 8.0, None)),
    (loss_scale.serialize(loss_scale.DynamicLossScale(2048, 500)), (True, 2048.0, 500)),
  ],
)
def test_experimental_conversions(family, loss_scale_arg, expected):
  opt = ExperimentalLSO(make_inner(family), loss_scale_arg)
  assert (opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps) == expected


def test_experimental_takes_a_serialized_loss_scale_as_tf24_s():
  """TF's own copy of TF 2.4's class, still shipped, as the reference."""
  tf24 = pytest.importorskip("tensorflow.python.keras.mixed_precision.loss_scale_optimizer")
  tf24_sgd = pytest.importorskip("tensorflow.python.keras.optimizer_v2.gradient_descent")
  for config in (
    {"class_name": "FixedLossScale", "config": {"loss_scale_value": 8.0}},
    {"class_name": "DynamicLossScale", "config": {"initial_loss_scale": 64.0}},
  ):
    theirs = tf24.LossScaleOptimizerV1(tf24_sgd.SGD(), config)
    ours = ExperimentalLSO(keras.optimizers.SGD(), config)
    assert (ours.dynamic, float(ours.loss_scale)) == (theirs.dynamic, float(theirs.loss_scale))


def test_experimental_errors(family):
  with pytest.raises(ValueError, match="DynamicLossScale.multiplier must be 2"):
    ExperimentalLSO(make_inner(family), loss_scale.DynamicLossScale(multiplier=3.0))

  class Custom(loss_scale.LossScale):
    def __call__(self):
      return tf.constant(1.0)

    def update(self, grads):
      return tf.no_op(), True

    def get_config(self):
      return {}

  with pytest.raises(TypeError, match="not a FixedLossScale or a DynamicLossScale"):
    ExperimentalLSO(make_inner(family), Custom())
  with pytest.raises(ValueError, match="Invalid value passed to loss_scale"):
    ExperimentalLSO(make_inner(family), "static")


def test_experimental_logs_deprecation_warning(caplog):
  with caplog.at_level("WARNING"):
    ExperimentalLSO(keras.optimizers.SGD(), "dynamic")
  assert "Please use tf_lossscale.keras.mixed_precision.LossScaleOptimizer instead" in caplog.text
  caplog.clear()
  with caplog.at_level("WARNING"):
    ExperimentalLSO(keras.optimizers.SGD(), loss_scale.DynamicLossScale(64, 10))
  assert "LossScaleOptimizer(opt, initial_scale=64.0, dynamic_growth_steps=10)" in caplog.text
  caplog.clear()
  with caplog.at_level("WARNING"):
    ExperimentalLSO(keras.optimizers.SGD(), 12)
  assert "LossScaleOptimizer(opt, dynamic=False, initial_scale=12)" in caplog.text


def _seed_pairs(make):
  """The three conversions of seed 000, with inner optimizers from `make()`."""
  return [
    (ExperimentalLSO(make(), loss_scale="dynamic"), LSO(make())),
    (ExperimentalLSO(make(), loss_scale=123), LSO(make(), dynamic=False, initial_scale=123)),
    (
      ExperimentalLSO(make(), loss_scale=loss_scale.DynamicLossScale(2048, 500)),
      LSO(make(), initial_scale=2048, dynamic_growth_steps=500),
    ),
  ]


def test_seed_config_equality_tf_keras_legacy():
  for opt1, opt2 in _seed_pairs(tf_keras.optimizers.legacy.SGD):
    assert opt1.get_config() == opt2.get_config()


def test_seed_config_equality_keras3_named():
  for opt1, opt2 in _seed_pairs(lambda: keras.optimizers.SGD(name="sgd")):
    assert opt1.get_config() == opt2.get_config()


def test_config_keeps_the_inner_optimizer_s_own_name():
  # Keras 3.15 on keys an optimizer's state by its name (`get_state_tree`, Orbax
  # checkpoints): a config that renamed `sgd_1` to `sgd` made seed 000's `==` hold,
  # but a model rebuilt from it found no optimizer state to load.
  keras.optimizers.SGD()
  inner = keras.optimizers.SGD()  # `sgd_N` on Keras 3.15 on, `SGD` before
  opt = LSO(inner)
  assert opt.get_config()["inner_optimizer"]["config"]["name"] == inner.name
  assert LSO.from_config(opt.get_config()).inner_optimizer.name == inner.name


def test_seed_config_equality_keras3_comparable_config():
  # Keras 3.15 on names the inner optimizers `sgd_N`, `sgd_M`; earlier Keras
  # names each `SGD`: the default name is dropped either way.
  for opt1, opt2 in _seed_pairs(keras.optimizers.SGD):
    assert opt1.comparable_config() == opt2.comparable_config()
    assert "name" not in opt1.comparable_config()["inner_optimizer"]["config"]
    assert "name" in opt1.get_config()["inner_optimizer"]["config"]
  named = LSO(keras.optimizers.SGD(name="mine")).comparable_config()
  assert named["inner_optimizer"]["config"]["name"] == "mine"
  assert (
    LSO(keras.optimizers.SGD(momentum=0.5)).comparable_config()
    != LSO(keras.optimizers.SGD()).comparable_config()
  )


# --- Config and serialization ------------------------------------------------


def test_config_round_trip(family):
  opt = LSO(make_inner(family, momentum=0.25), initial_scale=64, dynamic_growth_steps=7)
  config = opt.get_config()
  assert sorted(config) == ["dynamic", "dynamic_growth_steps", "initial_scale", "inner_optimizer"]
  clone = LSO.from_config(config)
  assert type(clone) is type(opt)
  assert (clone.initial_scale, clone.dynamic_growth_steps) == (64.0, 7)
  assert clone.inner_optimizer.get_config() == opt.inner_optimizer.get_config()
  exp_clone = ExperimentalLSO.from_config(config)
  assert isinstance(exp_clone, ExperimentalLSO) and exp_clone.dynamic_growth_steps == 7


@pytest.mark.parametrize("name", list(OPTIONS))
def test_an_option_set_is_in_config_and_round_trips(family, name):
  opt = LSO(make_inner(family), initial_scale=64, dynamic_growth_steps=7, **{name: OPTIONS[name]})
  config = opt.get_config()
  assert sorted(config) == sorted(
    ["dynamic", "dynamic_growth_steps", "initial_scale", "inner_optimizer", name]
  )
  assert config[name] == OPTIONS[name]
  for clone in (LSO.from_config(config), ExperimentalLSO.from_config(config)):
    assert getattr(clone, name) == OPTIONS[name]
    assert clone.comparable_config() == opt.comparable_config()


def test_experimental_class_takes_the_options_from_its_dynamic_loss_scale(family):
  exp = ExperimentalLSO(make_inner(family), loss_scale.DynamicLossScale(512, 500, **OPTIONS))
  opt = LSO(make_inner(family), initial_scale=512, dynamic_growth_steps=500, **OPTIONS)
  assert exp.comparable_config() == opt.comparable_config()
  assert (exp.min_loss_scale, exp.max_loss_scale, exp.hysteresis) == (0.25, 1024.0, 3)


def test_from_config_accepts_old_experimental_config(family):
  inner_config = LSO(make_inner(family)).get_config()["inner_optimizer"]
  old = {
    "optimizer": inner_config,
    "loss_scale": loss_scale.serialize(loss_scale.DynamicLossScale(256, 10)),
  }
  opt = LSO.from_config(old)
  assert (opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps) == (True, 256.0, 10)
  old["loss_scale"] = loss_scale.serialize(loss_scale.DynamicLossScale(256, 10, 4.0))
  with pytest.raises(ValueError, match="multiplier is not 2"):
    LSO.from_config(old)


def test_keras_serialize_deserialize():
  opt = LSO(keras.optimizers.Adam(0.5), dynamic=False, initial_scale=8)
  config = tf.keras.optimizers.serialize(opt)
  assert config["registered_name"] == "tf_lossscale>LossScaleOptimizer"
  clone = tf.keras.optimizers.deserialize(config)
  assert isinstance(clone, LSO) and clone.initial_scale == 8.0 and not clone.dynamic
  assert float(np.asarray(clone.learning_rate)) == 0.5
  # As TF 2.4: the experimental class deserializes as the non-experimental one.
  exp = ExperimentalLSO(keras.optimizers.SGD(), "dynamic")
  clone = tf.keras.optimizers.deserialize(tf.keras.optimizers.serialize(exp))
  assert isinstance(clone, LSO) and not isinstance(clone, ExperimentalLSO)


def test_tf_keras_serialize_deserialize():
  opt = LSO(tf_keras.optimizers.legacy.Adam(0.5), initial_scale=8)
  clone = tf_keras.optimizers.deserialize(
    tf_keras.optimizers.serialize(opt), use_legacy_optimizer=True
  )
  assert isinstance(clone, LSO) and clone.initial_scale == 8.0
  assert float(np.asarray(clone.learning_rate)) == 0.5


def _registered_subclass(saving):
  """A user's subclass with a setting of its own, registered with `saving`."""

  class ClippedLSO(LSO):
    def __init__(self, inner_optimizer, clip_to=1.0, **kwargs):
      super().__init__(inner_optimizer, **kwargs)
      self.clip_to = clip_to

    def get_config(self):
      return {**super().get_config(), "clip_to": self.clip_to}

  # A name of its own per framework: both register `ClippedLSO` otherwise.
  return saving.register_keras_serializable("user_" + saving.__name__.split(".")[0])(ClippedLSO)


_SERIALIZATION = {
  "keras3": (keras.saving, keras.optimizers.serialize, keras.optimizers.deserialize),
  "tf_keras": (
    tf_keras.saving,
    tf_keras.optimizers.serialize,
    lambda config: tf_keras.optimizers.deserialize(config, use_legacy_optimizer=True),
  ),
  "tf_keras_new": (tf_keras.saving, tf_keras.optimizers.serialize, tf_keras.optimizers.deserialize),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_registered_subclass_serializes_as_itself(family):
  """As a registered subclass of any Keras class: its own name, its own class back
  (an unregistered one, Horovod's, still saves as ours: test_horovod_wrapping)."""
  saving, serialize, deserialize = _SERIALIZATION[family]
  cls = _registered_subclass(saving)
  config = serialize(cls(make_inner(family, learning_rate=0.5), clip_to=3.0, initial_scale=8))
  assert config["registered_name"] == saving.get_registered_name(cls)
  clone = deserialize(config)
  assert isinstance(clone, cls) and clone.clip_to == 3.0 and clone.initial_scale == 8.0
  assert isinstance(clone.inner_optimizer, type(make_inner(family)))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_user_s_inner_optimizer_class_deserializes_with_its_framework(family):
  """Keras 3 and tf_keras write a user's class with its own module (None
  from `__main__`): a tf_keras subclass's config went to Keras 3, which could
  not find it."""
  saving, serialize, deserialize = _SERIALIZATION[family]
  inner_cls = type("UserSGD", (type(make_inner(family)),), {})
  config = serialize(LSO(inner_cls(learning_rate=0.5), initial_scale=8))
  with saving.custom_object_scope({"UserSGD": inner_cls}):
    clone = deserialize(config)
  assert type(clone.inner_optimizer) is inner_cls and clone.initial_scale == 8.0


def test_a_user_s_keras3_class_with_a_config_of_its_own_deserializes_with_keras3():
  """Without `use_ema` (its `get_config` not calling the base's), it is still
  found where Keras 3 registered it."""

  @keras.saving.register_keras_serializable("user_configs")
  class OwnConfigSGD(keras.optimizers.SGD):
    def get_config(self):
      return {"learning_rate": 0.5}

  config = keras.optimizers.serialize(LSO(OwnConfigSGD(0.5), initial_scale=8))
  clone = keras.optimizers.deserialize(config)
  assert type(clone.inner_optimizer) is OwnConfigSGD and clone.initial_scale == 8.0


def test_a_user_s_class_named_as_a_keras3_class_is_not_replaced_by_it():
  """Keras 3's Lamb is given to `deserialize` for Keras 3's own configs; a
  user's `Lamb` (its own module) comes back only as itself."""
  if not hasattr(keras.optimizers, "Lamb"):
    pytest.skip("this Keras has no Lamb")
  user_lamb = type("Lamb", (keras.optimizers.Lamb,), {"__module__": "user.optimizers"})
  config = LSO(user_lamb(), initial_scale=8).get_config()
  assert config["inner_optimizer"]["module"] == "user.optimizers"
  with pytest.raises(ValueError, match=re.escape("gave 'Lamb', not an optimizer: give its class")):
    LSO.from_config(config)
  assert type(LSO.from_config(config, {"Lamb": user_lamb}).inner_optimizer) is user_lamb
  assert type(LSO.from_config(LSO(keras.optimizers.Lamb()).get_config()).inner_optimizer) is (
    keras.optimizers.Lamb
  )


def test_from_config_leaves_the_config_it_is_given_as_it_was():
  """The peers (and we) let the framework replace the inner optimizer's
  schedule config by a schedule object in the caller's dict."""
  schedule = keras.optimizers.schedules.ExponentialDecay(0.5, 10, 0.9)
  config = LSO(keras.optimizers.SGD(schedule)).get_config()
  before = copy.deepcopy(config)
  for cls in (LSO, ExperimentalLSO):
    cls.from_config(config)
    assert config == before
  json.dumps(config)


def test_a_registered_subclass_survives_a_keras_model_save(tmp_path):
  cls = _registered_subclass(keras.saving)
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  model.compile(optimizer=cls(keras.optimizers.SGD(0.5), clip_to=3.0), loss="mse")
  model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
  model.save(tmp_path / "model.keras")
  loaded = keras.saving.load_model(tmp_path / "model.keras")
  assert isinstance(loaded.optimizer, cls) and loaded.optimizer.clip_to == 3.0


@pytest.mark.skipif(
  not hasattr(keras.optimizers.SGD, "_unpickle_model"),
  reason="this Keras pickles no optimizer (3.0, 3.2)",
)
def test_keras3_pickle_as_a_plain_keras3_optimizer():
  """As Keras 3 pickles an optimizer (for distributed-computing frameworks): its
  config, and its own variables (the scale state) where the copy has them; the
  inner optimizer, not built in the copy, starts afresh, as a plain one's does."""
  opt = LSO(keras.optimizers.SGD(0.5, momentum=0.9), initial_scale=8, dynamic_growth_steps=3)
  var = tf.Variable([1.0, 2.0])
  for grad in ([1.0, 1.0], [float("nan"), 1.0], [2.0, -1.0]):  # applied, skipped, applied
    opt.apply_gradients([(tf.constant(grad), var)])
  clone = pickle.loads(pickle.dumps(opt))
  assert type(clone) is type(opt) and clone.get_config() == opt.get_config()
  assert (float(clone.loss_scale), count(clone.dynamic_counter)) == (4.0, 1)
  plain = pickle.loads(pickle.dumps(opt.inner_optimizer))
  assert count(clone.iterations) == count(plain.iterations) == 0
  clone.apply_gradients([(tf.constant([1.0, 3.0]), var)])
  assert (float(clone.loss_scale), count(clone.dynamic_counter)) == (4.0, 2)


@pytest.mark.skipif(
  not hasattr(keras.optimizers.SGD, "_unpickle_model"),
  reason="this Keras pickles no optimizer (3.0, 3.2)",
)
@pytest.mark.parametrize(
  "how",
  [copy.copy, copy.deepcopy, lambda opt: pickle.loads(pickle.dumps(opt))],
  ids=["copy", "deepcopy", "pickle"],
)
def test_keras3_copies_of_the_experimental_class_keep_their_class(how):
  """Keras 3 copies through its saving format, which loads the experimental
  class's saved name as the non-experimental class (as TF 2.4 loaded a model)."""
  opt = ExperimentalLSO(
    keras.optimizers.SGD(0.5), loss_scale.DynamicLossScale(8.0, increment_period=3)
  )
  opt.apply_gradients([(tf.constant([float("nan")]), tf.Variable([1.0]))])
  clone = how(opt)
  assert type(clone) is type(opt) and isinstance(clone, ExperimentalLSO)
  assert clone.get_config() == opt.get_config()
  assert float(clone.loss_scale) == 4.0
  assert type(keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(opt))) is (
    type(LSO(keras.optimizers.SGD()))
  )


@pytest.mark.parametrize("family", FAMILIES)
def test_repr_names_the_inner_optimizer(family):
  """So that the other Keras's `compile`, which refuses it with its repr, shows
  which Keras the wrapper is for."""
  inner = make_inner(family)
  opt = LSO(inner)
  assert repr(opt) == f"<LossScaleOptimizer at {id(opt):#x} wrapping {inner!r}>"
  assert type(inner).__module__.split(".")[0] in repr(opt)


# --- Checkpoints -------------------------------------------------------------


def _train(opt, var, grads):
  for grad in grads:
    opt.apply_gradients([(tf.constant(grad), var)])


def _checkpoint_keys(path):
  return sorted(
    name for name, _ in tf.train.list_variables(path) if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
  )


def _state(opt, var):
  return (
    var.numpy().tolist(),
    np.asarray(momentum_slot(opt, var)).tolist(),
    count(opt.iterations),
    float(opt.loss_scale),
    count(opt.dynamic_counter),
  )


STEPS = [[1.0, 2.0], [float("nan"), 0.0], [0.5, 0.5]]


@pytest.mark.parametrize("direction", ["theirs_to_ours", "ours_to_theirs"])
def test_checkpoint_interop_with_tf_keras_lso(tmp_path, direction):
  def ours():
    return LSO(
      tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9), initial_scale=16, dynamic_growth_steps=5
    )

  def theirs():
    return tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9), initial_scale=16, dynamic_growth_steps=5
    )

  write, read = (theirs, ours) if direction == "theirs_to_ours" else (ours, theirs)
  var = tf.Variable([1.0, 1.0])
  opt = write()
  _train(opt, var, STEPS)
  expected = _state(opt, var)
  path = tf.train.Checkpoint(optimizer=opt, var=var).save(str(tmp_path / "ckpt"))

  reference = read()  # the other class: one checkpoint is ours, the other theirs
  reference_var = tf.Variable([1.0, 1.0])
  _train(reference, reference_var, STEPS)
  reference_path = tf.train.Checkpoint(optimizer=reference, var=reference_var).save(
    str(tmp_path / "reference")
  )
  assert _checkpoint_keys(path) == _checkpoint_keys(reference_path)
  assert "optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE" in _checkpoint_keys(
    path
  )

  new_var = tf.Variable([0.0, 0.0])
  new_opt = read()
  status = tf.train.Checkpoint(optimizer=new_opt, var=new_var).restore(path)
  new_opt.apply_gradients([(tf.constant([0.0, 0.0]), new_var)])  # creates slots: deferred restore
  status.assert_consumed()
  restored = _state(new_opt, new_var)
  assert restored[2] == expected[2] + 1 and restored[4] == expected[4] + 1
  assert restored[3] == expected[3] == 8.0
  np.testing.assert_allclose(restored[1], 0.9 * np.asarray(expected[1]), rtol=1e-6)


def test_keras3_tf_checkpoints_work_where_plain_keras3_ones_do(tmp_path):
  """Keras 3.0's optimizers are no TF trackables (Keras 3.1 made them so):
  `tf.train.Checkpoint` refuses a plain one there, and ours alike."""
  for name, make in (
    ("plain", keras.optimizers.SGD),
    ("ours", lambda: LSO(keras.optimizers.SGD())),
  ):
    opt, var = make(), tf.Variable([1.0, 1.0])
    if not helpers.KERAS3_OPTIMIZERS_CHECKPOINT:
      with pytest.raises(ValueError, match="was expecting optimizer to be a trackable object"):
        tf.train.Checkpoint(optimizer=opt, var=var)
      continue
    opt.apply_gradients([(tf.constant([1.0, 2.0]), var)])
    path = tf.train.Checkpoint(optimizer=opt, var=var).write(str(tmp_path / name))
    restored, restored_var = make(), tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(optimizer=restored, var=restored_var).read(path).assert_consumed()
    assert count(restored.iterations) == 1
    np.testing.assert_array_equal(restored_var.numpy(), var.numpy())


def test_delegate_tracking_says_whether_there_is_a_trackable_to_delegate_to():
  """The path of Keras 3.0's inner optimizers (no TF trackables), on any Keras."""

  class Wrapper:
    pass

  assert framework_internals.delegate_tracking(Wrapper(), tf.Variable(1.0))
  assert not framework_internals.delegate_tracking(Wrapper(), object())


@pytest.mark.parametrize("family", ["keras3", "tf_keras_new"])
def test_own_checkpoint_round_trip(tmp_path, family):
  """The checkpoint holds the inner optimizer's keys, as this Keras or tf_keras
  writes them (Keras <= 3.4 `iterations`, later `_iterations`), and the scale."""
  helpers.need_tf_checkpoints(family)

  def make():
    return LSO(
      make_inner(family, learning_rate=0.1, momentum=0.9), initial_scale=16, dynamic_growth_steps=5
    )

  var = tf.Variable([1.0, 1.0])
  opt = make()
  _train(opt, var, STEPS)
  expected = _state(opt, var)
  path = tf.train.Checkpoint(optimizer=opt, var=var).save(str(tmp_path / "ckpt"))
  plain = make_inner(family, learning_rate=0.1, momentum=0.9)
  _train(plain, var, STEPS[:1])
  plain_path = tf.train.Checkpoint(optimizer=plain, var=var).save(str(tmp_path / "plain"))
  scale_keys = [
    f"optimizer/loss_scale/{name}/.ATTRIBUTES/VARIABLE_VALUE"
    for name in ("current_loss_scale", "good_steps")
  ]
  assert _checkpoint_keys(path) == sorted(_checkpoint_keys(plain_path) + scale_keys)

  new_var = tf.Variable([0.0, 0.0])
  new_opt = make()
  new_opt.build([new_var])
  tf.train.Checkpoint(optimizer=new_opt, var=new_var).restore(path).assert_consumed()
  assert _state(new_opt, new_var) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_options_and_skipped_steps_add_no_checkpoint_key(tmp_path, family):
  """Checkpoints with the options keep TF 2.4's keys (and so restore into TF's classes);
  a run of non-finite steps (negative counter) restores and goes on."""
  helpers.need_tf_checkpoints(family)

  def make(**options):
    return LSO(
      make_inner(family, learning_rate=0.1, momentum=0.9),
      initial_scale=16,
      dynamic_growth_steps=5,
      **options,
    )

  paths = {}
  for name, options in (("tf24", {}), ("options", OPTIONS)):
    var = tf.Variable([1.0, 1.0])
    opt = make(**options)
    _train(opt, var, STEPS + [[float("inf"), 1.0]])
    paths[name] = tf.train.Checkpoint(optimizer=opt, var=var).save(str(tmp_path / name))
  assert _checkpoint_keys(paths["options"]) == _checkpoint_keys(paths["tf24"])
  assert not any("skipped" in key for key in _checkpoint_keys(paths["options"]))
  # With hysteresis 3: 16 (NaN, run 1, then a finite step), Inf (run 1): kept.
  assert (float(opt.loss_scale), count(opt.dynamic_counter), count(opt.skipped_steps)) == (
    16.0,
    -1,
    2,
  )

  new_var = tf.Variable([0.0, 0.0])
  new_opt = make(**OPTIONS)
  if family != "tf_keras":  # OptimizerV2 restores its slots as it creates them.
    new_opt.build([new_var])
  status = tf.train.Checkpoint(optimizer=new_opt, var=new_var).restore(paths["options"])
  assert (float(new_opt.loss_scale), count(new_opt.dynamic_counter)) == (16.0, -1)
  _train(new_opt, new_var, [[float("nan"), 0.0]] * 2)  # The run's 2nd and 3rd: halves once.
  status.assert_existing_objects_matched()
  assert (float(new_opt.loss_scale), count(new_opt.dynamic_counter)) == (8.0, -2)
  assert count(new_opt.skipped_steps) == 2  # Counted since this object was made.


def test_tf22_checkpoint_with_base_optimizer_restores_slots(tmp_path):
  """Up to TF 2.2 the inner optimizer sat under `base_optimizer`."""
  var = tf.Variable([1.0, 1.0])
  old_inner = tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9)
  old_inner.apply_gradients([(tf.constant([1.0, 2.0]), var)])
  old_wrapper = tf.__internal__.tracking.AutoTrackable()
  old_wrapper.base_optimizer = old_inner
  old_wrapper.loss_scale = loss_scale.DynamicLossScale(64, 3)
  path = tf.train.Checkpoint(optimizer=old_wrapper, var=var).save(str(tmp_path / "old"))

  new_var = tf.Variable([0.0, 0.0])
  opt = LSO(tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9))
  tf.train.Checkpoint(optimizer=opt, var=new_var).restore(path)
  opt.apply_gradients([(tf.constant([0.0, 0.0]), new_var)])
  np.testing.assert_allclose(opt.get_slot(new_var, "momentum").numpy(), [-0.09, -0.18], rtol=1e-5)
  assert float(opt.loss_scale) == 64.0


@pytest.mark.parametrize("cls", [mixed_precision.LossScaleOptimizer, ExperimentalLSO])
def test_from_config_refuses_a_dynamic_loss_scale_whose_multiplier_is_not_2(cls):
  # TF 2.4's message when deserializing (the constructor's own message differs).
  config = {
    "optimizer": {"class_name": "SGD", "config": {"name": "sgd"}},
    "loss_scale": {
      "class_name": "DynamicLossScale",
      "config": {"initial_loss_scale": 8.0, "increment_period": 10, "multiplier": 3.0},
    },
  }
  message = (
    "Cannot deserialize LossScaleOptimizer with a DynamicLossScale whose multiplier is not 2. "
    "Got DynamicLossScale: "
  )
  with pytest.raises(ValueError, match="^" + re.escape(message)):
    cls.from_config(config)


# --- Issue 16: classes called directly, minimize's hook, internals' fallbacks ----------


@pytest.mark.parametrize("other", FAMILIES)
def test_the_concrete_class_called_with_any_family_wraps_it(family, other):
  """`type(opt)(inner)` is `LossScaleOptimizer(inner)`, whatever the inner's family."""
  concrete = type(LSO(make_inner(family)))
  inner = make_inner(other)
  opt = concrete(inner, dynamic=False, initial_scale=4)
  assert type(opt) is type(LSO(make_inner(other)))
  assert opt.inner_optimizer is inner and float(opt.loss_scale) == 4.0


def test_a_subclass_of_a_concrete_class_keeps_its_class_and_refuses_another_family(family):
  cls = type("Sub", (type(LSO(make_inner(family))),), {})
  opt = cls(inner_optimizer=make_inner(family), initial_scale=8)
  assert type(opt) is cls and float(opt.loss_scale) == 8.0
  other = "tf_keras" if family == "keras3" else "keras3"
  with pytest.raises(TypeError, match="Sub subclasses the LossScaleOptimizer class of"):
    cls(make_inner(other))


def test_experimental_class_takes_its_arguments_as_keywords(family):
  inner = make_inner(family)
  opt = ExperimentalLSO(optimizer=inner, loss_scale=8)
  assert isinstance(opt, ExperimentalLSO) and opt.inner_optimizer is inner
  assert type(opt).from_config(opt.get_config()).initial_scale == 8.0


def test_minimize_goes_through_compute_gradients(family):
  """TF 2.4's OptimizerV2 path: `minimize` = `_compute_gradients` + `apply_gradients`."""
  seen = []

  class Recording(LSO):
    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
      pairs = super()._compute_gradients(loss, var_list, grad_loss, tape)
      seen.append([float(g) for g, _ in pairs])
      return pairs

  opt = Recording(make_inner(family, learning_rate=1.0), dynamic=False, initial_scale=4)
  var = tf.Variable(1.0)
  opt.minimize(lambda: 3.0 * var, var_list=[var])
  assert seen == [[3.0]] and float(var.numpy()) == -2.0  # unscaled once


def test_optimizer_v2_computes_the_scaled_loss_gradients_itself():
  """As TF 2.4: the inner OptimizerV2's `_compute_gradients` gets the scaled loss."""
  losses = []

  class RecordingSGD(tf_keras.optimizers.legacy.SGD):
    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
      losses.append(float(loss()))
      return super()._compute_gradients(loss, var_list, grad_loss, tape)

  opt = LSO(RecordingSGD(1.0), dynamic=False, initial_scale=4)
  var = tf.Variable(1.0)
  opt.minimize(lambda: 3.0 * var, var_list=[var])
  assert losses == [12.0] and float(var.numpy()) == -2.0


def test_internals_fallbacks_when_optimizer_v2_members_are_gone():
  var = tf.Variable(2.0)
  assert framework_internals.v2_compute_gradients(object(), lambda: var, [var], None, None) is None
  with pytest.raises(AttributeError, match="object has no `_decayed_lr`"):
    framework_internals.v2_decayed_lr(object(), tf.float32)

  class WithoutComputeGradients(tf_keras.optimizers.legacy.SGD):
    _compute_gradients = None  # gone in some future tf_keras

  opt = LSO(WithoutComputeGradients(1.0), dynamic=False, initial_scale=4)
  opt.minimize(lambda: 3.0 * var, var_list=[var])  # with the tape instead
  assert float(var.numpy()) == -1.0


def test_skip_gradients_aggregation_is_experimental_aggregate_gradients_false(family):
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    var = tf.Variable([1.0])
    opt = LSO(make_inner(family, learning_rate=1.0), initial_scale=4)

  @tf.function
  def step():
    # Each replica passes [1]: aggregated, the sum [2] would be applied.
    strategy.run(
      lambda: opt.apply_gradients([(tf.constant([1.0]), var)], skip_gradients_aggregation=True)
    )

  step()
  assert [float(v.numpy()[0]) for v in strategy.experimental_local_results(var)] == [0.0, 0.0]


@pytest.mark.skipif(
  "loss_scale_factor" not in inspect.signature(keras.optimizers.SGD.__init__).parameters,
  reason="this Keras 3 has no loss_scale_factor",
)
def test_an_inner_loss_scale_factor_is_cleared_with_a_warning(caplog):
  inner = keras.optimizers.SGD(loss_scale_factor=4.0)
  opt = LSO(inner)
  assert inner.loss_scale_factor is None
  assert "sets loss_scale_factor=4.0 of the inner SGD to None" in caplog.text
  assert opt.get_config()["inner_optimizer"]["config"]["loss_scale_factor"] is None


def _branch_ops(graph, op, attr):
  """The op types in the function `op`'s attribute `attr` names (an If's
  branch) and, recursively, in every function its nodes name."""
  library = {f.signature.name: f for f in graph.as_graph_def().library.function}
  names, types = [op.get_attr(attr).name], set()
  while names:
    for node in library[names.pop()].node_def:
      types.add(node.op)
      names += [v.func.name for v in node.attr.values() if v.func.name in library]
      names += [node.op] if node.op in library else []
  return types


@pytest.mark.parametrize("machine", ["cpu", "gpu"])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["function", "xla"])
def test_where_a_skipped_step_is_counted(family, jit_compile, machine, monkeypatch):
  """The skip branch writes the scale, its counter and the step counter, and
  no variable or slot; under XLA on a CPU it writes nothing, and the step
  counter gets 1 - finite after the apply.

  Under XLA on a CPU a skip branch writing the step counter made every variable
  and slot of the apply a select: 2.5 to 3 times the compile time with 100
  variables. Elsewhere only the taken branch runs, and it runs the state's
  transition for its own verdict alone (see `fast_paths._state_in_branches`).
  """
  monkeypatch.setattr(fast_paths, "_cpu_only", lambda: machine == "cpu")
  var = tf.Variable([1.0, 2.0])
  opt = LSO(make_inner(family, learning_rate=1.0, momentum=0.9), initial_scale=4)

  @tf.function(jit_compile=jit_compile)
  def step(grad):
    opt.apply_gradients([(grad, var)])

  graph = step.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph
  # The apply's If: the last (outside XLA on a CPU the check has Ifs of its own).
  cond = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")][-1]
  writes = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"}
  assert _branch_ops(graph, cond, "then_branch") & writes
  skip_writes = _branch_ops(graph, cond, "else_branch") & writes
  in_branches = not (machine == "cpu" and jit_compile) and fast_paths.enabled()
  assert bool(skip_writes) == in_branches
  if in_branches:
    # The scale and its counter; the skipped-step count and the step counter.
    assert skip_writes == {"AssignVariableOp", "AssignAddVariableOp"}
  step(tf.constant([float("nan"), 1.0]))  # skipped: counted, nothing moves
  step(tf.constant([4.0, 4.0]))  # applied: the momentum slot starts at 0
  assert count(opt.iterations) == 2 and count(opt.skipped_steps) == 1
  assert float(opt.loss_scale) == 2.0
  np.testing.assert_array_equal(var.numpy(), [-3.0, -2.0])


def test_compute_gradients_of_a_new_tf_keras_inner_as_tf_keras_wrapper():
  """tf_keras's optimizers have a public `compute_gradients`: a callable
  `var_list`, and variables the tape watches only because they are listed
  (not trainable), give what tf_keras's wrapper gives."""

  def gradients(wrap):
    opt = wrap(tf_keras.optimizers.SGD(0.5), dynamic=False, initial_scale=8)
    v, frozen = tf.Variable(3.0), tf.Variable(4.0, trainable=False)
    pairs = opt.compute_gradients(lambda: v**2, lambda: [v])
    pairs += opt.compute_gradients(lambda: frozen**2, [frozen])
    with tf.GradientTape() as tape:
      loss = v * frozen
    pairs += opt.compute_gradients(loss, [v], tape=tape)
    return [(float(g), var is v) for g, var in pairs]

  peer = gradients(tf_keras.mixed_precision.LossScaleOptimizer)
  assert peer == [(6.0, True), (8.0, False), (4.0, True)]
  assert gradients(mixed_precision.LossScaleOptimizer) == peer


def test_from_config_makes_no_loss_scale_variables_of_its_own_in_a_graph():
  """In a TF1 graph the optimizer's scale variables keep their names: a loss
  scale made to carry a config's settings made `current_loss_scale` first."""
  lso, experimental = mixed_precision.LossScaleOptimizer, mixed_precision.experimental
  new = lso(tf_keras.optimizers.legacy.SGD(0.1), initial_scale=4, dynamic_growth_steps=5)
  tf23 = {
    "optimizer": {"class_name": "SGD", "config": {"name": "SGD", "learning_rate": 0.1}},
    "loss_scale": {
      "class_name": "DynamicLossScale",
      "config": {"initial_loss_scale": 4.0, "increment_period": 5, "multiplier": 2.0},
    },
  }
  for cls, config in [
    (lso, new.get_config()),
    (experimental.LossScaleOptimizer, new.get_config()),
    (lso, tf23),
    (experimental.LossScaleOptimizer, tf23),
  ]:
    with tf.Graph().as_default():
      opt = cls.from_config(config)
      names = [v.name for v in tf.compat.v1.global_variables()]
      assert names == ["current_loss_scale:0", "good_steps:0"], cls
      assert (opt.initial_scale, opt.dynamic_growth_steps) == (4.0, 5)


def test_experimental_from_config_takes_the_defaults_of_settings_left_out():
  inner = keras.optimizers.serialize(keras.optimizers.SGD(0.1, name="sgd"))
  for config in ({"inner_optimizer": inner}, {"inner_optimizer": inner, "dynamic": True}):
    opt = mixed_precision.experimental.LossScaleOptimizer.from_config(config)
    assert opt.get_config() == mixed_precision.LossScaleOptimizer.from_config(config).get_config()
    assert (opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps) == (True, 2.0**15, 2000)


# --- Keras 3's optimizer API, as Keras 3's errors ------------------------------


def test_apply_without_variables_needs_a_built_inner_and_one_gradient_per_variable():
  """They failed as `zip()`'s 'argument 2 is shorter than argument 1'."""
  a, b = keras.Variable([1.0, 2.0]), keras.Variable(3.0)
  opt = LSO(keras.optimizers.SGD(0.5), dynamic=False, initial_scale=4)
  with pytest.raises(ValueError, match=re.escape("must already be built on a list of variables")):
    opt.apply([tf.ones([2]), tf.ones([])])
  opt.build([a, b])
  with pytest.raises(ValueError, match=re.escape("apply got 1 gradients for 2 trainable")):
    opt.apply([tf.ones([2])])
  with pytest.raises(ValueError, match=re.escape("apply got 3 gradients for 2 trainable")):
    opt.apply([tf.ones([2]), tf.ones([]), tf.ones([])])
  assert count(opt.iterations) == 0
  opt.apply([tf.ones([2]), tf.ones([])])
  np.testing.assert_array_equal(a.numpy(), [0.5, 1.5])


def test_stateless_apply_is_refused_with_keras3_s_error_type():
  plain = keras.optimizers.SGD()
  var = keras.Variable(1.0)
  for opt in (plain, LSO(keras.optimizers.SGD())):
    opt.build([var])
    with pytest.raises(ValueError, match="stateless_apply is not supported"):
      opt.stateless_apply([v.value for v in opt.variables], [tf.ones([])], [var.value])


def test_a_variable_the_inner_was_not_built_for_is_named_by_its_path():
  """Named 'kernel' only, every Dense layer's kernel looked alike."""
  dense = keras.layers.Dense(1, name="head")
  dense.build((None, 2))
  opt = LSO(keras.optimizers.SGD())
  opt.build([keras.Variable(1.0)])
  with pytest.raises(ValueError, match=re.escape("variable 'head/kernel'")):
    opt.apply_gradients([(tf.ones([2, 1]), dense.kernel)])


@pytest.mark.parametrize("family", FAMILIES)
def test_minimize_takes_a_tape_given_third_as_tf_keras_s_newer_optimizers_do(family):
  """`minimize(loss, var_list, tape)` is their signature: the tape was taken
  for TF 2.4's `grad_loss` ("`tape` is required when a `Tensor` loss is passed")."""
  var = tf.Variable(1.0)
  opt = LSO(make_inner(family, learning_rate=0.5), dynamic=False, initial_scale=4)
  with tf.GradientTape() as tape:
    loss = var * 3.0
  opt.minimize(loss, [var], tape)
  assert float(var.numpy()) == 1.0 - 0.5 * 3.0
