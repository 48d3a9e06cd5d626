"""Fixtures of the field tests: inner-optimizer family and a shared MirroredStrategy."""

import keras
import pytest
import tf_keras

from field import common


@pytest.fixture(params=["default", "mirrored"])
def strategy(request):
  """Overrides tests/conftest.py's: one MirroredStrategy shared by the field tests."""
  return common.strategy(request.param)


@pytest.fixture(params=common.FAMILIES)
def family(request):
  return request.param


@pytest.fixture
def mixed_float16():
  """Sets the `mixed_float16` policy in both frameworks for one test."""
  keras.mixed_precision.set_global_policy("mixed_float16")
  tf_keras.mixed_precision.set_global_policy("mixed_float16")
  yield
  keras.mixed_precision.set_global_policy("float32")
  tf_keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def restore_serialization_registries():
  """Puts Keras 3's and tf_keras's registered custom objects back after the test.

  Tests that instantiate or register subclasses of LossScaleOptimizer use it,
  so that later tests load saved models as before even if that ever adds to a
  registry again (instantiating one registered it under the wrapper's own
  name once; test_saving.py pins that it no longer does).
  """
  registries = [keras.saving.get_custom_objects(), tf_keras.saving.get_custom_objects()]
  snapshots = [dict(registry) for registry in registries]
  yield
  for registry, snapshot in zip(registries, snapshots, strict=True):
    registry.clear()
    registry.update(snapshot)
