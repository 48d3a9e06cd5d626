"""Tests of the dynamic loss-scale algorithm (`tf_lossscale/_src/algorithm.py`), and of the
fast paths (`fast_paths.py`) against it: the same decisions and numbers.

The reference is a plain Python model of the documented algorithm in float32
(`ScaleModel`: TF 2.4's `DynamicLossScale` with the options beyond TF 2.4 at their
defaults), and TF's own `tf.compat.v1.mixed_precision.DynamicLossScale`.
"""

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st
from tensorflow.python.distribute import values as tf_values

import helpers
from tf_lossscale import loss_scale
from tf_lossscale._src import algorithm, fast_paths

FLOAT32_MAX = float(np.finfo(np.float32).max)
NAN = float("nan")
INF = float("inf")

# Every hypothesis test here reuses one trace of its tf.functions; examples are
# cheap eager calls, so a few dozen of them keep the file fast.
SETTINGS = hypothesis.settings(max_examples=40, deadline=None)


class ScaleModel:
  """The documented dynamic loss scale, in float32 Python/NumPy, with its
  state kept apart: `good` finite steps since the scale last changed, `run`
  consecutive non-finite steps, `skipped` steps in all. TF 2.4's algorithm
  with the default options."""

  def __init__(
    self, scale, growth_steps, multiplier, min_scale=1.0, max_scale=INF, hysteresis=1, counter=0
  ):
    self.scale = np.float32(scale)
    self.growth_steps, self.hysteresis = growth_steps, hysteresis
    self.multiplier = np.float32(multiplier)
    self.min_scale, self.max_scale = np.float32(min_scale), np.float32(max_scale)
    # The state a counter variable encodes.
    self.good, self.run, self.skipped = max(counter, 0), max(-counter, 0), 0

  def step(self, finite):
    if not finite:
      self.skipped += 1
      self.good = 0
      self.run += 1
      if self.run >= self.hysteresis:
        self.scale = max(self.scale / self.multiplier, self.min_scale)
      return
    self.run = 0
    self.good += 1
    if self.good >= self.growth_steps:
      self.good = 0
      with np.errstate(over="ignore"):
        grown = self.scale * self.multiplier
      self.scale = min(grown if np.isfinite(grown) else self.scale, self.max_scale)

  @property
  def counter(self):
    """The documented encoding: the good steps, or minus the run so far (at
    most `hysteresis - 1`)."""
    return self.good if self.run == 0 else -min(self.run, self.hysteresis - 1)


def model_step(scale, counter, finite, growth_steps, multiplier, **options):
  """One transition of `ScaleModel` from `(scale, counter)`."""
  model = ScaleModel(scale, growth_steps, multiplier, counter=counter, **options)
  model.step(finite)
  return model.scale, model.counter


# --- all_finite --------------------------------------------------------------


def _indexed_slices(values, dtype=tf.float32):
  values = tf.constant(values, dtype)
  return tf.IndexedSlices(values, tf.range(tf.shape(values)[0]), tf.constant([10]))


ALL_FINITE_CASES = {
  "empty_list": ([], True),
  "only_none": ([None, None], True),
  "none_and_finite": (lambda: [None, tf.constant([1.0, -2.0])], True),
  "zero_size": (lambda: [tf.zeros([0, 3])], True),
  "nan": (lambda: [tf.constant([1.0, NAN])], False),
  "inf": (lambda: [tf.constant([INF, 1.0])], False),
  "minus_inf": (lambda: [tf.constant([[1.0], [-INF]])], False),
  "bad_grad_last_of_many": (lambda: [tf.ones([2])] * 3 + [tf.constant(NAN)], False),
  "bad_grad_first_of_many": (lambda: [tf.constant(-INF)] + [tf.ones([2])] * 3, False),
  "inf_beside_zero": (lambda: [tf.constant([INF, 0.0])], False),
  "inf_and_zero_grads": (lambda: [tf.zeros([3]), tf.constant([INF])], False),
  "float32_sum_overflows": (lambda: [tf.constant([FLOAT32_MAX, FLOAT32_MAX])], True),
  "float32_square_overflows": (lambda: [tf.constant([1e20]), tf.constant([1e20])], True),
  "float16_sum_overflows": (lambda: [tf.constant([65504.0, 65504.0], tf.float16)], True),
  "float64_sum_overflows": (lambda: [tf.constant([1.7e308, 1.7e308], tf.float64)], True),
  "mixed_dtypes_finite": (
    lambda: [tf.ones([2], tf.float16), tf.ones([2], tf.float64), tf.ones([2], tf.bfloat16)],
    True,
  ),
  "indexed_slices_finite": (lambda: [_indexed_slices([1.0, 2.0])], True),
  "indexed_slices_nan": (lambda: [_indexed_slices([1.0, NAN])], False),
  "indexed_slices_float16_inf": (lambda: [_indexed_slices([INF], tf.float16)], False),
}


