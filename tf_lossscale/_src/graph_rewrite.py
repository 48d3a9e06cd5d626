"""TF 2.4's `tf.compat.v1.mixed_precision.{enable,disable}_mixed_precision_graph_rewrite`.

`enable_mixed_precision_graph_rewrite(opt)` wraps `opt` in one of our loss
scale optimizers and switches on TensorFlow's `auto_mixed_precision` grappler
rewrite, which, on NVIDIA GPUs of compute capability 7.0 or more, runs
numerically safe float32 ops of every graph in float16. Elsewhere grappler
leaves the graph as it is (saying so only at verbose log levels; on a CPU,
TensorFlow's oneDNN builds may run a float16 rewrite of their own where the
CPU supports it).

The rewrite is switched on in two places, as TF 2.4 did:

- the public optimizer options (`tf.config.optimizer.set_experimental_options`),
  which `tf.function` graphs and every `tf.compat.v1.Session` created without
  a `config` use;
- TF's process-wide flag that a `tf.compat.v1.Session` reads to switch the
  rewrite on in a `ConfigProto` it is given (see
  `framework_internals`). Where that flag is gone, give such a
  Session `config.graph_options.rewrite_options.auto_mixed_precision = 1`.
"""

import sys

import keras
import tensorflow as tf

from tf_lossscale._src import compat_v1_optimizer, framework_internals, keras_experimental

_logger = tf.get_logger()


