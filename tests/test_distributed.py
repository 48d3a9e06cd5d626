"""Loss scaling under in-process tf.distribute strategies: one decision for all replicas.

The training scenarios live in `multi_worker_job.py` and run here unchanged
under MirroredStrategy (two and four logical CPUs), OneDeviceStrategy and
CentralStorageStrategy; `test_multi_worker.py` runs them across processes.
"""

import functools

import keras
import multi_worker_job as job
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
import tf_lossscale
from tf_lossscale.keras.mixed_precision import LossScaleOptimizer


def mirrored(num_devices):
  """A fresh MirroredStrategy over `num_devices` (2 or 4) logical CPUs."""
  return helpers.make_strategy("mirrored" if num_devices == 2 else "mirrored4")


def _train(name, strategy):
  run = job.build(name, strategy)
  history, _ = job.train(run)
  return run, history


def assert_replicas_identical(run):
  """Every variable, slot, scale and counter is bit-identical on every replica."""
  values = job.replica_values(run)
  for path, per_replica in values.items():
    assert len(per_replica) == len(
      run.strategy.experimental_local_results(job.as_variable(run.kernel))
    )
    for replica, value in enumerate(per_replica):
      assert np.all(np.isfinite(value)), f"{path} on replica {replica}: {value}"
      assert value.tobytes() == per_replica[0].tobytes(), (
        f"{path}: replica {replica} holds {value}, replica 0 holds {per_replica[0]}"
      )
  return {path: per_replica[0] for path, per_replica in values.items()}


@pytest.mark.parametrize("name", job.SCENARIOS)
@pytest.mark.parametrize("num_devices", [2, 4])
def test_nan_on_one_replica_skips_the_step_on_all(num_devices, name):
  strategy = mirrored(num_devices)
  run, history = _train(name, strategy)
  assert strategy.num_replicas_in_sync == num_devices
  job.check_history(history, strategy.num_replicas_in_sync, name)
  job.check_state(assert_replicas_identical(run), name)


_NO_AGGREGATION = "You must specify an aggregation method to update a AggregatingVariable"


@functools.cache
def _plain_keras3_step_under_central_storage():
  """A plain Keras 3 SGD step under CentralStorageStrategy: the error, or None."""
  strategy = tf.distribute.experimental.CentralStorageStrategy(helpers.TWO_CPUS)
  with strategy.scope():
    var = tf.Variable([1.0])
    opt = keras.optimizers.SGD(0.5)
  return helpers.plain_step_outcome(strategy, opt, var, [1.0])


def test_plain_keras3_under_central_storage_strategy():
  """Keras 3.5 and 3.6 cannot step under CentralStorageStrategy, even without loss
  scaling: their update of the central variable has no aggregation method (upstream)."""
  error, value = _plain_keras3_step_under_central_storage()
  if error is None:
    # Both replicas' gradients summed onto the one central copy (Keras < 3.5: one
    # replica's gradient only, it does not all-reduce).
    assert value == ([0.0] if helpers.keras3_all_reduces() else [0.5])
  else:
    assert _NO_AGGREGATION in error


@pytest.mark.parametrize("name", job.CUSTOM_LOOP_SCENARIOS)
@pytest.mark.parametrize("strategy_name", ["one_device", "central_storage"])
def test_one_device_and_central_storage_strategies_work(strategy_name, name):
  if strategy_name == "one_device":
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  else:
    if name in ("keras3", "experimental") and _plain_keras3_step_under_central_storage()[0]:
      pytest.skip("this Keras 3 cannot step under CentralStorageStrategy, even without us")
    strategy = tf.distribute.experimental.CentralStorageStrategy(helpers.TWO_CPUS)
  run, history = _train(name, strategy)
  # Alone, replica 0 is the one that gets the NaN.
  job.check_history(history, strategy.num_replicas_in_sync, name)
  job.check_state(assert_replicas_identical(run), name)


def test_parameter_server_strategy_v1_is_refused_by_the_keras_optimizer():
  # TF 2.4's Keras LossScaleOptimizer refused every strategy but Mirrored,
  # MultiWorkerMirrored and OneDevice. The TF1 ParameterServerStrategy runs
  # locally (no cluster) in graph mode; `test_multi_worker.py` covers the TF2
  # ParameterServerStrategy, which needs a cluster, for all three APIs.
  with tf.Graph().as_default():
    strategy = tf.compat.v1.distribute.experimental.ParameterServerStrategy()
    with strategy.scope():
      var = tf.Variable(1.0)
      with pytest.raises(
        ValueError,
        match="Loss scaling is not supported with the tf.distribute.Strategy: "
        "ParameterServerStrategyV1",
      ):
        opt = LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(1.0))
        strategy.extended.call_for_each_replica(
          lambda: opt.apply_gradients([(tf.constant(1.0), var)])
        )


