"""`enable_mixed_precision_graph_rewrite` / `disable_mixed_precision_graph_rewrite` (TF 2.4, compat.v1).

On this CPU-only machine grappler skips the float16 rewrite itself (it needs an
NVIDIA GPU of compute capability 7.0+); what is tested is what the functions
do: the wrapping, the rewrite option and TF's flag that Sessions read, the
errors and warnings, and training with the wrapped optimizers.
"""

import logging
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
import tf_lossscale
from tf_lossscale._src import fast_paths, framework_internals
from tf_lossscale.compat.v1 import mixed_precision as v1_mixed_precision
from tf_lossscale.compat.v1.train import experimental as v1_train_experimental
from tf_lossscale.keras.mixed_precision import experimental as keras_experimental

enable = v1_mixed_precision.enable_mixed_precision_graph_rewrite
disable = v1_mixed_precision.disable_mixed_precision_graph_rewrite
_ON = 1  # RewriterConfig.ON


def _rewrite_off():
  tf.config.optimizer.set_experimental_options({"auto_mixed_precision": None})
  framework_internals.set_graph_rewrite_flag(False)
  keras_experimental.set_policy(None)
  tf_keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(autouse=True)
def _rewrite_off_before_and_after():
  """Each test starts and ends with the rewrite never set and float32 policies
  (a test elsewhere, or a doctest, may have left the option set to False)."""
  _rewrite_off()
  yield
  _rewrite_off()


def _rewrite_state():
  options = tf.config.optimizer.get_experimental_options()
  return (
    options.get("auto_mixed_precision"),
    tf.__internal__.train.is_mixed_precision_graph_rewrite_enabled(),
  )


def test_same_functions_in_both_namespaces():
  assert v1_train_experimental.enable_mixed_precision_graph_rewrite is enable
  assert v1_train_experimental.disable_mixed_precision_graph_rewrite is disable


# --- Wrapping ------------------------------------------------------------------------


@pytest.mark.parametrize(
  "make",
  [
    lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    lambda: tf.compat.v1.train.AdamOptimizer(),
  ],
)
@pytest.mark.parametrize(
  "loss_scale, kind, value",
  [("dynamic", tf_lossscale.DynamicLossScale, 2.0**15), (128, tf_lossscale.FixedLossScale, 128.0)],
)
def test_compat_v1_optimizer_is_wrapped_in_ours(make, loss_scale, kind, value):
  inner = make()
  opt = enable(inner, loss_scale)
  assert type(opt) is v1_mixed_precision.MixedPrecisionLossScaleOptimizer
  assert opt._optimizer is inner  # pylint: disable=protected-access
  assert type(opt._loss_scale) is kind  # pylint: disable=protected-access
  assert float(opt._loss_scale()) == value  # pylint: disable=protected-access
  assert opt.get_name() == inner.get_name()


def test_a_legacy_loss_scale_object_is_used_as_is():
  scale = tf_lossscale.DynamicLossScale(4, increment_period=10)
  opt = enable(tf.compat.v1.train.GradientDescentOptimizer(0.1), scale)
  assert opt._loss_scale is scale  # pylint: disable=protected-access


@pytest.mark.parametrize(
  "make",
  [
    lambda: keras.optimizers.SGD(0.1),
    lambda: keras.optimizers.Adam(),
    lambda: tf_keras.optimizers.legacy.SGD(0.1),
    lambda: tf_keras.optimizers.SGD(0.1),
  ],
  ids=["keras3_sgd", "keras3_adam", "tf_keras_legacy_sgd", "tf_keras_sgd"],
)
@pytest.mark.parametrize(
  "loss_scale, settings",
  [
    ("dynamic", (True, 2.0**15, 2000)),
    (64, (False, 64.0, None)),
    (tf_lossscale.DynamicLossScale(4, increment_period=10), (True, 4.0, 10)),
  ],
)
def test_keras_optimizer_is_wrapped_in_our_experimental_class(make, loss_scale, settings):
  inner = make()
  opt = enable(inner, loss_scale)
  assert isinstance(opt, keras_experimental.LossScaleOptimizer)  # as TF 2.4's LossScaleOptimizerV1
  assert opt.inner_optimizer is inner
  assert (opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps) == settings


# --- The rewrite's state -------------------------------------------------------------------


def test_enable_and_disable_round_trips(caplog):
  assert _rewrite_state() == (None, False)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    for _ in range(2):
      enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))
      assert _rewrite_state() == (True, True)
      enable(keras.optimizers.SGD())  # enabling twice is allowed, silently (TF 2.4)
      assert _rewrite_state() == (True, True)
      disable()
      assert _rewrite_state() == (False, False)
  assert not [r for r in caplog.records if "already disabled" in r.getMessage()]
  assert not [r for r in caplog.records if "process-wide" in r.getMessage()]


