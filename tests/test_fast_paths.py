"""The fast paths behind the hot loop, and where each must not be taken.

* In a function, every If op is lowered, as any `tf.cond`'s: kept as a call
  of its branch functions (a former speed-up), the step's numbers moved 1-2
  ulps off a plain step's (tests/test_every_inner_optimizer.py holds every
  optimizer to a plain step's numbers).
* In a TF1 graph, one Switch gates the apply's ops (as TF1's cond gates a
  branch, without a Switch per input); inside functions the If stays.
* Eagerly, the unscale and the finiteness check each run as one call of a
  graph function instead of op by op, with the same numbers.
* Under XLA, every way of checking finiteness (sums with an exact fallback,
  concatenated chunks, and on a CPU matrix products with zeros for large
  gradients) decides as TF 2.4's element-wise check, on the same traps.
"""

import collections
import gc
import re
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import helpers
from tf_lossscale import loss_scale
from tf_lossscale._src import algorithm, fast_paths, scale_state
from tf_lossscale.compat.v1.mixed_precision import MixedPrecisionLossScaleOptimizer
from tf_lossscale.keras.mixed_precision import LossScaleOptimizer

pytestmark = pytest.mark.skipif(
  not fast_paths.enabled(), reason="pins the fast paths, off with TF_LOSSSCALE_FAST_PATHS=0"
)


def _lowering_of_top_level_ifs(graph, with_resources=True):
  """Whether each If of `graph` (with resource inputs: the apply) is lowered."""
  return [
    op.node_def.attr["_lower_using_switch_merge"].b
    for op in graph.get_operations()
    if op.type in ("If", "StatelessIf")
    and with_resources == any(t.dtype == tf.resource for t in op.inputs)
  ]


def _keras_step(opt, variables):
  def step(nan):
    with tf.GradientTape() as tape:
      loss = opt.get_scaled_loss(tf.add_n([tf.reduce_sum(v * v) for v in variables]) * nan)
    grads = opt.get_unscaled_gradients(tape.gradient(loss, variables))
    opt.apply_gradients(zip(grads, variables, strict=True))

  return step


def _v1_step(opt, variables):
  def step(nan):
    opt.minimize(
      lambda: tf.add_n([tf.reduce_sum(v * v) for v in variables]) * nan, var_list=variables
    )

  return step


_STEPS = {
  "keras": (
    lambda: LossScaleOptimizer(tf.keras.optimizers.SGD(0.25), initial_scale=8.0),
    _keras_step,
  ),
  "v1": (
    lambda: MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.25), "dynamic"
    ),
    _v1_step,
  ),
}


def _run_and_check(step, variables, opt_scale):
  """A finite step applies (v - 0.25 * 2v = v / 2), a NaN step skips and halves the scale."""
  before = [v.numpy() for v in variables]
  scale = float(opt_scale())
  step(tf.constant(1.0))
  for v, b in zip(variables, before, strict=True):
    np.testing.assert_array_equal(v.numpy(), b / 2)
  assert float(opt_scale()) == scale
  step(tf.constant(float("nan")))
  for v, b in zip(variables, before, strict=True):
    np.testing.assert_array_equal(v.numpy(), b / 2)
  assert float(opt_scale()) == scale / 2


def _scale_of(api, opt):
  if api == "keras":
    return lambda: opt.loss_scale
  return opt._loss_scale  # pylint: disable=protected-access


@pytest.mark.parametrize("size", [3, 400 * 400])
@pytest.mark.parametrize("api", sorted(_STEPS))
def test_every_cond_is_lowered_in_a_function(api, size):
  make_opt, make_step = _STEPS[api]
  opt = make_opt()
  variables = [tf.Variable(np.full([size], 4.0, np.float32)) for _ in range(3)]
  step = tf.function(make_step(opt, variables))
  _run_and_check(step, variables, _scale_of(api, opt))
  graph = step.get_concrete_function(tf.constant(1.0)).graph
  # The apply's If, and on a CPU the check's (its exact fallback when the
  # quick check fails).
  assert _lowering_of_top_level_ifs(graph) == [True]
  check_ifs = [] if not fast_paths._cpu_only() else [True]
  assert _lowering_of_top_level_ifs(graph, with_resources=False) == check_ifs


class _CountingSGD(tf.keras.optimizers.SGD):
  traced = 0

  def update_step(self, gradient, variable, learning_rate):
    self.traced += 1
    return super().update_step(gradient, variable, learning_rate)


class _CountingGradientDescent(tf.compat.v1.train.GradientDescentOptimizer):
  traced = 0

  def _resource_apply_dense(self, grad, handle):
    self.traced += 1
    return super()._resource_apply_dense(grad, handle)


@pytest.mark.parametrize("api", sorted(_STEPS))
def test_the_apply_is_traced_once_per_variable(api):
  # The apply runs after the quick check or after the exact one: built in
  # both, a model's whole update would be traced (and compiled) twice.
  if api == "keras":
    inner = _CountingSGD(0.25)
    opt = LossScaleOptimizer(inner, initial_scale=8.0)
  else:
    inner = _CountingGradientDescent(0.25)
    opt = MixedPrecisionLossScaleOptimizer(inner, "dynamic")
  variables = [tf.Variable(np.full([3], 4.0, np.float32)) for _ in range(3)]
  step = tf.function(_STEPS[api][1](opt, variables))
  _run_and_check(step, variables, _scale_of(api, opt))
  assert inner.traced == len(variables)