CHECKS = {"reference": algorithm.all_finite, "fast": fast_paths.all_finite}


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("grads, expected", ALL_FINITE_CASES.values(), ids=ALL_FINITE_CASES)
def test_all_finite_is_false_exactly_when_a_gradient_holds_nan_or_inf(grads, expected, mode, check):
  grads = grads() if callable(grads) else grads
  assert bool(mode(CHECKS[check])(grads)) is expected


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_all_finite_detects_each_non_finite_value_in_each_float_dtype(dtype, bad):
  finite = tf.constant([0.0, 1.0, -3.0], dtype)
  for check in CHECKS.values():
    assert bool(check([finite]))
    assert not bool(check([finite, tf.constant([1.0, bad, 2.0], dtype)]))


def test_all_finite_adds_at_most_three_ops_per_gradient():
  for num_grads in (1, 10, 100):
    graph = tf.Graph()
    with graph.as_default():
      grads = [tf.compat.v1.placeholder(tf.float32, [3, 4]) for _ in range(num_grads)]
      before = len(graph.get_operations())
      fast_paths.all_finite(grads)
      added = len(graph.get_operations()) - before
    # A sum per gradient, and the exact check gated by a Switch (a dozen ops
    # in all) with an is-finite and an all per gradient.
    assert added <= 3 * num_grads + 16, (num_grads, added)


# --- next_scale_and_counter --------------------------------------------------

_TRANSITION_SIGNATURE = [
  tf.TensorSpec([], tf.float32),
  tf.TensorSpec([], tf.int64),
  tf.TensorSpec([], tf.bool),
  tf.TensorSpec([], tf.int64),
  tf.TensorSpec([], tf.float32),
  tf.TensorSpec([], tf.float32),
  tf.TensorSpec([], tf.float32),
  tf.TensorSpec([], tf.int64),
]


# Tensor arguments, so each is traced once for all examples. (A Python-constant
# multiplier lets graph optimizers turn `scale / multiplier` into a multiply by
# the rounded reciprocal, 1 ulp off for multipliers that are not powers of 2;
# TF's own class does the same.)
def _next_scale_and_counter(
  scale, counter, finite, growth_steps, multiplier, min_scale=1.0, max_scale=INF, hysteresis=1
):
  settings = algorithm.ScaleSettings(
    growth_steps=growth_steps,
    multiplier=multiplier,
    min_scale=min_scale,
    max_scale=max_scale,
    hysteresis=hysteresis,
  )
  return algorithm.next_scale_and_counter(scale, counter, finite, settings)


def _given_verdict(scale, counter, finite, growth_steps, multiplier, *options):
  """fast_paths' transition for a verdict and settings known in Python (a
  branch of the step's conditional), eagerly: exact division."""
  min_scale, max_scale, hysteresis = (v.numpy().item() for v in options)
  settings = algorithm.ScaleSettings(
    growth_steps=int(growth_steps),
    multiplier=float(multiplier),
    min_scale=min_scale,
    max_scale=max_scale,
    hysteresis=hysteresis,
  )
  return fast_paths.next_state_given(bool(finite), scale, counter, settings)


TRANSITIONS = {
  "eager": _next_scale_and_counter,
  "given_verdict": _given_verdict,
  "function": tf.function(_next_scale_and_counter, input_signature=_TRANSITION_SIGNATURE),
  "jit": tf.function(
    _next_scale_and_counter, input_signature=_TRANSITION_SIGNATURE, jit_compile=True
  ),
}


def _transition(name):
  """TRANSITIONS[name], called with tensors of the signature's dtypes."""

  def call(scale, counter, finite, growth_steps, multiplier, **options):
    values = [scale, counter, finite, growth_steps, multiplier]
    values += [options.get("min_scale", 1.0), options.get("max_scale", INF)]
    values += [options.get("hysteresis", 1)]
    return TRANSITIONS[name](
      *[tf.constant(v, spec.dtype) for v, spec in zip(values, _TRANSITION_SIGNATURE, strict=True)]
    )

  return call


