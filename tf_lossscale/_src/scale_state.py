"""The loss scale as the optimizers use it: state, scaling, and the one seam.

Every API of this package updates a dynamic loss scale through
`DynamicState.update`, multiplies losses with `scale_loss`, divides
gradients with `unscale_gradients` and branches with `cond`. The update,
the unscale and `cond` run `fast_paths` while they are enabled and the
plain `algorithm` otherwise, with the same numbers (`scale_loss` has one
way): this module is the only place that chooses.
It chooses the plain `algorithm` also while TensorFlow hands every op to op
callbacks (`tf.debugging.enable_check_numerics`): the speed-ups sum and stack
gradients, and check-numerics would raise there at a NaN gradient, or at a
sum of finite ones that overflows, where the step must be skipped or applied.

Scaling gives the numbers TF 2.4 gave: the loss is multiplied by the scale
cast to the loss's dtype; each gradient by the scale's float32 reciprocal
cast to its dtype.
"""

import contextlib

import tensorflow as tf

from tf_lossscale._src import algorithm, fast_paths, framework_internals


def _impl():
  if fast_paths.enabled() and framework_internals.op_callbacks_active() is False:
    return fast_paths
  return algorithm


@tf.autograph.experimental.do_not_convert
def cond(pred, true_fn, false_fn):
  """`tf.cond`, decided in Python when `pred` is known (eagerly)."""
  return _impl().cond(pred, true_fn, false_fn)


def _names_tf1_conds():
  """The default graph, when it names conditionals as TF1 control flow did
  (name scopes of a graph that is not a function's); else None."""
  if tf.executing_eagerly() or tf.compat.v1.control_flow_v2_enabled():
    return None
  graph = tf.compat.v1.get_default_graph()
  return None if graph.building_function else graph


def reserve_tf24_update_cond():
  """Takes the name TF 2.4's scale update gave its conditional (`cond`), where
  names are TF1's (see `tf24_apply_name_scope`): the names after it are TF's."""
  graph = _names_tf1_conds()
  if graph is not None:
    graph.unique_name("cond")


def outer_name_scope():
  """The name scope of now, to enter again inside a conditional opened later,
  where names are TF1's (see `tf24_apply_name_scope`): for an apply TF 2.4
  ran outside any conditional."""
  graph = _names_tf1_conds()
  if graph is None:
    return contextlib.nullcontext()
  scope = graph.get_name_scope()
  return tf.name_scope(scope + "/" if scope else "")


def tf24_apply_name_scope(update_made=False):
  """The name scope of TF 2.4's apply under a dynamic loss scale, in a graph
  that is not a function's, for a name-based `Saver`: the variables an inner
  optimizer makes when it first applies are named after it.

  TF 2.4 updated the scale in one conditional (`cond`) and applied in
  another (`cond_1`). With TF1 control flow those were name scopes of the
  graph: Adam's `cond_1/beta1_power` (`train/cond_1/...` under a scope
  `train`), an OptimizerV2's `cond_1/Adam/iter`. With TF2 control flow each
  branch was a function graph of its own, its names starting at the top:
  `beta1_power` under any scope. Eagerly and in a function graph no name is
  saved: nothing changes there.

  Args:
    update_made: Whether the scale's update has run (a loss scale's own
      `update`, which took its names): the apply takes the next `cond`.
  """
  if tf.executing_eagerly() or tf.compat.v1.get_default_graph().building_function:
    return contextlib.nullcontext()
  graph = _names_tf1_conds()
  if graph is None:
    return tf.name_scope("")
  if not update_made:
    graph.unique_name("cond")  # The scale's update.
  return tf.name_scope(graph.unique_name("cond") + "/")


class DynamicState:
  """The state of a dynamic loss scale: its settings and variables.

  The variables belong to whoever tracks them in checkpoints (a legacy
  `DynamicLossScale`); this object updates them.

  Args:
    settings: An `algorithm.ScaleSettings`.
    scale: float32 scalar variable, the current loss scale.
    counter: int64 scalar variable, the counter of `algorithm.next_scale_and_counter`.
    skipped: None, or an int64 scalar variable counting the skipped steps.
  """

  def __init__(self, settings, scale, counter, skipped=None):
    self.settings = settings
    self.scale = scale
    self.counter = counter
    self.skipped = skipped

  @tf.autograph.experimental.do_not_convert
  def update(self, grads, grads_in_sync=False, apply_fn=None, skip_fn=None, count_skip=None):
    """Decides one step (see `algorithm.update_scale_variables`)."""
    return _impl().update_scale_variables(
      self.scale,
      self.counter,
      grads,
      self.settings,
      grads_in_sync,
      apply_fn,
      skip_fn,
      skipped_var=self.skipped,
      count_skip=count_skip,
    )


@tf.autograph.experimental.do_not_convert
def scale_loss(loss, loss_scale):
  """Returns `loss * loss_scale` in the loss's dtype (a callable for a callable).

  Args:
    loss: A tensor, or a callable taking no arguments that returns one.
    loss_scale: A float32 scalar tensor (or a callable returning one, read
      when a callable `loss` is called).

  >>> scale_loss(tf.constant(1.5, tf.float16), tf.constant(4.))
  <tf.Tensor: shape=(), dtype=float16, numpy=6.0>
  """
  if callable(loss):

    def scaled_loss():
      value = tf.convert_to_tensor(loss())
      scale = loss_scale() if callable(loss_scale) else loss_scale
      return value * tf.cast(scale, value.dtype)

    return scaled_loss
  loss = tf.convert_to_tensor(loss)
  return loss * tf.cast(loss_scale, loss.dtype)


@tf.autograph.experimental.do_not_convert
def unscale_gradients(grads, loss_scale):
  """Divides each gradient by `loss_scale`; None stays None.

  Each gradient is multiplied by the scale's float32 reciprocal cast to its
  dtype, as TF 2.4 did.

  Args:
    grads: An iterable of tensors, `tf.IndexedSlices` (kept as such) or None.
    loss_scale: A float32 scalar tensor.

  Returns:
    A new list of the same length.

  Raises:
    TypeError: For a dict (`tape.gradient` of a dict of variables), whose
      keys would be taken for the gradients.

  >>> [float(g) for g in unscale_gradients([tf.constant(2.)], tf.constant(4.))]
  [0.5]
  """
  if isinstance(grads, dict):
    # TF 2.4 took its keys for the gradients, and failed on them.
    raise TypeError(
      "get_unscaled_gradients takes a list of gradients, but got a dict (keys "
      f"{list(grads)[:3]}): pass a list, e.g. list(grads.values()), or tf.nest.flatten(grads)"
    )
  grads = list(grads)  # Any iterable, as TF 2.4's.
  reciprocal = 1.0 / tf.convert_to_tensor(loss_scale, tf.float32)
  present = [i for i, g in enumerate(grads) if g is not None]
  values = [algorithm.gradient_values(grads[i]) for i in present]
  if _impl() is fast_paths:
    values = fast_paths.multiply_all(values, reciprocal)
  else:
    values = [v * tf.cast(reciprocal, v.dtype) for v in values]
  unscaled = [None] * len(grads)
  for i, value in zip(present, values, strict=True):
    grad = grads[i]
    if isinstance(grad, tf.IndexedSlices):
      value = tf.IndexedSlices(value, grad.indices, grad.dense_shape)
    unscaled[i] = value
  return unscaled