def _keras_optimizer_classes():
  """The Keras optimizer classes our Keras `LossScaleOptimizer` wraps."""
  classes = (keras.optimizers.Optimizer,)
  tf_keras = sys.modules.get("tf_keras")
  if tf_keras is not None:
    classes += (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
  return classes


# The wrappers `enable_mixed_precision_graph_rewrite` makes, and TF's own
# compat.v1 one: an optimizer already wrapped in one is refused, as TF 2.4
# refused its two wrapper classes.
_WRAPPER_CLASSES = (
  compat_v1_optimizer.MixedPrecisionLossScaleOptimizer,
  tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
  keras_experimental.LossScaleOptimizer,
)


def _wrap_optimizer(opt, loss_scale):
  """Wraps `opt` in the loss scale optimizer of its kind, as TF 2.4 did."""
  for wrapper in _WRAPPER_CLASSES:
    if isinstance(opt, wrapper):
      raise ValueError(
        f'"opt" must not already be an instance of a {wrapper.__name__}. '
        "`enable_mixed_precision_graph_rewrite` will automatically wrap the "
        f"optimizer with a {wrapper.__name__}."
      )
  if isinstance(opt, tf.compat.v1.train.Optimizer):
    return compat_v1_optimizer.MixedPrecisionLossScaleOptimizer(opt, loss_scale)
  if isinstance(opt, _keras_optimizer_classes()):
    # TF 2.4 gave Keras optimizers the experimental class, which takes a
    # legacy loss scale (and logs its deprecation warning).
    return keras_experimental.LossScaleOptimizer(opt, loss_scale)
  raise ValueError(
    '"opt" must be an instance of a tf.train.Optimizer or a '
    f"tf.keras.optimizers.Optimizer, but got: {opt}"
  )


def _mixed_keras_policy_in_use():
  """Whether Keras 3's global policy (the experimental `set_policy` sets it
  too) or tf_keras's is a mixed one, as each is now: TF's shared flag is
  written by whichever of tf_keras and us set a policy last, and never by
  Keras 3."""
  policies = [keras.mixed_precision.global_policy()]
  tf_keras = sys.modules.get("tf_keras")
  if tf_keras is not None:
    policies.append(tf_keras.mixed_precision.global_policy())
  return any(policy.compute_dtype != policy.variable_dtype for policy in policies)


def enable_mixed_precision_graph_rewrite(opt, loss_scale="dynamic"):
  """Enables mixed precision through a graph rewrite, and loss scaling on `opt`.

  Mixed precision runs some operations in float16 and keeps others in
  float32, for speed on hardware with fast float16 units (NVIDIA Tensor
  Cores). This function switches on TensorFlow's `auto_mixed_precision`
  graph rewrite, which turns numerically safe float32 ops (matrix
  multiplications, convolutions, ...) of every graph into float16 ones on
  NVIDIA GPUs of compute capability 7.0 or more; the model itself stays
  float32. It returns `opt` wrapped in a loss scale optimizer, which keeps
  small float16 gradients from underflowing: compute and apply gradients
  only through it (`minimize`, or `compute_gradients` then
  `apply_gradients`), not with `tf.gradients` or a `tf.GradientTape` alone.

  - A `tf.compat.v1.train.Optimizer` is wrapped in
    `tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer`.
  - A Keras optimizer (Keras 3, or tf_keras's) is wrapped in the deprecated
    `tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer`, as
    TF 2.4 did (it logs a deprecation warning).

  The rewrite applies to `tf.function`s and `tf.compat.v1.Session`s created
  afterwards (with or without a `config`), not to eager ops, and not to
  Sessions that already exist (a warning says so when there are some). With
  a dynamic loss scale, a step with non-finite gradients is skipped (the
  variables and the global step do not change) and the scale lowered.

  >>> import tf_lossscale
  >>> opt = tf_lossscale.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(
  ...     tf.compat.v1.train.GradientDescentOptimizer(0.1))
  >>> type(opt).__name__
  'MixedPrecisionLossScaleOptimizer'
  >>> tf.config.optimizer.get_experimental_options()['auto_mixed_precision']
  True
  >>> tf_lossscale.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite()

  Only one mixed precision API can be used. This function refuses to run
  while a mixed global policy is set: Keras 3's (however it was set), or
  one recorded in TF's flag (by the experimental `set_policy` or tf_keras's
  `set_global_policy`). Once it has run, the experimental `set_policy`
  (and tf_keras's `set_global_policy`) refuse a mixed policy; Keras 3's
  `set_global_policy` (`tf_lossscale.keras.mixed_precision`'s) does not
  check.

  Args:
    opt: A `tf.compat.v1.train.Optimizer` or a Keras optimizer.
    loss_scale: The loss scale: the string `'dynamic'` (recommended, the
      default), an int or float (a fixed loss scale), or a legacy
      `LossScale`.

  Returns:
    `opt` wrapped in a loss scale optimizer.

  Raises:
    ValueError: If a mixed Keras global policy is set, if `opt` already is a
      loss scale optimizer this function makes, or is not an optimizer.
    TypeError: If `opt` is a (non-experimental) Keras `LossScaleOptimizer`,
      which the experimental one refuses to wrap, as in TF 2.4.
  """
  if _mixed_keras_policy_in_use():
    raise ValueError(
      "The mixed precision graph rewrite cannot be enabled, because the "
      "global Keras dtype Policy has been set to a mixed precision policy. "
      "At most, one of the following can be called:\n\n"
      "  1. tf.keras.mixed_precision.experimental.set_policy() with a mixed "
      "precision policy (You called this first)\n\n"
      "  2. tf.train.experimental.enable_mixed_precision_graph_rewrite() "
      "(You called this second)\n"
      "You called both functions, which is an error, because both functions "
      "enable you to use mixed precision. If in doubt which function to use, "
      "use the first, as it supports Eager execution and is more customizable."
    )
  if framework_internals.non_mixed_precision_session_created():
    _logger.warning(
      "You already have existing Sessions that do not use mixed precision. "
      "enable_mixed_precision_graph_rewrite() will not affect these Sessions."
    )
  opt = _wrap_optimizer(opt, loss_scale)
  tf.config.optimizer.set_experimental_options({"auto_mixed_precision": True})
  if not framework_internals.set_graph_rewrite_flag(True):
    _logger.warning(
      "This TensorFlow has no process-wide mixed precision graph rewrite flag: a "
      "tf.compat.v1.Session created without a config gets the rewrite, one given its own "
      "ConfigProto does not unless it sets "
      "config.graph_options.rewrite_options.auto_mixed_precision = 1."
    )
  return opt


def disable_mixed_precision_graph_rewrite():
  """Switches the mixed precision graph rewrite off again.

  `tf.function`s and `tf.compat.v1.Session`s created afterwards are no longer
  rewritten to float16; Sessions created while it was on keep it. Optimizers
  already wrapped keep scaling the loss (harmless, now needless).

  >>> import tf_lossscale
  >>> _ = tf_lossscale.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(
  ...     tf.compat.v1.train.AdamOptimizer())
  >>> tf_lossscale.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite()
  >>> tf.config.optimizer.get_experimental_options()['auto_mixed_precision']
  False
  """
  if not framework_internals.graph_rewrite_flag():
    _logger.warning(
      "disable_mixed_precision_graph_rewrite() called when mixed precision is already disabled."
    )
  tf.config.optimizer.set_experimental_options({"auto_mixed_precision": False})
  framework_internals.set_graph_rewrite_flag(False)