@SETTINGS
@hypothesis.given(
  scale=st.floats(min_value=2.0**-4, max_value=FLOAT32_MAX, width=32),
  counter=st.integers(-3, 9),
  finite=st.booleans(),
  growth_steps=st.integers(1, 9),
  multiplier=st.floats(min_value=1.0, max_value=1e4, width=32),
  min_scale=st.floats(min_value=2.0**-10, max_value=4.0, width=32),
  max_scale=st.one_of(st.just(INF), st.floats(min_value=4.0, max_value=FLOAT32_MAX, width=32)),
  hysteresis=st.integers(1, 4),
)
@hypothesis.example(
  scale=2.0**127,
  counter=0,
  finite=True,
  growth_steps=1,
  multiplier=2.0,
  min_scale=1.0,
  max_scale=INF,
  hysteresis=1,
)
@hypothesis.example(
  scale=FLOAT32_MAX,
  counter=4,
  finite=True,
  growth_steps=5,
  multiplier=1.5,
  min_scale=1.0,
  max_scale=INF,
  hysteresis=1,
)
@hypothesis.example(
  scale=1.5,
  counter=3,
  finite=False,
  growth_steps=5,
  multiplier=2.0,
  min_scale=1.0,
  max_scale=INF,
  hysteresis=1,
)
@pytest.mark.parametrize("transition", list(TRANSITIONS))
def test_transition_matches_float32_model(
  transition, scale, counter, finite, growth_steps, multiplier, min_scale, max_scale, hysteresis
):
  options = dict(min_scale=min_scale, max_scale=max_scale, hysteresis=hysteresis)
  next_scale, next_counter = _transition(transition)(
    scale, counter, finite, growth_steps, multiplier, **options
  )
  expected_scale, expected_counter = model_step(
    scale, counter, finite, growth_steps, multiplier, **options
  )
  assert next_scale.dtype == tf.float32 and next_counter.dtype == tf.int64
  if transition == "jit" and not finite and not fast_paths._cpu_only():
    # XLA divides float32 on NVIDIA GPUs with PTX's `div.full`, up to 2 ulp
    # from the rounded quotient, as it did TF 2.4's own `scale / multiplier`
    # (exact for the default multiplier, 2, and any power of two).
    np.testing.assert_array_max_ulp(next_scale.numpy(), expected_scale, maxulp=2)
  else:
    assert next_scale.numpy() == expected_scale
  assert next_counter.numpy() == expected_counter
  assert np.isfinite(next_scale.numpy())
  if not finite:
    assert next_scale.numpy() >= min(np.float32(min_scale), np.float32(scale))


@pytest.mark.parametrize(
  "scale, counter, finite, expected",
  [
    (8.0, 0, True, (8.0, 1)),  # counts a good step
    (8.0, 2, True, (16.0, 0)),  # third good step of 3: grows, restarts the count
    (8.0, 2, False, (4.0, 0)),  # non-finite: shrinks, restarts the count
    (1.5, 1, False, (1.0, 0)),  # shrinks no lower than 1
    (1.0, 0, False, (1.0, 0)),
    (0.5, 1, False, (1.0, 0)),  # below 1 (an initial scale): raised to 1, as TF 2.4 did
    (2.0**127, 2, True, (2.0**127, 0)),  # 2**128 is Inf in float32: keeps the scale
    (FLOAT32_MAX, 2, True, (FLOAT32_MAX, 0)),
  ],
)
@pytest.mark.parametrize("transition", list(TRANSITIONS))
def test_transition_pins_tf24_values(transition, scale, counter, finite, expected):
  next_scale, next_counter = _transition(transition)(scale, counter, finite, 3, 2.0)
  assert (float(next_scale), int(next_counter)) == expected


