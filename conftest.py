"""Root pytest set-up, run before any test or doctest imports TensorFlow's runtime.

Splits the CPU into logical devices so that tf.distribute strategies over
several devices can be tested on one machine; keeps float32 products in float32
and asks for deterministic kernels on GPUs; gives doctests `tf`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 4
tf.config.set_logical_device_configuration(
  tf.config.list_physical_devices("CPU")[0],
  [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS,
)
# GPUs of compute capability 8.0 and later round float32 matrix products'
# inputs to TensorFloat-32 by default (10-bit mantissas): the tests compare
# float32 results with references computed another way, so they keep float32.
tf.config.experimental.enable_tensor_float_32_execution(False)
# Some GPU kernels sum in no fixed order (by atomic adds), so two runs of one
# step can differ in their last bits there (seen on an H200 in a plain `fit`).
# The tests compare steps with the plain optimizer's bit for bit, so on a GPU
# they run TensorFlow's deterministic kernels (which want a global seed for
# random ops). TF_LOSSSCALE_TEST_DETERMINISM=1 turns them on anywhere, 0 off.
_DETERMINISM = os.environ.get("TF_LOSSSCALE_TEST_DETERMINISM", "").strip().lower()
if _DETERMINISM not in ("0", "false") and (_DETERMINISM or tf.config.list_physical_devices("GPU")):
  tf.config.experimental.enable_op_determinism()
  tf.random.set_seed(0)


@pytest.fixture(autouse=True)
def _doctest_tf(doctest_namespace):
  doctest_namespace["tf"] = tf
