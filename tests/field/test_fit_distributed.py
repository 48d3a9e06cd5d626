"""`fit` with regularization losses under MirroredStrategy, and its execution modes.

Reproduces keras-team/keras#20609 (loss scaling with MirroredStrategy and
`keras.regularizers`: the regularization losses were scaled wrongly per
replica), keras-team/keras#18666 (Keras 3's loss-scale optimizer failing in
`merge_call` under MirroredStrategy in `fit`) and keras-team/keras#21366
(`jit_compile=True` with MirroredStrategy and a loss-scale optimizer crashed in
`merge_call`). The issue also lists keras-team/keras#19246, whose report could
not be read here; the execution modes it stands for (`steps_per_execution > 1`,
`run_eagerly=True`) are covered generically.

Each run records the weights after every training step and must match a
plain optimizer on a single replica step by step; under `mixed_float16`, where
a plain optimizer's float16 gradients would underflow, the reference is the
family's own loss-scale optimizer on a single replica.

Two combinations cannot run on this machine whatever the optimizer (a plain
one fails the same way), and are skipped with the reason: Keras 3's `fit` with
`steps_per_execution > 1` under MirroredStrategy (its `while_loop` over
replicated steps feeds no value to a placeholder), and any XLA-compiled
function touching the second replica's variables under MirroredStrategy over
logical CPUs (XLA compiles for CPU:0 and refuses a variable on CPU:1). The
XLA test below compiles each replica's gradient computation instead, which
works on every strategy.
"""

import keras
import multi_worker_job as job
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from field import common
from tf_lossscale.keras import mixed_precision

LSO = mixed_precision.LossScaleOptimizer

_KERAS3_SPE = (
  "Keras 3 fit(steps_per_execution>1) fails under MirroredStrategy with plain optimizers too"
)
_XLA_LOGICAL_CPUS = (
  "XLA cannot compile a replicated step over logical CPUs (variable on CPU:1 accessed from "
  "CPU:0), with plain optimizers too"
)

MODES = {
  "graph": {},
  "run_eagerly": {"run_eagerly": True},
  "steps_per_execution": {"steps_per_execution": 2},
  "jit_compile": {"jit_compile": True},
}


class _RecordWeights:
  """A callback factory: the model's weights after every training batch."""

  def __init__(self, fw):
    record = self.record = []

    class Callback(fw.callbacks.Callback):
      def on_train_batch_end(self, batch, logs=None):
        del batch, logs
        record.append([np.array(w) for w in self.model.get_weights()])

    self.callback = Callback()


def _fit(family, strategy, wrap, compile_kwargs, learning_rate=0.1):
  fw = common.framework(family)
  recorder = _RecordWeights(fw)
  with strategy.scope():
    model = common.dense_model(fw, regularized=True)
    inner = common.make_inner(family, learning_rate=learning_rate, momentum=0.5)
    model.compile(wrap(inner), loss="mse", **compile_kwargs)
  model.fit(
    common.X,
    common.Y,
    batch_size=4,
    epochs=2,
    shuffle=False,
    verbose=0,
    callbacks=[recorder.callback],
  )
  return recorder.record, model


_REFERENCES = {}


def _fit_gradient_factor(family, strategy):
  """How many times the global batch's gradient a `fit` step under `strategy` applies:
  Keras < 3.8's `fit` does not divide a replica's loss by the replicas in sync (upstream,
  plain optimizers alike; see `multi_worker_job.keras3_fit_divides_loss`)."""
  if family == "keras3" and not job.keras3_fit_divides_loss():
    return strategy.num_replicas_in_sync
  return 1


def _single_replica_reference(family, gradient_factor=1):
  """A plain optimizer's steps on one replica; `gradient_factor` times the learning
  rate (SGD with momentum: the same as that many times each gradient)."""
  key = (family, gradient_factor)
  if key not in _REFERENCES:
    record, _ = _fit(
      family,
      common.strategy("default"),
      lambda inner: inner,
      {},
      learning_rate=0.1 * gradient_factor,
    )
    _REFERENCES[key] = record
  return _REFERENCES[key]


def _cases():
  for family in common.FAMILIES:
    for strategy_name in ("default", "mirrored"):
      for mode in MODES:
        reason = None
        if strategy_name == "mirrored" and mode == "jit_compile":
          reason = _XLA_LOGICAL_CPUS
        elif strategy_name == "mirrored" and mode == "steps_per_execution" and family == "keras3":
          reason = _KERAS3_SPE
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        yield pytest.param(
          family, strategy_name, mode, marks=marks, id=f"{family}-{strategy_name}-{mode}"
        )