@pytest.mark.parametrize("api", sorted(_STEPS))
def test_cond_is_lowered_when_resources_are_on_two_devices(api):
  # The If kernel could not run a branch touching both: it must be lowered.
  make_opt, make_step = _STEPS[api]
  opt = make_opt()
  variables = []
  for device in ("/cpu:1", "/cpu:2"):
    with tf.device(device):
      variables.append(tf.Variable(np.full([3], 4.0, np.float32)))
  step = tf.function(make_step(opt, variables))
  _run_and_check(step, variables, _scale_of(api, opt))
  graph = step.get_concrete_function(tf.constant(1.0)).graph
  assert _lowering_of_top_level_ifs(graph) == [True]


def test_devices_are_followed_through_nested_functions():
  opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.25), initial_scale=8.0)
  variables = []
  for device in ("/cpu:1", "/cpu:2"):
    with tf.device(device):
      variables.append(tf.Variable(np.full([3], 4.0, np.float32)))
  inner = tf.function(_keras_step(opt, variables))
  outer = tf.function(lambda nan: inner(nan))
  _run_and_check(outer, variables, lambda: opt.loss_scale)


def test_cond_is_lowered_under_mirrored_strategy():
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.25), initial_scale=8.0)
    variables = [tf.Variable(np.full([3], 4.0, np.float32))]
  step = _keras_step(opt, variables)
  run = tf.function(lambda nan: strategy.run(step, args=(nan,)))
  graph = run.get_concrete_function(tf.constant(1.0)).graph
  lowering = _lowering_of_top_level_ifs(graph)
  assert lowering and all(lowering)


def test_cond_is_not_touched_under_xla():
  opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.25), initial_scale=8.0)
  variables = [tf.Variable(np.full([3], 4.0, np.float32))]
  step = tf.function(_keras_step(opt, variables), jit_compile=True)
  _run_and_check(step, variables, lambda: opt.loss_scale)
  graph = step.get_concrete_function(tf.constant(1.0)).graph
  ifs = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
  assert ifs and all("_lower_using_switch_merge" not in op.node_def.attr for op in ifs)


def _mixed_grads(rows):
  rng = np.random.default_rng(0)
  return [
    tf.constant(rng.normal(size=[4, 3]), tf.float32),
    None,
    tf.constant(rng.normal(size=[5]), tf.float16),
    tf.IndexedSlices(
      tf.constant(rng.normal(size=[rows, 3]), tf.float64), tf.range(rows), tf.constant([9, 3])
    ),
    tf.constant(rng.normal(size=[]), tf.bfloat16),
  ]


def test_eager_unscale_is_one_call_with_the_numbers_of_op_by_op():
  scale = tf.constant(3.0)  # A reciprocal that is not exact in binary.
  calls = fast_paths._times_call  # pylint: disable=protected-access
  calls._concrete.clear()  # pylint: disable=protected-access
  for rows in (2, 5, 7):  # Sparse gradients change shape every step.
    grads = _mixed_grads(rows) * 4  # 16 gradients: enough to take one call.
    unscaled = scale_state.unscale_gradients(grads, scale)
    assert [g is None for g in unscaled] == [g is None for g in grads]
    for got, grad in zip(unscaled, grads, strict=True):
      if grad is None:
        continue
      if isinstance(grad, tf.IndexedSlices):
        assert isinstance(got, tf.IndexedSlices)
        np.testing.assert_array_equal(got.indices, grad.indices)
        got, grad = got.values, grad.values
      expected = grad * tf.cast(1.0 / scale, grad.dtype)
      assert got.dtype == grad.dtype and got.shape == grad.shape
      np.testing.assert_array_equal(got.numpy(), expected.numpy())
  # One signature (the dtypes) for all three steps: nothing is retraced.
  assert len(calls._concrete) == 1  # pylint: disable=protected-access


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf")])
def test_eager_check_with_sparse_gradients(bad):
  grads = _mixed_grads(3)
  if bad is not None:
    values = grads[3].values.numpy()
    values[1, 2] = bad
    grads[3] = tf.IndexedSlices(tf.constant(values), grads[3].indices, grads[3].dense_shape)
  assert bool(fast_paths.all_finite(grads)) == (bad is None)


def test_eager_check_under_a_strategy_runs_op_by_op(monkeypatch):
  calls = []
  one_call, op_by_op = fast_paths._check_call, fast_paths._check  # pylint: disable=protected-access
  # The one call's function keeps the `_check` it was made with: each path is seen once.
  monkeypatch.setattr(fast_paths, "_check_call", lambda v: calls.append("one call") or one_call(v))
  monkeypatch.setattr(fast_paths, "_check", lambda v: calls.append("op by op") or op_by_op(v))
  strategy = helpers.make_strategy("mirrored")
  grads = [tf.constant([1.0, 2.0]), tf.constant([float("inf")])]
  with strategy.scope():
    assert not fast_paths.eager_outside_strategies()
    assert not bool(fast_paths.all_finite(grads))
    assert bool(fast_paths.all_finite(grads[:1]))
  assert calls == ["op by op"] * 2
  calls.clear()
  assert fast_paths.eager_outside_strategies()
  assert not bool(fast_paths.all_finite(grads))
  assert bool(fast_paths.all_finite(grads[:1]))
  assert calls == ["one call"] * 2


