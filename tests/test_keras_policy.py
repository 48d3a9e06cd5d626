"""Keras dtype policies: Keras 3's re-exported, TF 2.4's deprecated experimental API rebuilt."""

import logging
import threading

import keras
import multi_worker_job as job
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tf_lossscale
from tf_lossscale._src import keras_policy
from tf_lossscale.keras import mixed_precision
from tf_lossscale.keras.mixed_precision import experimental

# One Dense(1) kernel of ones, inputs of ones, targets 0: each SGD(0.1) step
# multiplies the kernel by 0.6 (mse gradient 4 * w), so 3 steps give 0.216.
X = np.ones((4, 2), "float32")
Y = np.zeros((4, 1), "float32")


@pytest.fixture(autouse=True)
def _float32_policy_after():
  yield
  experimental.set_policy(None)
  tf_keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def tf24_policy():
  """TF's own copy of TF 2.4's Keras policies (still shipped, unused, in TF 2.21)."""
  return pytest.importorskip("tensorflow.python.keras.mixed_precision.policy")


def _config(loss_scale):
  return None if loss_scale is None else tf_lossscale.loss_scale.serialize(loss_scale)


def _tf24_config(loss_scale):
  return (
    None
    if loss_scale is None
    else {
      "class_name": type(loss_scale).__name__,
      "config": loss_scale.get_config(),
    }
  )


# --- Today's Keras objects ---------------------------------------------------------


def test_non_experimental_names_are_keras3_objects():
  assert mixed_precision.Policy is keras.mixed_precision.Policy is keras.mixed_precision.DTypePolicy
  assert mixed_precision.global_policy is keras.mixed_precision.global_policy
  assert mixed_precision.set_global_policy is keras.mixed_precision.set_global_policy
  assert experimental.global_policy is mixed_precision.global_policy  # as in TF 2.4


# --- experimental.Policy -----------------------------------------------------------


@pytest.mark.parametrize(
  "name, loss_scale",
  [
    ("mixed_float16", "auto"),
    ("mixed_bfloat16", "auto"),
    ("float32", "auto"),
    ("float16", "auto"),
    ("float64", "auto"),
    ("mixed_float16", None),
    ("mixed_float16", "dynamic"),
    ("mixed_float16", 128),
    ("mixed_float16", 0.5 + 1.5),
    ("float32", "dynamic"),
    ("mixed_float16", {"class_name": "FixedLossScale", "config": {"loss_scale_value": 4.0}}),
  ],
)
def test_policy_matches_tf24(tf24_policy, name, loss_scale):
  ours = experimental.Policy(name, loss_scale)
  theirs = tf24_policy.PolicyV1(name, loss_scale)
  assert (ours.name, ours.compute_dtype, ours.variable_dtype) == (
    theirs.name,
    theirs.compute_dtype,
    theirs.variable_dtype,
  )
  assert _config(ours.loss_scale) == _tf24_config(theirs.loss_scale)
  assert ours.get_config() == theirs.get_config()
  assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("alias", ["half", "float", "double"])
def test_a_dtype_alias_is_its_dtype_as_in_tf24(tf24_policy, alias):
  """TF 2.4 took any name `tf.as_dtype` takes; Keras 3 takes dtype names only, so
  the policy is named after the dtype (TF 2.4's kept the alias as its name)."""
  ours, theirs = experimental.Policy(alias), tf24_policy.PolicyV1(alias)
  assert (ours.compute_dtype, ours.variable_dtype) == (theirs.compute_dtype, theirs.variable_dtype)
  assert ours.name == tf.as_dtype(alias).name
  experimental.set_policy(alias)
  assert experimental.global_policy().compute_dtype == theirs.compute_dtype