@pytest.mark.parametrize(
  "scale, counter, finite, options, expected",
  [
    (1.0, 0, False, {"min_scale": 0.25}, (0.5, 0)),  # a floor below 1
    (0.5, 0, False, {"min_scale": 0.25}, (0.25, 0)),
    (0.25, 0, False, {"min_scale": 0.25}, (0.25, 0)),
    (16.0, 0, False, {"min_scale": 12.0}, (12.0, 0)),
    (2.0, 1, False, {"min_scale": 100.0}, (100.0, 0)),  # a floor above the scale: raised to it
    (8.0, 2, True, {"max_scale": 12.0}, (12.0, 0)),  # growth clipped to the maximum
    (12.0, 2, True, {"max_scale": 12.0}, (12.0, 0)),
    (2.0**127, 2, True, {"max_scale": 1.5 * 2.0**127}, (2.0**127, 0)),  # Inf product: kept
    (8.0, 2, False, {"hysteresis": 3}, (8.0, -1)),  # a run's first non-finite step: counted
    (8.0, -1, False, {"hysteresis": 3}, (8.0, -2)),
    (8.0, -2, False, {"hysteresis": 3}, (4.0, -2)),  # its third: shrinks
    (4.0, -2, False, {"hysteresis": 3}, (2.0, -2)),  # and so does every further one
    (4.0, -2, True, {"hysteresis": 3}, (4.0, 1)),  # a finite step ends the run
    (4.0, -1, True, {"hysteresis": 2}, (4.0, 1)),
    (1.0, -1, False, {"hysteresis": 2, "min_scale": 0.5}, (0.5, -1)),
  ],
)
@pytest.mark.parametrize("transition", list(TRANSITIONS))
def test_transition_pins_option_values(transition, scale, counter, finite, options, expected):
  next_scale, next_counter = _transition(transition)(scale, counter, finite, 3, 2.0, **options)
  assert (float(next_scale), int(next_counter)) == expected


def test_transition_accepts_python_values():
  assert [float(x) for x in _next_scale_and_counter(8.0, 1, True, 2, 2.0)] == [16, 0]
  assert [float(x) for x in _next_scale_and_counter(8.0, 1, False, 2, 2.0)] == [4, 0]


# --- DynamicLossScale.update as a state machine ------------------------------

GRAD_VALUES = {"finite": 0.5, "nan": NAN, "inf": INF, "-inf": -INF}

state_machine_args = dict(
  initial_loss_scale=st.one_of(
    st.floats(min_value=1.0, max_value=2.0**20, width=32),
    st.floats(min_value=2.0**120, max_value=FLOAT32_MAX, width=32),
  ),
  increment_period=st.integers(1, 4),
  multiplier=st.floats(min_value=1.0, max_value=1e3, width=32, exclude_min=True),
  steps=st.lists(st.sampled_from(list(GRAD_VALUES)), max_size=12),
)


def _step_grads(kind):
  """One step's gradients: a finite dense one, an IndexedSlices and a None."""
  return [
    tf.constant([1.0, -2.0]),
    _indexed_slices([GRAD_VALUES[kind], 1.0], tf.float16),
    None,
  ]


@st.composite
def _options(draw, initial_loss_scale):
  """Options beyond TF 2.4, each left at its default half of the time."""
  options = {}
  if draw(st.booleans()):
    options["min_loss_scale"] = draw(st.floats(min_value=2.0**-10, max_value=8.0, width=32))
  if draw(st.booleans()):
    lowest = max(initial_loss_scale, options.get("min_loss_scale", 1.0))
    options["max_loss_scale"] = draw(
      st.floats(min_value=lowest, max_value=min(lowest * 64, FLOAT32_MAX), width=32)
    )
  if draw(st.booleans()):
    options["hysteresis"] = draw(st.integers(1, 4))
  return options


@SETTINGS
@hypothesis.given(**state_machine_args, data=st.data())
def test_update_follows_python_model(initial_loss_scale, increment_period, multiplier, steps, data):
  options = data.draw(_options(initial_loss_scale), label="options")
  ls = loss_scale.DynamicLossScale(initial_loss_scale, increment_period, multiplier, **options)
  model = ScaleModel(
    initial_loss_scale,
    increment_period,
    multiplier,
    min_scale=options.get("min_loss_scale", 1.0),
    max_scale=options.get("max_loss_scale", INF),
    hysteresis=options.get("hysteresis", 1),
  )
  for kind in steps:
    _, should_apply = ls.update(_step_grads(kind))
    model.step(kind == "finite")
    assert bool(should_apply) is (kind == "finite")
    assert ls().numpy() == model.scale
    assert ls._num_good_steps.numpy() == model.counter
    assert ls.skipped_steps.numpy() == model.skipped