# --- TF1 graphs: one Switch gates the apply -----------------------------------


def test_tf1_graph_gates_the_apply_with_a_switch_and_skips_exactly(monkeypatch):
  monkeypatch.setattr(fast_paths, "_cpu_only", lambda: True)  # The check's two parts.
  graph = tf.Graph()
  with graph.as_default():
    variables = [tf.Variable(np.full([3], 4.0, np.float32)) for _ in range(3)]
    step = tf.compat.v1.train.get_or_create_global_step()
    nan = tf.compat.v1.placeholder(tf.float32, [])
    opt = MixedPrecisionLossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.25), "dynamic")
    train_op = opt.minimize(
      tf.add_n([tf.reduce_sum(v * v) for v in variables]) * nan, global_step=step
    )
    state = [variables, [opt._optimizer.get_slot(v, "m") for v in variables]]  # pylint: disable=protected-access
    state += [step, opt._loss_scale(), opt._optimizer._get_beta_accumulators()]  # pylint: disable=protected-access
    types = [op.type for op in graph.get_operations()]
  # The exact check and the apply each behind a Switch; no If, no Switch per input.
  assert types.count("Switch") == 2 and types.count("Merge") == 2
  assert "If" not in types and "StatelessIf" not in types
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(tf.compat.v1.global_variables_initializer())  # Slots made in a branch.
    session.run(train_op, {nan: 1.0})
    applied = session.run(state)
    assert applied[2] == 1 and not np.allclose(applied[0], 4.0)
    for bad in (float("nan"), float("inf")):
      session.run(train_op, {nan: bad})
      skipped = session.run(state)
      tf.nest.map_structure(np.testing.assert_array_equal, skipped[:3], applied[:3])
      tf.nest.map_structure(np.testing.assert_array_equal, skipped[4], applied[4])
      assert skipped[3] == applied[3] / 2
      applied = skipped


def test_tf1_graph_cond_returns_the_taken_branch_s_values():
  graph = tf.Graph()
  with graph.as_default():
    pred = tf.compat.v1.placeholder(tf.bool, [])
    outer = tf.constant([1.0, 2.0])
    result = fast_paths.cond(
      pred, lambda: (outer, {"n": tf.constant(1)}), lambda: (outer * 3, {"n": tf.constant(2)})
    )
    op = fast_paths.cond(pred, tf.no_op, lambda: None)
    with pytest.raises(ValueError, match="same structure"):
      fast_paths.cond(pred, lambda: tf.constant(1), lambda: tf.constant(1.0))
  assert isinstance(op, tf.Operation)
  with tf.compat.v1.Session(graph=graph) as session:
    for taken, (values, n) in ((True, ([1.0, 2.0], 1)), (False, ([3.0, 6.0], 2))):
      got, extra, _ = session.run([result[0], result[1], op], {pred: taken})
      np.testing.assert_array_equal(got, values)
      assert extra == {"n": n}


def test_tf1_graph_inside_a_function_keeps_the_if():
  graph = tf.Graph()
  with graph.as_default():
    variables = [tf.Variable(np.full([3], 4.0, np.float32))]
    opt = MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.25), "dynamic"
    )
    step = tf.function(_v1_step(opt, variables))
    step(tf.constant(1.0))
    concrete = step.get_concrete_function(tf.constant(1.0))
  types = [op.type for op in concrete.graph.get_operations()]
  assert "If" in types and "Switch" not in types


def test_tf1_graph_cond_runs_what_the_taken_branch_makes_and_does_not_return():
  # As a function's branch would (TF1's own cond would not).
  graph = tf.Graph()
  with graph.as_default():
    pred = tf.compat.v1.placeholder(tf.bool, [])
    counters = [tf.Variable(0), tf.Variable(0)]

    def bump(counter):
      def branch():
        counter.assign_add(1)  # Not returned.

      return branch

    op = fast_paths.cond(pred, bump(counters[1]), bump(counters[0]))
    value = fast_paths.cond(
      pred, lambda: (bump(counters[1])(), tf.constant(1))[1], lambda: tf.constant(0)
    )
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(op, {pred: True})
    assert session.run(counters) == [0, 1]
    session.run(op, {pred: False})
    assert session.run(counters) == [1, 1]
    assert session.run(value, {pred: True}) == 1
    assert session.run(counters) == [1, 2]