def test_policies_compare_and_hash_as_tf24_s(tf24_policy):
  ours = [experimental.Policy("mixed_float16", 128), experimental.Policy("mixed_float16", None)]
  theirs = [tf24_policy.PolicyV1("mixed_float16", 128), tf24_policy.PolicyV1("mixed_float16", None)]
  for policies in (ours, theirs):
    assert policies[0] == policies[0] and policies[0] != policies[1]
    assert len({policies[0]: 1, policies[1]: 2}) == 2


def test_auto_loss_scale_is_dynamic_for_mixed_float16_only():
  scale = experimental.Policy("mixed_float16").loss_scale
  assert isinstance(scale, tf_lossscale.DynamicLossScale)
  assert (scale.initial_loss_scale, scale.increment_period, scale.multiplier) == (2**15, 2000, 2)
  for name in ("mixed_bfloat16", "float32", "float16"):
    assert experimental.Policy(name).loss_scale is None


def test_a_loss_scale_object_is_kept():
  scale = tf_lossscale.FixedLossScale(64)
  assert experimental.Policy("mixed_float16", scale).loss_scale is scale


def test_loss_scale_on_a_non_float16_policy_warns(caplog):
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    experimental.Policy("float32", loss_scale="dynamic")
    experimental.Policy("mixed_bfloat16")
    experimental.Policy("mixed_float16", loss_scale=8)
  warnings = [
    r.getMessage() for r in caplog.records if "loss scale is only useful" in r.getMessage()
  ]
  assert warnings == [
    "Creating a Policy with a loss scale is only useful for float16 policies. You passed "
    "loss_scale='dynamic' for policy float32. Consider not passing any loss_scale instead."
  ]


@pytest.mark.parametrize(
  "name, loss_scale",
  [
    (tf.float16, "auto"),
    (1, "auto"),
    ("float16_with_float32_vars", "auto"),
    ("infer_float32_vars", "auto"),
    ("my_float32_vars", "auto"),
    ("not_a_dtype", "auto"),
    ("mixed_float16", "bogus"),
  ],
)
def test_policy_errors_match_tf24(tf24_policy, name, loss_scale):
  with pytest.raises((TypeError, ValueError)) as theirs:
    tf24_policy.PolicyV1(name, loss_scale)
  with pytest.raises(theirs.type) as ours:
    experimental.Policy(name, loss_scale)
  assert str(ours.value) == str(theirs.value)


def test_policy_is_a_keras3_dtype_policy():
  policy = experimental.Policy("mixed_float16", 128)
  assert isinstance(policy, keras.mixed_precision.DTypePolicy)
  layer = keras.layers.Dense(2, dtype=policy)
  y = layer(np.ones((1, 3), "float32"))
  assert layer.dtype_policy is policy
  assert y.dtype == "float16" and layer.kernel.dtype == "float32"


def test_policy_config_round_trip():
  for policy in (
    experimental.Policy("mixed_float16"),
    experimental.Policy("mixed_float16", None),
    experimental.Policy("float32", tf_lossscale.DynamicLossScale(4, 3)),
  ):
    restored = experimental.Policy.from_config(policy.get_config())
    assert restored.get_config() == policy.get_config()
    assert _config(restored.loss_scale) == _config(policy.loss_scale)


def test_policy_from_config_takes_custom_loss_scales():
  class MyLossScale(tf_lossscale.FixedLossScale):
    pass

  config = {
    "name": "mixed_float16",
    "loss_scale": {"class_name": "MyLossScale", "config": {"loss_scale_value": 2.0}},
  }
  policy = experimental.Policy.from_config(config, custom_objects={"MyLossScale": MyLossScale})
  assert type(policy.loss_scale) is MyLossScale


def test_layers_saved_with_the_policy_load_with_a_plain_policy():
  """As TF 2.4 documented: deserialized as the non-experimental Policy, loss scale dropped."""
  experimental.set_policy(experimental.Policy("mixed_float16", 16))
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  restored = keras.Sequential.from_config(model.get_config())
  reloaded = restored.layers[0].dtype_policy
  assert isinstance(reloaded, keras.mixed_precision.DTypePolicy) and not isinstance(
    reloaded, experimental.Policy
  )
  assert reloaded.name == "mixed_float16"


