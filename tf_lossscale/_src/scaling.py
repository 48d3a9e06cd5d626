"""Multiplying the loss by the loss scale and dividing the gradients by it.

Shared by the Keras and the compat.v1 optimizers, so both give the same
numbers as TF 2.4: the loss is multiplied by the scale cast to the loss's
dtype; each gradient by the scale's float32 reciprocal cast to its dtype.
"""

import tensorflow as tf


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


def unscale_gradients(grads, loss_scale):
  """Divides each gradient by `loss_scale`; None stays None.

  The reciprocal is computed once and cast once per gradient dtype, and the
  multiply is issued as a raw op: eagerly, with hundreds of gradients, the
  Python work per gradient is most of the cost.

  Args:
    grads: A list of tensors, `tf.IndexedSlices` (kept as such) or None.
    loss_scale: A float32 scalar tensor.

  Returns:
    A new list of the same length.

  >>> [float(g) for g in unscale_gradients([tf.constant(2.)], tf.constant(4.))]
  [0.5]
  """
  reciprocal = 1.0 / tf.convert_to_tensor(loss_scale, tf.float32)
  factors = {}

  def times_reciprocal(values):
    if values.dtype not in factors:
      factors[values.dtype] = tf.cast(reciprocal, values.dtype)
    return tf.raw_ops.Mul(x=values, y=factors[values.dtype])

  def unscale(grad):
    if grad is None:
      return None
    if isinstance(grad, tf.IndexedSlices):
      return tf.IndexedSlices(times_reciprocal(grad.values), grad.indices, grad.dense_shape)
    return times_reciprocal(tf.convert_to_tensor(grad))

  return [unscale(g) for g in grads]