def test_disable_when_disabled_warns(caplog):
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    disable()
  assert [r.getMessage() for r in caplog.records] == [
    "disable_mixed_precision_graph_rewrite() called when mixed precision is already disabled."
  ]
  assert _rewrite_state() == (False, False)


def test_shares_state_with_tensorflows_own_functions(caplog):
  enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    tf.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite()
    assert _rewrite_state() == (False, False)
    tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(
      tf.compat.v1.train.GradientDescentOptimizer(0.1)
    )
    assert _rewrite_state() == (True, True)
    disable()
    assert _rewrite_state() == (False, False)
  assert not [r for r in caplog.records if "already disabled" in r.getMessage()]


def test_existing_sessions_are_warned_about(caplog):
  tf.compat.v1.Session(graph=tf.Graph()).close()  # a Session without the rewrite
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))
  assert (
    "You already have existing Sessions that do not use mixed precision. "
    "enable_mixed_precision_graph_rewrite() will not affect these Sessions."
  ) in [r.getMessage() for r in caplog.records]


# --- Errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "make, name",
  [
    (
      lambda: v1_mixed_precision.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic"
      ),
      "MixedPrecisionLossScaleOptimizer",
    ),
    (
      lambda: tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic"
      ),
      "MixedPrecisionLossScaleOptimizer",
    ),
    (
      lambda: keras_experimental.LossScaleOptimizer(keras.optimizers.SGD(), "dynamic"),
      "LossScaleOptimizer",
    ),
  ],
)
def test_an_optimizer_already_wrapped_is_refused(make, name):
  opt = make()
  with pytest.raises(ValueError) as e:
    enable(opt)
  assert str(e.value) == (
    f'"opt" must not already be an instance of a {name}. `enable_mixed_precision_graph_rewrite` '
    f"will automatically wrap the optimizer with a {name}."
  )
  assert _rewrite_state() == (None, False)


def test_a_non_experimental_keras_loss_scale_optimizer_is_refused_by_its_constructor():
  # TF 2.4 too: its wrapper registry held only the experimental class, whose
  # constructor then refused to wrap a LossScaleOptimizer.
  opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
  with pytest.raises(TypeError, match="LossScaleOptimizer cannot wrap another LossScaleOptimizer"):
    enable(opt)
  assert _rewrite_state() == (None, False)


@pytest.mark.parametrize("opt", ["sgd", 3, None])
def test_not_an_optimizer_is_refused(opt):
  with pytest.raises(ValueError) as e:
    enable(opt)
  assert str(e.value) == (
    '"opt" must be an instance of a tf.train.Optimizer or a tf.keras.optimizers.Optimizer, '
    f"but got: {opt}"
  )
  assert _rewrite_state() == (None, False)


def _keras3_policy(name):
  keras.mixed_precision.set_global_policy(name)


def _tf_keras_policy(name):
  tf_keras.mixed_precision.set_global_policy(name)


def _experimental_policy(name):
  keras_experimental.set_policy(keras_experimental.Policy(name))


@pytest.mark.parametrize(
  "set_global_policy", [_keras3_policy, _tf_keras_policy, _experimental_policy]
)
@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_a_mixed_keras_policy_is_refused(set_global_policy, name):
  set_global_policy(name)
  with pytest.raises(ValueError) as e:
    enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))
  assert str(e.value).startswith(
    "The mixed precision graph rewrite cannot be enabled, because the global Keras dtype "
    "Policy has been set to a mixed precision policy. At most, one of the following can be "
    "called:\n\n  1. tf.keras.mixed_precision.experimental.set_policy() with a mixed precision "
    "policy (You called this first)\n\n  2. tf.train.experimental."
    "enable_mixed_precision_graph_rewrite() (You called this second)\n"
  )
  assert _rewrite_state() == (None, False)
  set_global_policy("float32")
  enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))


def test_the_policies_in_force_decide_not_the_last_one_set():
  """TF's shared flag records only the last of tf_keras's and our `set_policy`;
  Keras 3's `set_global_policy` never writes it."""
  keras_experimental.set_policy("mixed_float16")
  keras.mixed_precision.set_global_policy("float32")  # Our experimental policy replaced.
  enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))
  disable()
  tf_keras.mixed_precision.set_global_policy("mixed_float16")
  keras_experimental.set_policy("float32")  # tf_keras's policy is still mixed.
  with pytest.raises(ValueError, match="global Keras dtype Policy has been set to a mixed"):
    enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))
  tf_keras.mixed_precision.set_global_policy("float32")
  enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))


def test_a_mixed_keras_policy_is_refused_after_the_rewrite():
  enable(tf.compat.v1.train.GradientDescentOptimizer(0.1))
  with pytest.raises(ValueError, match='global dtype policy cannot be set to "mixed_float16"'):
    keras_experimental.set_policy("mixed_float16")
  with pytest.raises(ValueError, match='global dtype policy cannot be set to "mixed_float16"'):
    tf_keras.mixed_precision.set_global_policy("mixed_float16")  # TF's flag is shared
  keras_experimental.set_policy("float64")  # not a mixed policy: allowed


