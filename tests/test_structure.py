"""The package's structure: imports run one way, other packages' internals stay in
`framework_internals.py`, and the inner-optimizer family contract is enforced."""

import ast
import pathlib
import pickle
import sys
import types

import keras
import numpy as np
import pytest

import helpers
from tf_lossscale._src import families, framework_internals

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


def _private_names_defined(trees):
  """Underscored names our package defines: functions, classes, attributes set."""
  names = set()
  for tree in trees:
    for node in ast.walk(tree):
      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        names.add(node.name)
      elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        names.add(node.attr)
      elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        names.add(node.id)
      elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        names.add(node.value)  # `object.__setattr__(self, "_x", ...)`, `getattr(self, "_x")`
  return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _inherited_private_calls(tree, ours):
  """`self._x(...)` of an `_x` the package never defines (a base class's, from
  TensorFlow or Keras), and `super()._x(...)` outside an override of `_x`."""
  found = []
  for function in ast.walk(tree):
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
      continue
    for node in ast.walk(function):
      if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        continue
      attr, owner = node.func.attr, node.func.value
      if not attr.startswith("_") or attr.startswith("__"):
        continue
      is_super = isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super"
      if is_super and attr != function.name:
        found.append(ast.unparse(node))
      elif isinstance(owner, ast.Name) and owner.id in ("self", "cls") and attr not in ours:
        found.append(ast.unparse(node))
  return found


def test_no_base_class_s_private_member_called_outside_framework_internals():
  """ruff's SLF001 lets `self._x()` pass: a private method inherited from a
  TensorFlow or Keras base is called through `framework_internals` too. An
  override may call the base's own (the Trackable protocol's hooks)."""
  trees = {m: ast.parse(p.read_text()) for m, p in MODULES.items()}
  ours = _private_names_defined(trees.values())
  calls = {
    m: _inherited_private_calls(tree, ours)
    for m, tree in trees.items()
    if m != "tf_lossscale._src.framework_internals"
  }
  assert {m: c for m, c in calls.items() if c} == {}


def test_a_family_missing_a_hook_fails_when_it_is_defined():
  with pytest.raises(
    TypeError, match=r"HalfAFamily must implement \['accepts_class', 'apply', 'build',"
  ):

    class HalfAFamily(families.Family):  # noqa: F841
      optimizer_api = object

      def count_skipped_step(self, skipped):
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


# --- Each fallback of `framework_internals`, its internal gone --------------------
# (run on every row of the version matrix, as the rest of the suite)


def test_speed_up_fallbacks_answer_as_their_docstrings_say(monkeypatch):
  import tensorflow as tf

  from tf_lossscale._src import algorithm, scale_state

  assert framework_internals.op_callbacks_active() is False
  monkeypatch.setattr(framework_internals, "op_callbacks", None)
  assert framework_internals.op_callbacks_active() is None
  assert scale_state._impl() is algorithm
  monkeypatch.setattr(framework_internals, "control_flow_util", None)
  assert framework_internals.in_xla_context(tf.compat.v1.get_default_graph()) is None
  assert framework_internals.in_v1_control_flow(object()) is None
  assert framework_internals.v1_optimizer_use_locking(object()) is False

  concrete = tf.function(lambda x, y: x * y).get_concrete_function(
    tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32)
  )

  class PublicCallOnly:
    def __call__(self, *tensors):
      return concrete(*tensors)

  args = [tf.constant(3.0), tf.constant(4.0)]
  assert float(framework_internals.call_concrete_function(PublicCallOnly(), args)) == 12.0
  assert float(framework_internals.call_concrete_function(concrete, args)) == 12.0


def test_the_scale_steps_the_same_under_xla_without_the_xla_and_v1_internals(monkeypatch):
  import tensorflow as tf

  from tf_lossscale.keras import mixed_precision

  results = []
  for gone in (False, True):
    if gone:
      monkeypatch.setattr(framework_internals, "control_flow_util", None)
    var = tf.Variable([1.0, 2.0])
    opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=8)
    step = tf.function(
      lambda g, opt=opt, var=var: opt.apply_gradients([(g, var)]), jit_compile=True
    )
    for grad in ([1.0, 1.0], [float("nan"), 1.0], [2.0, -1.0]):
      step(tf.constant(grad))
    results.append((var.numpy().tolist(), float(opt.loss_scale), int(opt.iterations.numpy())))
  assert results[0] == results[1] == ([-0.5, 2.0], 4.0, 3)


class _Bare:
  """An optimizer-like object with none of the private members."""

  iterations = "the public counter"