def test_policy_serializes_as_a_keras_object():
  policy = experimental.Policy("mixed_float16", 32)
  restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(policy))
  assert type(restored) is experimental.Policy and restored.get_config() == policy.get_config()


# --- The device check ----------------------------------------------------------------


@pytest.mark.parametrize(
  "gpus, level, text",
  [
    ([], logging.WARNING, "may run slowly because this machine does not have a GPU"),
    (
      [{"device_name": "Tesla P100", "compute_capability": (6, 0)}],
      logging.WARNING,
      "Your GPU may run slowly with dtype policy mixed_float16 because it does not have "
      "compute capability of at least 7.0. Your GPU:\n  Tesla P100, compute capability 6.0\n",
    ),
    (
      [
        {"device_name": "V100", "compute_capability": (7, 0)},
        {"device_name": "K80", "compute_capability": (3, 7)},
        {"device_name": "K80", "compute_capability": (3, 7)},
        {"device_name": "Unknown"},
      ],
      logging.WARNING,
      "Some of your GPUs may run slowly with dtype policy mixed_float16 because they do not "
      "all have compute capability of at least 7.0. Your GPUs:\n  V100, compute capability "
      "7.0\n  K80, compute capability 3.7 (x2)\n  Unknown, no compute capability (probably "
      "not an Nvidia GPU)\n",
    ),
    (
      [{"device_name": "H100", "compute_capability": (9, 0)}],
      logging.INFO,
      "Your GPU will likely run quickly with dtype policy mixed_float16 as it has compute "
      "capability of at least 7.0. Your GPU: H100, compute capability 9.0",
    ),
  ],
)
def test_device_check_messages(caplog, gpus, level, text):
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    keras_policy._DeviceCheck.log(gpus)  # pylint: disable=protected-access
  [record] = caplog.records
  assert record.levelno == level
  assert record.getMessage().startswith("Mixed precision compatibility check (mixed_float16): ")
  assert text in record.getMessage()


@pytest.mark.parametrize("make", ["Policy", "set_policy"])
def test_device_check_logs_once_for_mixed_float16_only(caplog, monkeypatch, make):
  """A Policy of that name logs it, and so does set_policy given the name."""
  monkeypatch.setattr(keras_policy._DeviceCheck, "logged", False)  # pylint: disable=protected-access
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    for name in ("mixed_bfloat16", "mixed_float16", "mixed_float16"):
      getattr(experimental, make)(name)
  experimental.set_policy("float32")
  checks = [r for r in caplog.records if "compatibility check" in r.getMessage()]
  assert len(checks) == 1


# --- set_policy, global_policy, get_layer_policy -----------------------------------------


def test_set_policy_makes_keras3_build_layers_and_models_with_it():
  policy = experimental.Policy("mixed_float16", 1024)
  experimental.set_policy(policy)
  assert experimental.global_policy() is policy
  assert keras.mixed_precision.global_policy() is policy
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  assert model.dtype_policy is policy and model.layers[0].dtype_policy is policy


@pytest.mark.parametrize("name", ["mixed_float16", "float64"])
def test_set_policy_with_a_name_sets_a_plain_policy(name):
  experimental.set_policy(name)
  policy = experimental.global_policy()
  assert isinstance(policy, keras.mixed_precision.DTypePolicy) and not isinstance(
    policy, experimental.Policy
  )
  assert policy.name == name