# --- Aggregation semantics (MirroredStrategy over two logical CPUs) -----------------------


class _NarrowedSGD(tf_keras.optimizers.SGD):
  """Its `apply_gradients` takes no `skip_gradients_aggregation`: it sums itself."""

  def apply_gradients(self, grads_and_vars, name=None):
    return super().apply_gradients(grads_and_vars, name=name)


def _lso(family, learning_rate, **inner_kwargs):
  if family == "tf_keras":
    inner = tf_keras.optimizers.legacy.SGD(learning_rate, **inner_kwargs)
  elif family == "tf_keras_narrowed":
    inner = _NarrowedSGD(learning_rate, **inner_kwargs)
  else:
    inner = tf.keras.optimizers.SGD(learning_rate, **inner_kwargs)
  return LossScaleOptimizer(
    inner, initial_scale=job.INITIAL_SCALE, dynamic_growth_steps=job.GROWTH_STEPS
  )


def _scalar_variable(family):
  if family.startswith("tf_keras"):
    return tf.Variable(0.0)
  return tf.keras.Variable(0.0)


def _replica_grad(values):
  """In a replica context: `values[replica_id]` as a float32 scalar."""
  ctx = tf.distribute.get_replica_context()
  return tf.gather(tf.convert_to_tensor(values, tf.float32), ctx.replica_id_in_sync_group)


def _per_replica(strategy, var):
  values = strategy.experimental_local_results(job.as_variable(var))
  return [float(v.numpy()) for v in values]


@pytest.mark.parametrize("strategy_name", ["mirrored", "central_storage"])
@pytest.mark.parametrize("family", ["keras3", "tf_keras", "tf_keras_narrowed"])
def test_gradients_are_all_reduced_before_the_finiteness_check(family, strategy_name):
  # Under CentralStorageStrategy an OptimizerV2, and a narrowed optimizer anywhere,
  # sums the replicas' gradients itself: the decision is still on their sum.
  if strategy_name == "mirrored":
    strategy = mirrored(2)
  else:
    if family == "keras3" and _plain_keras3_step_under_central_storage()[0]:
      pytest.skip("this Keras 3 cannot step under CentralStorageStrategy, even without us")
    strategy = tf.distribute.experimental.CentralStorageStrategy(helpers.TWO_CPUS)
  with strategy.scope():
    var = _scalar_variable(family)
    opt = _lso(family, 1e-30)

  @tf.function
  def step(values):
    strategy.run(lambda: opt.apply_gradients([(_replica_grad(values), var)]))

  # 2e38 is finite on each replica; the all-reduced 4e38 overflows float32.
  copies = len(_per_replica(strategy, var))  # 1 central copy under CentralStorageStrategy
  step(tf.constant([2e38, 2e38]))
  assert _per_replica(strategy, var) == [0.0] * copies
  assert float(opt.loss_scale) == job.INITIAL_SCALE / 2
  # 1e38 + 1e38 is finite: applied (times the learning rate 1e-30).
  step(tf.constant([1e38, 1e38]))
  np.testing.assert_allclose(_per_replica(strategy, var), [-2e8] * copies, rtol=1e-5)
  assert (float(opt.loss_scale), int(opt.dynamic_counter.numpy())) == (job.INITIAL_SCALE / 2, 1)


@pytest.mark.parametrize("family", ["keras3", "tf_keras"])
def test_experimental_aggregate_gradients_false_is_honoured(family):
  strategy = mirrored(2)
  with strategy.scope():
    var = _scalar_variable(family)
    opt = _lso(family, 0.5)

  @tf.function
  def step(values, reduce_first):
    def replica_fn():
      grad = _replica_grad(values)
      if reduce_first:
        grad = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grad)
      opt.apply_gradients([(grad, var)], experimental_aggregate_gradients=False)

    strategy.run(replica_fn)

  # Already all-reduced by the caller to 1 + 3 = 4: applied once, not summed again (8).
  step(tf.constant([1.0, 3.0]), True)
  assert _per_replica(strategy, var) == [-2.0, -2.0]
  # Not aggregated, finite on replica 0, NaN on replica 1: every replica skips.
  step(tf.constant([1.0, float("nan")]), False)
  assert _per_replica(strategy, var) == [-2.0, -2.0]
  assert float(opt.loss_scale) == job.INITIAL_SCALE / 2
  assert int(opt.dynamic_counter.numpy()) == 0