def test_keras3_fallbacks(monkeypatch):
  bare = _Bare()
  assert framework_internals.keras3_step_counter(bare) == "the public counter"
  assert framework_internals.keras3_knows_variable(bare, object()) is True
  with pytest.raises(framework_internals.FrameworkChangedError, match=r"keras .*pass `trainable"):
    framework_internals.keras3_trainable_variables(bare)
  with pytest.raises(framework_internals.FrameworkChangedError, match=r"weight averages"):
    framework_internals.keras3_ema_averages(bare)
  layer = keras.layers.Dense(1)
  layer.build((None, 2))
  assert isinstance(layer.kernel, framework_internals.keras3_variable_class())
  monkeypatch.setattr(framework_internals, "_KerasVariable", None)
  assert framework_internals.keras3_variable_class() is keras.Variable
  reduced = (pickle.loads, (b"",))
  assert framework_internals.keras3_reduce_as(reduced, keras.optimizers.SGD) is reduced


@pytest.mark.parametrize(
  ("release", "expected"),
  [((3, 0, 5), "reduce here"), ((3, 2, 0), "reduce here"), ((3, 2, 1), "refuse")],
)
def test_keras3_reduce_once_without_keras_s_reduction_decides_by_the_release(
  monkeypatch, release, expected
):
  """Keras 3.0 to 3.2.0 never all-reduce: the wrapper reduces with the replica
  context. A later Keras without the method may reduce elsewhere: refused, never
  a second (silent) reduction."""
  monkeypatch.setattr(framework_internals, "keras_release", lambda: release)
  if expected == "refuse":
    with pytest.raises(framework_internals.FrameworkChangedError, match="reduced again"):
      framework_internals.keras3_reduce_once(_Bare(), lambda inner: False)
  else:
    reduce = framework_internals.keras3_reduce_once(_Bare(), lambda inner: False)
    assert reduce is framework_internals._all_reduce_sum


@pytest.mark.skipif(
  not hasattr(keras.optimizers.SGD, "_all_reduce_sum_gradients"), reason="Keras < 3.2.1"
)
def test_keras3_reduce_once_passes_gradients_through_while_applying_reduced_ones():
  inner, applying = keras.optimizers.SGD(0.1), [False]
  original = framework_internals.keras3_reduce_once(inner, lambda opt: applying[0])
  assert original.__name__ == "_all_reduce_sum_gradients"
  applying[0] = True
  pairs = [("gradient", "variable")]
  assert inner._all_reduce_sum_gradients(pairs) == pairs  # not reduced again
  assert "_all_reduce_sum_gradients" not in vars(keras.optimizers.SGD(0.1))  # this one only


def test_keras_release_reads_pre_releases_as_their_release(monkeypatch):
  for version, release in (
    ("3.15.1", (3, 15, 1)),
    ("3.16.0.dev2026112503", (3, 16, 0)),
    ("3.2", (3, 2, 0)),
  ):
    monkeypatch.setattr(keras, "__version__", version)
    assert framework_internals.keras_release() == release


def test_tf_keras_fallbacks(monkeypatch):
  import tensorflow as tf

  assert framework_internals.tf_keras_knows_variable(_Bare(), object()) is True
  with pytest.raises(
    framework_internals.FrameworkChangedError, match="OptimizerV2 no longer has _name"
  ):
    framework_internals.v2_check_members(_Bare())
  monkeypatch.setitem(sys.modules, "tf_keras", types.SimpleNamespace())  # no __internal__
  with tf.Graph().as_default():
    framework_internals.tf_keras_track_variable(tf.compat.v1.Variable(1.0))  # nothing to do


def test_tensorboard_train_writer_fallbacks(tmp_path):
  """None, so that the monitor opens a writer of its own: a callback without
  the property, one not given a model yet, one whose writer its `fit` closed."""
  import tensorflow as tf

  assert framework_internals.tensorboard_train_writer(None) is None
  assert framework_internals.tensorboard_train_writer(types.SimpleNamespace(log_dir="logs")) is None
  tensorboard = keras.callbacks.TensorBoard(str(tmp_path), write_graph=False)
  assert framework_internals.tensorboard_train_writer(tensorboard) is None
  tensorboard.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
  writer = framework_internals.tensorboard_train_writer(tensorboard)
  assert isinstance(writer, tf.summary.SummaryWriter)
  assert framework_internals.tensorboard_train_writer(tensorboard) is writer
  writer.close()
  assert framework_internals.tensorboard_train_writer(tensorboard) is None


_WITHOUT_BASE_LSO = """
import sys
import tf_keras
from tf_keras.src.mixed_precision import loss_scale_optimizer
del loss_scale_optimizer.BaseLossScaleOptimizer
import keras
from tf_lossscale.keras import mixed_precision
from tf_lossscale import MixedPrecisionLossScaleOptimizer
import tensorflow as tf
mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1))  # Keras 3: works
MixedPrecisionLossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic")
for inner in (tf_keras.optimizers.legacy.SGD(0.1), tf_keras.optimizers.SGD(0.1)):
  try:
    mixed_precision.LossScaleOptimizer(inner)
  except RuntimeError as error:
    print(type(error).__name__, error)
"""


