"""Keras LossScaleOptimizer in `Model.compile` + `Model.fit`, Keras 3 and tf_keras."""

import keras
import multi_worker_job as job
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from test_keras_lso import locals_of, shared_strategy

from tf_lossscale._src import framework_internals
from tf_lossscale.keras import mixed_precision

# One Dense(1) kernel of ones, inputs of ones, targets 0: each SGD(0.1) step
# multiplies the kernel by 0.6 (mse gradient 4 * w), so 3 steps give 0.216.
X = np.ones((4, 2), "float32")
Y = np.zeros((4, 1), "float32")


@pytest.fixture(params=["float32", "mixed_float16"])
def policy(request):
  keras.mixed_precision.set_global_policy(request.param)
  tf_keras.mixed_precision.set_global_policy(request.param)
  yield request.param
  keras.mixed_precision.set_global_policy("float32")
  tf_keras.mixed_precision.set_global_policy("float32")


def _fit(framework, opt, x=X, **kwargs):
  model = framework.Sequential(
    [
      framework.Input((2,)),
      framework.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
    ]
  )
  model.compile(optimizer=opt, loss="mse")
  model.fit(x, Y, batch_size=4, epochs=3, verbose=0, **kwargs)
  return model


def test_keras3_fit_uses_our_scale(policy, tmp_path):
  opt = mixed_precision.LossScaleOptimizer(
    keras.optimizers.SGD(0.1), initial_scale=4, dynamic_growth_steps=2
  )
  model = _fit(keras, opt)
  assert model.optimizer is opt  # compile did not wrap it in Keras 3's own
  np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), [0.216, 0.216], rtol=1e-3)
  assert float(opt.loss_scale) == 8.0 and int(opt.dynamic_counter.numpy()) == 1
  assert int(opt.iterations.numpy()) == 3

  model.save(tmp_path / "model.keras")
  loaded = keras.models.load_model(tmp_path / "model.keras")
  assert isinstance(loaded.optimizer, mixed_precision.LossScaleOptimizer)
  assert float(loaded.optimizer.loss_scale) == 8.0
  assert int(loaded.optimizer.dynamic_counter.numpy()) == 1
  assert int(loaded.optimizer.iterations.numpy()) == 3


def test_keras3_fit_skips_overflowing_steps(policy):
  # The scaled gradients overflow (float16 backward pass, or float32 for a
  # scale of 2**127): the step is skipped and the scale halved, as TF 2.4 did.
  # float32: the loss is 4, its gradient 4 per weight; scaled by 2**127 and
  # 2**126 it overflows, by 2**125 (2**127) not: two skips, then w = 1 - 0.1 * 4.
  # float16: the scaled gradients overflow float16 at 2**40, 2**39 and 2**38.
  initial = 2.0**40 if policy == "mixed_float16" else 2.0**127
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=initial)
  model = _fit(keras, opt)
  kernel = model.layers[0].kernel.numpy().ravel()
  skipped, applied = (3, 1.0) if policy == "mixed_float16" else (2, 0.6)
  assert float(opt.loss_scale) == initial / 2**skipped
  assert (int(opt.skipped_steps.numpy()), int(opt.iterations.numpy())) == (skipped, 3)
  np.testing.assert_allclose(kernel, [applied, applied], rtol=1e-6)


@pytest.mark.parametrize("optimizers", [tf_keras.optimizers.legacy, tf_keras.optimizers])
def test_tf_keras_fit_uses_our_scale(policy, optimizers):
  opt = mixed_precision.LossScaleOptimizer(
    optimizers.SGD(0.1), initial_scale=4, dynamic_growth_steps=2
  )
  model = _fit(tf_keras, opt)
  assert model.optimizer is opt
  np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), [0.216, 0.216], rtol=1e-3)
  assert float(opt.loss_scale) == 8.0 and int(opt.dynamic_counter.numpy()) == 1
  assert int(opt.iterations.numpy()) == 3


def test_tf_keras_fit_under_mirrored_strategy(policy):
  """Each replica scales its loss once and unscales once: same result as one device."""
  with shared_strategy("mirrored").scope():
    opt = mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.legacy.SGD(0.1), initial_scale=4, dynamic_growth_steps=2
    )
    model = _fit(tf_keras, opt)
  np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), [0.216, 0.216], rtol=1e-3)
  assert float(opt.loss_scale) == 8.0 and int(opt.dynamic_counter.numpy()) == 1
  assert int(opt.iterations.numpy()) == 3


def test_keras3_fit_under_mirrored_strategy_takes_plain_keras_steps(policy):
  """Ours takes the steps plain Keras's `fit` takes on this Keras.

  Each replica's batch here is two rows, [1, 0] on the first and [0, 1] on the
  second, target 0: a replica's gradient has one non-zero coordinate, 2 * w.
  Keras >= 3.8 divides each replica's loss by the replicas in sync: w *= 0.9 a
  step, the global batch's step. Earlier Keras does not (upstream): summed,
  w *= 0.8 a step (plain Keras 3.5 to 3.7 alike); Keras < 3.5 does not even
  all-reduce (each replica's copy steps on its own gradient and they drift
  apart), and ours sums as 3.5 to 3.7 do.
  """
  x = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], "float32")
  strategy = shared_strategy("mirrored")
  kernels = []
  # The reference: the plain optimizer, or under mixed_float16 (where compile
  # would wrap a plain one in Keras 3's own loss scale, whose first steps at its
  # default scale overflow) Keras 3's own wrapper at the same scale.
  plain = (
    (lambda inner: keras.optimizers.LossScaleOptimizer(inner, initial_scale=4))
    if policy == "mixed_float16"
    else (lambda inner: inner)
  )
  for wrap in (lambda inner: mixed_precision.LossScaleOptimizer(inner, initial_scale=4), plain):
    with strategy.scope():
      model = _fit(keras, wrap(keras.optimizers.SGD(0.1)), x, shuffle=False)
    kernels.append([k.ravel() for k in locals_of(strategy, model.layers[0].kernel)])
  ours, plain = kernels
  step = 0.9 if job.keras3_fit_divides_loss() else 0.8
  for replica in ours:
    np.testing.assert_allclose(replica, [step**3, step**3], rtol=1e-3)
  if all(np.array_equal(replica, plain[0]) for replica in plain):
    np.testing.assert_allclose(ours, plain, rtol=1e-3)
  else:  # Keras < 3.5: no all-reduce, each copy steps on its replica's coordinate only.
    assert plain[0][1] == plain[1][0] == 1.0


