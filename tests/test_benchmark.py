"""Tests of `scripts/benchmark.py`, and of the finiteness semantics it must not trade away.

The smoke test runs a tiny benchmark in-process and checks the structure of its
JSON and markdown output (not its numbers). The `all_finite` cases pin the
behaviours of TF 2.4's check that a faster one (sums instead of element-wise
`is_finite`, gradients grouped by shape) could silently lose.
"""

import argparse
import io
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

import helpers

_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "benchmark.py"


@pytest.fixture(scope="module")
def benchmark():
  return helpers.load_script("benchmark")


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
      "--optimizer=sgd,momentum,adam",
      "--first-calls=2",
      "--no-processes",  # a new process per mode and optimizer: TensorFlow imported six times
    ],
    out=out,
  )
  data = json.loads(path.read_text())
  assert set(data["meta"]) >= {"date", "versions", "args", "memory", "workloads"}
  rows = {(r["optimizer"], r["mode"], r["family"], r["impl"]): r for r in data["results"]}
  expected = set()
  for o in benchmark.OPTIMIZERS:
    expected |= {(o, "eager", f, i) for f in benchmark.FAMILIES for i in benchmark.IMPLS}
    # TF1 Sessions: v1 optimizers only.
    expected |= {(o, "graph", "v1", i) for i in benchmark.IMPLS}
  assert set(rows) == expected
  for key, row in rows.items():
    assert row["workload"] == "tiny"
    assert row["status"] in ("ok", "n/a", "fail"), key
    if row["status"] == "ok":
      assert len(row["wall_ms"]) == len(row["cpu_ms"]) == 2, key
      assert row["median_ms"] > 0 and row["first_call_s"] > 0, key
      assert len(row["first_calls_s"]) == 2, key
      assert row["first_call_s"] == pytest.approx(sum(row["first_calls_s"]) / 2), key
      # Counted in functions and TF1 graphs, where an executor runs the ops.
      assert (row["ops"] is None) == (row["mode"] == "eager"), key
      assert row["ops"] is None or row["ops"] > 0, key
    else:
      assert row["reason"] and row["median_ms"] is None, key
  assert all(row["status"] == "ok" for row in rows.values()), rows  # Floors eagerly too.

  text = out.getvalue()
  assert "| workload · optimizer · mode | Keras 3 LSO | ours (keras3) |" in text
  for o in benchmark.OPTIMIZERS:
    for mode in ("eager", "graph"):
      assert f"| tiny · {o} · {mode} |" in text
    assert f"| tiny · {o} · graph · v1 |" in text
    assert f"| tiny · {o} · graph · keras3 |" not in text

  # The tables can be printed again from the JSON alone.
  again = io.StringIO()
  benchmark.main([f"--from-json={path}"], out=again)
  assert again.getvalue() == text


def test_fit_run_compares_ours_with_each_framework_s_own_wrapping(benchmark, tmp_path):
  out = io.StringIO()
  path = tmp_path / "fit.json"
  argv = ["--workloads=", "--modes=", "--fit=tinyfit", "--rounds=2", "--first-epochs=2"]
  argv.append(f"--json={path}")
  benchmark.main(argv, out=out)
  rows = {(r["family"], r["impl"]): r for r in json.loads(path.read_text())["results"]}
  assert set(rows) == {(f, i) for f in benchmark.FIT_FAMILIES for i in ("peer", "ours")}
  for key, row in rows.items():
    assert row["status"] == "ok", (key, row["reason"])
    assert (row["mode"], row["optimizer"]) == ("fit", "adam")
    assert len(row["wall_ms"]) == 2 and row["first_call_s"] > 0, key
    # Each first epoch on a new model; the median is the one reported.
    assert len(row["first_calls_s"]) == 2, key
    assert row["first_call_s"] == pytest.approx(sum(row["first_calls_s"]) / 2), key
  text = out.getvalue()
  assert "| tinyfit · adam · keras3 |" in text and "| tinyfit · adam · tf_keras |" in text
  assert "Step time of each LSO" not in text  # No step workload ran.
  again = io.StringIO()
  benchmark.main([f"--from-json={path}"], out=again)
  assert again.getvalue() == text