def test_without_tf_keras_s_base_class_only_tf_keras_optimizers_are_refused(tmp_path):
  """tf_keras's private `BaseLossScaleOptimizer` gone: importing tf_lossscale and
  wrapping Keras 3 and compat.v1 optimizers still work; a tf_keras optimizer is
  refused with `FrameworkChangedError` naming what changed."""
  done = helpers.run_script(tmp_path, _WITHOUT_BASE_LSO, None)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert len(lines) == 2, done.stdout
  for line in lines:
    assert line.startswith("FrameworkChangedError tf_lossscale cannot work safely with tf_keras")
    assert "`BaseLossScaleOptimizer` is gone" in line


_WITHOUT_TF_KERAS = """
import json, sys
sys.modules["tf_keras"] = None  # not installed
from tf_lossscale.keras import mixed_precision
try:
  mixed_precision.LossScaleOptimizer.from_config(json.load(open(sys.argv[1])))
except ImportError as error:
  print(type(error).__name__, error)
"""


def test_a_tf_keras_config_without_tf_keras_names_the_extra(tmp_path):
  import tf_keras

  from tf_lossscale.keras import mixed_precision

  config = mixed_precision.LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(0.1)).get_config()
  done = helpers.run_script(tmp_path, _WITHOUT_TF_KERAS, config)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith("ModuleNotFoundError This optimizer config was written by tf_keras")
  assert "pip install 'tf-lossscale[tf-keras]'" in done.stdout


_WITHOUT_TRACKING_BASE = """
import tensorflow as tf
del tf.__internal__.tracking.DelegatingTrackableMixin
try:
  import tf_lossscale
except RuntimeError as error:
  print(type(error).__name__, error)
"""


def test_without_tf_s_tracking_base_the_import_names_what_changed(tmp_path):
  done = helpers.run_script(tmp_path, _WITHOUT_TRACKING_BASE, None)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith(
    "FrameworkChangedError tf_lossscale cannot work safely with tensorflow"
  )
  assert (
    "`tf.__internal__.tracking.DelegatingTrackableMixin`, which checkpointing needs" in done.stdout
  )


_IMPORT_WITH = """
import sys
if "{tensorflow}" == "none":
  sys.modules["tensorflow"] = None  # not installed
else:
  import tensorflow as tf
  tf.__version__ = "{tensorflow}"
try:
  import tf_lossscale
except ImportError as error:
  print(type(error).__name__, error)
else:
  print("imported")
"""


@pytest.mark.parametrize(
  ("tensorflow", "expected"),
  [
    (
      "none",
      "ModuleNotFoundError tf_lossscale needs TensorFlow >= 2.16, and none is installed: "
      "pip install 'tf-lossscale[tensorflow]'",
    ),
    ("2.15.1", "ImportError tf_lossscale needs TensorFlow >= 2.16; this is TensorFlow 2.15.1"),
    ("2.16.0rc0", "imported"),
  ],
)
def test_importing_without_a_recent_enough_tensorflow_says_how_to_install_one(
  tmp_path, tensorflow, expected
):
  """pip installs no TensorFlow by name (it would put `tensorflow` over
  `tensorflow-cpu` or tf-nightly): the import says what is missing."""
  done = helpers.run_script(tmp_path, _IMPORT_WITH.format(tensorflow=tensorflow), None)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith(expected), done.stdout


def test_an_optimizer_v2_without_its_compute_gradients_minimizes_the_same(monkeypatch):
  """`v2_compute_gradients` gone: the wrapper computes the gradients with the tape."""
  import tensorflow as tf
  import tf_keras

  from tf_lossscale.keras import mixed_precision

  def minimized(compute_gradients_gone):
    inner = tf_keras.optimizers.legacy.SGD(0.1)
    if compute_gradients_gone:
      monkeypatch.setattr(inner, "_compute_gradients", None, raising=False)
    opt = mixed_precision.LossScaleOptimizer(inner, initial_scale=4)
    var = tf.Variable([1.0, 2.0])
    opt.minimize(lambda: tf.reduce_sum(var * [3.0, -5.0]), [var])
    return var.numpy(), int(opt.iterations), float(opt.loss_scale)

  calls = []
  original = framework_internals.v2_compute_gradients
  monkeypatch.setattr(
    framework_internals,
    "v2_compute_gradients",
    lambda *args: calls.append(original(*args)) or calls[-1],
  )
  expected = minimized(False)
  assert calls[-1] is not None  # the member's gradients
  gone = minimized(True)
  assert calls[-1] is None
  np.testing.assert_array_equal(gone[0], expected[0])
  assert gone[1:] == expected[1:] == (1, 4.0)