@SETTINGS
@hypothesis.given(**state_machine_args)
def test_update_matches_tf_dynamic_loss_scale(
  initial_loss_scale, increment_period, multiplier, steps
):
  ours = loss_scale.DynamicLossScale(initial_loss_scale, increment_period, multiplier)
  theirs = tf.compat.v1.mixed_precision.DynamicLossScale(
    initial_loss_scale, increment_period, multiplier
  )
  for kind in steps:
    _, our_apply = ours.update(_step_grads(kind))
    _, their_apply = theirs.update(_step_grads(kind))
    assert bool(our_apply) is bool(their_apply)
    assert ours().numpy() == theirs().numpy()
    assert ours._num_good_steps.numpy() == theirs._num_good_steps.numpy()


# --- Under a tf.distribute strategy ------------------------------------------


def _last_replica(strategy):
  # Replica 0 stays finite: its decision alone would be wrong.
  return strategy.num_replicas_in_sync - 1


def test_variables_are_mirrored_non_trainable_and_unaggregated():
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    ls = loss_scale.DynamicLossScale()
  for var in (ls._current_loss_scale, ls._num_good_steps, ls.skipped_steps):
    assert isinstance(var, tf_values.MirroredVariable)
    assert not var.trainable
    assert var.aggregation == tf.VariableAggregation.NONE
    assert len(var.values) == 2


def test_nan_on_one_replica_makes_every_replica_skip_and_halves_scale_once(strategy, mode):
  with strategy.scope():
    ls = loss_scale.DynamicLossScale(initial_loss_scale=8, increment_period=3)

  @mode
  def step(bad_replica):
    def replica_fn():
      grad = helpers.replica_nan([1.0, 2.0], bad_replica)
      should_apply = tf.distribute.get_replica_context().merge_call(
        lambda _, g: ls.update([g, None])[1], args=(grad,)
      )
      return tf.identity(should_apply)  # This replica's copy of the decision.

    return strategy.run(replica_fn)

  assert [bool(x) for x in strategy.experimental_local_results(step(-1))] == [True] * (
    strategy.num_replicas_in_sync
  )
  assert (ls().numpy(), ls._num_good_steps.numpy()) == (8.0, 1)

  should_apply = step(_last_replica(strategy))
  assert [bool(x) for x in strategy.experimental_local_results(should_apply)] == [False] * (
    strategy.num_replicas_in_sync
  )
  for var, expected in (
    (ls._current_loss_scale, 4.0),
    (ls._num_good_steps, 0),
    (ls.skipped_steps, 1),
  ):
    assert [x.numpy() for x in strategy.experimental_local_results(var)] == [expected] * (
      strategy.num_replicas_in_sync
    )


@pytest.mark.parametrize(
  "bad_replica, expected", [(None, True), (0, False), ("last", False)], ids=str
)
@pytest.mark.parametrize("grads_in_sync", [True, False])
def test_replicas_all_finite_decides_once_for_all_replicas(
  strategy, mode, grads_in_sync, bad_replica, expected
):
  if bad_replica == "last" and strategy.num_replicas_in_sync == 1:
    pytest.skip("one replica: the last is replica 0, the case before")
  bad_replica = {None: -1, 0: 0, "last": _last_replica(strategy)}[bad_replica]

  @mode
  def step():
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      grad = helpers.replica_nan([1.0, 1e30], bad_replica)
      if grads_in_sync:
        grad = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grad)
      finite = ctx.merge_call(
        lambda _, g: algorithm.replicas_all_finite([g, None], grads_in_sync),
        args=(grad,),
      )
      return tf.identity(finite)  # This replica's copy of the decision.

    return strategy.run(replica_fn)

  results = [bool(x) for x in strategy.experimental_local_results(step())]
  assert results == [expected] * strategy.num_replicas_in_sync


