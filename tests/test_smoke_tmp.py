import helpers
import tensorflow as tf
from tf_lossscale import loss_scale


def test_nan_on_one_replica(mode):
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    ls = loss_scale.DynamicLossScale(8, 2)

  @mode
  def step():
    def rep():
      g = helpers.replica_nan(1.0)
      return tf.distribute.get_replica_context().merge_call(lambda s, g: ls.update([g])[1], args=(g,))
    return strategy.run(rep)

  step()
  assert float(ls()) == 4.0
