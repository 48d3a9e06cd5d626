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


def _pins(name):
  """{normalized name: version} of a pip requirements file's `name==version` lines."""
  pins = {}
  for line in (ROOT / name).read_text().splitlines():
    if line and not line.startswith("#"):
      package, version = line.split("==")
      pins[_normalized(package)] = version
  return pins


def _normalized(name):
  return name.lower().replace("_", "-").replace(".", "-")


def test_the_bazel_lock_pins_the_direct_dependencies():
  locked = _pins("requirements.txt")
  for package, version in _pins("requirements.in").items():
    assert locked.get(package) == version, f"requirements.txt must pin {package}=={version}"


# Where the lock is for (MODULE.bazel's toolchain), whatever runs the test.
_LOCK_ENVIRONMENT = {
  "extra": "",
  "python_version": "3.11",
  "python_full_version": "3.11.0",
  "implementation_name": "cpython",
  "platform_python_implementation": "CPython",
  "os_name": "posix",
  "sys_platform": "linux",
  "platform_system": "Linux",
  "platform_machine": "x86_64",
}


def test_the_bazel_lock_is_closed_under_the_installed_packages_requirements():
  """rules_python installs the lock without resolving it: a package it needs
  and the lock lacks is missing at run time. Checked with the metadata of the
  packages installed here at the lock's versions."""
  metadata = pytest.importorskip("importlib.metadata")
  requirements = pytest.importorskip("packaging.requirements")
  locked = _pins("requirements.txt")
  checked = 0
  for package, version in locked.items():
    try:
      distribution = metadata.distribution(package)
    except metadata.PackageNotFoundError:
      continue
    if distribution.version != version:
      continue
    checked += 1
    for text in distribution.requires or ():
      requirement = requirements.Requirement(text)
      if requirement.marker is None or requirement.marker.evaluate(_LOCK_ENVIRONMENT):
        name = _normalized(requirement.name)
        assert name in locked, (
          f"{package}=={version} requires {requirement.name}, which requirements.txt lacks"
        )
        assert requirement.specifier.contains(locked[name], prereleases=True), (
          f"{package}=={version} requires {text}; requirements.txt pins {locked[name]}"
        )
  if checked == 0:
    pytest.skip("no package is installed here at the lock's version")
