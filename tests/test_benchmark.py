"""Tests of `scripts/benchmark.py`, and of the finiteness semantics it must not trade away.

The smoke test runs a tiny benchmark in-process and checks the structure of its
JSON and markdown output (not its numbers). The `all_finite` cases pin the
behaviours of TF 2.4's check that a faster one (sums instead of element-wise
`is_finite`, gradients grouped by shape) could silently lose.
"""

import importlib.util
import io
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tf_lossscale._src import dynamic_scale

_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "benchmark.py"


@pytest.fixture(scope="module")
def benchmark():
  spec = importlib.util.spec_from_file_location("benchmark", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_tiny_run_reports_every_config_in_json_and_markdown(benchmark, tmp_path):
  out = io.StringIO()
  path = tmp_path / "bench.json"
  benchmark.main(
    [
      "--workloads=tiny",
      "--modes=eager,graph",  # no tracing: a few seconds
      "--rounds=2",
      "--block-seconds=0",
      f"--json={path}",
    ],
    out=out,
  )
  data = json.loads(path.read_text())
  assert set(data["meta"]) >= {"date", "versions", "args", "memory", "workloads"}
  rows = {(r["mode"], r["family"], r["impl"]): r for r in data["results"]}
  expected = {("eager", f, i) for f in benchmark.FAMILIES for i in benchmark.IMPLS}
  expected |= {("graph", "v1", i) for i in benchmark.IMPLS}  # TF1 Sessions: v1 optimizers only
  assert set(rows) == expected
  for key, row in rows.items():
    assert row["workload"] == "tiny"
    assert row["status"] in ("ok", "n/a", "fail"), key
    if row["status"] == "ok":
      assert len(row["wall_ms"]) == len(row["cpu_ms"]) == 2, key
      assert row["median_ms"] > 0 and row["first_call_s"] > 0, key
    else:
      assert row["reason"] and row["median_ms"] is None, key
  assert all(row["status"] == "ok" for row in rows.values()), rows  # Floors eagerly too.

  text = out.getvalue()
  assert "| workload · mode | Keras 3 LSO | ours (keras3) |" in text
  for mode in ("eager", "graph"):
    assert f"| tiny · {mode} |" in text
  assert "| tiny · graph · v1 |" in text
  assert "| tiny · graph · keras3 |" not in text

  # The tables can be printed again from the JSON alone.
  again = io.StringIO()
  benchmark.main([f"--from-json={path}"], out=again)
  assert again.getvalue() == text


def _floors(floor, cond):
  return {"floor": floor, "gated": cond}


@pytest.mark.parametrize(
  "peers, ours, floors, expected",
  [
    # Overheads (ratio - 1). Best peer 0.30: the target is 0.15 for every family.
    ([0.3, 0.4], {"a": 0.15, "b": 0.1}, {"a": _floors(0.0, 0.1), "b": _floors(0.0, 0.1)}, "yes"),
    ([0.3, 0.4], {"a": 0.2, "b": 0.1}, {"a": _floors(0.0, 0.1), "b": _floors(0.0, 0.0)}, "no"),
    # The family that misses has a floor above the target: explained, by its own floor.
    (
      [0.3],
      {"a": 0.2, "b": 0.1},
      {"a": _floors(0.16, 0.2), "b": _floors(0.0, 0.0)},
      "no, floor > ½",
    ),
    (
      [0.3],
      {"a": 0.2, "b": 0.1},
      {"a": _floors(0.1, 0.18), "b": _floors(0.0, 0.0)},
      "no, floor+cond > ½",
    ),
    # Another family's high floor explains nothing.
    ([0.3], {"a": 0.2, "b": 0.1}, {"a": _floors(0.1, 0.1), "b": _floors(0.3, 0.3)}, "no"),
    ([0.3], {"a": 0.2}, {"a": _floors(None, None)}, "no"),
    ([None], {"a": 0.2}, {"a": _floors(0.0, 0.0)}, "-"),
    ([0.3], {"a": None}, {"a": _floors(0.0, 0.0)}, "-"),
  ],
)
def test_verdict_explains_a_miss_only_by_that_family_s_floors(
  benchmark, peers, ours, floors, expected
):
  assert benchmark._verdict(peers, ours, floors) == expected  # pylint: disable=protected-access


def test_unknown_workload_is_refused_with_the_allowed_names(benchmark, capsys):
  with pytest.raises(SystemExit):
    benchmark.parse_args(["--workloads=resnet"])
  assert "mlp1m" in capsys.readouterr().err


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
  "inf_in_float16_beside_float32": (
    lambda: [tf.ones([3]), tf.constant([1.0, INF], tf.float16)],
    False,
  ),
}

MODES = {
  "eager": lambda fn: fn,
  "function": tf.function,
  # XLA's algebraic simplifier must not fold a check away either.
  "xla": lambda fn: tf.function(fn, jit_compile=True),
}


@pytest.mark.parametrize("mode", [*MODES, "xla_if"])
@pytest.mark.parametrize("grads, expected", FAST_CHECK_TRAPS.values(), ids=FAST_CHECK_TRAPS)
def test_all_finite_skips_exactly_on_nan_or_inf_never_on_overflow(
  grads, expected, mode, monkeypatch
):
  if mode == "xla_if":  # Under XLA, few gradients are checked with no If: check the If too.
    monkeypatch.setattr(dynamic_scale, "_XLA_IF_FREE_UP_TO", 0)
    mode = "xla"
  grads = grads()
  assert bool(MODES[mode](lambda: dynamic_scale.all_finite(grads))()) is expected


def _fused_step(grads):
  """The scale update with the conditional apply, as the optimizers call it."""
  scale, counter = tf.Variable(8.0), tf.Variable(0, dtype=tf.int64)
  applied, skipped = tf.Variable(0), tf.Variable(0)

  def step():
    update_op, finite = dynamic_scale.update_scale_variables(
      scale,
      counter,
      grads(),
      2,
      2.0,
      apply_fn=lambda: applied.assign_add(1),
      skip_fn=lambda: skipped.assign_add(1),
    )
    return update_op, finite

  return step, (scale, counter, applied, skipped)


@pytest.mark.parametrize("mode", ["function", "xla", "xla_if", "graph"])
@pytest.mark.parametrize("grads, expected", FAST_CHECK_TRAPS.values(), ids=FAST_CHECK_TRAPS)
def test_check_fused_with_the_apply_decides_exactly_too(grads, expected, mode, monkeypatch):
  # In a function (not XLA's) the check and the conditional apply share one If op, with
  # the exact check nested in its skip branch; in a TF1 graph each is gated by a Switch;
  # under XLA few gradients are checked with no If: the same traps must hold everywhere.
  if mode == "xla_if":
    monkeypatch.setattr(dynamic_scale, "_XLA_IF_FREE_UP_TO", 0)
    mode = "xla"
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