@pytest.mark.parametrize("family", ["keras3", "tf_keras"])
@pytest.mark.parametrize("impl", ["peer", "ours"])
def test_fit_models_are_mixed_float16_with_the_expected_wrapper(benchmark, family, impl):
  workload = benchmark.FIT_WORKLOADS["tinyfit"]
  model = benchmark.compiled_fit_model(family, impl, "adam", 0.01, workload)
  module = type(model.optimizer).__module__
  assert module.startswith("tf_lossscale") == (impl == "ours"), module
  assert "LossScaleOptimizer" in type(model.optimizer).__name__
  assert model.layers[1].compute_dtype == "float16"
  assert model.layers[-1].compute_dtype == "float32"  # The logits.
  framework = benchmark._fit_framework(family)  # pylint: disable=protected-access
  assert framework.mixed_precision.global_policy().name == "float32"  # Restored.


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


def test_fit_runs_by_default_only_in_the_full_matrix(benchmark):
  assert benchmark.parse_args([]).fit == ["resnet", "transformer"]
  assert benchmark.parse_args(["--quick"]).fit == []
  assert benchmark.parse_args(["--workloads=mlp1m"]).fit == []
  assert benchmark.parse_args(["--modes=xla", "--fit=resnet"]).fit == ["resnet"]