def test_keras3_saving_keeps_the_options_and_a_run_of_non_finite_steps(tmp_path):
  options = dict(min_loss_scale=0.5, max_loss_scale=64.0, hysteresis=2)
  opt = mixed_precision.LossScaleOptimizer(
    keras.optimizers.SGD(0.1), initial_scale=4, dynamic_growth_steps=2, **options
  )
  model = _fit(keras, opt)
  kernel = model.layers[0].kernel
  opt.apply_gradients([(np.full((2, 1), np.nan, "float32"), kernel)])  # A run starts: kept.
  assert (float(opt.loss_scale), int(opt.dynamic_counter.numpy())) == (8.0, -1)

  model.save(tmp_path / "model.keras")
  loaded = keras.models.load_model(tmp_path / "model.keras").optimizer
  assert loaded.comparable_config() == opt.comparable_config()
  assert (loaded.min_loss_scale, loaded.max_loss_scale, loaded.hysteresis) == (0.5, 64.0, 2)
  assert (float(loaded.loss_scale), int(loaded.dynamic_counter.numpy())) == (8.0, -1)
  assert int(loaded.iterations.numpy()) == 4


@pytest.mark.parametrize("wrap", [False, True])
def test_keras3_legacy_h5_model_file_restores_what_it_restores_for_a_plain_optimizer(
  wrap, tmp_path
):
  """Keras 3's `load_model` of a `.h5` file builds the optimizer and sets its
  variables with `set_weights`: ours takes them as its inner optimizer would
  (Keras 3 builds it for no variables there, so the slots stay unrestored for a
  plain optimizer too; the scale restarts: the format keeps only `variables`)."""
  opt = keras.optimizers.Adam(0.01)
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  # A loss object: Keras 3 cannot load the string "mse" from a `.h5` file.
  model.compile(
    optimizer=mixed_precision.LossScaleOptimizer(opt) if wrap else opt,
    loss=keras.losses.MeanSquaredError(),
  )
  model.fit(X, Y, batch_size=4, epochs=3, verbose=0)
  model.save(tmp_path / "model.h5")
  loaded = keras.models.load_model(tmp_path / "model.h5").optimizer
  assert isinstance(loaded, type(model.optimizer))
  assert int(loaded.iterations.numpy()) == 3
  assert [v.name.split("/")[-1] for v in loaded.variables] == ["iteration", "learning_rate"]


@pytest.mark.skipif(
  framework_internals.keras_release() < (3, 10, 0),
  reason="Keras 3's own wrapper, the reference, unscales float8's scales before Keras 3.10",
)
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_keras3_float8_training_as_keras3_s_own_wrapper(strategy_name):
  """float8 training (`model.quantize("float8")`): its scale variables take
  their "gradient" as their new value (`overwrite_with_gradient`), neither
  unscaled nor summed over replicas; every weight as with Keras 3's wrapper."""
  rng = np.random.RandomState(0)
  x, y = rng.randn(32, 8).astype("float32"), rng.randn(32, 2).astype("float32")
  weights = {}
  for wrap in (mixed_precision.LossScaleOptimizer, keras.optimizers.LossScaleOptimizer):
    keras.utils.set_random_seed(1)
    with shared_strategy(strategy_name).scope():
      model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(2)])
      model.quantize("float8")
      model.compile(optimizer=wrap(keras.optimizers.SGD(0.01), initial_scale=1024), loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    weights[wrap] = [w.numpy() for w in model.weights]
  ours, theirs = weights.values()
  assert len(ours) > 4  # The float8 scales and histories among them.
  for got, want in zip(ours, theirs, strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.skipif(
  framework_internals.keras_release() < (3, 10, 0),
  reason="Keras 3's own wrapper, the reference, unscales float8's scales before Keras 3.10",
)
def test_keras3_float8_training_with_a_weight_average_in_a_custom_loop():
  """The float8 scales have no weight average (Keras 3 keeps None for them)."""
  rng = np.random.RandomState(0)
  x, y = rng.randn(16, 8).astype("float32"), rng.randn(16, 2).astype("float32")
  weights = []
  for wrap in (mixed_precision.LossScaleOptimizer, keras.optimizers.LossScaleOptimizer):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(2)])
    model.quantize("float8")
    opt = wrap(keras.optimizers.SGD(0.01, use_ema=True), initial_scale=1024)

    @tf.function
    def step(model=model, opt=opt):
      with tf.GradientTape() as tape:
        loss = opt.scale_loss(tf.reduce_mean(tf.square(model(x, training=True) - y)))
      grads = tape.gradient(loss, model.trainable_variables)
      opt.apply_gradients(zip(grads, model.trainable_variables))

    for _ in range(3):
      step()
    weights.append([w.numpy() for w in model.weights])
  for got, want in zip(*weights, strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-6)
