"""Checks of user input that every API shares: a clear error before anything changes.

A bad constructor argument is refused before any variable exists, and bad
gradients before the loss scale, a variable or a slot is touched: an error
leaves everything as it was. Each API calls these from one small function of
its own, which also holds the rules only that API has (TF 2.4's wording where
TF had an error).
"""

import math
import numbers

import numpy as np
import tensorflow as tf

FLOAT32_MAX = float(np.finfo(np.float32).max)
# The smallest normal float32: a scale floor below it loses precision, and its
# reciprocal (what unscaling multiplies by) overflows from about 2.9e-39.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
INT64_MAX = 2**63 - 1


def float32_overflows(number):
  """Whether a finite Python number is Inf as a float32 (scales are float32)."""
  with np.errstate(over="ignore"):
    return bool(np.isinf(np.float32(number)))


def check_finite_above(name, value, bound):
  """Raises `ValueError` unless `value` is a finite float32 number greater than `bound`.

  Args:
    name: The argument's name, for the message.
    value: What was passed: a Python or NumPy number (anything `float` takes).
    bound: The exclusive lower bound.

  Raises:
    ValueError: If `value` is not a number, is NaN or infinite (a float32
      Inf included), or is not greater than `bound`.

  >>> check_finite_above("multiplier", 1.5, 1)
  >>> check_finite_above("multiplier", 1, 1)
  Traceback (most recent call last):
  ...
  ValueError: multiplier must be a finite number > 1, got 1
  >>> check_finite_above("initial_scale", 1e39, 0)
  Traceback (most recent call last):
  ...
  ValueError: initial_scale must be at most the float32 maximum, 3.4028234663852886e+38, got 1e+39
  """
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = math.nan
  if not (math.isfinite(number) and number > bound):
    raise ValueError(f"{name} must be a finite number > {bound}, got {value!r}")
  if float32_overflows(number):
    raise ValueError(f"{name} must be at most the float32 maximum, {FLOAT32_MAX!r}, got {value!r}")


def int64(name, value):
  """`int(value)`, naming `name` in the error `int` raises for a value it
  refuses (its own type, as TF 2.4's `int(...)`: `TypeError`, `ValueError`,
  `OverflowError`) and in a `ValueError` for an int outside int64 (counts are
  int64 variables; a larger one wrapped around in a graph).

  >>> int64("dynamic_growth_steps", 2000.0)
  2000
  >>> int64("dynamic_growth_steps", 2**63)
  Traceback (most recent call last):
  ...
  ValueError: dynamic_growth_steps must be an int from -2**63 to 2**63 - 1 (an int64), but got: 9223372036854775808
  """
  try:
    number = int(value)
  except (TypeError, ValueError, OverflowError) as error:
    raise type(error)(f"{name} must be an int, but got: {value!r}") from None
  if not -INT64_MAX - 1 <= number <= INT64_MAX:
    raise ValueError(
      f"{name} must be an int from -2**63 to 2**63 - 1 (an int64), but got: {value!r}"
    )
  return number


def gradient_pairs(grads_and_vars):
  """The `(gradient, variable)` pairs of `apply_gradients`, as a list.

  Args:
    grads_and_vars: An iterable of pairs.

  Returns:
    A list of `(gradient, variable)` tuples.

  Raises:
    TypeError: For an item that is not a pair whose second element is a
      variable (bare gradients, for instance).

  >>> gradient_pairs([tf.constant(1.)])
  Traceback (most recent call last):
  ...
  TypeError: apply_gradients expects (gradient, variable) pairs, got a EagerTensor: <tf.Tensor: shape=(), dtype=float32, numpy=1.0>
  """
  pairs = []
  for item in grads_and_vars:
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
      raise TypeError(
        f"apply_gradients expects (gradient, variable) pairs, got a {type(item).__name__}: {item!r}"
      )
    if not hasattr(item[1], "assign"):
      hint = ""
      if isinstance(item[1], tf.Tensor) and not tf.executing_eagerly():
        hint = (
          " (a Keras variable passed to a tf.function as an argument arrives there as a "
          "tensor: let the function capture it instead)"
        )
      raise TypeError(
        "apply_gradients expects (gradient, variable) pairs, got a pair whose second item "
        f"is a {type(item[1]).__name__}, not a variable: {item!r}{hint}"
      )
    pairs.append(tuple(item))
  return pairs