def test_set_policy_takes_a_tf_keras_policy_by_its_name(monkeypatch):
  """tf_keras's `Policy` is TF 2.4's non-experimental one, which TF 2.4's
  `set_policy` took; it was refused as "'name' must be a string". Given one,
  tf_keras's layers are to use it: tf_keras's global policy is set too."""
  monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
  experimental.set_policy(tf_keras.mixed_precision.Policy("mixed_float16"))
  policy = keras.mixed_precision.global_policy()
  assert not isinstance(policy, experimental.Policy) and policy.name == "mixed_float16"
  assert tf_keras.layers.Dense(1).compute_dtype == "float16"
  experimental.set_policy(None)  # Both reset, as TF 2.4's one global policy.
  assert tf_keras.layers.Dense(1).compute_dtype == "float32"
  experimental.set_policy("mixed_float16")
  assert tf_keras.layers.Dense(1).compute_dtype == "float16"
  tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")  # Not ours any more: kept.
  experimental.set_policy("float32")
  assert tf_keras.mixed_precision.global_policy().name == "mixed_bfloat16"


def test_set_policy_none_restores_floatx():
  experimental.set_policy("mixed_float16")
  experimental.set_policy(None)
  assert experimental.global_policy().name == keras.config.floatx()


@pytest.mark.parametrize("policy", ["int32", experimental.Policy("bool")])
def test_set_policy_refuses_non_floating_policies(policy):
  with pytest.raises(ValueError) as e:
    experimental.set_policy(policy)
  assert str(e.value) == (
    "set_policy can only be used to set the global policy to floating-point policies, "
    'such as "float32" and "mixed_float16", but got policy: ' + str(getattr(policy, "name", policy))
  )


def test_set_policy_refuses_what_tf24_did():
  with pytest.raises(TypeError, match="'name' must be a string, but got: 3"):
    experimental.set_policy(3)


def test_a_mixed_policy_blocks_tf_own_graph_rewrite():
  experimental.set_policy("mixed_float16")
  with pytest.raises(ValueError, match="global Keras dtype Policy has been set to a mixed"):
    tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(
      tf.compat.v1.train.GradientDescentOptimizer(1.0)
    )
  experimental.set_policy("float32")
  opt = tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(
    tf.compat.v1.train.GradientDescentOptimizer(1.0)
  )
  tf.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite()
  assert opt is not None


def test_tf_own_graph_rewrite_stays_blocked_while_tf_keras_s_policy_is_mixed():
  """TF's flag is shared: `set_policy(None)` cleared it while tf_keras's global
  policy was still mixed, and TF's rewrite then ran beside it."""
  tf_keras.mixed_precision.set_global_policy("mixed_float16")
  experimental.set_policy(None)
  try:
    with pytest.raises(ValueError, match="global Keras dtype Policy has been set to a mixed"):
      tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(
        tf.compat.v1.train.GradientDescentOptimizer(1.0)
      )
  finally:  # Left on, the rewrite would fail the next tests.
    tf.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite()


@pytest.mark.parametrize("value, legacy", [("1", True), ("true", True), ("0", False)])
def test_with_tf_use_legacy_keras_set_policy_sets_tf_keras_s_policy_too(monkeypatch, value, legacy):
  """`tf.keras` is tf_keras there, and its layers read tf_keras's global policy."""
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", value)
  experimental.set_policy(experimental.Policy("mixed_float16"))
  layer = tf_keras.layers.Dense(1)
  assert layer.compute_dtype == ("float16" if legacy else "float32")
  assert keras.layers.Dense(1).compute_dtype == "float16"
  experimental.set_policy(None)
  assert tf_keras.layers.Dense(1).compute_dtype == "float32"


