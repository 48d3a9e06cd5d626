"""Helpers shared by the tests (import as `import helpers`)."""

import tensorflow as tf

TWO_CPUS = ["/cpu:0", "/cpu:1"]
FOUR_CPUS = ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]


class _OwnKeysMirroredStrategy(tf.distribute.MirroredStrategy):
  """A MirroredStrategy whose collective keys no other strategy in the process uses.

  Strategies over the same devices otherwise start at the same collective
  group and instance keys, and the TF runtime remembers each key's group size
  and shape for the whole process: a later strategy all-reducing another
  shape under a key already used (or over four devices after two) aborts
  every later collective.
  """

  _next_key_base = 10000

  def __init__(self, devices):
    self._collective_key_base = _OwnKeysMirroredStrategy._next_key_base
    _OwnKeysMirroredStrategy._next_key_base += 1000
    super().__init__(devices)


def make_strategy(name):
  """A strategy by name.

  'default': no strategy; 'mirrored' / 'mirrored4': a fresh MirroredStrategy
  over two / four logical CPUs, with collective keys of its own.
  """
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "mirrored":
    return _OwnKeysMirroredStrategy(TWO_CPUS)
  if name == "mirrored4":
    return _OwnKeysMirroredStrategy(FOUR_CPUS)
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