def _static_shape_and_dtype(grad):
  """A gradient's static shape and dtype (its values' for `tf.IndexedSlices`).

  A Python number or (nested) list of them has NumPy's shape and no dtype:
  it takes its variable's when converted. None for anything else (a ragged
  list, a list holding tensors: TensorFlow converts, or refuses, those).
  """
  values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
  if tf.is_tensor(values) or isinstance(values, (np.ndarray, np.generic)):
    return tf.TensorShape(values.shape), tf.as_dtype(values.dtype)
  if not all(isinstance(v, numbers.Number) for v in tf.nest.flatten(values)):
    return None
  try:
    return tf.TensorShape(np.shape(values)), None
  except ValueError:
    return None


def check_gradients_fit(pairs, dtype_must_match):
  """Raises unless every gradient can be applied to its variable.

  Static shapes must be compatible (for `tf.IndexedSlices`, every dimension
  but the first); unknown dimensions pass. `None` gradients are skipped.

  Args:
    pairs: `(gradient, variable)` tuples, as `gradient_pairs` returns them.
    dtype_must_match: Whether a gradient must have its variable's dtype (for
      optimizers that do not cast gradients).

  Raises:
    ValueError: For a gradient whose shape does not fit its variable's.
    TypeError: For a gradient that is not of numbers (a string tensor), or
      with `dtype_must_match` of another dtype than its variable's.

  >>> var = tf.Variable([1., 2.], name='w')
  >>> check_gradients_fit([(tf.ones([3]), var)], dtype_must_match=True)
  Traceback (most recent call last):
  ...
  ValueError: apply_gradients got a gradient of shape (3,) for variable 'w:0' of shape (2,); a gradient must have its variable's shape
  """
  for grad, var in pairs:
    found = None if grad is None else _static_shape_and_dtype(grad)
    if found is None:
      continue
    shape, dtype = found
    var_shape, var_dtype = tf.TensorShape(var.shape), tf.as_dtype(var.dtype)
    sparse = isinstance(grad, tf.IndexedSlices)
    if not (
      shape[1:].is_compatible_with(var_shape[1:]) if sparse else shape.is_compatible_with(var_shape)
    ):
      what = "tf.IndexedSlices with values of shape" if sparse else "gradient of shape"
      raise ValueError(
        f"apply_gradients got a {what} {shape} for variable {var.name!r} of shape {var_shape}; "
        "a gradient must have its variable's shape"
        + (" (but for the first dimension, the rows it updates)" if sparse else "")
      )
    if dtype is not None and not (dtype.is_numeric or dtype.is_bool):
      raise TypeError(
        f"apply_gradients got a {dtype.name} gradient for variable {var.name!r}; a gradient "
        "must be a tensor of numbers (floating-point, integer, complex or bool)"
      )
    if dtype_must_match and dtype is not None and dtype.base_dtype != var_dtype.base_dtype:
      raise TypeError(
        f"apply_gradients got a {dtype.name} gradient for variable {var.name!r} of dtype "
        f"{var_dtype.name}; this optimizer needs gradients of the variable's dtype"
      )


def check_variables_in_their_strategy(variables):
  """Refuses a variable mirrored over several replicas, stepped outside any strategy.

  For optimizers that would update one replica's copy only (TF1's, an
  OptimizerV2): the replicas would drift apart. A lone replica's mirrored
  variable is fine.
  """
  if tf.distribute.has_strategy():
    return
  for var in variables:
    if not isinstance(var, tf.distribute.DistributedValues):
      continue
    strategy = var.distribute_strategy
    if strategy.num_replicas_in_sync > 1:
      raise ValueError(
        f"apply_gradients got the variable {var.name!r}, mirrored over the "
        f"{strategy.num_replicas_in_sync} replicas of the {type(strategy).__name__} it was "
        "made under, outside that strategy: apply gradients inside `strategy.run(...)` "
        "(outside it the replicas' copies would drift apart)"
      )


def warn_missing_gradients(pairs):
  """Logs the variables of `pairs` whose gradient is None, in TF 2.4's words
  (its optimizers and wrapper logged them; the inner optimizer never sees
  them, the wrapper leaves them out)."""
  missing = [v.name for g, v in pairs if g is None]
  if missing:
    tf.get_logger().warning(
      "Gradients do not exist for variables %s when minimizing the loss.", missing
    )