@pytest.mark.parametrize(
  "loss_scale, name, warned",
  [
    ("auto", "mixed_float16", False),
    ("dynamic", "mixed_float16", False),
    (128, "mixed_float16", True),
    (None, "mixed_float16", True),  # Keras 3's `compile` scales anyway.
    (tf_lossscale.DynamicLossScale(increment_period=8), "mixed_float16", True),
    ("auto", "float32", False),
    (64, "float32", True),
  ],
)
def test_set_policy_says_once_that_compile_ignores_a_loss_scale(
  caplog, monkeypatch, loss_scale, name, warned
):
  from tf_lossscale._src import keras_policy

  monkeypatch.setattr(keras_policy, "_compile_warning_logged", False)
  policy = experimental.Policy(name, loss_scale)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    experimental.set_policy(policy)
    experimental.set_policy(policy)
  said = [r.getMessage() for r in caplog.records if "does not use the loss scale" in r.getMessage()]
  assert said == (
    [
      "Keras's `Model.compile` does not use the loss scale of the global policy "
      f"{policy!r} (TF 2.4's did; under 'mixed_float16' Keras's adds its own dynamic one). "
      "To train as TF 2.4 did, pass `wrap_optimizer_for_policy(optimizer)` from "
      "tf_lossscale.keras.mixed_precision.experimental to `compile` (for a policy without "
      "a loss scale, pass `optimizer` with `auto_scale_loss=False`)."
    ]
    if warned
    else []
  )


def test_under_tf_use_legacy_keras_the_compile_warning_gives_tf_keras_s_way(caplog, monkeypatch):
  """tf_keras's `compile` refuses `auto_scale_loss`; a fixed scale of 1 trains unscaled."""
  monkeypatch.setattr(keras_policy, "_compile_warning_logged", False)
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    experimental.set_policy(experimental.Policy("mixed_float16", None))
  said = [r.getMessage() for r in caplog.records if "does not use the loss scale" in r.getMessage()]
  assert len(said) == 1
  assert said[0].endswith(
    "(for a policy without a loss scale, pass `LossScaleOptimizer(optimizer, dynamic=False, "
    "initial_scale=1)` from tf_lossscale.keras.mixed_precision, which scales by 1: no scaling)."
  )
  # What it says works: tf_keras's `compile` keeps the optimizer, which scales by 1.
  model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
  opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(
    tf_keras.optimizers.SGD(0.1), dynamic=False, initial_scale=1
  )
  model.compile(opt, "mse")
  model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
  assert model.optimizer is opt
  assert float(opt.loss_scale) == 1.0


def test_under_tf_use_legacy_keras_a_policy_tf_keras_refuses_sets_neither(monkeypatch):
  try:
    quantized = keras.dtype_policies.get("int8_from_mixed_bfloat16")
  except (AttributeError, ValueError):
    pytest.skip("this Keras has no quantized policies, the kind tf_keras refuses")
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
  with pytest.raises(ValueError, match="int8_from_mixed_bfloat16"):
    experimental.set_policy(quantized)
  assert keras.mixed_precision.global_policy().name == "float32"
  assert tf_keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.parametrize(
  "policies",
  [
    ["mixed_float16"],
    [lambda: tf_keras.mixed_precision.Policy("mixed_float16")],  # TF 2.4's usual code
    [lambda: keras.mixed_precision.Policy("mixed_float16"), "mixed_float16"],
  ],
  ids=["name", "tf_keras_policy", "keras_policy_then_name"],
)
def test_under_tf_use_legacy_keras_the_device_check_is_logged_once(caplog, monkeypatch, policies):
  """tf_keras's policy logs its own copy of the check: said once by either."""
  from tf_keras.src.mixed_precision import device_compatibility_check as tf_keras_check

  monkeypatch.setattr(keras_policy._DeviceCheck, "logged", False)
  monkeypatch.setattr(tf_keras_check, "_logged_compatibility_check", False)
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    for policy in policies:
      experimental.set_policy(policy() if callable(policy) else policy)
  checks = [r for r in caplog.records if "compatibility check" in r.getMessage()]
  assert len(checks) == 1


def test_the_filter_of_tf_keras_s_device_check_spares_other_threads(caplog, monkeypatch):
  monkeypatch.setattr(keras_policy._DeviceCheck, "logged", False)
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    with keras_policy._DeviceCheck.heard_once():
      other = threading.Thread(target=keras_policy._DeviceCheck.log_once)
      other.start()
      other.join()
  checks = [r for r in caplog.records if "compatibility check" in r.getMessage()]
  assert len(checks) == 1


