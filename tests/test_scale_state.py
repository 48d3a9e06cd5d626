"""The seam between the algorithm and its speed-ups (`scale_state.py`).

With the fast paths off (`TF_LOSSSCALE_FAST_PATHS=0`) every API must produce the
same numbers, bit for bit, as with them on: variables, slots, loss scale, counter
and step counters, step after step, through finite, overflowing, Inf and NaN steps.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
from tf_lossscale._src import fast_paths
from tf_lossscale.compat.v1.mixed_precision import MixedPrecisionLossScaleOptimizer
from tf_lossscale.keras.mixed_precision import LossScaleOptimizer
from tf_lossscale.loss_scale import DynamicLossScale

NAN, INF = float("nan"), float("inf")
# Per step, what multiplies the loss: finite steps, a finite gradient whose sum
# overflows float32 (3e38 * 2 elements), Inf and NaN.
STEPS = [1.0, 1.0, 3e38, INF, 1.0, NAN, 1.0, 1.0, 1.0, -INF, 0.5]


def _variables():
  return [tf.Variable([[1.0, -2.0], [0.5, 3.0]]), tf.Variable([0.25, -0.75])]


def _loss(variables, factor):
  return factor * (tf.reduce_sum(variables[0] ** 2) + tf.reduce_sum(variables[1]))


def _keras_run(make_inner):
  def build():
    variables = _variables()
    opt = LossScaleOptimizer(make_inner(), initial_scale=4.0, dynamic_growth_steps=2)

    def step(factor):
      with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(_loss(variables, factor))
      grads = opt.get_unscaled_gradients(tape.gradient(loss, variables))
      opt.apply_gradients(zip(grads, variables, strict=True))

    def state():
      inner = opt.inner_optimizer.variables
      inner = inner() if callable(inner) else inner  # A method on OptimizerV2.
      return [*variables, *inner, opt.loss_scale, opt.dynamic_counter, opt.iterations]

    return step, state

  return build


def _v1_run():
  variables = _variables()
  opt = MixedPrecisionLossScaleOptimizer(
    tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9),
    DynamicLossScale(initial_loss_scale=4.0, increment_period=2, multiplier=3.0),
  )
  global_step = tf.Variable(0, dtype=tf.int64)

  def step(factor):
    return opt.minimize(lambda: _loss(variables, factor), global_step, var_list=variables)

  def state():
    return [*variables, *opt.variables(), global_step]

  return step, state


def _legacy_run():
  scale = DynamicLossScale(initial_loss_scale=4.0, increment_period=2, multiplier=3.0)
  variables = _variables()

  def step(factor):
    grads = [factor * v for v in variables]
    # `update` takes every replica's gradients, in a cross-replica context.
    tf.distribute.get_replica_context().merge_call(lambda _, g: scale.update(g), args=(grads,))

  return step, lambda: [scale(), scale._num_good_steps]


RUNS = {
  "keras3_momentum": _keras_run(lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9)),
  "keras3_adam": _keras_run(lambda: tf.keras.optimizers.Adam(0.01)),
  "tf_keras_v2_adam": _keras_run(lambda: tf_keras.optimizers.legacy.Adam(0.01)),
  "tf_keras_new_momentum": _keras_run(lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9)),
  "compat_v1_momentum": _v1_run,
  "legacy_dynamic_loss_scale": _legacy_run,
}


def _states(run, mode, strategy_name):
  strategy = helpers.make_strategy(strategy_name)
  with strategy.scope():
    step, state = RUNS[run]()

  @mode
  def run_step(factor):  # Returns nothing: minimize's op cannot leave a function.
    if strategy_name == "default":
      step(factor)
    else:
      strategy.run(step, args=(factor,))

  states = []
  for factor in STEPS:
    run_step(tf.constant(factor))
    states.append([np.array(tf.convert_to_tensor(x)) for x in state()])
  return states


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
@pytest.mark.parametrize("run", list(RUNS))
def test_fast_paths_off_gives_the_same_numbers_bit_for_bit(run, mode, strategy_name, monkeypatch):
  monkeypatch.setattr(fast_paths, "ENABLED", True)
  fast = _states(run, mode, strategy_name)
  monkeypatch.setattr(fast_paths, "ENABLED", False)
  plain = _states(run, mode, strategy_name)
  for step, (got, expected) in enumerate(zip(plain, fast, strict=True)):
    for a, b in zip(got, expected, strict=True):
      np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
  # The sequence did skip and grow: the comparison covered both branches.
  scales = [float(s[-3] if run != "legacy_dynamic_loss_scale" else s[0]) for s in fast]
  assert len(set(scales)) >= 3, scales


@pytest.mark.parametrize("fast", [True, False])
def test_tf1_graph_compat_v1_steps_match_with_and_without_fast_paths(fast, monkeypatch):
  monkeypatch.setattr(fast_paths, "ENABLED", fast)
  with tf.Graph().as_default():
    step, state = _v1_run()
    factor = tf.compat.v1.placeholder(tf.float32, [])
    train = step(factor)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      results = []
      for f in STEPS:
        session.run(train, {factor: f})
        results.append(session.run(state()))
  eager = _states("compat_v1_momentum", lambda fn: fn, "default")
  for got, expected in zip(results, eager, strict=True):
    for a, b in zip(got, expected, strict=True):
      np.testing.assert_array_equal(a, b)