def test_eager_update_is_one_call_with_the_numbers_of_op_by_op(monkeypatch):
  # Check, transition and both assigns in one call; the same states as op by op.
  sequence = [[1.0, 2.0], [3e38, 3e38], [1.0, float("inf")], [float("nan"), 1.0], [0.5, 0.5]] * 2

  settings = algorithm.ScaleSettings(growth_steps=2, multiplier=3.0)

  def run(one_call):
    monkeypatch.setattr(fast_paths, "_eager_one_call", lambda *_: one_call)
    scale, counter = tf.Variable(4.0), tf.Variable(0, dtype=tf.int64)
    states = []
    for values in sequence:
      _, finite = fast_paths.update_scale_variables(
        scale, counter, [tf.constant(values), None], settings
      )
      states.append((bool(finite), float(scale.numpy()), int(counter.numpy())))
    return states

  calls = fast_paths._check_and_step_call  # pylint: disable=protected-access
  calls._concrete.clear()  # pylint: disable=protected-access
  fused = run(True)
  assert len(calls._concrete) == 1  # pylint: disable=protected-access
  assert fused == run(False)
  assert [f for f, _, _ in fused] == [True, True, False, False, True] * 2


def test_a_mirrored_scale_updated_eagerly_outside_its_strategy_moves_every_replica():
  """Variables made in a strategy's scope, updated outside it: each replica's
  copy, as TF's class (a handle there is one replica's)."""
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    ours = loss_scale.DynamicLossScale(8.0, 1)
    tfs = tf.compat.v1.mixed_precision.DynamicLossScale(8.0, 1)
  for grad in (NAN, 1.0, 1.0):
    for scale in (ours, tfs):
      scale.update([tf.constant([grad])])
  replicas = [strategy.experimental_local_results(s._current_loss_scale) for s in (ours, tfs)]
  assert [[float(x) for x in r] for r in replicas] == [[16.0, 16.0]] * 2
  assert [int(x) for x in strategy.experimental_local_results(ours.skipped_steps)] == [1, 1]
  with strategy.scope():
    var = tf.Variable([1.0])
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.125), initial_scale=8.0, dynamic_growth_steps=1)
    opt.build([var])
  for grad in (NAN, 1.0, 1.0):
    opt.apply_gradients([(tf.constant([grad]), var)])  # It raised (a replica's handle).
  assert [x.numpy().tolist() for x in strategy.experimental_local_results(var)] == [[0.75]] * 2
  assert [float(x) for x in strategy.experimental_local_results(opt.loss_scale)] == [16.0]


@pytest.mark.parametrize("one_call", [True, False], ids=["one_call", "op_by_op"])
def test_an_apply_that_raises_leaves_the_state_as_it_was(one_call, monkeypatch):
  monkeypatch.setattr(fast_paths, "_eager_one_call", lambda *_: one_call)
  scale, counter = tf.Variable(8.0), tf.Variable(1, dtype=tf.int64)
  skipped = tf.Variable(0, dtype=tf.int64)
  settings = algorithm.ScaleSettings(8.0, 2, 2.0)

  def apply_fn():
    raise RuntimeError("the inner optimizer refused")

  for grad in (1.0, NAN):
    with pytest.raises(RuntimeError, match="refused"):
      fast_paths.update_scale_variables(
        scale,
        counter,
        [tf.constant(grad)],
        settings,
        apply_fn=apply_fn,
        skip_fn=apply_fn,
        skipped_var=skipped,
      )
    assert (float(scale.numpy()), int(counter.numpy()), int(skipped.numpy())) == (8.0, 1, 0)


# --- all_finite: behaviours a faster check must keep --------------------------

FLOAT32_MAX = float(np.finfo(np.float32).max)
BIG = 0.75 * FLOAT32_MAX
INF, NAN = float("inf"), float("nan")