def test_get_layer_policy():
  assert experimental.get_layer_policy(keras.layers.Dense(1, dtype="float64")).name == "float64"
  tf_keras_layer = tf_keras.layers.Dense(1, dtype="mixed_float16")
  assert experimental.get_layer_policy(tf_keras_layer) is tf_keras_layer.dtype_policy
  with pytest.raises(ValueError, match="^get_policy can only be called on a layer, but got: 1$"):
    experimental.get_layer_policy(1)


# --- The policy's loss scale in training ----------------------------------------------


@pytest.mark.parametrize(
  "policy, expected",
  [
    (lambda: experimental.Policy("mixed_float16"), ("experimental", True, 2.0**15, 2000)),
    (lambda: experimental.Policy("mixed_float16", 64), ("experimental", False, 64.0, None)),
    (lambda: experimental.Policy("float32", "dynamic"), ("experimental", True, 2.0**15, 2000)),
    (lambda: experimental.Policy("mixed_float16", None), None),
    (lambda: experimental.Policy("mixed_bfloat16"), None),
    (
      lambda: keras.mixed_precision.DTypePolicy("mixed_float16"),
      ("non-experimental", True, 2.0**15, 2000),
    ),
    (lambda: "mixed_float16", ("non-experimental", True, 2.0**15, 2000)),
    (lambda: keras.mixed_precision.DTypePolicy("float32"), None),
    (
      lambda: keras.layers.Dense(1, dtype=experimental.Policy("mixed_float16", 8)),
      ("experimental", False, 8.0, None),
    ),
  ],
)
def test_wrap_optimizer_for_policy_follows_tf24_compile(policy, expected):
  inner = keras.optimizers.SGD()
  opt = experimental.wrap_optimizer_for_policy(inner, policy())
  if expected is None:
    assert opt is inner
    return
  kind, dynamic, initial_scale, growth_steps = expected
  assert isinstance(opt, experimental.LossScaleOptimizer) == (kind == "experimental")
  assert opt.inner_optimizer is inner
  assert (opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps) == (
    dynamic,
    initial_scale,
    growth_steps,
  )


def test_wrap_optimizer_for_policy_defaults_to_the_global_policy():
  experimental.set_policy(experimental.Policy("mixed_float16", 32))
  opt = experimental.wrap_optimizer_for_policy("sgd")
  assert isinstance(opt.inner_optimizer, keras.optimizers.SGD)
  assert float(opt.loss_scale) == 32.0


def test_wrap_optimizer_for_policy_makes_a_named_optimizer_of_the_model_s_framework():
  """A tf_keras model's compile takes tf_keras optimizers only."""
  model = tf_keras.Sequential(
    [tf_keras.Input((2,)), tf_keras.layers.Dense(1, dtype="mixed_float16")]
  )
  opt = experimental.wrap_optimizer_for_policy("sgd", model.layers[0])
  assert isinstance(opt.inner_optimizer, tf_keras.optimizers.SGD)
  model.compile(optimizer=opt, loss="mse")
  assert model.optimizer is opt


@pytest.mark.parametrize("given", ["model", "global policy"])
def test_under_tf_use_legacy_keras_a_tf_keras_model_gets_the_experimental_policy_s_scale(
  monkeypatch, given
):
  """There `tf.keras` is tf_keras: its layers have tf_keras's policy of the
  experimental one's name, and TF 2.4's `compile` took the loss scale from theirs."""
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
  policy = experimental.Policy("mixed_float16", 256)
  experimental.set_policy(policy)
  model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
  assert experimental.get_layer_policy(model.layers[0]) is policy
  opt = experimental.wrap_optimizer_for_policy("sgd", *([model] if given == "model" else []))
  assert isinstance(opt.inner_optimizer, tf_keras.optimizers.SGD)
  assert (opt.dynamic, float(opt.loss_scale)) == (False, 256.0)
  model.compile(optimizer=opt, loss="mse")
  assert model.optimizer is opt
  experimental.set_policy(None)


