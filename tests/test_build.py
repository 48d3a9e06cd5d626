"""The Bazel BUILD file stays complete: every module and test file is declared."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _build_calls():
  """Parses BUILD (Starlark is Python syntax) into {rule: [kwargs, ...]}."""
  tree = ast.parse((ROOT / "BUILD").read_text())
  calls = {}
  for node in tree.body:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
      call = node.value
      if isinstance(call.func, ast.Name):
        kwargs = {}
        for kw in call.keywords:
          try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
          except ValueError:  # e.g. deps = [requirement("tensorflow")]
            kwargs[kw.arg] = None
        calls.setdefault(call.func.id, []).append(kwargs)
  return calls


@pytest.mark.parametrize("package", ["tf_lossscale", "tf_lossscale_upgrade"])
def test_library_lists_every_module(package):
  (library,) = [lib for lib in _build_calls()["py_library"] if lib["name"] == package]
  on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py")}
  declared = set(library["srcs"])
  assert sorted(on_disk - declared) == [], "modules missing from BUILD's py_library srcs"
  assert sorted(declared - on_disk) == [], "BUILD lists modules that do not exist"


def test_every_test_file_has_a_py_test():
  tests = _build_calls()["py_test"]
  declared = {src for t in tests for src in t["srcs"] if "/test_" in src}
  on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
  assert sorted(on_disk - declared) == [], "test files missing a py_test in BUILD"
  assert sorted(declared - on_disk) == [], "BUILD declares test files that do not exist"
  for t in tests:
    (src,) = [s for s in t["srcs"] if "/test_" in s]
    # tests/field/test_x.py is "field/test_x": unique beside tests/test_x.py.
    name = pathlib.Path(src).relative_to("tests").with_suffix("").as_posix()
    assert t["name"] == name, f"py_test {t['name']} should be named {name}, after {src}"
    assert t["args"] == [src], f"py_test {t['name']} must pass its file to the pytest runner"
