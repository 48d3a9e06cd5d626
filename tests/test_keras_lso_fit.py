"""Keras LossScaleOptimizer in `Model.compile` + `Model.fit`, Keras 3 and tf_keras."""

import keras
import numpy as np
import pytest
import tf_keras
from test_keras_lso import shared_strategy

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


def _fit(framework, opt):
  model = framework.Sequential(
    [
      framework.Input((2,)),
      framework.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
    ]
  )
  model.compile(optimizer=opt, loss="mse")
  model.fit(X, Y, batch_size=4, epochs=3, verbose=0)
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
  initial = 2.0**40 if policy == "mixed_float16" else 2.0**127
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=initial)
  model = _fit(keras, opt)
  kernel = model.layers[0].kernel.numpy().ravel()
  assert float(opt.loss_scale) < initial and int(opt.iterations.numpy()) == 3
  assert np.isfinite(kernel).all()


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


@pytest.mark.parametrize("framework", ["keras3", "tf_keras"])
def test_fit_under_mirrored_strategy(policy, framework):
  """Each replica scales its loss once and unscales once: same result as one device."""
  fw, inner = (
    (keras, lambda: keras.optimizers.SGD(0.1))
    if framework == "keras3"
    else (tf_keras, lambda: tf_keras.optimizers.legacy.SGD(0.1))
  )
  with shared_strategy("mirrored").scope():
    opt = mixed_precision.LossScaleOptimizer(inner(), initial_scale=4, dynamic_growth_steps=2)
    model = _fit(fw, opt)
  np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), [0.216, 0.216], rtol=1e-3)
  assert float(opt.loss_scale) == 8.0 and int(opt.dynamic_counter.numpy()) == 1
  assert int(opt.iterations.numpy()) == 3


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
