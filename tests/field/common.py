"""Helpers shared by the field tests (import as `from field import common`)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers

# The inner-optimizer families: Keras 3, tf_keras's OptimizerV2 (TF 2.4's own
# optimizers) and the newer tf_keras optimizers.
FAMILIES = ("keras3", "tf_keras", "tf_keras_new")
_MODULES = {
  "keras3": keras.optimizers,
  "tf_keras": tf_keras.optimizers.legacy,
  "tf_keras_new": tf_keras.optimizers,
}

_SHARED = {}


def needs_keras3_option(name):
  """Skips a test where the installed Keras 3's optimizers lack the option `name`."""
  present = helpers.keras3_has_option(name)
  return pytest.mark.skipif(not present, reason=f"Keras {keras.__version__} has no {name}")


def strategy(name):
  """No strategy, or the MirroredStrategy over two logical CPUs that field tests share."""
  if name == "default":
    return tf.distribute.get_strategy()
  if name not in _SHARED:
    _SHARED[name] = helpers.make_strategy(name)
  return _SHARED[name]


def make_inner(family, kind="SGD", **kwargs):
  """A fresh optimizer `kind` of `family`."""
  return getattr(_MODULES[family], kind)(**kwargs)


def framework(family):
  """The Keras module whose models take optimizers of `family`."""
  return keras if family == "keras3" else tf_keras


def schedules(family):
  """The learning-rate schedule module matching `family`."""
  return framework(family).optimizers.schedules


def built(optimizer, variables):
  """`optimizer` with its variables created, for plain references under a strategy.

  A plain Keras 3 optimizer cannot create its variables during the first call
  of a replicated tf.function over tf.Variables (the lifted initializer's
  placeholder is never fed); the wrapper builds its inner optimizer in
  cross-replica context and has no such problem.
  """
  if hasattr(optimizer, "build") and not isinstance(
    optimizer, tf_keras.optimizers.legacy.Optimizer
  ):
    optimizer.build(variables)
  return optimizer


class NoScaling:
  """Stands in for a LossScaleOptimizer's scaling methods in plain-optimizer references."""

  loss_scale = 1.0

  @staticmethod
  def get_scaled_loss(loss):
    return loss

  @staticmethod
  def get_unscaled_gradients(grads):
    return grads


def replica_values(strategy, value):
  """Every replica's copy of a variable (or a plain tensor), as numpy arrays."""
  if isinstance(value, keras.Variable):
    value = value.value
  return [np.asarray(v.numpy()) for v in strategy.experimental_local_results(value)]


def assert_on_every_replica(strategy, value, expected, **tolerance):
  """`value` equals `expected` on every replica (exactly unless a tolerance is given)."""
  for replica_value in replica_values(strategy, value):
    if tolerance:
      np.testing.assert_allclose(replica_value, expected, **tolerance)
    else:
      np.testing.assert_array_equal(replica_value, np.asarray(expected, replica_value.dtype))


def as_int(value):
  """An int from an integer variable or tensor (Keras, mirrored or plain)."""
  if isinstance(value, keras.Variable):
    value = value.value
  return int(tf.convert_to_tensor(value).numpy())


def dense_model(fw, units=1, regularized=False, input_dim=2):
  """A Dense stack with constant initial weights, the same in Keras 3 and tf_keras.

  With `regularized`, a hidden Dense(3) carries an L2 kernel regularizer and
  the output an L1 bias regularizer, so the loss includes regularization
  losses.
  """
  layers = fw.layers
  hidden_regularizer = fw.regularizers.L2(0.1) if regularized else None
  output_regularizer = fw.regularizers.L1(0.01) if regularized else None
  stack = [
    layers.Dense(3, kernel_initializer="ones", kernel_regularizer=hidden_regularizer),
    layers.Dense(
      units,
      kernel_initializer=fw.initializers.Constant(0.5),
      bias_initializer="ones",
      bias_regularizer=output_regularizer,
    ),
  ]
  return fw.Sequential([fw.Input((input_dim,)), *stack])


# Eight samples: a global batch of 4 splits into 2 per replica.
X = (np.arange(16, dtype="float32").reshape(8, 2) - 5.0) / 8.0
Y = np.linspace(-1.0, 1.0, 8, dtype="float32").reshape(8, 1)