def test_momentum_and_adam_are_the_default_inner_optimizers(benchmark, capsys):
  assert benchmark.parse_args([]).optimizer == ["momentum", "adam"]
  assert benchmark.parse_args(["--optimizer=sgd"]).optimizer == ["sgd"]
  with pytest.raises(SystemExit):
    benchmark.parse_args(["--optimizer=rmsprop"])
  assert "momentum" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["keras3", "tf_keras", "v1"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_inner_optimizers_are_the_named_kind(benchmark, family, optimizer):
  inner = benchmark._inner(family, optimizer, 0.5)  # pylint: disable=protected-access
  name = type(inner).__name__
  if family == "v1":
    expected = {
      "sgd": "GradientDescentOptimizer",
      "momentum": "MomentumOptimizer",
      "adam": "AdamOptimizer",
    }
    assert name == expected[optimizer]
    return
  assert name == ("Adam" if optimizer == "adam" else "SGD")
  if optimizer != "adam":
    momentum = inner.momentum
    momentum = float(momentum.numpy() if hasattr(momentum, "numpy") else momentum)
    assert momentum == pytest.approx(0.9 if optimizer == "momentum" else 0.0)


@pytest.mark.parametrize("impl", ["floor", "gated"])
def test_the_xla_floors_keep_their_finiteness_check(benchmark, impl):
  # XLA compiles away what only a control dependency waits for: the floor's
  # apply must use the check's verdict (floor+cond's conditional does), or it
  # measures a step without one.
  import tensorflow as tf

  variables, loss_fn = benchmark.WORKLOADS["tiny"].build()
  opt = benchmark._make_optimizer("keras3", impl, "sgd", 0.5)  # pylint: disable=protected-access
  opt.build(variables)
  step = tf.function(
    benchmark._make_step("keras3", impl, opt, variables, loss_fn),  # pylint: disable=protected-access
    jit_compile=True,
  )
  hlo = step.experimental_get_compiler_ir()(stage="optimized_hlo")
  assert "is-finite" in hlo


_TEN = [10.0] * 9


@pytest.mark.parametrize(
  "ours, expected",
  [
    ([9.0, 10.0, 11.0, 10.0, 9.5, 10.0, 10.2, 9.8, 10.0], ("1.00 (0.95–1.02)", "yes")),
    # Ours above the peer in 7 of 9 rounds: the 95% interval of the median
    # reaches 1 (two equal implementations do this in 9% of rows), noise.
    ([9.9, 10.0, 10.3, 10.4, 10.5, 10.6, 10.7, 10.8, 10.9], ("1.05 (1.00–1.08)", "noise")),
    # In 8 of 9: slower beyond the noise (2% of rows for equal ones).
    ([9.9, 10.2, 10.3, 10.4, 10.5, 10.6, 10.7, 10.8, 10.9], ("1.05 (1.02–1.08)", "no")),
  ],
)
def test_ours_against_the_peer_is_judged_round_by_round(benchmark, ours, expected):
  def config(times):
    return benchmark.Config("w", "function", "keras3", "ours", wall_ms=times, cpu_ms=times)

  assert benchmark._against_peer(config(ours), config(_TEN)) == expected  # pylint: disable=protected-access


@pytest.mark.parametrize(
  # The order statistics of the usual tables of 95% intervals for a median.
  "n, ranks",
  [(5, (1, 5)), (6, (1, 6)), (9, (2, 8)), (15, (4, 12)), (20, (6, 15)), (30, (10, 21))],
)
def test_the_interval_of_the_median_is_the_textbook_one(benchmark, n, ranks):
  values = [float(i) for i in range(n, 0, -1)]
  assert benchmark._median_interval(values) == ranks  # pylint: disable=protected-access


def test_each_mode_is_warmed_up_before_anything_is_measured(benchmark, monkeypatch):
  # A process's first trace pays for one-time setup: measured, it would make
  # the first configuration's first call look slow.
  calls = []
  real = benchmark.run_workload_mode

  def recording(workload, mode, optimizer, args, log):
    calls.append((workload.name, mode, args.rounds))
    return real(workload, mode, optimizer, args, log)

  monkeypatch.setattr(benchmark, "run_workload_mode", recording)
  argv = [
    "--workloads=tiny",
    "--modes=eager,graph",
    "--rounds=2",
    "--block-seconds=0",
    "--no-processes",
  ]
  results = benchmark.main([*argv, "--optimizer=sgd", "--families=v1"], out=io.StringIO())
  assert calls == [
    ("tiny", "eager", 1),
    ("tiny", "graph", 1),
    ("tiny", "eager", 2),
    ("tiny", "graph", 2),
  ]
  assert len(results["results"]) == 2 * len(benchmark.IMPLS)  # The warm-up is not reported.


def test_first_calls_are_taken_on_new_optimizers_in_alternating_order(benchmark, monkeypatch):
  # One first call per configuration, always in the same order, moved by what
  # ran before it; the median of several, alternating, is what is reported.
  prepared = []
  real = benchmark._prepare_graph  # pylint: disable=protected-access

  def recording(cfg, args, workload):
    real(cfg, args, workload)
    prepared.append((cfg.impl, cfg.run))

  monkeypatch.setattr(benchmark, "_prepare_graph", recording)
  args = benchmark.parse_args(
    ["--workloads=tiny", "--modes=graph", "--optimizer=sgd", "--first-calls=3"]
  )
  args.rounds, args.block_seconds = 1, 0
  configs = benchmark.run_workload_mode(
    benchmark.WORKLOADS["tiny"], "graph", "sgd", args, lambda msg: None
  )
  impls = list(benchmark.IMPLS)
  assert [impl for impl, _ in prepared] == impls + impls[::-1] + impls
  assert len({id(run) for _, run in prepared}) == len(prepared)  # A new one each time.
  for cfg in configs:
    assert cfg.status == "ok", cfg.reason
    assert len(cfg.first_calls_s) == 3
    assert cfg.first_call_s == sorted(cfg.first_calls_s)[1]


def test_the_first_call_ratio_shows_each_repeat(benchmark):
  def config(impl, firsts):
    cfg = benchmark.Config("w", "xla", "keras3", impl, first_calls_s=firsts)
    cfg.first_call_s = sorted(firsts)[1]
    return cfg

  ours, plain = config("ours", [1.3, 2.6, 1.2]), config("plain", [1.0, 2.0, 1.0])
  assert benchmark._first_call_ratio(ours, plain) == "1.30x (1.30, 1.30, 1.20)"  # pylint: disable=protected-access
  plain.status = "fail"
  assert benchmark._first_call_ratio(ours, plain) == "-"  # pylint: disable=protected-access


def test_the_detail_table_shows_the_floor_s_first_call_beside_plain_and_ours(benchmark):
  # The floor (the check alone, its verdict used as data) bounds what any exact
  # skip adds to a first call: the table shows it and its ratio to plain.
  configs = []
  for impl, firsts in zip(
    benchmark.IMPLS,
    ([1.0, 2.0, 1.0], [1.5, 3.0, 1.4], [1.6, 3.2, 1.6], [2.0, 4.0, 2.0], [1.8, 3.6, 1.7]),
    strict=True,
  ):
    cfg = benchmark.Config("w", "xla", "keras3", impl, optimizer="adam", first_calls_s=firsts)
    cfg.first_call_s = sorted(firsts)[1]
    cfg.wall_ms = [3.0, 3.0]
    configs.append(cfg)
  table = benchmark.detail_table(configs, ["keras3"], "RSS", benchmark.Notes())
  head, _, row = table.splitlines()
  cells = dict(zip(head.split(" | "), row.split(" | "), strict=True))
  assert cells["first call s (plain/floor/floor+cond/peer/ours)"] == "1.00/1.50/1.60/2.00/1.80"
  assert cells["first call ours/plain (each)"] == "1.80x (1.80, 1.80, 1.70)"
  assert cells["first call floor/plain (each)"] == "1.50x (1.50, 1.50, 1.40)"


def test_xla_first_calls_stop_short_of_the_process_s_memory_map_limit(benchmark, monkeypatch):
  # XLA keeps every compiled function; past vm.max_map_count the next
  # compilation crashes the process. Near it, a configuration is n/a instead.
  assert benchmark._maps_left() > 0  # pylint: disable=protected-access
  monkeypatch.setattr(benchmark, "_maps_left", lambda: 100)
  args = benchmark.parse_args(["--workloads=tiny", "--modes=xla", "--optimizer=sgd"])
  args.rounds, args.block_seconds = 1, 0
  configs = benchmark.run_workload_mode(
    benchmark.WORKLOADS["tiny"], "xla", "sgd", args, lambda msg: None
  )
  for cfg in configs:
    assert cfg.status == "n/a" and "100 memory maps left" in cfg.reason, cfg.reason
    assert "fewer workloads, families or optimizers per process" in cfg.reason


def test_runs_split_over_processes_print_as_one(benchmark, tmp_path):
  paths = []
  for family in ("keras3", "v1"):
    paths.append(tmp_path / f"{family}.json")
    argv = ["--workloads=tiny", "--modes=eager", "--rounds=1", "--block-seconds=0"]
    argv += ["--optimizer=sgd", f"--families={family}", "--first-calls=1", "--no-processes"]
    argv += [f"--json={paths[-1]}"]
    benchmark.main(argv, out=io.StringIO())
  out = io.StringIO()
  merged = benchmark.main([f"--from-json={paths[0]},{paths[1]}"], out=out)
  runs = [json.loads(p.read_text()) for p in paths]
  assert merged["results"] == runs[0]["results"] + runs[1]["results"]
  assert merged["meta"]["seconds"] == pytest.approx(
    sum(r["meta"]["seconds"] for r in runs), abs=0.1
  )
  text = out.getvalue()
  assert "| tiny · sgd · eager · keras3 |" in text and "| tiny · sgd · eager · v1 |" in text


def test_rows_run_in_a_process_per_mode_and_under_xla_per_family(
  benchmark, tmp_path, monkeypatch, capfd
):
  children = []
  real = benchmark.subprocess.run

  def recording(argv, **kwargs):
    children.append(argv)
    return real(argv, **kwargs)

  monkeypatch.setattr(benchmark.subprocess, "run", recording)
  argv = ["--workloads=tiny", "--modes=xla,graph", "--optimizer=sgd", "--families=keras3,v1"]
  argv += ["--rounds=1", "--block-seconds=0", "--first-calls=1", f"--json={tmp_path / 'x.json'}"]
  results = benchmark.main(argv, out=io.StringIO())
  assert [[a for a in c if a.startswith(("--families", "--modes"))] for c in children] == [
    ["--modes=xla", "--families=keras3"],
    ["--modes=xla", "--families=v1"],
    ["--modes=graph", "--families=keras3,v1"],
  ]
  assert all("--no-processes" in c for c in children)
  # Each row's header once, from the parent, not again from its processes.
  logged = capfd.readouterr().err.splitlines()
  assert [line for line in logged if " · sgd · " in line] == [
    "tiny · sgd · xla",
    "tiny · sgd · graph",
  ]
  rows = {(r["mode"], r["family"], r["impl"]): r for r in results["results"]}
  expected = {("xla", f, i) for f in ("keras3", "v1") for i in benchmark.IMPLS}
  assert set(rows) == expected | {("graph", "v1", i) for i in benchmark.IMPLS}
  for key, row in rows.items():
    assert row["status"] == "ok" and len(row["wall_ms"]) == 1, key


def test_a_child_that_dies_is_reported_not_fatal(benchmark, monkeypatch):
  monkeypatch.setattr(
    benchmark.subprocess, "run", lambda argv, **kwargs: argparse.Namespace(returncode=-11)
  )
  args = benchmark.parse_args(["--workloads=tiny", "--modes=xla", "--optimizer=sgd"])
  configs = benchmark.run_in_child("tiny", "graph", "sgd", "keras3,v1", args, lambda msg: None)
  assert [(c.family, c.impl) for c in configs] == [("v1", i) for i in benchmark.IMPLS]
  for cfg in configs:
    assert cfg.status == "fail" and cfg.reason == "RuntimeError: its process exited with status -11"


def test_quick_takes_one_first_call_in_one_process(benchmark):
  quick, full = benchmark.parse_args(["--quick"]), benchmark.parse_args([])
  assert (quick.first_calls, quick.processes) == (1, False)
  assert (full.first_calls, full.processes) == (3, True)
  assert benchmark.parse_args(["--quick", "--processes"]).processes is True


_PEAK_OF_64_MIB = f"""
import importlib.util
import tensorflow as tf
spec = importlib.util.spec_from_file_location("benchmark", {str(_SCRIPT)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
memory = module.PeakMemory()
memory.start()
x = tf.zeros([16, 2**20])  # 64 MiB, alive until the peak is read
print(memory.kind, "|", memory.stop())
"""


@pytest.mark.parametrize("bfc, kind", [("true", "CPU allocator peak"), ("false", "RSS high-water")])
def test_peak_memory_reads_the_cpu_allocator_where_it_keeps_statistics(bfc, kind):
  env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": bfc, "CUDA_VISIBLE_DEVICES": ""}
  child = subprocess.run(
    [sys.executable, "-c", _PEAK_OF_64_MIB], capture_output=True, text=True, env=env, check=True
  )
  reported_kind, peak = child.stdout.strip().splitlines()[-1].split(" | ")
  assert reported_kind == kind
  if bfc == "true":  # the allocator's count: the tensor and no more than rounding
    assert 64 <= float(peak) < 65
  else:  # pages touched: the tensor, give or take what the allocator kept
    assert float(peak) > 32


def test_each_block_ends_when_the_device_has_run_its_steps(benchmark):
  # A GPU runs behind the host: a block timed without waiting for it leaves its
  # last steps out (an H100 ran `mlp16m` 15% slower than the host queued it).
  events = []

  def wait():
    events.append("wait")
    time.sleep(0.03)

  cfg = benchmark.Config("tiny", "function", "keras3", "ours", run=lambda: events.append("step"))
  cfg.wait, cfg.steps_per_block = wait, 3
  benchmark._measure([cfg], argparse.Namespace(rounds=2))  # pylint: disable=protected-access
  assert events == (["step"] * 3 + ["wait"]) * 2
  assert min(cfg.wall_ms) >= 10  # The wait is in the time per step.


def test_steps_wait_on_a_variable_the_step_updates(benchmark):
  args = benchmark.parse_args(["--workloads=tiny", "--modes=function", "--optimizer=sgd"])
  variables, loss_fn = benchmark.WORKLOADS["tiny"].build()
  cfg = benchmark.Config("tiny", "function", "keras3", "ours", optimizer="sgd")
  benchmark._prepare(cfg, args, variables, loss_fn)  # pylint: disable=protected-access
  before = variables[-1].numpy().copy()
  cfg.steps(2)
  assert not (cfg.wait() == before).all()
  assert (cfg.wait() == variables[-1].numpy()).all()
  assert "wait" not in cfg.to_json()


def test_ops_counted_on_the_host_and_on_a_gpu(benchmark):
  """A trace laid out as a GPU's (seen on an H200, TF 2.21): the host's events of
  ops run on the GPU name kernels, not ops, so the GPU's stream lines count them."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2

  def plane(name, lines):
    p = xplane_pb2.XPlane(name=name)
    for i, (line_name, events) in enumerate(lines):
      line = p.lines.add(id=i, name=line_name)
      for event in events:
        meta = len(p.event_metadata) + 1
        p.event_metadata[meta].name = event
        line.events.add(metadata_id=meta)
    return p

  host_ops = ["mul:Mul", "cond:If", "ThreadpoolListener::StartRegion", "MemoryAllocation"]
  launches = ["Mul_GPU_DT_FLOAT_DT_FLOAT_kernel", "void cutlass::Kernel2<a>(b)"]
  host = plane("/host:CPU", [("tf_Compute/1", host_ops + launches), ("python3", ["x:Add"])])
  gpu = plane("/device:GPU:0", [("Stream #13(Compute)", launches), ("XLA Ops", ["fusion"])])
  count = benchmark._count_ops  # pylint: disable=protected-access
  assert count(xplane_pb2.XSpace(planes=[host])) == 2
  assert count(xplane_pb2.XSpace(planes=[host, gpu])) == 4
  assert count(xplane_pb2.XSpace(planes=[plane("/host:CPU", [("python3", ["x:Add"])])])) is None


@pytest.mark.parametrize("family", ["keras3", "tf_keras", "v1"])
def test_ops_run_per_step_count_what_a_step_runs(benchmark, family, monkeypatch):
  """The executor's ops one step runs (on a GPU each a kernel launch): a
  step of ours runs its state's transition for its own verdict in the
  branch taken (`fast_paths._state_in_branches`), at least 14 ops fewer than
  the transition for either verdict after the conditional did (the plain
  algorithm's, which makes no bound op for an unbounded scale)."""
  from tf_lossscale._src import fast_paths

  args = benchmark.parse_args(["--workloads=tiny", "--modes=function", "--optimizer=momentum"])

  def ops(impl):
    variables, loss_fn = benchmark.WORKLOADS["tiny"].build()
    cfg = benchmark.Config("tiny", "function", family, impl, optimizer="momentum")
    benchmark._prepare(cfg, args, variables, loss_fn)  # pylint: disable=protected-access
    cfg.steps(2)
    return benchmark._ops_run(cfg.steps)  # pylint: disable=protected-access

  plain, gated, ours = ops("plain"), ops("gated"), ops("ours")
  assert 0 < plain < gated < ours  # floor+cond adds the check, ours the scale
  if fast_paths.enabled():
    monkeypatch.setattr(fast_paths, "_state_in_branches", lambda: False)
    assert ops("ours") >= ours + 14