@pytest.mark.parametrize("family, strategy_name, mode", list(_cases()))
def test_fit_with_regularization_matches_a_single_replica_step_by_step(family, strategy_name, mode):
  strategy = common.strategy(strategy_name)
  record, model = _fit(
    family, strategy, lambda inner: LSO(inner, initial_scale=8, dynamic_growth_steps=2), MODES[mode]
  )
  reference = _single_replica_reference(family, _fit_gradient_factor(family, strategy))
  if mode == "steps_per_execution":  # one callback per execution of 2 steps
    reference = reference[1::2]
  assert len(record) == len(reference)
  exact = strategy_name == "default" and mode != "jit_compile"
  for step_weights, reference_weights in zip(record, reference, strict=True):
    for ours, theirs in zip(step_weights, reference_weights, strict=True):
      if exact:
        np.testing.assert_array_equal(ours, theirs)
      else:  # summed over replicas in another order, or fused by XLA
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
  assert float(model.optimizer.loss_scale) == 32.0  # 4 finite steps: doubled twice
  assert common.as_int(model.optimizer.iterations) == 4


def _peer_wrapper(family):
  """The family's own loss-scale optimizer at the scale of our mixed_float16 runs: Keras 3's
  for Keras 3 optimizers, tf_keras's (a factory taking OptimizerV2 and its newer ones) else."""
  if family == "keras3":
    return lambda inner: keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0**10)
  return lambda inner: tf_keras.mixed_precision.LossScaleOptimizer(inner, initial_scale=2.0**10)


def _peer_scale(optimizer):
  """A peer wrapper's current loss scale (Keras 3 names it `dynamic_scale`)."""
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    return float(optimizer.dynamic_scale.numpy())
  return float(optimizer.loss_scale)


def test_fit_under_mixed_float16_mirrored_matches_a_single_replica(family, mixed_float16):
  """One replica matches the family's own wrapper exactly; two agree to float16 precision.

  Scaling by a power of two changes only exponents, in float16 as in float32,
  and both wrappers unscale the float32 gradients by the exact reciprocal: our
  run on one replica and the peer's take the same steps bit for bit. Across
  replicas the float16 computations are split and summed in another order.
  """
  default, mirrored = common.strategy("default"), common.strategy("mirrored")
  learning_rate = 0.1 * _fit_gradient_factor(family, mirrored)

  def ours(inner):
    return LSO(inner, initial_scale=2.0**10)

  peer_record, peer = _fit(family, default, _peer_wrapper(family), {}, learning_rate)
  single_record, single = _fit(family, default, ours, {}, learning_rate)
  mirrored_record, mirrored_model = _fit(family, mirrored, ours, {}, 0.1)
  assert len(single_record) == len(peer_record) == 4
  for step_weights, peer_weights in zip(single_record, peer_record, strict=True):
    for ours_value, theirs in zip(step_weights, peer_weights, strict=True):
      np.testing.assert_array_equal(ours_value, theirs)
  for ours_value, theirs in zip(mirrored_record[-1], single_record[-1], strict=True):
    np.testing.assert_allclose(ours_value, theirs, rtol=1e-2, atol=1e-3)
  scales = [_peer_scale(peer.optimizer)]
  scales += [float(model.optimizer.loss_scale) for model in (single, mirrored_model)]
  assert scales == [2.0**10] * 3  # 4 finite steps of the default 2000 before growing


def _xla_run(family, strategy, scaled):
  """Three steps on a variable whose gradients each replica computes in an XLA-compiled
  function: through our wrapper at scale 8 if `scaled`, else with a plain optimizer."""
  with strategy.scope():
    var = tf.Variable([1.0, -2.0])
    inner = common.make_inner(family, learning_rate=0.25, momentum=0.5)
    opt = LSO(inner, initial_scale=8) if scaled else common.built(inner, [var])
  scaling = opt if scaled else common.NoScaling

  @tf.function(jit_compile=True)
  def gradients(x):
    with tf.GradientTape() as tape:
      loss = scaling.get_scaled_loss(tf.reduce_sum(tf.sin(var) * x))
    return scaling.get_unscaled_gradients(tape.gradient(loss, [var]))

  @tf.function
  def step(x):
    def replica_fn():
      # Each replica sees x / replicas: the summed gradient matches one replica with x.
      grads = gradients(x / strategy.num_replicas_in_sync)
      opt.apply_gradients(zip(grads, [var], strict=True))

    strategy.run(replica_fn)

  for i in range(3):
    step(tf.constant([1.0, 0.5]) * (i + 1))
  return var, opt


def test_xla_compiled_replica_gradients_match_a_single_replica(family, strategy):
  """keras#21366's setting without `merge_call` inside XLA: each replica's gradients compiled.

  The reference is a plain optimizer on one replica. In float32, scaling by 8
  and unscaling are exact, and so are halving `x` and summing the two halves:
  every replica's variable must equal it exactly.
  """
  reference, _ = _xla_run(family, common.strategy("default"), scaled=False)
  var, opt = _xla_run(family, strategy, scaled=True)
  common.assert_on_every_replica(strategy, var, reference.numpy())
  assert float(opt.loss_scale) == 8.0
  common.assert_on_every_replica(strategy, opt.dynamic_counter, 3)  # 3 finite steps