FAST_CHECK_TRAPS = {
  # A sum of finite values may overflow: that is no reason to skip.
  "same_shape_grads_overflow_elementwise": (lambda: [tf.fill([4], BIG)] * 3, True),
  "partial_sums_overflow_only_when_added": (
    lambda: [tf.constant([BIG]), tf.fill([2, 1], BIG)],
    True,
  ),
  "overflow_to_inf_then_back_down": (lambda: [tf.constant([BIG, BIG, -BIG, -BIG])], True),
  "float32_and_float64_overflow_together": (
    lambda: [tf.constant([BIG]), tf.constant([1.7e308, 1.7e308], tf.float64)],
    True,
  ),
  "negative_zero_and_denormals": (lambda: [tf.constant([-0.0, 1e-45, -1e-40])], True),
  # Inf and -Inf must not cancel, in one gradient or across gradients.
  "inf_and_minus_inf_in_one_grad": (lambda: [tf.constant([INF, -INF])], False),
  "inf_and_minus_inf_in_same_shape_grads": (
    lambda: [tf.constant([INF]), tf.constant([-INF])],
    False,
  ),
  # Inf x 0 is NaN: a check built on multiplying by zero must still see it.
  "inf_among_zeros_of_many_same_shape_grads": (
    lambda: [tf.zeros([8])] * 20 + [tf.constant([0.0] * 7 + [INF])],
    False,
  ),
  "nan_after_an_overflowing_sum": (lambda: [tf.constant([BIG, BIG, NAN])], False),
  # XLA's CPU max drops NaN: a max(|g|) check would call this finite.
  "nan_beside_finite_values": (lambda: [tf.ones([3]), tf.constant([1.0, NAN, 2.0])], False),
  "nan_at_the_end_of_a_large_grad": (
    lambda: [tf.concat([tf.ones([100_000]), tf.constant([NAN])], 0)],
    False,
  ),
  # The sum overflows, so the exact check decides, over concatenated chunks of small gradients.
  "overflow_across_many_small_grads": (lambda: [tf.constant([BIG])] * 5 + [tf.ones([2])], True),
  "nan_in_an_earlier_chunk": (
    lambda: [tf.constant([BIG]), tf.constant([NAN]), tf.ones([2]), tf.ones([1])],
    False,
  ),
  "nan_in_a_later_chunk_after_an_overflow": (
    lambda: [tf.constant([BIG])] * 2 + [tf.ones([1]), tf.ones([2]), tf.constant([NAN])],
    False,
  ),
  # A group of same-shaped gradients fills a stacked chunk (16 of 2**16 elements).
  "nan_in_the_last_gradient_of_a_full_chunk": (
    lambda: [tf.ones([1 << 16])] * 15 + [tf.concat([tf.ones([(1 << 16) - 1]), [NAN]], 0)],
    False,
  ),
  "inf_in_float16_beside_float32": (
    lambda: [tf.ones([3]), tf.constant([1.0, INF], tf.float16)],
    False,
  ),
  # Matrices (checked by products with zeros under XLA on a CPU in the "products" modes).
  "rows_of_large_finite_values": (lambda: [tf.fill([4, 3], BIG), tf.fill([3, 5], -BIG)], True),
  "large_finite_float64_matrix": (
    lambda: [tf.fill([2, 3], tf.constant(1.7e308, tf.float64))],
    True,
  ),
  "inf_and_minus_inf_in_one_row": (lambda: [tf.constant([[INF, -INF, 1.0]] * 2)], False),
  "inf_in_the_first_element": (lambda: [tf.constant([[INF, 1.0, 1.0], [1.0] * 3])], False),
  "nan_in_the_last_row": (
    lambda: [tf.concat([tf.ones([3, 3]), tf.constant([[1.0, 1.0, NAN]])], 0)],
    False,
  ),
  # Small gradients beside matrices: concatenated, beside the matrices' products.
  "nan_in_a_small_grad_beside_a_matrix": (
    lambda: [tf.constant([1.0, NAN, 1.0]), tf.ones([4, 3]), tf.ones([5])],
    False,
  ),
  "inf_in_a_float64_matrix_beside_float32": (
    lambda: [tf.ones([2, 3]), tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, INF]], tf.float64)],
    False,
  ),
}

MODES = {
  "eager": lambda fn: fn,
  "function": tf.function,
  # XLA's algebraic simplifier must not fold a check away either.
  "xla": lambda fn: tf.function(fn, jit_compile=True),
}


def _small_gradients_are_large(mode, monkeypatch):
  """Sets the modes' limits so that the traps' few elements take the paths of
  large gradients; returns the mode to run in."""
  if mode.startswith("xla_"):  # xla_gpu too: the matrices xla_products checks by products.
    monkeypatch.setattr(fast_paths, "_GROUPED_MAX_ELEMENTS", 2)
    monkeypatch.setattr(fast_paths, "_STACKED_MAX_ELEMENTS", 3)
  if mode.endswith("small_chunks"):  # The element-wise check, over several concatenations.
    monkeypatch.setattr(fast_paths, "_PRODUCT_MAX_COLUMNS", 0)
  if mode.endswith("gpu"):  # The paths taken on a machine with a GPU.
    monkeypatch.setattr(fast_paths, "_cpu_only", lambda: False)
  return mode.split("_")[0]


XLA_VARIANTS = ["xla_small_chunks", "xla_products", "xla_gpu", "function_gpu"]


def _parts_taken(monkeypatch):
  """The names of the check's parts that the next check builds, in a set it fills."""
  taken = set()

  def spy(name, part):
    def recorded(*args):
      taken.add(name)
      return part(*args)

    return recorded

  for name in ("_summer", "_each_finite", "_concatenated_finite", "_products_finite"):
    monkeypatch.setattr(fast_paths, name, spy(name, getattr(fast_paths, name)))
  # The module's one call reuses what it traced before: it would build no part again.
  monkeypatch.setattr(
    fast_paths, "_check_call", fast_paths.OneCall(fast_paths._check, static_shapes=True)
  )
  return taken


def _parts_expected(mode, grads):
  """Outside XLA: sums, then the element-wise check if they are not finite, on a
  CPU; the element-wise check alone on a GPU. Under XLA: concatenations, and on
  a CPU with xla_products' limits, products for matrices of more than 2 elements."""
  cpu = fast_paths._cpu_only()  # pylint: disable=protected-access
  if not mode.startswith("xla"):
    return {"_summer", "_each_finite"} if cpu else {"_each_finite"}
  matrices = [g.shape.rank >= 2 and g.shape.num_elements() > 2 for g in grads]
  if not (cpu and mode == "xla_products" and any(matrices)):
    return {"_concatenated_finite"}
  return {"_products_finite"} if all(matrices) else {"_products_finite", "_concatenated_finite"}


