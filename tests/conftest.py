"""Fixtures parametrizing tests over strategy and execution mode."""

import pytest
import tensorflow as tf

import helpers


@pytest.fixture(params=["default", "mirrored"])
def strategy(request):
  """The default (no) strategy, and MirroredStrategy over two logical CPUs."""
  return helpers.make_strategy(request.param)


@pytest.fixture(params=["eager", "function"])
def mode(request):
  """`mode(fn)` returns fn itself (eager) or `tf.function(fn)`."""
  if request.param == "eager":
    return lambda fn: fn
  return tf.function
