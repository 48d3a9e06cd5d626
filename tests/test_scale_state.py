"""The seam between the algorithm and its speed-ups (`scale_state.py`).

With the fast paths off (`TF_LOSSSCALE_FAST_PATHS=0`) every API must produce the
same numbers, bit for bit, as with them on: variables, slots, loss scale, counter,
skipped-step and step counters, step after step, through finite, overflowing, Inf and
NaN steps, with TF 2.4's settings and with the options beyond them.
"""

import functools

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
# With a floor of 1.5, a ceiling of 8 and a hysteresis of 2: grows to the
# ceiling, shrinks from a run's second non-finite step on, a finite step ends
# a run, and the floor holds.
OPTIONS = {"min_loss_scale": 1.5, "max_loss_scale": 8.0, "hysteresis": 2}
OPTION_STEPS = [1.0, 1.0, 1.0, 1.0, INF, NAN, INF, 1.0, NAN, 1.0, 1.0, -INF, NAN, NAN, 0.5]


def _variables():
  return [tf.Variable([[1.0, -2.0], [0.5, 3.0]]), tf.Variable([0.25, -0.75])]


def _loss(variables, factor):
  return factor * (tf.reduce_sum(variables[0] ** 2) + tf.reduce_sum(variables[1]))


def _keras_run(make_inner, **options):
  def build():
    variables = _variables()
    opt = LossScaleOptimizer(make_inner(), initial_scale=4.0, dynamic_growth_steps=2, **options)

    def step(factor):
      with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(_loss(variables, factor))
      grads = opt.get_unscaled_gradients(tape.gradient(loss, variables))
      opt.apply_gradients(zip(grads, variables, strict=True))

    def state():
      inner = opt.inner_optimizer.variables
      inner = inner() if callable(inner) else inner  # A method on OptimizerV2.
      scale = [opt.loss_scale, opt.dynamic_counter, opt.skipped_steps]
      return [*variables, *inner, *scale, opt.iterations]

    return step, state

  return build


def _v1_run(**options):
  variables = _variables()
  opt = MixedPrecisionLossScaleOptimizer(
    tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9),
    DynamicLossScale(initial_loss_scale=4.0, increment_period=2, multiplier=3.0, **options),
  )
  global_step = tf.Variable(0, dtype=tf.int64)

  def step(factor):
    return opt.minimize(lambda: _loss(variables, factor), global_step, var_list=variables)

  def state():
    # The slots by variable: `variables()` sorts them by name, and eagerly
    # those end in a process-wide count (`Momentum_9` after `Momentum_10`).
    slots = [opt.get_slot(v, "momentum") for v in variables]
    scale = opt.variables()[-2:]  # The loss scale's, after the wrapped optimizer's.
    if opt.skipped_steps is None:  # A TF1 graph.
      return [*variables, *slots, *scale, global_step]
    return [*variables, *slots, *scale, opt.skipped_steps, global_step]

  return step, state


def _legacy_run(**options):
  scale = DynamicLossScale(initial_loss_scale=4.0, increment_period=2, multiplier=3.0, **options)
  variables = _variables()

  def step(factor):
    grads = [factor * v for v in variables]
    # `update` takes every replica's gradients, in a cross-replica context.
    tf.distribute.get_replica_context().merge_call(lambda _, g: scale.update(g), args=(grads,))

  return step, lambda: [scale(), scale._num_good_steps, scale.skipped_steps]


# name: (build, steps)
RUNS = {
  "keras3_momentum": (_keras_run(lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9)), STEPS),
  "keras3_adam": (_keras_run(lambda: tf.keras.optimizers.Adam(0.01)), STEPS),
  "tf_keras_v2_adam": (_keras_run(lambda: tf_keras.optimizers.legacy.Adam(0.01)), STEPS),
  "tf_keras_new_momentum": (
    _keras_run(lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9)),
    STEPS,
  ),
  "compat_v1_momentum": (_v1_run, STEPS),
  "legacy_dynamic_loss_scale": (_legacy_run, STEPS),
  "keras3_adam_options": (
    _keras_run(lambda: tf.keras.optimizers.Adam(0.01), **OPTIONS),
    OPTION_STEPS,
  ),
  "tf_keras_v2_momentum_options": (
    _keras_run(lambda: tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9), **OPTIONS),
    OPTION_STEPS,
  ),
  "compat_v1_momentum_options": (functools.partial(_v1_run, **OPTIONS), OPTION_STEPS),
  "legacy_dynamic_loss_scale_options": (functools.partial(_legacy_run, **OPTIONS), OPTION_STEPS),
}


def _states(run, mode, strategy_name):
  strategy = helpers.make_strategy(strategy_name)
  build, steps = RUNS[run]
  with strategy.scope():
    step, state = build()

  @mode
  def run_step(factor):  # Returns nothing: minimize's op cannot leave a function.
    if strategy_name == "default":
      step(factor)
    else:
      strategy.run(step, args=(factor,))

  states = []
  for factor in steps:
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
  scales = [float(s[0] if run.startswith("legacy_") else s[-4]) for s in fast]
  assert len(set(scales)) >= 3, scales
  skipped = int(fast[-1][-1 if run.startswith("legacy_") else -2])
  # At least the Inf and NaN steps (factors that overflow may add more).
  assert skipped >= sum(not np.isfinite(f) for f in RUNS[run][1]), skipped


@pytest.mark.parametrize("run", ["compat_v1_momentum", "compat_v1_momentum_options"])
@pytest.mark.parametrize("fast", [True, False])
def test_tf1_graph_compat_v1_steps_match_with_and_without_fast_paths(run, fast, monkeypatch):
  monkeypatch.setattr(fast_paths, "ENABLED", fast)
  build, steps = RUNS[run]
  with tf.Graph().as_default():
    step, state = build()
    factor = tf.compat.v1.placeholder(tf.float32, [])
    train = step(factor)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      results = []
      for f in steps:
        session.run(train, {factor: f})
        results.append(session.run(state()))
  eager = _states(run, lambda fn: fn, "default")
  for got, expected in zip(results, eager, strict=True):
    del expected[-2]  # The skipped-step count: a TF1 graph has no such variable.
    for a, b in zip(got, expected, strict=True):
      np.testing.assert_array_equal(a, b)
