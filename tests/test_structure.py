"""The package's structure: imports run one way, other packages' internals stay in
`framework_internals.py`, and the inner-optimizer family contract is enforced."""

import ast
import pathlib

import pytest

from tf_lossscale._src import families

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tf_lossscale"

# Lower layers never import higher ones (namespaces -> callbacks -> optimizers ->
# families -> scale state -> algorithm). Every module must be in one layer.
LAYERS = [
  (
    "algorithm",
    ["_src", "_src.framework_internals", "_src.algorithm", "_src.fast_paths", "_src.validation"],
  ),
  ("scale state", ["_src.scale_state", "_src.loss_scale"]),
  ("families", ["_src.families"]),
  ("optimizers", ["_src.keras_optimizer", "_src.keras_experimental", "_src.compat_v1_optimizer"]),
  ("callbacks", ["_src.keras_callbacks"]),
  ("policies, graph rewrite", ["_src.keras_policy", "_src.graph_rewrite"]),
  ("namespaces", ["", "loss_scale", "keras", "compat", "mixed_precision", "upgrade"]),
]


def _module_name(path):
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _layer(module):
  relative = module.removeprefix("tf_lossscale").removeprefix(".")
  best = None
  for rank, (_, prefixes) in enumerate(LAYERS):
    for prefix in prefixes:
      if relative == prefix or relative.startswith(prefix + ".") or (prefix == "" and not relative):
        if best is None or len(prefix) > best[1]:
          best = (rank, len(prefix))
  assert best is not None, f"{module} is in no layer of LAYERS: add it"
  return best[0]


def _imports(path, top_level_only=True):
  """The tf_lossscale modules `path` imports (`from a import b` counts a.b if
  that is a module)."""
  tree = ast.parse(path.read_text())
  nodes = tree.body if top_level_only else list(ast.walk(tree))
  found = set()
  for node in nodes:
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      submodules = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
      # `from package import module` imports the module; the package is its parent.
      found |= submodules if len(submodules) == len(node.names) else {node.module}
  return {m for m in found if m in MODULES}


def test_no_import_cycle_among_modules():
  graph = {m: _imports(p) for m, p in MODULES.items()}
  state = {}

  def visit(module, path):
    if state.get(module) == "done":
      return
    assert state.get(module) != "open", f"import cycle: {' -> '.join(path + [module])}"
    state[module] = "open"
    for imported in graph[module]:
      visit(imported, path + [module])
    state[module] = "done"

  for module in graph:
    visit(module, [])


def test_imports_run_from_namespaces_down_to_the_algorithm():
  upward = [(m, i) for m, p in MODULES.items() for i in _imports(p) if _layer(i) > _layer(m)]
  assert upward == []


def test_no_import_inside_a_function_but_optional_tf_keras():
  for module, path in MODULES.items():
    tree = ast.parse(path.read_text())
    nested = [
      n
      for f in ast.walk(tree)
      if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
      for n in ast.walk(f)
      if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    for node in nested:
      names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
      assert any(n.startswith("tf_keras") for n in names), (module, ast.unparse(node))


def _uses_internals(path):
  """Whether a module imports TF's/Keras's/tf_keras's non-public modules or reaches
  into `tf.__internal__` or `_call_flat` (names in strings, e.g. the migration
  tool's table of TF's old module names, are not uses)."""
  private = ("tensorflow.python", "tensorflow.core", "keras.src", "tf_keras.src")
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import) and any(a.name.startswith(private) for a in node.names):
      return True
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(private):
      return True
    if isinstance(node, ast.Attribute) and node.attr in ("__internal__", "_call_flat"):
      return True
  return False


def test_other_packages_internals_only_in_framework_internals():
  users = sorted(m for m, p in MODULES.items() if _uses_internals(p))
  assert users == ["tf_lossscale._src.framework_internals"]


def test_a_family_missing_a_hook_fails_when_it_is_defined():
  with pytest.raises(TypeError, match=r"HalfAFamily must implement \['accepts', 'apply', 'build',"):

    class HalfAFamily(families.Family):  # noqa: F841
      optimizer_api = object

      def count_skipped_step(self):
        pass


def test_a_family_without_its_optimizer_api_fails_when_it_is_defined():
  complete = {name: lambda *a: None for name in families.Family.__abstractmethods__}
  with pytest.raises(TypeError, match="set optimizer_api"):
    type("NoApi", (families.Family,), complete)


def test_the_migration_tool_imports_neither_tensorflow_nor_the_library():
  # tf_lossscale_upgrade rewrites text: it must start without TensorFlow's import cost.
  heavy = ("tensorflow", "keras", "tf_keras", "tf_lossscale")
  found = []
  for path in sorted((ROOT / "tf_lossscale_upgrade").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module or ""]
      else:
        continue
      found += [(path.name, n) for n in names if n.split(".")[0] in heavy]
  assert found == []