@pytest.mark.parametrize("policy", [3, object()])
def test_wrap_optimizer_for_policy_names_a_bad_policy(policy):
  with pytest.raises(TypeError, match="policy must be a dtype policy, a Keras layer or model"):
    experimental.wrap_optimizer_for_policy("sgd", policy)


def test_wrap_optimizer_for_policy_leaves_loss_scale_optimizers_alone():
  policy = experimental.Policy("mixed_float16")
  for opt in (
    mixed_precision.LossScaleOptimizer(keras.optimizers.SGD()),
    keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
  ):
    assert experimental.wrap_optimizer_for_policy(opt, policy) is opt


def _model():
  return keras.Sequential(
    [keras.Input((2,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
  )


def test_keras3_model_under_the_experimental_policy_trains_with_its_loss_scale(strategy):
  experimental.set_policy(
    experimental.Policy("mixed_float16", tf_lossscale.DynamicLossScale(4, increment_period=2))
  )
  with strategy.scope():
    model = _model()
    opt = experimental.wrap_optimizer_for_policy(keras.optimizers.SGD(0.1), model)
    model.compile(optimizer=opt, loss="mse")
  model.fit(X, Y, batch_size=4, epochs=3, verbose=0)
  assert model.optimizer is opt  # Keras 3 did not wrap it in its own
  assert model.layers[0].compute_dtype == "float16"
  # Each step multiplies the kernel by 1 - 0.4 (mse gradient 4 * w), or by 1 - 0.4 * replicas
  # where Keras's fit does not divide a replica's loss by the replicas (Keras < 3.8).
  replicas = 1 if job.keras3_fit_divides_loss() else strategy.num_replicas_in_sync
  expected = (1 - 0.4 * replicas) ** 3
  np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), [expected] * 2, rtol=1e-3)
  # 4 doubles after every 2 finite steps: 3 steps -> 8, one step counted.
  assert float(opt.loss_scale) == 8.0 and int(opt.dynamic_counter.numpy()) == 1


def test_keras3_model_under_the_experimental_policy_skips_overflowing_steps():
  experimental.set_policy(
    experimental.Policy("mixed_float16", tf_lossscale.DynamicLossScale(2.0**40))
  )
  model = _model()
  opt = experimental.wrap_optimizer_for_policy(keras.optimizers.SGD(0.1), model)
  model.compile(optimizer=opt, loss="mse")
  model.fit(X, Y, batch_size=4, epochs=3, verbose=0)
  assert float(opt.loss_scale) == 2.0**37  # float16 gradients overflowed: 3 steps skipped
  np.testing.assert_array_equal(model.layers[0].kernel.numpy(), np.ones((2, 1)))


def test_tf23_guide_snippet_trains():
  # The TF 2.1-2.3 mixed precision guide, `tf` rewritten to `tf_lossscale` in the import.
  from tf_lossscale.keras.mixed_precision import experimental as mixed_precision

  policy = mixed_precision.Policy("mixed_float16")
  mixed_precision.set_policy(policy)
  keras.utils.set_random_seed(0)
  inputs = keras.Input(shape=(2,))
  x = keras.layers.Dense(8, activation="relu")(inputs)
  x = keras.layers.Dense(1)(x)
  outputs = keras.layers.Activation("linear", dtype="float32")(x)
  model = keras.Model(inputs=inputs, outputs=outputs)
  assert outputs.dtype == "float32" and model.layers[1].compute_dtype == "float16"
  model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.01))
  history = model.fit(X, Y + 1.0, batch_size=4, epochs=30, verbose=0)
  losses = history.history["loss"]
  assert losses[-1] < losses[0] and np.isfinite(losses).all()
  # Keras 3's compile wrapped it in its own dynamic LossScaleOptimizer, as
  # TF 2.4's did with its own; wrap_optimizer_for_policy gives ours.
  assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