def test_custom_gradient_aggregator_runs_before_the_check():
  strategy = mirrored(2)
  calls = []

  def sum_finite_parts(grads_and_vars):
    """Sums the gradients across replicas, counting a non-finite one as 0."""
    calls.append(len(grads_and_vars))
    grads = [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)) for g, _ in grads_and_vars]
    grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
    return list(zip(grads, [v for _, v in grads_and_vars], strict=True))

  with strategy.scope():
    var = tf.Variable(0.0)
    opt = _lso("tf_keras", 0.5, gradient_aggregator=sum_finite_parts)

  @tf.function
  def step(values):
    strategy.run(lambda: opt.apply_gradients([(_replica_grad(values), var)]))

  # The aggregator turns (1, NaN) into 1: the check sees its output and applies.
  step(tf.constant([1.0, float("nan")]))
  assert calls, "the gradient_aggregator was never called"
  assert _per_replica(strategy, var) == [-0.5, -0.5]
  assert (float(opt.loss_scale), int(opt.dynamic_counter.numpy())) == (job.INITIAL_SCALE, 1)


def test_gradient_transformers_get_the_aggregated_unscaled_gradients():
  strategy = mirrored(2)

  def square(grads_and_vars):
    return [(g * g, v) for g, v in grads_and_vars]

  with strategy.scope():
    var = tf.Variable(0.0)
    opt = _lso("tf_keras", 1.0, gradient_transformers=[square])

  @tf.function
  def step(values):
    def replica_fn():
      scaled = _replica_grad(values) * opt.loss_scale
      opt.apply_gradients(zip(opt.get_unscaled_gradients([scaled]), [var], strict=True))

    strategy.run(replica_fn)

  # (1 + 3) ** 2 = 16; squaring per replica first would give 1 + 9 = 10, and a
  # scaled gradient (16 * 4) ** 2.
  step(tf.constant([1.0, 3.0]))
  assert _per_replica(strategy, var) == [-16.0, -16.0]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("family", ["tf_keras", "tf_keras_new", "compat_v1"])
def test_a_lone_replicas_variables_step_outside_its_strategy_as_with_the_plain_optimizer(
  family, mode
):
  """A MirroredStrategy of one device (one GPU) whose step runs outside
  `strategy.run`: the plain optimizer and tf_keras's wrapper step there, and
  so do ours (an OptimizerV2 inner failed: a `tuple indices` TypeError)."""

  def make(wrap):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
      var = tf.Variable([1.0, 2.0])
      if family == "compat_v1":
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        opt = tf_lossscale.MixedPrecisionLossScaleOptimizer(opt, "dynamic") if wrap else opt
      else:
        inner = {"tf_keras": tf_keras.optimizers.legacy, "tf_keras_new": tf_keras.optimizers}
        opt = inner[family].SGD(0.1, momentum=0.9)
        opt = LossScaleOptimizer(opt) if wrap else opt

    def step(grad):
      opt.apply_gradients([(grad, var)])

    return var, opt, (step if mode == "eager" else tf.function(step))

  var, opt, step = make(wrap=True)
  plain_var, _, plain_step = make(wrap=False)
  for grad in ([1.0, -2.0], [float("nan"), 1.0], [0.5, 0.5]):
    step(tf.constant(grad))
    if np.all(np.isfinite(grad)):  # The plain optimizer skips nothing.
      plain_step(tf.constant(grad))
  np.testing.assert_array_equal(var.numpy(), plain_var.numpy())
  scale = opt._loss_scale() if family == "compat_v1" else opt.loss_scale
  assert float(scale) == 2.0**14


@pytest.mark.parametrize("family", ["keras3", "tf_keras_new"])
def test_an_optimizer_built_in_scope_steps_every_replica_outside_the_strategy(family):
  """Keras 3's and tf_keras's new optimizers assign mirrored variables and
  slots whole; built in the strategy's scope, they stay in step outside it."""
  strategy = mirrored(2)
  inner = {"keras3": keras.optimizers, "tf_keras_new": tf_keras.optimizers}[family]
  with strategy.scope():
    var = tf.Variable([1.0, 2.0])
    opt = LossScaleOptimizer(inner.SGD(0.1, momentum=0.9), initial_scale=8.0)
    opt.build([var])
    plain_var = tf.Variable([1.0, 2.0])
    plain = inner.SGD(0.1, momentum=0.9)
    plain.build([plain_var])
  for grad in ([1.0, -2.0], [float("nan"), 1.0], [0.5, 0.5]):
    opt.apply_gradients([(tf.constant(grad), var)])
    if np.all(np.isfinite(grad)):
      plain.apply_gradients([(tf.constant(grad), plain_var)])
  values = [v.numpy().tolist() for v in strategy.experimental_local_results(var)]
  assert values == [plain_var.numpy().tolist()] * 2
  assert float(opt.loss_scale) == 4.0
