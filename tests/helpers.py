"""Helpers shared by the tests (import as `import helpers`)."""

import tensorflow as tf

TWO_CPUS = ["/cpu:0", "/cpu:1"]
FOUR_CPUS = ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]


def make_strategy(name):
  """'default': no strategy; 'mirrored': MirroredStrategy over two logical CPUs."""
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "mirrored":
    return tf.distribute.MirroredStrategy(TWO_CPUS)
  if name == "mirrored4":
    return tf.distribute.MirroredStrategy(FOUR_CPUS)
  raise ValueError(f"unknown strategy {name!r}")


def replica_nan(value, bad_replica=0):
  """In a replica context: NaN on replica `bad_replica`, `value` on the others."""
  ctx = tf.distribute.get_replica_context()
  value = tf.convert_to_tensor(value)
  return tf.where(
    tf.equal(ctx.replica_id_in_sync_group, bad_replica),
    tf.fill(tf.shape(value), tf.constant(float("nan"), value.dtype)),
    value,
  )