# --- Training -----------------------------------------------------------------------------


def _v1_regression(make_optimizer, loss_scale, config):
  """Trains w in (x @ w - sum(x))^2 in a TF1 graph and Session; returns what happened."""
  with tf.Graph().as_default():
    x = tf.constant(np.random.default_rng(0).normal(size=(16, 3)), tf.float32)
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    w = tf.compat.v1.get_variable("w", (3, 1), initializer=tf.compat.v1.zeros_initializer())
    poison = tf.compat.v1.placeholder_with_default(1.0, ())
    loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2) * poison
    step = tf.compat.v1.train.get_or_create_global_step()
    opt = v1_train_experimental.enable_mixed_precision_graph_rewrite(make_optimizer(), loss_scale)
    train = opt.minimize(loss, global_step=step)
    with tf.compat.v1.Session(config=config) as sess:
      rewrite = sess._config.graph_options.rewrite_options.auto_mixed_precision  # pylint: disable=protected-access
      sess.run(tf.compat.v1.global_variables_initializer())
      first = sess.run(loss)
      for _ in range(30):
        sess.run(train)
      trained = sess.run([loss, step, w])
      sess.run(train, {poison: float("nan")})
      after_nan = sess.run([step, w, opt._loss_scale()])  # pylint: disable=protected-access
  return rewrite, first, trained, after_nan


@pytest.mark.parametrize(
  "make_optimizer",
  [
    lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.5),
  ],
  ids=["sgd", "momentum"],
)
@pytest.mark.parametrize("config", [None, tf.compat.v1.ConfigProto()], ids=["default", "own"])
def test_tf1_session_trains_with_the_rewrite_on(make_optimizer, config):
  rewrite, first, (loss, step, w), (step_after, w_after, scale_after) = _v1_regression(
    make_optimizer, "dynamic", config
  )
  assert rewrite == _ON  # the Session's config asks grappler for the rewrite
  # On a GPU the rewritten graph computes in float16, where a first step can overflow at
  # the initial scale of 2**15 and be skipped; on a CPU nothing becomes float16.
  skipped = round(math.log2(2.0**14 / scale_after))
  assert (skipped == 0) if fast_paths._cpu_only() else (0 <= skipped <= 2)
  assert loss < 1e-3 * first and step == 30 - skipped
  np.testing.assert_allclose(w.ravel(), [1.0, 1.0, 1.0], atol=0.05)
  # A NaN step is skipped: no variable or global-step change, the scale halves.
  assert step_after == step
  np.testing.assert_array_equal(w_after, w)


def test_without_tensorflows_flag_only_default_sessions_get_the_rewrite(monkeypatch, caplog):
  """The fallback if TF's private flag disappears: public options only, and a
  warning that says what a Session given its own config needs."""
  monkeypatch.setattr(framework_internals, "_global_state", None)
  make = lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1)  # noqa: E731
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    assert _v1_regression(make, 8, None)[0] == _ON
  assert [r for r in caplog.records if "auto_mixed_precision = 1" in r.getMessage()]
  assert _v1_regression(make, 8, tf.compat.v1.ConfigProto())[0] != _ON
  assert framework_internals.graph_rewrite_flag()  # read from the public option
  disable()
  assert not framework_internals.graph_rewrite_flag()


def test_keras_model_trains_with_the_rewrite_on():
  # Model Garden's TF2 pattern, `tf` rewritten to `tf_lossscale` in the call.
  opt = keras.optimizers.SGD(0.1)
  opt = tf_lossscale.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite(opt)
  model = keras.Sequential(
    [keras.Input((2,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
  )
  model.compile(optimizer=opt, loss="mse")
  model.fit(np.ones((4, 2), "float32"), np.zeros((4, 1), "float32"), epochs=3, verbose=0)
  assert model.optimizer is opt
  np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), [0.216, 0.216], rtol=1e-6)
  assert int(opt.dynamic_counter.numpy()) == 3


def test_compat_v1_optimizer_trains_eagerly_and_in_functions_with_the_rewrite_on(mode):
  var = tf.Variable([1.0, 2.0])
  opt = enable(tf.compat.v1.train.GradientDescentOptimizer(0.5), 1024)
  assert _rewrite_state() == (True, True)
  seen = tf.Variable(0.0)  # d(the loss the tape differentiates) / d(the loss)
  record = helpers.gradient_probe(seen)

  @mode
  def step():
    opt.minimize(lambda: record(tf.reduce_sum(var**2)), var_list=[var])

  step()
  assert float(seen.numpy()) == 1024.0  # scaled by the wrapper the function made
  np.testing.assert_allclose(var.numpy(), [0.0, 0.0])  # and unscaled