def test_an_in_sync_decision_is_replica_0s_check_run_on_its_device(mode, monkeypatch):
  # Replica 0 on the second CPU, so that a check left on the default device shows.
  strategy = helpers._OwnKeysMirroredStrategy(["/cpu:1", "/cpu:0"])
  seen = []

  def check(grads):
    seen.append((grads[0].device, tf.constant(0.0).device))
    return algorithm.all_finite(grads)

  def decide(strategy, grad):
    # Eagerly, `call_for_each_replica` runs a thread per replica: not needed here.
    with monkeypatch.context() as patch:
      patch.setattr(strategy.extended, "call_for_each_replica", None)
      return algorithm.replicas_all_finite([grad], True, check=check)

  @mode
  def step():
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      grad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, helpers.replica_nan([1.0], -1))
      return tf.identity(ctx.merge_call(decide, args=(grad,)))

    return strategy.run(replica_fn)

  assert [bool(x) for x in strategy.experimental_local_results(step())] == [True, True]
  assert strategy.extended.worker_devices[0].endswith("CPU:1")
  assert len(seen) == 1
  for device in seen[0]:
    assert device.endswith("CPU:1"), seen


UPDATES = {"plain": algorithm.update_scale_variables, "fast": fast_paths.update_scale_variables}


@pytest.mark.parametrize("update", list(UPDATES))
@pytest.mark.parametrize("grads_in_sync", [True, False])
def test_update_scale_variables_assigns_once_and_returns_decision(mode, grads_in_sync, update):
  scale = tf.Variable(8.0)
  counter = tf.Variable(1, dtype=tf.int64)
  skipped = tf.Variable(0, dtype=tf.int64)
  settings = algorithm.ScaleSettings(growth_steps=2)

  @mode
  def step(grad):
    return UPDATES[update](
      scale,
      counter,
      {"a": [grad, None]},
      settings,
      grads_in_sync=grads_in_sync,
      skipped_var=skipped,
    )[1]

  assert bool(step(tf.constant(1.0)))
  assert (float(scale), int(counter), int(skipped)) == (16.0, 0, 0)
  assert not bool(step(tf.constant(NAN)))
  assert (float(scale), int(counter), int(skipped)) == (8.0, 0, 1)
  assert not bool(step(tf.constant(INF)))
  assert (float(scale), int(counter), int(skipped)) == (4.0, 0, 2)


def _ops_added(build):
  """The types of the ops `build` adds to a TF1 graph that run when every
  gradient is finite: not those gated by a Switch's False side (the exact
  check's, which runs only when the quick one fails)."""
  graph = tf.Graph()
  with graph.as_default():
    before = len(graph.get_operations())
    build()
    added = graph.get_operations()[before:]
  gated = set()
  frontier = [c for op in added if op.type == "Switch" for c in op.outputs[0].consumers()]
  while frontier:
    op = frontier.pop()
    if op.type != "Merge" and op not in gated:
      gated.add(op)
      frontier += [c for out in op.outputs for c in out.consumers()]
      frontier += op._control_outputs  # pylint: disable=protected-access
  return [op.type for op in added if op not in gated]


@pytest.mark.parametrize("num_grads", [10, 100])
def test_all_finite_reads_same_shaped_gradients_with_one_sum(num_grads, monkeypatch):
  monkeypatch.setattr(fast_paths, "_cpu_only", lambda: True)  # On a GPU: no sums.

  def build():
    grads = [tf.compat.v1.placeholder(tf.float32, [3, 4]) for _ in range(num_grads)]
    fast_paths.all_finite(grads)

  ops = [t for t in _ops_added(build) if t != "Placeholder"]
  # Fast path: one AddN and one Sum for the group, one IsFinite on the total;
  # the element-wise check is gated by a Switch, and does not run.
  assert ops.count("Sum") == 1 and ops.count("AddN") == 1, ops
  assert ops.count("IsFinite") == 1, ops
  assert len(ops) <= 9, ops  # With the Switch, a pivot, True and the Merge.


def test_all_finite_sums_each_large_gradient_once(monkeypatch):
  monkeypatch.setattr(fast_paths, "_cpu_only", lambda: True)  # On a GPU: no sums.

  def build():
    grads = [tf.compat.v1.placeholder(tf.float32, [512, 1024 + i]) for i in range(6)]
    fast_paths.all_finite(grads)

  ops = _ops_added(build)
  assert ops.count("Sum") == 6 and ops.count("IsFinite") == 1, ops


def test_all_finite_makes_no_full_size_temporary_on_finite_steps():
  # Only gradients of at most 2**16 elements are added element-wise.
  grads = [tf.ones([1 << 17])] * 3
  concrete = tf.function(fast_paths.all_finite).get_concrete_function(grads)
  assert "AddN" not in [
    op.type for op in concrete.graph.get_operations() if op.outputs and op.outputs[0].shape.rank
  ]