@pytest.mark.parametrize("mode", [*MODES, *XLA_VARIANTS])
@pytest.mark.parametrize("grads, expected", FAST_CHECK_TRAPS.values(), ids=FAST_CHECK_TRAPS)
def test_all_finite_skips_exactly_on_nan_or_inf_never_on_overflow(
  grads, expected, mode, monkeypatch
):
  taken = _parts_taken(monkeypatch)
  run = MODES[_small_gradients_are_large(mode, monkeypatch)]
  grads = grads()
  assert bool(run(lambda: fast_paths.all_finite(grads))()) is expected
  # Each mode checks its own path: xla_gpu, on the matrices, not xla_products' products.
  assert taken == _parts_expected(mode, grads)


@pytest.mark.parametrize("count", [6, 500])
def test_xla_reads_small_gradients_concatenated(count):
  # A reduction per gradient was a kernel or two more for XLA to compile per gradient, and
  # a quick sum each with an exact fallback an If whose branch XLA compiles whether it runs
  # or not (docs/benchmarks.md): however many gradients, the check is one reduction, no If.
  grads = [tf.fill([3, i % 7 + 1], float(i)) for i in range(count // 2)]
  grads += [tf.fill([i % 5 + 1], float(i)) for i in range(count // 2)]  # Flat: no reshape.
  check = tf.function(lambda: fast_paths.all_finite(grads), jit_compile=True)
  hlo = check.experimental_get_compiler_ir()(stage="hlo")
  assert len(re.findall(r" reduce\(", hlo)) == 1
  assert "conditional(" not in hlo
  graph = check.get_concrete_function().graph
  assert sum(op.type == "Reshape" for op in graph.get_operations()) == count // 2
  assert bool(check())


@pytest.mark.skipif(not fast_paths._cpu_only(), reason="products check large gradients on a CPU")
@pytest.mark.parametrize("bad", [None, (0, 0, 0, INF), (1, 299, 299, -INF), (2, 150, 7, NAN)])
def test_xla_checks_large_gradients_by_products(bad):
  # Reductions were one to three kernels per gradient for XLA to compile; the products are
  # library calls: two per large gradient, and one reduction for all of them.
  values = [np.ones([300, 300], np.float32) for _ in range(3)]
  if bad is not None:
    grad, row, column, value = bad
    values[grad][row, column] = value
  grads = [tf.constant(v) for v in values]
  check = tf.function(lambda: fast_paths.all_finite(grads), jit_compile=True)
  hlo = check.experimental_get_compiler_ir()(stage="hlo")
  assert len(re.findall(r" dot\(", hlo)) == 6
  assert len(re.findall(r" reduce\(", hlo)) == 1
  assert bool(check()) is (bad is None)


def _placeholders_read_by(op):
  """The names of the function inputs (placeholders) `op` depends on."""
  seen, todo, found = set(), [op], set()
  while todo:
    op = todo.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if op.type == "Placeholder":
      found.add(op.name)
    todo += [t.op for t in op.inputs]
  return found


@pytest.mark.skipif(not fast_paths._cpu_only(), reason="products check large gradients on a CPU")
@pytest.mark.parametrize("bad", [None, "small", "large"])
def test_xla_products_take_their_zeros_from_a_small_gradient(bad):
  # XLA unscales a gradient in place only where nothing else reads it: zeros taken from a
  # large gradient kept one more large gradient alive, 16 of the 80 MiB `mlp16m`'s step
  # took. From the last small gradient (the last layer's, which backprop computes first)
  # they are ready before the large ones (docs/benchmarks.md).
  large = [np.ones([300, 300], np.float32) for _ in range(2)]
  small = [np.ones([3], np.float32), np.ones([5], np.float32)]  # The last, not the smallest.
  if bad == "small":
    small[1][0] = NAN  # The zeros are NaN then: every product too, and the verdict is right.
  if bad == "large":
    large[1][3, 4] = INF
  args = [tf.constant(v) for v in (small[0], large[0], small[1], large[1])]
  check = tf.function(lambda *grads: fast_paths.all_finite(list(grads)), jit_compile=True)
  graph = check.get_concrete_function(*args).graph
  slices = [op for op in graph.get_operations() if op.type == "StridedSlice"]
  assert slices
  assert set().union(*map(_placeholders_read_by, slices)) == {graph.inputs[2].op.name}
  assert bool(check(*args)) is (bad is None)


def _fused_step(grads):
  """The scale update with the conditional apply, as the optimizers call it."""
  scale, counter = tf.Variable(8.0), tf.Variable(0, dtype=tf.int64)
  # int64: an int32 variable lives in host memory, out of reach of XLA on a GPU.
  applied, skipped = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)

  def step():
    update_op, finite = fast_paths.update_scale_variables(
      scale,
      counter,
      grads(),
      algorithm.ScaleSettings(growth_steps=2),
      apply_fn=lambda: applied.assign_add(1),
      skip_fn=lambda: skipped.assign_add(1),
    )
    return update_op, finite

  return step, (scale, counter, applied, skipped)


@pytest.mark.parametrize("mode", ["function", "xla", "xla_small_chunks", "xla_products", "graph"])
@pytest.mark.parametrize("grads, expected", FAST_CHECK_TRAPS.values(), ids=FAST_CHECK_TRAPS)
def test_check_fused_with_the_apply_decides_exactly_too(grads, expected, mode, monkeypatch):
  # In a function (not XLA's) the check and the conditional apply share one If op, with
  # the exact check nested in its skip branch; in a TF1 graph each is gated by a Switch;
  # under XLA the check is exact with no If: the same traps must hold everywhere.
  mode = _small_gradients_are_large(mode, monkeypatch)
  if mode == "graph":
    with tf.Graph().as_default():
      step, state = _fused_step(grads)
      update_op, finite = step()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        _, finite = sess.run([update_op, finite])
        state = sess.run(state)
  else:
    step, state = _fused_step(grads)
    finite = tf.function(lambda: step()[1], jit_compile=mode == "xla")()
    state = [v.numpy() for v in state]
  assert bool(finite) is expected
  assert list(state) == ([8.0, 1, 1, 0] if expected else [4.0, 0, 0, 1])


def _inner(family, optimizer):
  import tf_keras  # pylint: disable=import-outside-toplevel

  classes = tf.keras.optimizers if family == "keras3" else tf_keras.optimizers.legacy
  return classes.Adam(0.1) if optimizer == "adam" else classes.SGD(0.1, momentum=0.9)


def _xla_training(family, optimizer, monkeypatch, fast):
  """Variables, slots and step counter after steps (finite, NaN, finite, Inf, finite)
  of an XLA-compiled step with a momentum or Adam inner optimizer."""
  monkeypatch.setattr(fast_paths, "ENABLED", fast)
  tf.keras.utils.set_random_seed(0)
  variables = [tf.Variable(tf.random.normal([3, 2])), tf.Variable(tf.random.normal([2]))]
  inner = _inner(family, optimizer)
  opt = LossScaleOptimizer(inner, initial_scale=2.0**15)
  if family == "keras3":
    opt.build(variables)
  factor = tf.Variable(1.0)

  @tf.function(jit_compile=True)
  def step():
    with tf.GradientTape() as tape:
      loss = opt.get_scaled_loss(tf.reduce_sum(variables[0] * variables[1]) * factor)
    grads = opt.get_unscaled_gradients(tape.gradient(loss, variables))
    opt.apply_gradients(zip(grads, variables))

  history = []
  for value in (1.0, float("nan"), 2.0, float("inf"), 3.0):
    factor.assign(value)
    step()
    state = inner.variables if family == "keras3" else inner.variables()
    history.append([v.numpy() for v in [*variables, *state, opt.loss_scale, opt.dynamic_counter]])
  return history


def _bits(history):
  return [[value.tobytes() for value in step] for step in history]


@pytest.mark.skipif(
  not fast_paths._cpu_only(), reason="on a GPU XLA's fusions round apart (next test)"
)
@pytest.mark.parametrize("family", ["keras3", "tf_keras"])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("check", ["xla", "xla_products"])
def test_xla_steps_with_slots_have_the_numbers_of_the_plain_path(
  family, optimizer, check, monkeypatch
):
  # Under XLA how the apply is placed decides how XLA fuses (and rounds) it: the fast
  # paths must leave every variable, slot and counter bit for bit as the plain path does,
  # skipped steps included. (The paths of a machine with a GPU: the next test.)
  _small_gradients_are_large(check, monkeypatch)
  fast = _xla_training(family, optimizer, monkeypatch, fast=True)
  assert _bits(fast) == _bits(_xla_training(family, optimizer, monkeypatch, fast=False))


@pytest.mark.parametrize("family", ["keras3", "tf_keras"])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_xla_steps_on_a_gpu_skip_exactly_and_apply_as_the_plain_path(
  family, optimizer, monkeypatch
):
  # On a GPU XLA computes the apply beside the selects (see
  # test_under_xla_on_a_gpu_the_skip_is_selects_not_a_conditional): it may fuse the
  # gradients' last operations into it and contract a product and a sum into one fused
  # multiply-add where the plain path's conditional rounds twice (Keras 3 Adam's second
  # moment, 1 ulp). A skipped step still moves no variable or slot by a bit.
  plain = _xla_training(family, optimizer, monkeypatch, fast=False)
  monkeypatch.setattr(fast_paths, "_cpu_only", lambda: False)
  fast = _xla_training(family, optimizer, monkeypatch, fast=True)
  for step in (1, 3):  # The NaN and the Inf step; the inner's step counter counts them.
    before, after = _bits(fast[step - 1 : step + 1])
    assert before[:2] + before[3:-2] == after[:2] + after[3:-2]
    assert fast[step][2] == fast[step - 1][2] + 1
  for ours, theirs in zip(fast, plain, strict=True):
    for a, b in zip(ours, theirs, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
    assert _bits([ours[-2:]]) == _bits([theirs[-2:]])  # The scale and the counter.


def _optimized_hlo_of_an_xla_step(family, monkeypatch, gpu):
  monkeypatch.setattr(fast_paths, "_cpu_only", lambda: not gpu)
  variables = [tf.Variable(tf.ones([3, 2])), tf.Variable(tf.ones([2]))]
  opt = LossScaleOptimizer(_inner(family, "adam"), initial_scale=8.0)
  if family == "keras3":
    opt.build(variables)
  step = tf.function(_keras_step(opt, variables), jit_compile=True)
  return step.experimental_get_compiler_ir(tf.constant(1.0))(stage="optimized_hlo")


@pytest.mark.parametrize("family", ["keras3", "tf_keras"])
def test_under_xla_on_a_gpu_the_skip_is_selects_not_a_conditional(family, monkeypatch):
  # On a GPU a conditional waits for its predicate on the host. With the state assigned
  # in both branches no branch is empty, and XLA turns the conditional into selects (the
  # numbers: test_xla_steps_on_a_gpu_skip_exactly_and_apply_as_the_plain_path).
  assert "conditional(" not in _optimized_hlo_of_an_xla_step(family, monkeypatch, gpu=True)
  assert "conditional(" in _optimized_hlo_of_an_xla_step(family, monkeypatch, gpu=False)


def test_on_a_gpu_a_function_step_has_one_if(monkeypatch):
  # The check without the If deciding whether its exact part runs, on a GPU (see
  # quick_and_exact); the traps decide exactly there too ([function_gpu-...] above).
  def ifs_in_a_step():
    opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.25), initial_scale=8.0)
    variables = [tf.Variable(np.full([3], 4.0, np.float32))]
    step = tf.function(_keras_step(opt, variables))
    _run_and_check(step, variables, lambda: opt.loss_scale)
    graph = step.get_concrete_function(tf.constant(1.0)).graph
    return [op.type for op in graph.get_operations() if op.type in ("If", "StatelessIf")]

  monkeypatch.setattr(fast_paths, "_cpu_only", lambda: True)
  assert len(ifs_in_a_step()) == 2
  monkeypatch.setattr(fast_paths, "_cpu_only", lambda: False)
  assert len(ifs_in_a_step()) == 1


def _one_calls():
  return [value for value in vars(fast_paths).values() if isinstance(value, fast_paths.OneCall)]


def test_eager_steps_of_many_model_shapes_keep_a_bounded_number_of_traced_functions():
  # A sweep over model shapes, trained eagerly in one process: the functions traced
  # for shapes long gone are dropped (the tf.function's own cache kept every one).
  assert len(_one_calls()) >= 3
  for one_call in _one_calls():
    one_call._concrete.clear()  # pylint: disable=protected-access
  first = None
  for width in range(1, fast_paths.OneCall._MAX_SIGNATURES + 8):
    var = tf.Variable(tf.ones([width]))
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=2.0)
    with tf.GradientTape() as tape:
      loss = opt.get_scaled_loss(tf.reduce_sum(var))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
    opt.apply_gradients(zip(grads, [var]))
    assert np.array_equal(var.numpy(), np.zeros(width))
    if first is None:
      first = [weakref.ref(c) for o in _one_calls() for c in o._concrete.values()]
      assert first
  gc.collect()
  assert [ref for ref in first if ref() is not None] == []
  assert max(len(o._concrete) for o in _one_calls()) <= fast_paths.OneCall._MAX_SIGNATURES


def test_eager_calls_cycling_through_many_signatures_trace_each_once():
  # Per-variable applies of a 40-variable model, several optimizers: signatures in
  # turn. (Dropping every one at a cap of 32 made each such call trace anew: 30x slower.)
  traces = []

  def total(tensors):
    traces.append(len(tensors))
    return tf.add_n([tf.reduce_sum(t) for t in tensors])

  one_call = fast_paths.OneCall(total, static_shapes=True)
  widths = range(1, 41)
  for _ in range(3):
    for width in widths:
      assert float(one_call([tf.ones([width])])) == width
  assert len(traces) == len(widths)


def test_a_cycle_of_more_signatures_than_kept_runs_the_dropped_ones_op_by_op(monkeypatch):
  # More models than are kept, trained in turn: those dropped come back op by op,
  # with the same numbers (tracing each anew on every call was 20-30x slower).
  monkeypatch.setattr(fast_paths.OneCall, "_MAX_SIGNATURES", 2)
  calls = []

  def total(tensors):
    calls.append("eager" if tf.executing_eagerly() else "traced")
    return tf.add_n([tf.reduce_sum(t) for t in tensors])

  one_call = fast_paths.OneCall(total, static_shapes=True)
  for _ in range(3):
    for width in (1, 2, 3):
      assert float(one_call([tf.ones([width])])) == width
  assert calls == ["traced"] * 3 + ["eager"] * 2  # width 1, dropped for 3, in rounds 2 and 3

  for one_call in _one_calls():
    monkeypatch.setattr(one_call, "_concrete", collections.OrderedDict())
    monkeypatch.setattr(one_call, "_dropped", collections.OrderedDict())
  models = [
    (tf.Variable(tf.ones([width])), LossScaleOptimizer(keras.optimizers.SGD(1.0), True, 4, 2))
    for width in (1, 2, 3)
  ]
  for step in range(4):
    for var, opt in models:
      grad = tf.fill(var.shape, NAN if step == 1 else 1.0)
      opt.apply_gradients([(grad, var)])
  assert fast_paths._check_and_step_call._dropped  # the op-by-op path was taken
  for var, opt in models:
    assert np.array_equal(var.numpy(), np.full(var.shape, -2.0))  # 3 steps applied
    assert (float(opt.loss_scale), int(opt.dynamic_counter), int(opt.skipped_steps)) == (4, 0, 1)
