"""tf-lossscale-upgrade: the corpus's expected rewrites, the command line, and the
rewritten programs running to completion on today's TensorFlow.

The corpus (tests/upgrade_corpus/) holds realistic TF 2.x-era files, each with
its expected output `<name>.upgraded.<ext>.txt`; the `.txt` suffix keeps pytest,
ruff and the tool itself (run on this repository) away from them.
"""

import doctest
import functools
import importlib
import io
import itertools
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import types
import warnings

import pytest
import tensorflow as tf

import helpers
import tf_lossscale
import tf_lossscale.upgrade
import tf_lossscale_upgrade
from tf_lossscale_upgrade import main, upgrade_source

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "upgrade_corpus"
INPUTS = sorted(p for p in CORPUS.glob("*.txt") if ".upgraded." not in p.name)
NAMES = [p.name[: -len(".txt")] for p in INPUTS]  # keras_fit.py, tutorial.ipynb, ...
UNCHANGED = {"own_module.py", "keras3_loop.py"}


def _expected_path(name):
  stem, ext = name.rsplit(".", 1)
  return CORPUS / f"{stem}.upgraded.{ext}.txt"


def _upgrade_text(name, text):
  """The tool's output for one corpus file, through the same code the command uses."""
  from tf_lossscale_upgrade import _notebook

  if name.endswith(".ipynb"):
    notebook = _notebook.Notebook(text)
    changed, _ = notebook.upgrade()
    return notebook.dumps(changed) if changed else text
  return upgrade_source(text).code


def _tool(*args, stdin="", cwd=None):
  """Runs the command (`tf_lossscale_upgrade.main`) in this process, as a subprocess would.

  stdin and stdout are UTF-8 text streams over bytes, as a process's are; `stdin`
  is text or bytes, and stdout comes back as text, or as bytes where stdin was bytes.
  """
  streams = sys.stdin, sys.stdout, sys.stderr
  raw = stdin if isinstance(stdin, bytes) else stdin.encode()
  sys.stdin = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")
  sys.stdout, sys.stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
  directory = os.getcwd()
  try:
    if cwd is not None:
      os.chdir(cwd)
    try:
      returncode = main(list(args))
    except SystemExit as e:  # argparse errors
      returncode = e.code
    sys.stdout.flush()
    out, err = sys.stdout.buffer.getvalue(), sys.stderr.getvalue()
    if not isinstance(stdin, bytes):
      out = out.decode()
  finally:
    os.chdir(directory)
    sys.stdin, sys.stdout, sys.stderr = streams
  return subprocess.CompletedProcess(args, returncode, out, err)


def _subprocess_tool(*args, cwd=None):
  """Runs `python -m tf_lossscale_upgrade`, a process of its own."""
  env = helpers.subprocess_env()
  return subprocess.run(
    [sys.executable, "-m", "tf_lossscale_upgrade", *args],
    capture_output=True,
    text=True,
    cwd=cwd,
    env=env,
    timeout=300,
  )


@pytest.fixture
def project(tmp_path):
  """A copy of the corpus under real file names, notebooks in a subdirectory."""
  root = tmp_path / "project"
  (root / "notebooks").mkdir(parents=True)
  (root / ".venv" / "lib").mkdir(parents=True)  # never searched
  shutil.copy(CORPUS / "custom_loop.py.txt", root / ".venv" / "lib" / "custom_loop.py")
  for path, name in zip(INPUTS, NAMES):
    folder = root / "notebooks" if name.endswith(".ipynb") else root
    shutil.copy(path, folder / name)
  return root


def _project_files(root):
  return {
    p.name: p.read_text(encoding="utf-8")
    for p in root.rglob("*")
    if p.is_file() and ".venv" not in p.parts
  }


# The corpus --------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_corpus_file_becomes_its_expected_output(name):
  source = (CORPUS / f"{name}.txt").read_text(encoding="utf-8")
  assert _upgrade_text(name, source) == _expected_path(name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", NAMES)
def test_second_run_changes_nothing(name):
  expected = _expected_path(name).read_text(encoding="utf-8")
  assert _upgrade_text(name, expected) == expected


@pytest.mark.parametrize("name", sorted(UNCHANGED))
def test_files_without_tf24_loss_scaling_stay_as_they_are(name):
  source = (CORPUS / f"{name}.txt").read_text(encoding="utf-8")
  assert _expected_path(name).read_text(encoding="utf-8") == source
  result = upgrade_source(source)
  assert result.code == source
  assert [f for f in result.findings if f.kind != "not rewritten"] == []


def test_notebook_keeps_its_json_layout_and_other_cells():
  before_text = (CORPUS / "tutorial.ipynb.txt").read_text(encoding="utf-8")
  after_text = _upgrade_text("tutorial.ipynb", before_text)
  assert after_text == _expected_path("tutorial.ipynb").read_text(encoding="utf-8")
  before, after = json.loads(before_text), json.loads(after_text)
  changed = [
    i for i, (a, b) in enumerate(zip(before["cells"], after["cells"], strict=True)) if a != b
  ]
  assert changed == [3]  # the import cell, nothing else (outputs, markdown, magics)
  assert after["cells"][3]["source"][2] == (
    "from tf_lossscale.keras.mixed_precision import experimental as mixed_precision\n"
  )
  assert after_text == json.dumps(after, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def test_notebook_with_string_sources_and_its_own_layout(tmp_path):
  notebook = {
    "nbformat": 4,
    "cells": [
      {"cell_type": "code", "source": "%load_ext autoreload\nimport tensorflow as tf"},
      {"cell_type": "markdown", "source": "tf.keras.mixed_precision.LossScaleOptimizer"},
      {
        "cell_type": "code",
        "source": "opt = tf.keras.mixed_precision.LossScaleOptimizer(o)\n%time 1",
      },
    ],
  }
  path = tmp_path / "nb.ipynb"
  path.write_text(json.dumps(notebook, indent=2))
  result = _tool("--in-place", str(path))
  assert result.returncode == 0, result.stderr
  notebook["cells"][0]["source"] += "\nimport tf_lossscale"
  notebook["cells"][2]["source"] = (
    "opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(o)\n%time 1"
  )
  assert path.read_text() == json.dumps(notebook, indent=2)
  assert f"{path}:cell_3:1:7: tf.keras.mixed_precision.LossScaleOptimizer" in result.stderr


def test_notebook_whose_cell_ends_with_a_comment_is_still_rewritten(tmp_path):
  # Jupyter saves a cell's last line without a newline: joined as they are, the
  # comment hid the next cell's import from the pre-filter, which skipped the file.
  notebook = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {},
    "cells": [
      {"cell_type": "code", "source": ["# Licensed under the Apache License"]},
      {"cell_type": "code", "source": ["import tensorflow as tf\n", "# mixed_precision below"]},
      {
        "cell_type": "code",
        "source": ["opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(o, 'dynamic')"],
      },
    ],
  }
  path = tmp_path / "guide.ipynb"
  path.write_text(json.dumps(notebook))
  assert _tool("--check", str(path)).returncode == 1
  assert _tool("--in-place", str(path)).returncode == 0
  assert json.loads(path.read_text())["cells"][2]["source"] == [
    "opt = tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer(o, 'dynamic')"
  ]


@pytest.mark.parametrize("line_end", ["\n", "\r\n", ""])
def test_a_notebook_on_one_line_keeps_its_layout(tmp_path, line_end):
  """`json.dump` and a newline: the file's only line end was taken for a second line."""
  cells = [
    {"cell_type": "code", "source": ["import tensorflow as tf\n"]},
    {"cell_type": "code", "source": ["opt = tf.keras.mixed_precision.LossScaleOptimizer(o)"]},
  ]
  path = tmp_path / "one_line.ipynb"
  path.write_bytes((json.dumps({"cells": cells, "nbformat": 4}) + line_end).encode())
  assert _tool("--in-place", "--quiet", str(path)).returncode == 0
  cells[0]["source"].append("import tf_lossscale\n")
  cells[1]["source"] = ["opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(o)"]
  assert path.read_bytes() == (json.dumps({"cells": cells, "nbformat": 4}) + line_end).encode()


def test_a_notebook_with_u2028_on_one_line_keeps_its_layout(tmp_path):
  """U+2028 is text in JSON: not the line end of a second line. A rewritten cell's
  lines are split as nbformat splits them (`str.splitlines`)."""
  cells = [
    {"cell_type": "markdown", "source": ["a\u2028b"]},
    {"cell_type": "code", "source": ["import tensorflow as tf\n", "s = 'a\x0cb'\n"]},
    {"cell_type": "code", "source": ["opt = tf.keras.mixed_precision.LossScaleOptimizer(o)"]},
  ]
  path = tmp_path / "one_line.ipynb"
  path.write_text(json.dumps({"cells": cells, "nbformat": 4}, ensure_ascii=False), "utf-8")
  assert _tool("--in-place", "--quiet", str(path)).returncode == 0
  new = "import tensorflow as tf\nimport tf_lossscale\ns = 'a\x0cb'\n"
  cells[1]["source"] = new.splitlines(keepends=True)
  cells[2]["source"] = ["opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(o)"]
  expected = json.dumps({"cells": cells, "nbformat": 4}, ensure_ascii=False)
  assert path.read_text("utf-8") == expected


def test_notebook_with_windows_line_endings_keeps_them_and_its_layout(tmp_path):
  cells = [
    {"cell_type": "code", "metadata": {}, "outputs": [], "source": ["import tensorflow as tf\n"]},
    {"cell_type": "markdown", "metadata": {}, "source": ["Some text\n", "more"]},
    {
      "cell_type": "code",
      "metadata": {},
      "outputs": [],
      "source": ["opt = tf.keras.mixed_precision.LossScaleOptimizer(o)"],
    },
  ]

  def text(notebook_cells):
    notebook = {"cells": notebook_cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return (json.dumps(notebook, indent=2) + "\n").replace("\n", "\r\n")

  path = tmp_path / "crlf.ipynb"
  path.write_bytes(text(cells).encode())
  assert _tool("--in-place", "--quiet", str(path)).returncode == 0
  cells[0]["source"] = ["import tensorflow as tf\n", "import tf_lossscale\n"]
  cells[2]["source"] = ["opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(o)"]
  assert path.read_bytes() == text(cells).encode()


def test_notebook_cells_with_ipython_syntax_are_rewritten_or_reported():
  from tf_lossscale_upgrade import _notebook

  lso = "tf.keras.mixed_precision.experimental.LossScaleOptimizer(o, 'dynamic')"
  ours = "tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer(o, 'dynamic')"
  cells = [
    "import tensorflow as tf\ntf.keras.mixed_precision?",  # help
    f"%%time\nopt = {lso}",  # a cell magic that runs Python
    f'def make():\n  """Why wrap?\n  Underflow."""\n  return {lso}',  # `?` ending a docstring line
    f"new = (tf.__version__\n       != '2.4.0')\n!nvidia-smi\nopt = {lso}",  # `!=` continued
    f'print("%s"\n      % tf.__version__)\nopt = {lso}',  # `%` continued: Python as it is
    "%%bash\necho tf.keras.mixed_precision.experimental.LossScaleOptimizer",  # not Python
    "%%bash\necho nothing to see",
  ]
  notebook = {"nbformat": 4, "cells": [{"cell_type": "code", "source": c} for c in cells]}
  changed, findings = _notebook.Notebook(json.dumps(notebook)).upgrade()
  assert changed == {
    0: "import tensorflow as tf\nimport tf_lossscale\ntf.keras.mixed_precision?",
    1: cells[1].replace(lso, ours),
    2: cells[2].replace(lso, ours),
    3: cells[3].replace(lso, ours),
    4: cells[4].replace(lso, ours),
  }
  left = [(cell, f.line, f.kind, f.old, f.reason) for cell, f in findings if f.kind != "rewrite"]
  assert left == [(5, 1, "not rewritten", "%%bash", _notebook._LEFT_OUT)]


# The command line ---------------------------------------------------------------


def test_check_fails_before_and_passes_after_in_place(project):
  before = _project_files(project)
  check = _tool("--check", str(project))
  assert check.returncode == 1, check.stderr
  assert check.stdout == ""  # --check prints no diff unless --diff is given
  assert _project_files(project) == before

  rewrite = _tool("--in-place", str(project))
  assert rewrite.returncode == 0, rewrite.stderr
  after = _project_files(project)
  for name in NAMES:
    assert after[name] == _expected_path(name).read_text(encoding="utf-8"), name
  assert (project / ".venv" / "lib" / "custom_loop.py").read_text() == (
    CORPUS / "custom_loop.py.txt"
  ).read_text()

  assert _tool("--check", str(project)).returncode == 0
  again = _tool("--in-place", str(project))
  assert again.returncode == 0
  assert _project_files(project) == after
  assert "would rewrite" not in again.stderr and "rewrote 0 " in again.stderr


def test_diff_is_the_default_and_applies_with_patch(project):
  result = _tool("custom_loop.py", cwd=project)
  assert result.returncode == 0
  assert result.stdout.startswith("--- custom_loop.py\n+++ custom_loop.py\n@@ ")
  assert "-opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n" in result.stdout
  assert "+opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(opt)\n" in result.stdout
  patch = shutil.which("patch")
  if patch:
    subprocess.run([patch, "-s", "-p0"], input=result.stdout, text=True, cwd=project, check=True)
    target = project / "custom_loop.py"
    assert target.read_text() == _expected_path("custom_loop.py").read_text()


def test_the_diff_of_a_file_with_form_feeds_has_its_lines(tmp_path):
  """A form feed (a page break in older Python files) is no line end: the diff's
  context and removed lines are the file's own, so it applies."""
  before = (
    "import tensorflow as tf\n\x0c\n\nx = 1\n\x0c\n"
    "opt = tf.keras.mixed_precision.LossScaleOptimizer(o)\n"
  )
  path = tmp_path / "paged.py"
  path.write_text(before)
  diff = _tool(str(path)).stdout.split("\n")
  assert diff[2] == "@@ -1,6 +1,7 @@"
  old_side = [line[1:] for line in diff[3:] if line[:1] in (" ", "-")]
  assert "\n".join(old_side) + "\n" == before


def test_stdin():
  source = (CORPUS / "custom_loop.py.txt").read_text()
  expected = _expected_path("custom_loop.py").read_text()
  diff = _tool("-", stdin=source)
  assert diff.returncode == 0 and diff.stdout.startswith("--- <stdin>\n+++ <stdin>\n")
  assert _tool("--in-place", "-", stdin=source).stdout == expected
  assert _tool("--in-place", "-", stdin=expected).stdout == expected  # a filter: passes through
  assert _tool("--check", "-", stdin=source).returncode == 1
  assert _tool("--check", "-", stdin=expected).returncode == 0
  notebook = (CORPUS / "tutorial.ipynb.txt").read_text()
  assert _tool("-i", "-", stdin=notebook).stdout == _expected_path("tutorial.ipynb").read_text()


def test_stdin_filter_writes_the_code_in_its_own_encoding():
  before = (
    '# -*- coding: latin-1 -*-\nimport tensorflow as tf\nNAME = "caf\xe9"\n'
    "opt = tf.keras.mixed_precision.LossScaleOptimizer\n"
  )
  after = before.replace("tf\nNAME", "tf\nimport tf_lossscale\nNAME").replace(
    "= tf.keras", "= tf_lossscale.keras"
  )
  result = _tool("--in-place", "--quiet", "-", stdin=before.encode("latin-1"))
  assert result.returncode == 0, result.stderr
  assert result.stdout == after.encode("latin-1")


# The `check` reason of an experimental policy's loss scale.
COMPILE_REASON = (
  "Keras 3's `Model.compile` does not wrap the optimizer with the policy's loss scale "
  "(under 'mixed_float16' it adds Keras 3's own LossScaleOptimizer instead): pass "
  "`wrap_optimizer_for_policy(optimizer, model)` from "
  "tf_lossscale.keras.mixed_precision.experimental to `compile`"
)


def _report(result):
  """The report lines on stderr, paths made relative, without the summary."""
  return [line for line in result.stderr.splitlines() if not line.startswith("tf-lossscale")]


def test_report_lists_rewrites_and_uses_left_with_reasons(project):
  result = _tool("--check", "unsafe_uses.py", "keras3_loop.py", "notebooks", cwd=project)
  assert _report(result) == [
    "unsafe_uses.py:4:1: not rewritten: tensorflow.compat.v1.train.experimental: a star import "
    "of a module tf_lossscale mirrors only in part; import the names you use",
    "unsafe_uses.py:6:53: not rewritten: tensorflow.python.keras.mixed_precision.autocast_variable:"
    " tf_lossscale has no equivalent of tensorflow.python.keras.mixed_precision.autocast_variable;"
    " port this use by hand",
    "unsafe_uses.py:15:19: not rewritten: tf.keras.mixed_precision: a loss-scaling module used as "
    "a value: the names later taken from it cannot be followed; migrate them by hand",
    "unsafe_uses.py:18:25: tf.mixed_precision.experimental.DynamicLossScale -> "
    "tf_lossscale.mixed_precision.experimental.DynamicLossScale",
    "unsafe_uses.py:26:24: tf.keras.mixed_precision.LossScaleOptimizer -> "
    "tf_lossscale.keras.mixed_precision.LossScaleOptimizer",
    "unsafe_uses.py:26:24: check: tf.keras.mixed_precision.LossScaleOptimizer: class "
    "PatchedOptimizer overrides _apply_gradients_cross_replica: TensorFlow's private methods, "
    "which tf_lossscale's class does not have; port them by hand",
    "unsafe_uses.py:34:12: not rewritten: loss_scale_lib._is_all_finite: tf_lossscale has no "
    "equivalent of tensorflow.python.training.experimental.loss_scale._is_all_finite; port this "
    "use by hand",
    "unsafe_uses.py:38:12: loss_scale_lib.FixedLossScale -> tf_lossscale.loss_scale.FixedLossScale",
    "unsafe_uses.py:42:12: not rewritten: tf_v1.train.experimental.MixedPrecisionLossScaleOptimizer:"
    " `tf_v1` is also bound on line 12 to something else: cannot tell which one this is",
    "unsafe_uses.py:47:20: keras_mp.LossScaleOptimizer -> "
    "tf_lossscale.keras.mixed_precision.LossScaleOptimizer",
    "unsafe_uses.py:55:1: not rewritten: tf.keras.mixed_precision.experimental.LossScaleOptimizer: "
    "assigned to or deleted: patching TensorFlow's module cannot be migrated",
    "keras3_loop.py:11:13: not rewritten: tf.keras.mixed_precision.LossScaleOptimizer: this file "
    "uses Keras 3's `scale_loss` protocol, so this is Keras 3's own LossScaleOptimizer, which "
    "today's TensorFlow has",
    "notebooks/tutorial.ipynb:cell_4:3:46: tensorflow.keras.mixed_precision.experimental -> "
    "tf_lossscale.keras.mixed_precision.experimental",
    f"notebooks/tutorial.ipynb:cell_6:2:1: check: mixed_precision.set_policy: {COMPILE_REASON}",
  ]
  assert result.stderr.splitlines()[-1] == (
    "tf-lossscale-upgrade: 3 files, would rewrite 2 (5 changes); 7 uses not rewritten, 2 to check"
  )
  assert result.returncode == 1


def test_in_place_keeps_the_encoding_and_line_endings(tmp_path):
  path = tmp_path / "legacy.py"
  before = (
    "# -*- coding: latin-1 -*-\r\n# Mod\xe8le\r\nimport tensorflow as tf\r\n"
    "s = tf.mixed_precision.experimental.FixedLossScale(8)\r\n"
  )
  path.write_bytes(before.encode("latin-1"))
  assert _tool("--in-place", "--quiet", str(path)).returncode == 0
  after = before.replace("tf\r\ns = tf.", "tf\r\nimport tf_lossscale\r\ns = tf_lossscale.")
  assert path.read_bytes() == after.encode("latin-1")


def test_invalid_python_is_an_error_and_other_files_still_go(tmp_path):
  broken = "import tensorflow as tf\nopt = tf.keras.mixed_precision.LossScaleOptimizer(:\n"
  (tmp_path / "broken.py").write_text(broken)
  shutil.copy(CORPUS / "custom_loop.py.txt", tmp_path / "good.py")
  result = _tool("--in-place", str(tmp_path))
  assert result.returncode == 2
  assert f"{tmp_path / 'broken.py'}: error: not valid Python (line 2" in result.stderr
  assert (tmp_path / "good.py").read_text() == _expected_path("custom_loop.py").read_text()


def test_an_unwritable_file_is_an_error_and_other_files_still_go(tmp_path, monkeypatch):
  """The tests run as root, whom file modes do not stop: the write itself fails."""
  import builtins

  for name in ("a.py", "b.py", "c.py"):
    shutil.copy(CORPUS / "custom_loop.py.txt", tmp_path / name)
  unwritable = str(tmp_path / "b.py")
  real_open = builtins.open

  def open_(file, mode="r", *args, **kwargs):
    if str(file) == unwritable and "w" in mode:
      raise PermissionError(1, "Operation not permitted", unwritable)
    return real_open(file, mode, *args, **kwargs)

  monkeypatch.setattr(builtins, "open", open_)
  result = _tool("--in-place", str(tmp_path))
  monkeypatch.undo()
  assert result.returncode == 2
  assert [line for line in result.stderr.splitlines() if "b.py" in line] == [
    f"{unwritable}: error: [Errno 1] Operation not permitted: '{unwritable}'"
  ]
  assert result.stderr.splitlines()[-1] == (
    "tf-lossscale-upgrade: 3 files, rewrote 2 (2 changes); 0 uses not rewritten, 0 to check"
  )
  expected = _expected_path("custom_loop.py").read_text()
  rewritten = [
    name for name in ("a.py", "b.py", "c.py") if (tmp_path / name).read_text() == expected
  ]
  assert rewritten == ["a.py", "c.py"]


# Notebooks the tool cannot read: {case: file text}.
BAD_NOTEBOOKS = {
  "nbformat 3": json.dumps(
    {
      "nbformat": 3,
      "worksheets": [{"cells": [{"cell_type": "code", "input": ["import tensorflow as tf\n"]}]}],
    }
  ),
  "a JSON list": "[1, 2]",
  "cells not a list": '{"nbformat": 4, "cells": {"cell_type": "code"}}',
  "a cell not an object": '{"nbformat": 4, "cells": ["import tensorflow as tf"]}',
  "a source of numbers": '{"nbformat": 4, "cells": [{"cell_type": "code", "source": [1]}]}',
  "not JSON": "import tensorflow as tf\n",
}


@pytest.mark.parametrize("case", sorted(BAD_NOTEBOOKS))
def test_a_notebook_the_tool_cannot_read_is_an_error_and_other_files_still_go(tmp_path, case):
  (tmp_path / "bad.ipynb").write_text(BAD_NOTEBOOKS[case])
  shutil.copy(CORPUS / "custom_loop.py.txt", tmp_path / "good.py")
  result = _tool("--in-place", str(tmp_path))
  assert result.returncode == 2
  assert f"{tmp_path / 'bad.ipynb'}: error: " in result.stderr, result.stderr
  assert (tmp_path / "good.py").read_text() == _expected_path("custom_loop.py").read_text()
  assert (tmp_path / "bad.ipynb").read_text() == BAD_NOTEBOOKS[case]


def test_many_files_in_worker_processes_give_the_same_result(tmp_path):
  for index in range(40):  # above the threshold for worker processes
    shutil.copy(CORPUS / "aliases.py.txt", tmp_path / f"m{index}.py")
  result = _subprocess_tool("--in-place", "--jobs", "2", "--quiet", str(tmp_path))
  assert result.returncode == 0, result.stderr
  assert result.stderr == ""  # --quiet: nothing reported
  expected = _expected_path("aliases.py").read_text()
  assert all(p.read_text() == expected for p in tmp_path.glob("*.py"))


@pytest.mark.skipif(
  not os.path.isdir("/proc/self/task") or multiprocessing.get_start_method() != "fork",
  reason="only where processes fork by default and /proc lists a process's threads (Linux)",
)
def test_workers_are_spawned_where_this_process_runs_threads():
  """A forked copy of a process running threads (TensorFlow's, here) can deadlock
  or crash: a worker process of this pytest run once died so, from a fork."""
  from tf_lossscale_upgrade import _cli

  assert len(os.listdir("/proc/self/task")) > 1  # tf_lossscale imported TensorFlow
  assert _cli._pool_context().get_start_method() == "spawn"
  alone = "from tf_lossscale_upgrade import _cli; print(_cli._pool_context())"
  result = subprocess.run(
    [sys.executable, "-c", alone],
    capture_output=True,
    text=True,
    check=True,
    env=helpers.subprocess_env(),
  )
  assert result.stdout == "None\n"  # one thread: the platform's fork, the fastest


# The train.py of docs/migration.md's report example.
_REPORT_EXAMPLE = """import tensorflow as tf

try:
  import tensorflow.compat.v1 as tf_v1
except ImportError:
  tf_v1 = None

opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD())


class PatchedOptimizer(tf.keras.mixed_precision.LossScaleOptimizer):
  def _apply_gradients_cross_replica(self, distribution, grads_and_vars, name):
    return super()._apply_gradients_cross_replica(distribution, grads_and_vars, name)


def graph_optimizer(opt):
  return tf_v1.train.experimental.MixedPrecisionLossScaleOptimizer(opt, "dynamic")
"""


def test_the_report_in_docs_is_the_tools(tmp_path):
  (tmp_path / "train.py").write_text(_REPORT_EXAMPLE)
  result = _tool("--check", "train.py", cwd=tmp_path)
  assert result.returncode == 1
  page = (ROOT / "docs" / "migration.md").read_text()
  shown = re.search(r"^  ```\n(  train\.py:.*?)^  ```", page, flags=re.MULTILINE | re.DOTALL)
  assert shown, "docs/migration.md: no report example"
  assert result.stderr.splitlines() == [line[2:] for line in shown.group(1).splitlines()]


def test_the_upgrade_source_example_in_docs_runs():
  page = (ROOT / "docs" / "migration.md").read_text()
  (example,) = re.findall(r"^```pycon\n(.*?)^```", page, flags=re.MULTILINE | re.DOTALL)
  test = doctest.DocTestParser().get_doctest(example, {}, "docs/migration.md", None, 0)
  output = []
  result = doctest.DocTestRunner().run(test, out=output.append)
  assert result.failed == 0 and result.attempted > 5, "".join(output)


def test_list_names_prints_the_table_in_docs():
  table = _tool("--list-names").stdout
  assert table.startswith("| TensorFlow name | becomes | |\n")
  assert table in (ROOT / "docs" / "migration.md").read_text()


def test_python_m_tf_lossscale_upgrade_and_the_console_script():
  def run(*command):
    return subprocess.run(
      [*command, "--in-place", "-"],
      input=(CORPUS / "custom_loop.py.txt").read_text(),
      capture_output=True,
      text=True,
      env=helpers.subprocess_env(),
      timeout=300,
    )

  def report(stderr):  # without TensorFlow's log lines: tf_lossscale imports it
    return [line for line in stderr.splitlines() if line.startswith(("<stdin>:", "tf-lossscale"))]

  python_m = run(sys.executable, "-m", "tf_lossscale.upgrade")
  assert python_m.returncode == 0, python_m.stderr
  assert python_m.stdout == _expected_path("custom_loop.py").read_text()
  assert report(python_m.stderr) == [
    "<stdin>:18:7: tf.keras.mixed_precision.LossScaleOptimizer -> "
    "tf_lossscale.keras.mixed_precision.LossScaleOptimizer",
    "tf-lossscale-upgrade: 1 file, rewrote 1 (1 change); 0 uses not rewritten, 0 to check",
  ]
  # setup.py's console script, put beside this Python by `pip install [-e] .`
  # (scripts/matrix.py installs this checkout so in each row's venv too).
  script = shutil.which("tf-lossscale-upgrade", path=os.path.dirname(sys.executable))
  if script is None:
    pytest.skip(f"the tf-lossscale-upgrade script is not installed beside {sys.executable}")
  console_script = run(script)
  assert console_script.returncode == 0, console_script.stderr
  assert console_script.stdout == python_m.stdout
  assert console_script.stderr.splitlines() == report(python_m.stderr)


def test_tf_lossscale_upgrade_re_exports_the_tool():
  for name in tf_lossscale_upgrade.__all__:
    assert getattr(tf_lossscale.upgrade, name) is getattr(tf_lossscale_upgrade, name)
  assert tf_lossscale.upgrade.__all__ == tf_lossscale_upgrade.__all__


_NO_TF_PROBE = r"""
import sys
import tf_lossscale_upgrade
status = tf_lossscale_upgrade.main(sys.argv[1:])
heavy = sorted(m for m in ("tensorflow", "keras", "tf_keras", "tf_lossscale") if m in sys.modules)
print("imported:", heavy, "status:", status)
"""


def test_the_tool_never_imports_tensorflow(project):
  result = subprocess.run(
    [sys.executable, "-c", _NO_TF_PROBE, "--check", "--quiet", str(project)],
    capture_output=True,
    text=True,
    env=helpers.subprocess_env(),
    timeout=120,
  )
  assert result.stdout == "imported: [] status: 1\n", result.stderr


# Resolution rules, each on a few lines -------------------------------------------

CASES = {
  "compat.v1's own compat": (
    "import tensorflow.compat.v1 as tf\n"
    "opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, 'dynamic')\n"
    "opt = tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite(opt)\n"
    "scale = tf.compat.v2.mixed_precision.experimental.DynamicLossScale()\n",
    "import tensorflow.compat.v1 as tf\n"
    "import tf_lossscale\n"
    "opt = tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, 'dynamic')\n"
    "opt = tf_lossscale.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite(opt)\n"
    "scale = tf_lossscale.mixed_precision.experimental.DynamicLossScale()\n",
  ),
  "tf1 program": (
    "import tensorflow.compat.v1 as tf\n"
    "opt = tf.train.experimental.MixedPrecisionLossScaleOptimizer(opt, 'dynamic')\n",
    "import tensorflow.compat.v1 as tf\n"
    "import tf_lossscale\n"
    "opt = tf_lossscale.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer(opt, "
    "'dynamic')\n",
  ),
  "tensorflow spelled out, tf2 train.experimental": (
    "import tensorflow\n"
    "opt = tensorflow.train.experimental.enable_mixed_precision_graph_rewrite(opt)\n",
    "import tensorflow\n"
    "import tf_lossscale\n"
    "opt = tf_lossscale.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite(opt)\n",
  ),
  "try/except imports reaching the same class": (
    "try:\n  import tensorflow.compat.v1 as tf\nexcept ImportError:\n  import tensorflow as tf\n"
    "s = tf.train.experimental.DynamicLossScale()\n",
    "try:\n  import tensorflow.compat.v1 as tf\nexcept ImportError:\n  import tensorflow as tf\n"
    "import tf_lossscale\n"
    "s = tf_lossscale.compat.v1.train.experimental.DynamicLossScale()\n",
  ),
  "a shadowing parameter": (
    "import tensorflow as tf\ndef f(tf):\n  return tf.keras.mixed_precision.LossScaleOptimizer\n",
    None,
  ),
  "tf_lossscale already imported under an alias": (
    "import tensorflow as tf\nimport tf_lossscale as tfl\n"
    "x = tf.mixed_precision.experimental.FixedLossScale(2)\n",
    "import tensorflow as tf\nimport tf_lossscale as tfl\n"
    "x = tfl.mixed_precision.experimental.FixedLossScale(2)\n",
  ),
  "the name tf_lossscale taken": (
    "import tensorflow as tf\ntf_lossscale = 1\n"
    "x = tf.mixed_precision.experimental.FixedLossScale(2)\n",
    None,
  ),
  "a module gone from TF as a value": (
    "import tensorflow as tf\nmp = tf.keras.mixed_precision.experimental\n",
    "import tensorflow as tf\nimport tf_lossscale\n"
    "mp = tf_lossscale.keras.mixed_precision.experimental\n",
  ),
  "a star import of a module tf_lossscale mirrors fully": (
    "from tensorflow.keras.mixed_precision.experimental import *\n",
    "from tf_lossscale.keras.mixed_precision.experimental import *\n",
  ),
  "an unused import of a module gone from TF": (
    "import tensorflow.keras.mixed_precision.experimental as mp\n",
    "import tf_lossscale.keras.mixed_precision.experimental as mp\n",
  ),
  # TF 2.1-2.3's private home of Keras mixed precision, gone since TF 2.4 (real code).
  "an unused import of a private module gone from TF": (
    "import tensorflow as tf\n"
    "from tensorflow.python.keras.mixed_precision.experimental import policy\n",
    "import tensorflow as tf\n"
    "from tf_lossscale.keras.mixed_precision import experimental as policy\n",
  ),
  "an unused dotted import of a private module gone from TF": (
    "import tensorflow as tf\nimport tensorflow.python.keras.mixed_precision.experimental.policy\n",
    "import tensorflow as tf\n",
  ),
  "a dotted import of a private module the tool does not know, under one gone": (
    "import tensorflow.python.keras.mixed_precision.experimental.autocast_variable\n"
    "v = tensorflow.python.keras.mixed_precision.experimental.autocast_variable.f(w)\n",
    None,
  ),
  "a private module gone from TF kept by a use": (
    "from tensorflow.python.keras.mixed_precision.experimental import policy\n"
    "x = policy._policy_equivalent_to_dtype\n",
    None,
  ),
  "a dotted import of a module gone from TF whose root other uses read": (
    "import tensorflow.keras.mixed_precision.experimental\n"
    "opt = tensorflow.keras.optimizers.SGD()\n"
    "opt = tensorflow.keras.mixed_precision.experimental.LossScaleOptimizer(opt, 'dynamic')\n",
    "import tensorflow\n"
    "import tf_lossscale\n"
    "opt = tensorflow.keras.optimizers.SGD()\n"
    "opt = tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer(opt, 'dynamic')\n",
  ),
  "renamed private names keep their bound name": (
    "from tensorflow.python.training.experimental.mixed_precision import (\n"
    "    enable_mixed_precision_graph_rewrite_v1,  # TF1's\n"
    ")\n",
    "from tf_lossscale.compat.v1.mixed_precision import (\n"
    "    enable_mixed_precision_graph_rewrite as enable_mixed_precision_graph_rewrite_v1,  # TF1's\n"
    ")\n",
  ),
  "an import split: ours and today's Keras": (
    "from tensorflow.keras.mixed_precision import DTypePolicy, LossScaleOptimizer\n",
    "from tensorflow.keras.mixed_precision import DTypePolicy\n"
    "from tf_lossscale.keras.mixed_precision import LossScaleOptimizer\n",
  ),
  "a parenthesised import split": (
    "from tensorflow.keras.mixed_precision import (\n"
    "    DTypePolicy,  # Keras 3's\n"
    "    LossScaleOptimizer,\n"
    "    experimental,\n"
    ")\n"
    "x = experimental.LossScaleOptimizer\n",
    "from tensorflow.keras.mixed_precision import (\n"
    "    DTypePolicy,  # Keras 3's\n"
    ")\n"
    "from tf_lossscale.keras.mixed_precision import LossScaleOptimizer, experimental\n"
    "x = experimental.LossScaleOptimizer\n",
  ),
  "a policy name today's TF has is left alone": (
    "from tensorflow.keras.mixed_precision import set_global_policy\n"
    "import tensorflow as tf\ntf.keras.mixed_precision.global_policy()\n",
    None,
  ),
  "a dotted private import goes, its comment stays": (
    "import tensorflow as tf\n"
    "# the v1 optimizer\n"
    "import tensorflow.python.training.experimental.loss_scale_optimizer\n"
    "c = tensorflow.python.training.experimental.loss_scale_optimizer."
    "MixedPrecisionLossScaleOptimizer\n"
    "d = tf.constant(1)\n",
    "import tensorflow as tf\n"
    "import tf_lossscale\n"
    "# the v1 optimizer\n"
    "c = tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer\n"
    "d = tf.constant(1)\n",
  ),
  "a use on the line of the import": (
    "import tensorflow as tf; x = tf.mixed_precision.experimental.LossScale\n",
    "import tf_lossscale\nimport tensorflow as tf; x = tf_lossscale.mixed_precision.experimental.LossScale\n",
  ),
  # The statements after a split import stay after every import it is split into
  # (they went below the new one, a NameError); the line's comment stays with them.
  "an import split, with uses after it on its line": (
    "x = 1; from tensorflow.keras.mixed_precision import experimental as mp, global_policy; "
    "p = mp.Policy('float32'); q = global_policy()  # policies\n",
    "x = 1; from tensorflow.keras.mixed_precision import global_policy\n"
    "from tf_lossscale.keras.mixed_precision import experimental as mp\n"
    "p = mp.Policy('float32'); q = global_policy()  # policies\n",
  ),
  # A suite on its header's line was not rewritten at all (yet reported as rewritten).
  "an import in a one-line suite": (
    "try: from tensorflow.keras.mixed_precision import experimental as mp\n"
    "except ImportError: mp = None\n",
    "try: from tf_lossscale.keras.mixed_precision import experimental as mp\n"
    "except ImportError: mp = None\n",
  ),
  "unused imports dropped from one-line suites": (
    "if True: import tensorflow.python.keras.mixed_precision.experimental.policy\n"
    "try: import tensorflow.python.keras.mixed_precision.experimental.policy; x = 1\n"
    "except ImportError: pass\n",
    "if True: pass\ntry: x = 1\nexcept ImportError: pass\n",
  ),
  "an import split in a one-line suite, with a use after it": (
    "if True: from tensorflow.keras.mixed_precision import Policy, LossScaleOptimizer as L; L(o)\n",
    "if True: from tensorflow.keras.mixed_precision import Policy; "
    "from tf_lossscale.keras.mixed_precision import LossScaleOptimizer as L; L(o)\n",
  ),
  "a lazy import: tf_lossscale's beside it": (
    "# Copyright 2020\ndef f():\n  import tensorflow as tf\n"
    "  return tf.mixed_precision.experimental.LossScale\n",
    "# Copyright 2020\ndef f():\n  import tensorflow as tf\n  import tf_lossscale\n"
    "  return tf_lossscale.mixed_precision.experimental.LossScale\n",
  ),
  "lazy imports in two functions, one on the line of its use": (
    "def f():\n  import tensorflow as tf\n  return tf.mixed_precision.experimental.LossScale\n"
    "def g():\n  import tensorflow as tf; return tf.mixed_precision.experimental.LossScale\n",
    "def f():\n  import tensorflow as tf\n  import tf_lossscale\n"
    "  return tf_lossscale.mixed_precision.experimental.LossScale\n"
    "def g():\n  import tf_lossscale\n"
    "  import tensorflow as tf; return tf_lossscale.mixed_precision.experimental.LossScale\n",
  ),
  "an optional TensorFlow: tf_lossscale's import as optional": (
    "try:\n  import tensorflow as tf\nexcept ImportError:\n  tf = None\n"
    "def f():\n  return tf.mixed_precision.experimental.LossScale\n",
    None,  # `tf` may be None: reported, and nothing added.
  ),
  "an optional TensorFlow without a second binding": (
    "try:\n  import tensorflow as tf\n  HAS_TF = True\nexcept ImportError:\n  HAS_TF = False\n"
    "if TYPE_CHECKING:\n  from tensorflow.keras import mixed_precision as mp\n"
    "def f():\n  return tf.mixed_precision.experimental.LossScale, mp.experimental.Policy\n",
    "try:\n  import tensorflow as tf\n  import tf_lossscale\n  HAS_TF = True\n"
    "except ImportError:\n  HAS_TF = False\n"
    "if TYPE_CHECKING:\n  from tf_lossscale.keras import mixed_precision as mp\n"
    "def f():\n  return tf_lossscale.mixed_precision.experimental.LossScale, mp.experimental.Policy\n",
  ),
  "under an if": (
    "if TYPE_CHECKING:\n  import tensorflow as tf\n"
    "def f():\n  return tf.mixed_precision.experimental.LossScale, tf.constant(1)\n",
    "if TYPE_CHECKING:\n  import tensorflow as tf\n  import tf_lossscale\n"
    "def f():\n  return tf_lossscale.mixed_precision.experimental.LossScale, tf.constant(1)\n",
  ),
  "a function's import beside a module-level one: at module level": (
    "import tensorflow as tf\n"
    "def f():\n  import tensorflow.compat.v1 as tf1\n"
    "  return tf1.mixed_precision.DynamicLossScale, tf.mixed_precision.experimental.LossScale\n",
    "import tensorflow as tf\nimport tf_lossscale\n"
    "def f():\n  import tensorflow.compat.v1 as tf1\n"
    "  return tf_lossscale.compat.v1.mixed_precision.DynamicLossScale, "
    "tf_lossscale.mixed_precision.experimental.LossScale\n",
  ),
  "scale_loss named but not called: TF 2.4 code": (
    "import tensorflow as tf\n"
    "flags.DEFINE_bool('scale_loss', True, 'call opt.scale_loss(loss)?')  # .scale_loss(\n"
    "if FLAGS.scale_loss:\n"
    "  opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n",
    "import tensorflow as tf\n"
    "import tf_lossscale\n"
    "flags.DEFINE_bool('scale_loss', True, 'call opt.scale_loss(loss)?')  # .scale_loss(\n"
    "if FLAGS.scale_loss:\n"
    "  opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(opt)\n",
  ),
  "scale_loss called: Keras 3 code": (
    "import tensorflow as tf\n"
    "opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n"
    "loss = opt.scale_loss(loss)  # not opt.get_scaled_loss(loss)\n",
    None,
  ),
  "modules bound by assignment": (
    "import tensorflow as tf\n"
    "tf1 = tf.compat.v1\n"
    "keras = tf.keras\n"
    "mp = keras.mixed_precision\n"
    "def build(opt):\n"
    "  mp.experimental.set_policy('float32')\n"
    "  return tf1.train.experimental.enable_mixed_precision_graph_rewrite(opt), keras.layers\n"
    "x = mp.DTypePolicy\n",
    "import tensorflow as tf\n"
    "import tf_lossscale\n"
    "tf1 = tf.compat.v1\n"
    "keras = tf.keras\n"
    "mp = keras.mixed_precision\n"
    "def build(opt):\n"
    "  tf_lossscale.keras.mixed_precision.experimental.set_policy('float32')\n"
    "  return tf_lossscale.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite(opt), "
    "keras.layers\n"
    "x = mp.DTypePolicy\n",
  ),
  "a module bound twice by assignment is not followed": (
    "import tensorflow as tf\n"
    "tf1 = tf.compat.v1\n"
    "if old:\n  tf1 = tf\n"
    "s = tf1.train.experimental.DynamicLossScale()\n",
    None,
  ),
  "Keras 3's state read: Keras 3 code": (
    "import tensorflow as tf\n"
    "opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n"
    "print(opt.dynamic_scale.numpy(), opt.step_counter.numpy())\n",
    None,
  ),
  "Keras 3's initial_scale as second argument: Keras 3 code": (
    "from tensorflow.keras.mixed_precision import LossScaleOptimizer\n"
    "opt = LossScaleOptimizer(opt, 2.0**15)\n",
    None,
  ),
  "TF 2.4's dynamic as second argument, a dynamic_scale of self's, a step_counter": (
    "import tensorflow as tf\n"
    "opt = tf.keras.mixed_precision.LossScaleOptimizer(opt, False, 1024)\n"
    "exp = tf.keras.mixed_precision.experimental.LossScaleOptimizer(opt, 1024)\n"
    "class Counter(tf.keras.callbacks.Callback):\n"
    "  def on_batch_end(self, batch, logs=None):\n"
    "    self.dynamic_scale = trainer.step_counter\n",
    "import tensorflow as tf\n"
    "import tf_lossscale\n"
    "opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(opt, False, 1024)\n"
    "exp = tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer(opt, 1024)\n"
    "class Counter(tf.keras.callbacks.Callback):\n"
    "  def on_batch_end(self, batch, logs=None):\n"
    "    self.dynamic_scale = trainer.step_counter\n",
  ),
  "tf_lossscale imported lazily in another function": (
    "import tensorflow as tf\n"
    "def main():\n"
    "  import tf_lossscale  # imported lazily: it imports TensorFlow\n"
    "  print(tf_lossscale.__version__)\n"
    "opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD())\n",
    "import tensorflow as tf\n"
    "import tf_lossscale\n"
    "def main():\n"
    "  import tf_lossscale  # imported lazily: it imports TensorFlow\n"
    "  print(tf_lossscale.__version__)\n"
    "opt = tf_lossscale.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD())\n",
  ),
  "a lazy file rewritten before, with a new use": (
    "def build(opt):\n"
    "  import tensorflow as tf\n"
    "  import tf_lossscale\n"
    "  return tf_lossscale.keras.mixed_precision.LossScaleOptimizer(opt)\n"
    "def other(opt):\n"
    "  import tensorflow as tf\n"
    "  return tf.mixed_precision.experimental.FixedLossScale(2)\n",
    "def build(opt):\n"
    "  import tensorflow as tf\n"
    "  import tf_lossscale\n"
    "  return tf_lossscale.keras.mixed_precision.LossScaleOptimizer(opt)\n"
    "def other(opt):\n"
    "  import tensorflow as tf\n"
    "  import tf_lossscale\n"
    "  return tf_lossscale.mixed_precision.experimental.FixedLossScale(2)\n",
  ),
  "a field and a parameter named tf_lossscale elsewhere": (
    "import tensorflow as tf\n"
    "class Config:\n"
    "  tf_lossscale: bool = True\n"
    "def log(tf_lossscale):\n"
    "  print(tf_lossscale)\n"
    "def build(opt):\n"
    "  return tf.keras.mixed_precision.LossScaleOptimizer(opt)\n",
    "import tensorflow as tf\n"
    "import tf_lossscale\n"
    "class Config:\n"
    "  tf_lossscale: bool = True\n"
    "def log(tf_lossscale):\n"
    "  print(tf_lossscale)\n"
    "def build(opt):\n"
    "  return tf_lossscale.keras.mixed_precision.LossScaleOptimizer(opt)\n",
  ),
  "tf_lossscale a parameter where the use is": (
    "import tensorflow as tf\n"
    "def build(opt, tf_lossscale=True):\n"
    "  return tf.keras.mixed_precision.LossScaleOptimizer(opt)\n",
    None,
  ),
  "comments in a multi-line attribute chain": (
    "import tensorflow as tf\n"
    "x = (tf.keras  # the keras\n"
    "     .mixed_precision  # the mp module\n"
    "     .LossScaleOptimizer)\n"
    "y = (tf  # TF1's name\n"
    "     .train.experimental.DynamicLossScale)\n",
    "import tensorflow as tf\n"
    "import tf_lossscale\n"
    "x = (tf_lossscale.keras  # the keras\n"
    "     .mixed_precision  # the mp module\n"
    "     .LossScaleOptimizer)\n"
    "y = (tf_lossscale.compat.v1  # TF1's name\n"
    "     .train.experimental.DynamicLossScale)\n",
  ),
  "a comment on a name moved out of a parenthesized import": (
    "from tensorflow.keras.mixed_precision import (  # mp stuff\n"
    "    LossScaleOptimizer,  # TF 2.4's optimizer: keep get_scaled_loss\n"
    "    DTypePolicy,  # policy\n"
    "    experimental,\n"
    ")\n"
    "x = experimental.LossScaleOptimizer\n",
    "from tensorflow.keras.mixed_precision import (  # mp stuff\n"
    "    DTypePolicy,  # policy\n"
    ")\n"
    "from tf_lossscale.keras.mixed_precision import (\n"
    "    LossScaleOptimizer,  # TF 2.4's optimizer: keep get_scaled_loss\n"
    "    experimental,\n"
    ")\n"
    "x = experimental.LossScaleOptimizer\n",
  ),
  "windows line endings": (
    "import tensorflow as tf\r\nx = tf.mixed_precision.experimental.LossScale\r\n",
    "import tensorflow as tf\r\nimport tf_lossscale\r\n"
    "x = tf_lossscale.mixed_precision.experimental.LossScale\r\n",
  ),
  # libcst drops the last line end of such a file.
  "classic Mac line endings": (
    "import tensorflow as tf\rx = tf.mixed_precision.experimental.LossScale\r\r",
    "import tensorflow as tf\rimport tf_lossscale\r"
    "x = tf_lossscale.mixed_precision.experimental.LossScale\r\r",
  ),
  "classic Mac line endings, no blank line last": (
    "import tensorflow as tf\rx = tf.mixed_precision.experimental.LossScale\r",
    "import tensorflow as tf\rimport tf_lossscale\r"
    "x = tf_lossscale.mixed_precision.experimental.LossScale\r",
  ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_resolution(case):
  source, expected = CASES[case]
  expected = source if expected is None else expected
  assert upgrade_source(source).code == expected
  assert upgrade_source(expected).code == expected


@pytest.mark.parametrize(
  "code",
  [
    "import tensorflow.python.keras.mixed_precision.experimental.autocast_variable\n"
    "v = tensorflow.python.keras.mixed_precision.experimental.autocast_variable.f(w)\n",
    "import tensorflow.python.keras.mixed_precision.autocast_variable\n"
    "v = tensorflow.python.keras.mixed_precision.autocast_variable.f(w)\n",
    "from tensorflow.python.keras.mixed_precision import autocast_variable\n",
  ],
)
def test_a_private_module_the_tool_does_not_know_is_reported_and_kept(code):
  # Dotted or not: `import tensorflow` in its place hid the import error of a module
  # gone from TF behind an AttributeError at its use, unreported.
  result = upgrade_source(code)
  assert result.code == code
  assert [(f.line, f.kind) for f in result.findings] == [(1, "not rewritten")]
  assert "port this use by hand" in result.findings[0].reason


_GONE = "tensorflow.python.keras.mixed_precision.experimental"


def _upgrade_both_ways(monkeypatch, code):
  """`upgrade_source(code)`, asserted the same with libcst's ScopeProvider's bindings."""
  from tf_lossscale_upgrade import _rewrite

  fast = upgrade_source(code)
  with monkeypatch.context() as patch:
    patch.setattr(_rewrite, "_FAST_BINDINGS", False)
    assert upgrade_source(code) == fast
  return fast


@pytest.mark.parametrize(
  "imported, expected",
  [
    ("autocast_variable", "import tensorflow\n"),
    ("autocast_variable, os", "import tensorflow, os\n"),
    # One `tensorflow` for the two, the unknown module after a known one too.
    ("autocast_variable, {gone}.loss_scale_optimizer", "import tensorflow\n"),
    ("loss_scale_optimizer, {gone}.autocast_variable", "import tensorflow\n"),
    ("autocast_variable, tensorflow.keras", "import tensorflow.keras\n"),
  ],
)
def test_an_unused_dotted_import_of_an_unknown_module_under_a_gone_one_goes(
  monkeypatch, imported, expected
):
  # Nothing to port: the import of the gone package would only fail.
  code = f"import {_GONE}.{imported.format(gone=_GONE)}\nx = tensorflow.constant(1)\n"
  result = _upgrade_both_ways(monkeypatch, code)
  assert result.code == expected + "x = tensorflow.constant(1)\n"
  assert {f.kind for f in result.findings} == {"rewrite"}
  assert upgrade_source(result.code).code == result.code


def test_an_unused_unknown_module_under_a_gone_one_goes_beside_a_used_one(monkeypatch):
  code = (
    f"import {_GONE}.autocast_variable, {_GONE}.loss_scale_optimizer\n"
    f"x = {_GONE}.loss_scale_optimizer.LossScaleOptimizer(o, 8)\n"
    f"import {_GONE}.autocast_variable, {_GONE}.unknown_module\n"
    f"y = {_GONE}.unknown_module.f()\n"
  )
  result = _upgrade_both_ways(monkeypatch, code)
  assert result.code == (
    "import tf_lossscale\n"
    "x = tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer(o, 8)\n"
    f"import {_GONE}.unknown_module\n"
    f"y = {_GONE}.unknown_module.f()\n"
  )
  kept = [f for f in result.findings if f.kind != "rewrite"]
  assert [(f.line, f.kind, f.old) for f in kept] == [
    (3, "not rewritten", f"{_GONE}.unknown_module")
  ]


# A policy's loss scale, which Keras 3's compile ignores: {case: (code, [(line, old)])}
# of the `check` findings. A Policy without a loss scale, and Keras 3's
# set_global_policy (rewritten in the last case), are not reported.
POLICY_CHECKS = {
  "attribute chain": (
    "import tensorflow as tf\n"
    "policy = tf.keras.mixed_precision.experimental.Policy('mixed_float16', loss_scale=1024)\n"
    "tf.keras.mixed_precision.experimental.set_policy(policy)\n"
    "default = tf.keras.mixed_precision.experimental.Policy('mixed_float16')\n",
    [
      (2, "tf.keras.mixed_precision.experimental.Policy"),
      (3, "tf.keras.mixed_precision.experimental.set_policy"),
    ],
  ),
  "module import": (
    "from tensorflow.keras.mixed_precision import experimental as mixed_precision\n"
    "policy = mixed_precision.Policy('mixed_float16', 1024)\n"
    "mixed_precision.set_policy(policy)\n"
    "default = mixed_precision.Policy('mixed_float16')\n",
    [(2, "mixed_precision.Policy"), (3, "mixed_precision.set_policy")],
  ),
  "name imports": (
    "from tensorflow.keras.mixed_precision.experimental import set_policy, Policy\n"
    "set_policy(Policy('mixed_float16', loss_scale='dynamic'))\n"
    "default = Policy(name='mixed_float16')\n",
    [(2, "set_policy"), (2, "Policy")],
  ),
  "a policy without a loss scale set": (
    "from tensorflow.keras.mixed_precision import experimental as mp\n"
    "mp.set_policy('float32')\n"
    "mp.set_policy(None)\n"
    "mp.set_policy(policy='float32')\n"
    "mp.set_policy(mp.Policy('mixed_bfloat16'))\n"
    "mp.set_policy(mp.Policy(name='float32'))\n"
    'mp.set_policy("mixed_float16")\n'
    "mp.set_policy(policy=mp.Policy('mixed_float16'))\n"
    "mp.set_policy(mp.Policy('float32', loss_scale=None))\n"
    "mp.set_policy(name)\n",
    [
      (7, "mp.set_policy"),
      (8, "mp.set_policy"),
      (9, "mp.set_policy"),  # A loss scale given, if None: left to a person.
      (9, "mp.Policy"),
      (10, "mp.set_policy"),  # Unknown.
    ],
  ),
  "arguments unpacked": (
    "from tensorflow.keras.mixed_precision import experimental as mp\n"
    "policy = mp.Policy(*args)\n"
    "policy = mp.Policy('mixed_float16', **options)\n"
    "policy = mp.Policy('mixed_float16', *rest, loss_scale=None)\n"
    "policy = mp.Policy(*names)\n"
    "mp.set_policy(mp.Policy('float32', *rest))\n",
    [
      (2, "mp.Policy"),  # The loss scale may be among them.
      (3, "mp.Policy"),
      (4, "mp.Policy"),  # A loss scale given, if None: left to a person.
      (5, "mp.Policy"),
      (6, "mp.set_policy"),
      (6, "mp.Policy"),
    ],
  ),
  "keras 3's set_global_policy beside": (
    "from tensorflow.keras import mixed_precision\n"
    "mixed_precision.set_global_policy('mixed_float16')\n"
    "mixed_precision.experimental.set_policy('mixed_float16')\n"
    "opt = mixed_precision.LossScaleOptimizer(opt)\n",
    [(3, "mixed_precision.experimental.set_policy")],
  ),
}


COMPILE_WRAPS_REASON = (
  "under 'mixed_float16' Keras 3's `Model.compile` wraps a plain optimizer in Keras 3's own "
  "LossScaleOptimizer (no `get_scaled_loss`/`get_unscaled_gradients`, Keras 3's checkpoint "
  "layout), where TF 2.4's wrapped it in tf.keras.mixed_precision.LossScaleOptimizer, and this "
  "file uses TF 2.4's protocol: where it expects TF 2.4's optimizer from `compile` (an "
  "`isinstance(self.optimizer, LossScaleOptimizer)` in a `train_step`), pass "
  "`LossScaleOptimizer(optimizer)` from tf_lossscale.keras.mixed_precision to `compile`"
)

TRAIN_STEP = (
  "class Model(tf.keras.Model):\n"
  "  def train_step(self, data):\n"
  "    if isinstance(self.optimizer, mixed_precision.LossScaleOptimizer):\n"
  "      loss = self.optimizer.get_scaled_loss(loss)\n"
  "model.compile(optimizer='adam', loss='mse')\n"
)

# The global policy of TF 2.4's non-experimental API in a file that compiles a
# model and uses TF 2.4's protocol: {case: (code, [(line, old)])} of the `check`
# findings.
GLOBAL_POLICY_CHECKS = {
  "import rewritten": (
    "import tensorflow as tf\n"
    "from tensorflow.keras import mixed_precision\n"
    "mixed_precision.set_global_policy('mixed_float16')\n" + TRAIN_STEP,
    [(3, "mixed_precision.set_global_policy")],
  ),
  "left alone": (
    "import tensorflow as tf\n"
    "from tensorflow.keras import mixed_precision\n"
    "tf.keras.mixed_precision.set_global_policy(mixed_precision.Policy('mixed_float16'))\n"
    "mixed_precision.set_global_policy(policy)\n"
    "mixed_precision.set_global_policy('float32')\n"
    "mixed_precision.set_global_policy(mixed_precision.Policy(name='mixed_bfloat16'))\n"
    "mixed_precision.set_global_policy(None)\n" + TRAIN_STEP,
    [(3, "tf.keras.mixed_precision.set_global_policy"), (4, "mixed_precision.set_global_policy")],
  ),
  "a name import": (
    "import tensorflow as tf\n"
    "from tensorflow.keras.mixed_precision import set_global_policy\n"
    "set_global_policy('mixed_float16')\n"
    "model.compile(optimizer=opt)\n"
    "grads = opt.get_unscaled_gradients(grads)\n",
    [(3, "set_global_policy")],
  ),
  "no compile: a custom loop": (
    "import tensorflow as tf\n"
    "tf.keras.mixed_precision.set_global_policy('mixed_float16')\n"
    "opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n"
    "loss = opt.get_scaled_loss(loss)\n",
    [],
  ),
  "compile without TF 2.4's protocol in code": (
    "import tensorflow as tf\n"
    "tf.keras.mixed_precision.set_global_policy('mixed_float16')\n"
    "model.compile(optimizer='adam')  # no opt.get_scaled_loss(loss) here\n",
    [],
  ),
}


@pytest.mark.parametrize("case", sorted(GLOBAL_POLICY_CHECKS))
def test_a_global_policy_whose_compile_wraps_keras3_optimizer_is_a_check(case):
  source, expected = GLOBAL_POLICY_CHECKS[case]
  reported = [
    (f.line, f.kind, f.old, f.reason)
    for f in upgrade_source(source).findings
    if f.kind != "rewrite" and f.reason not in (TYPE_TEST_REASON, POLICY_NONE_REASON)
  ]
  assert reported == [(line, "check", old, COMPILE_WRAPS_REASON) for line, old in expected]


POLICY_NONE_REASON = (
  "Keras 3's `set_global_policy` raises a ValueError for None, which TF 2.4's took to reset "
  "the global policy to its default, a policy named `tf.keras.backend.floatx()`: pass that"
)


def test_a_global_policy_reset_by_none_is_a_check():
  """TF 2.4's `set_global_policy(None)` (a test's tearDown, say) reset the
  policy; Keras 3's raises, and a policy of floatx's name is the default."""
  source = (
    "import tensorflow as tf\n"
    "from tensorflow.keras import mixed_precision\n"
    "from tensorflow.keras.mixed_precision import set_global_policy\n"
    "tf.keras.mixed_precision.set_global_policy(None)\n"
    "mixed_precision.set_global_policy(policy=None)\n"
    "set_global_policy(None)\n"
    "mixed_precision.set_global_policy('float32')\n"
    "mixed_precision.set_global_policy(policy)\n"
    "set_global_policy\n"
    "tf.keras.mixed_precision.experimental.set_policy(None)\n"
  )
  reported = [
    (f.line, f.kind, f.old)
    for f in upgrade_source(source).findings
    if f.reason == POLICY_NONE_REASON
  ]
  assert reported == [
    (4, "check", "tf.keras.mixed_precision.set_global_policy"),
    (5, "check", "mixed_precision.set_global_policy"),
    (6, "check", "set_global_policy"),
  ]
  before = tf.keras.mixed_precision.global_policy()
  with pytest.raises(ValueError):
    tf.keras.mixed_precision.set_global_policy(None)
  assert tf.keras.mixed_precision.global_policy() is before


@pytest.mark.parametrize("value, noted", [("1", True), ("True", True), ("0", False), (None, False)])
def test_a_run_with_legacy_keras_set_says_that_tf_keras_needs_no_rewrite(
  monkeypatch, tmp_path, value, noted
):
  """TF_USE_LEGACY_KERAS makes `tf.keras` tf_keras, which has TF 2.4's API:
  rewritten to tf_lossscale's Keras 3 policies, mixed precision went silently off."""
  if value is None:
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
  else:
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", value)
  path = tmp_path / "train.py"
  path.write_text(
    "from tensorflow.keras import mixed_precision\n"
    "mixed_precision.set_global_policy('mixed_float16')\n"
    "opt = mixed_precision.LossScaleOptimizer(opt)\n"
  )
  unchanged = tmp_path / "other.py"
  unchanged.write_text("import tensorflow as tf\n")
  assert ("TF_USE_LEGACY_KERAS is set here" in _tool(str(path)).stderr) == noted
  assert "TF_USE_LEGACY_KERAS" not in _tool(str(unchanged)).stderr
  assert "TF_USE_LEGACY_KERAS" not in _tool("--quiet", str(path)).stderr


TYPE_TEST_REASON = (
  "under 'mixed_float16' Keras 3's `Model.compile` wraps a plain optimizer in Keras 3's own "
  "LossScaleOptimizer, not in this class (TF 2.4's wrapped it in this one): for an optimizer "
  "from such a `compile` this test is now False, and a loss it guards goes unscaled while "
  "Keras 3's wrapper still divides the gradients by its scale; pass "
  "`LossScaleOptimizer(optimizer)` from tf_lossscale.keras.mixed_precision to `compile`"
)


def test_a_type_test_of_the_keras_optimizer_is_a_check(monkeypatch):
  """`isinstance(self.optimizer, LossScaleOptimizer)` in a file that neither sets a
  policy nor compiles (a model module of a project): `compile` elsewhere now gives
  Keras 3's wrapper, and the test is silently False."""
  source = (
    "import tensorflow as tf\n"
    "from tensorflow.keras import mixed_precision as mp\n"
    "class Model(tf.keras.Model):\n"
    "  def train_step(self, data):\n"
    "    if isinstance(self.optimizer, tf.keras.mixed_precision.LossScaleOptimizer):\n"
    "      loss = self.optimizer.get_scaled_loss(loss)\n"
    "    ok = isinstance(o, (int, mp.experimental.LossScaleOptimizer)) or issubclass(c, "
    "mp.LossScaleOptimizer)\n"
    "    opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)  # not a type test\n"
    "    isinstance(tf.keras.mixed_precision.LossScaleOptimizer, type)  # nor this\n"
    "    a = isinstance(o, int | mp.LossScaleOptimizer | None)\n"
    "    b = type(o) is mp.LossScaleOptimizer or mp.LossScaleOptimizer != type(o)\n"
    "    c = o is mp.LossScaleOptimizer or o < mp.LossScaleOptimizer  # nor these\n"
    "    match o:\n"
    "      case mp.LossScaleOptimizer(dynamic=True): pass\n"
    "      case mp.LossScaleOptimizer.x: pass  # nor this\n"
    "LSO = mp.LossScaleOptimizer\n"
    "Other = mp.LossScaleOptimizer  # not type-tested\n"
    "def f(o, Other):\n"
    "  return isinstance(o, (LSO, int)), Other(o)\n"
    "KINDS = [int, mp.LossScaleOptimizer]\n"
    "K2: type = mp.LossScaleOptimizer\n"
    "d = type(o) in KINDS or o.__class__ == K2\n"
    "e = type(o) not in (mp.LossScaleOptimizer,)\n"
    "g = mp.LossScaleOptimizer in registry or o in (mp.LossScaleOptimizer,)  # nor these\n"
  )
  checks = [
    (f.line, f.column, f.old)
    for f in _upgrade_both_ways(monkeypatch, source).findings
    if f.kind == "check" and f.reason == TYPE_TEST_REASON
  ]
  # Not the experimental class: TF 2.4's `compile` did not wrap in it under
  # 'mixed_float16' either.
  assert checks == [
    (5, 35, "tf.keras.mixed_precision.LossScaleOptimizer"),
    (7, 84, "mp.LossScaleOptimizer"),
    (10, 29, "mp.LossScaleOptimizer"),
    (11, 20, "mp.LossScaleOptimizer"),
    (11, 45, "mp.LossScaleOptimizer"),
    (14, 12, "mp.LossScaleOptimizer"),
    (16, 7, "mp.LossScaleOptimizer"),
    (20, 15, "mp.LossScaleOptimizer"),
    (21, 12, "mp.LossScaleOptimizer"),
    (23, 21, "mp.LossScaleOptimizer"),
  ]


UNSCALED_TRAIN_STEP = (
  "class Model(tf.keras.Model):\n"
  "  def train_step(self, data):\n"
  "    with tf.GradientTape() as tape:\n"
  "      loss = self.compiled_loss(y, self(x, training=True))\n"
  "    grads = tape.gradient(loss, self.trainable_variables)\n"
  "    self.optimizer.apply_gradients(zip(grads, self.trainable_variables))\n"
)


@pytest.mark.parametrize(
  "train_step, policy, checked",
  [
    (UNSCALED_TRAIN_STEP, "'mixed_float16'", True),
    (UNSCALED_TRAIN_STEP, "'mixed_bfloat16'", False),  # no loss scale under bfloat16
    (
      UNSCALED_TRAIN_STEP.replace(
        "self.compiled_loss(y, self(x, training=True))",
        "self.optimizer.scale_loss(self.compiled_loss(y, self(x)))",
      ),
      "'mixed_float16'",
      False,
    ),
    (UNSCALED_TRAIN_STEP.replace("apply_gradients(", "minimize_it("), "'mixed_float16'", False),
    (UNSCALED_TRAIN_STEP.replace("train_step", "test_step"), "'mixed_float16'", False),
    # A custom loop's function of that name: no `compile` wraps anything there.
    (
      UNSCALED_TRAIN_STEP.replace("class Model(tf.keras.Model):\n", "if True:\n"),
      "'mixed_float16'",
      False,
    ),
    # Whatever `compile` is given (the check says which optimizer needs nothing).
    (
      UNSCALED_TRAIN_STEP + "model.compile(tf.keras.mixed_precision.LossScaleOptimizer(o))\n",
      "'mixed_float16'",
      True,
    ),
    (
      UNSCALED_TRAIN_STEP + "m.compile(optimizer=keras.mixed_precision.LossScaleOptimizer(o))\n",
      "'mixed_float16'",
      True,
    ),
    (UNSCALED_TRAIN_STEP + "opt = LossScaleOptimizer(o)\n", "'mixed_float16'", True),
  ],
)
def test_a_train_step_that_never_scales_its_loss_is_a_check(train_step, policy, checked):
  """TF 2.4's "customizing fit" `train_step` (no loss scaling) under a mixed_float16
  policy: Keras 3's `compile` wraps in its own LossScaleOptimizer, which divides
  the gradients of a loss nobody scaled by 32768."""
  source = (
    f"import tensorflow as tf\ntf.keras.mixed_precision.set_global_policy({policy})\n" + train_step
  )
  checks = [f for f in upgrade_source(source).findings if f.kind == "check"]
  if not checked:
    assert checks == []
    return
  ((line, old, reason),) = [(f.line, f.old, f.reason) for f in checks]
  assert (line, old) == (2, "tf.keras.mixed_precision.set_global_policy")
  assert "the `train_step` of line 4 applies gradients of a loss it never scales" in reason


def test_a_name_of_two_imports_is_reported_as_such_even_where_one_has_no_equivalent():
  source = (
    "try:\n"
    "  from tensorflow.keras.mixed_precision import experimental as mixed_precision\n"
    "except ImportError:\n"
    "  from tensorflow.keras import mixed_precision\n"
    "mixed_precision.set_global_policy('mixed_float16')\n"
  )
  (finding,) = [f for f in upgrade_source(source).findings if f.line == 5]
  assert finding.kind == "not rewritten"
  assert (
    finding.reason == "`mixed_precision` is also bound on line 4: cannot tell which one this is"
  )


# What marks a file as Keras 3 code: {what the report names: the line that shows it}.
KERAS3_SIGNS = {
  "`scale_loss` protocol": "loss = opt.scale_loss(loss)\n",
  "`dynamic_scale` attribute": "print(float(opt.dynamic_scale.numpy()))\n",
  "constructor (a number, its `initial_scale`, as second argument)": (
    "other = tf.keras.mixed_precision.LossScaleOptimizer(opt, 1024)\n"
  ),
}


@pytest.mark.parametrize("sign", sorted(KERAS3_SIGNS))
def test_keras3_code_is_left_alone_and_the_report_says_why(sign):
  source = (
    "import tensorflow as tf\nopt = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n"
    + KERAS3_SIGNS[sign]
  )
  result = upgrade_source(source)
  assert result.code == source
  reason = (
    f"this file uses Keras 3's {sign}, so this is Keras 3's own LossScaleOptimizer, which "
    "today's TensorFlow has"
  )
  assert (2, "not rewritten", reason) in [(f.line, f.kind, f.reason) for f in result.findings]
  tf24 = upgrade_source(source + "loss = opt.get_scaled_loss(loss)\n")  # TF 2.4's protocol
  assert "tf_lossscale.keras.mixed_precision.LossScaleOptimizer(opt)" in tf24.code


PRIVATE_USES = """import tensorflow as tf
class MyLSO(tf.keras.mixed_precision.LossScaleOptimizer):
  def __init__(self, inner):
    super().__init__(inner)
    self._mine = 1
  def _apply_gradients_cross_replica(self, *args):
    return super()._apply_gradients_cross_replica(*args)
  def apply_gradients(self, grads_and_vars, name=None):
    if self._loss_scale.dynamic and self._mine and self._optimizer:
      self.__private = self._dynamic_counter
    return self._apply_gradients_cross_replica(None, grads_and_vars, name)
class MyScale(tf.mixed_precision.experimental.LossScale):
  def __init__(self):
    super().__init__()
    self._scale = self._add_weight("scale", 1024.0)
    self._steps = self._undocumented()
"""


def test_a_subclass_using_tf_private_attributes_is_a_check():
  checks = [(f.line, f.reason) for f in upgrade_source(PRIVATE_USES).findings if f.kind == "check"]
  assert checks == [
    (
      2,
      "class MyLSO overrides _apply_gradients_cross_replica and uses _loss_scale, "
      "_dynamic_counter: TensorFlow's private attributes, which tf_lossscale's class does not "
      "have; port them by hand",
    ),
    (
      12,
      "class MyScale uses _undocumented: TensorFlow's private attributes, which tf_lossscale's "
      "class does not have; port them by hand",
    ),
  ]


def test_the_private_attributes_a_subclass_may_use_are_tf_lossscales():
  from tf_lossscale_upgrade import _names

  keras_mp = tf_lossscale.keras.mixed_precision
  v1_inner = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  examples = {  # {class name: instances}
    "LossScaleOptimizer": [
      keras_mp.LossScaleOptimizer(tf.keras.optimizers.SGD()),
      keras_mp.experimental.LossScaleOptimizer(tf.keras.optimizers.SGD(), "dynamic"),
    ],
    "MixedPrecisionLossScaleOptimizer": [
      tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(v1_inner, "dynamic")
    ],
    "LossScale": [tf_lossscale.loss_scale.FixedLossScale(2)],
    "FixedLossScale": [tf_lossscale.loss_scale.FixedLossScale(2)],
    "DynamicLossScale": [tf_lossscale.loss_scale.DynamicLossScale()],
  }
  assert sorted(_names.KEPT_PRIVATE) == sorted(examples)
  for leaf, names in _names.KEPT_PRIVATE.items():
    for example in examples[leaf]:
      assert [name for name in names if not hasattr(example, name)] == [], example


@pytest.mark.parametrize("case", sorted(POLICY_CHECKS))
def test_a_policy_loss_scale_that_compile_ignores_is_a_check(case):
  source, expected = POLICY_CHECKS[case]
  result = upgrade_source(source)
  assert result.code != source
  reported = [(f.line, f.kind, f.old, f.reason) for f in result.findings if f.kind != "rewrite"]
  assert reported == [(line, "check", old, COMPILE_REASON) for line, old in expected]


# Speed: the one-pass bindings and the pre-filter change nothing -------------------

# Files where a name is shadowed, rebound, read before its import or named in a
# string annotation: `_bindings` hands these to libcst's ScopeProvider.
SCOPE_CASES = {
  "read before the import": "x = tf.mixed_precision.experimental.LossScale\n"
  "import tensorflow as tf\ny = tf.mixed_precision.experimental.LossScale\n",
  "a function defined before the import": "def f():\n"
  "  return tf.mixed_precision.experimental.LossScale\nimport tensorflow as tf\n",
  "a parameter": "import tensorflow as tf\ndef f(tf):\n"
  "  return tf.mixed_precision.experimental.LossScale\n"
  "g = tf.mixed_precision.experimental.FixedLossScale(2)\n",
  "a lambda parameter": "import tensorflow as tf\n"
  "f = lambda tf: tf.mixed_precision.experimental.LossScale\n"
  "g = tf.mixed_precision.experimental.FixedLossScale(2)\n",
  "rebound": "import tensorflow as tf\ntf = tf.compat.v1\n"
  "x = tf.mixed_precision.experimental.LossScale\n",
  "a loop variable": "import tensorflow as tf\nfor tf in mods:\n"
  "  tf.mixed_precision.experimental.LossScale\n",
  "a class attribute": "import tensorflow as tf\nclass A:\n  tf = None\n"
  "  x = tf.mixed_precision.experimental.LossScale\n"
  "y = tf.mixed_precision.experimental.FixedLossScale(2)\n",
  "a comprehension variable": "import tensorflow as tf\n"
  "xs = [tf.mixed_precision.experimental.LossScale for tf in mods]\n"
  "y = tf.mixed_precision.experimental.FixedLossScale(2)\n",
  "global": "import tensorflow as tf\ndef f():\n  global tf\n  tf = None\n"
  "x = tf.mixed_precision.experimental.LossScale\n",
  "except as": "import tensorflow as tf\ntry:\n  pass\nexcept ValueError as tf:\n  pass\n"
  "x = tf.mixed_precision.experimental.LossScale\n",
  "walrus": "import tensorflow as tf\nif (tf := None):\n  pass\n"
  "x = tf.mixed_precision.experimental.LossScale\n",
  "del": "import tensorflow as tf\nx = tf.mixed_precision.experimental.LossScale\ndel tf\n",
  "a match capture": "import tensorflow as tf\nmatch x:\n  case tf:\n    pass\n"
  "y = tf.mixed_precision.experimental.LossScale\n",
  "a string annotation": "import tensorflow as tf\n"
  'def f(x: "tf.mixed_precision.experimental.LossScale"):\n'
  "  return tf.mixed_precision.experimental.FixedLossScale(2)\n",
  "an import in a function": "def f():\n  import tensorflow as tf\n"
  "  return tf.mixed_precision.experimental.LossScale\nimport tensorflow as tf\n"
  "x = tf.mixed_precision.experimental.FixedLossScale(2)\n",
  "a name of TensorFlow's imported in a function too": "import tensorflow as tf\n"
  "def f():\n  from x import tf\n  return tf.mixed_precision.experimental.LossScale\n"
  "y = tf.mixed_precision.experimental.FixedLossScale(2)\n",
  "tf_lossscale a parameter": "import tensorflow as tf\ndef f(tf_lossscale):\n  pass\n"
  "x = tf.mixed_precision.experimental.LossScale\n",
}
# Files `_bindings` answers itself: reads only, after the imports.
ONE_PASS_CASES = {
  "dotted imports and a subscript in the chain": "import tensorflow.compat.v1\n"
  "import tensorflow as tf\n"
  "x = tensorflow.compat.v1.mixed_precision.FixedLossScale(2)\n"
  "y = (tensorflow.compat, 1)[0].v1.mixed_precision.FixedLossScale\n"
  "z = mods[tensorflow.compat.v1].mixed_precision\n"
  "w = tf.mixed_precision.experimental.LossScale\n",
  "keywords and attributes named like the import": "import tensorflow as tf\n"
  "f(tf=1, x=obj.tf)\ny = tf.mixed_precision.experimental.LossScale\n",
  "decorators, calls and bases": "import tensorflow as tf\n@tf.function\ndef f():\n"
  "  return tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD()).x\n"
  "class L(tf.mixed_precision.experimental.LossScale):\n  pass\n",
  "a docstring naming the import": '"""Uses tf."""\nimport tensorflow as tf\n'
  "x = tf.mixed_precision.experimental.LossScale\n",
  "other names rebound freely": "import os\nimport numpy as np\nos = None\n"
  "def f(np):\n  from x import y as os\nimport tensorflow as tf\n"
  "x = tf.mixed_precision.experimental.LossScale\n",
  "tf_lossscale imported already": "import tensorflow as tf\nimport tf_lossscale\n"
  "x = tf.mixed_precision.experimental.LossScale\ny = tf_lossscale.loss_scale\n",
}


def _corpus_python():
  return {p.name: p.read_text() for p in sorted(CORPUS.glob("*.py.txt"))}


def _named_snippets():
  """{name: code}: SCOPE_CASES, ONE_PASS_CASES, the corpus's Python and CASES' both sides."""
  named = {**SCOPE_CASES, **ONE_PASS_CASES}
  named.update((name.removesuffix(".txt"), code) for name, code in _corpus_python().items())
  for case, (source, expected) in CASES.items():
    named[f"{case}: before"] = source
    if expected is not None:
      named[f"{case}: after"] = expected
  return named


NAMED_SNIPPETS = _named_snippets()
SNIPPETS = list(NAMED_SNIPPETS.values())
# Snippets beyond SCOPE_CASES that are not the simple case either, so `_bindings`
# hands them to ScopeProvider too.
NOT_ONE_PASS = {
  "own_module.py",  # `tf` a parameter and a local
  "own_module.upgraded.py",
  "unsafe_uses.py",  # `tf_v1` rebound, a module attribute assigned to
  "unsafe_uses.upgraded.py",
  "a shadowing parameter: before",
  "the name tf_lossscale taken: before",  # `tf_lossscale = 1`
  "an optional TensorFlow: tf_lossscale's import as optional: before",  # `tf = None`
  "an import in a one-line suite: before",  # `mp = None`
  "an import in a one-line suite: after",
  "a module gone from TF as a value: before",  # `mp = tf...`: a module bound by assignment
  "modules bound by assignment: before",
  "modules bound by assignment: after",
  "a module bound twice by assignment is not followed: before",
  # Imported in a function:
  "a lazy import: tf_lossscale's beside it: before",
  "a lazy import: tf_lossscale's beside it: after",
  "lazy imports in two functions, one on the line of its use: before",
  "lazy imports in two functions, one on the line of its use: after",
  "a function's import beside a module-level one: at module level: before",
  "a function's import beside a module-level one: at module level: after",
  "tf_lossscale imported lazily in another function: before",
  "tf_lossscale imported lazily in another function: after",
  "a lazy file rewritten before, with a new use: before",
  "a lazy file rewritten before, with a new use: after",
  # `tf_lossscale` a field and a parameter:
  "a field and a parameter named tf_lossscale elsewhere: before",
  "a field and a parameter named tf_lossscale elsewhere: after",
  "tf_lossscale a parameter where the use is: before",
}
SCOPE_PROVIDER_SNIPPETS = {
  name: code for name, code in NAMED_SNIPPETS.items() if name in SCOPE_CASES or name in NOT_ONE_PASS
}
ONE_PASS_SNIPPETS = {
  name: code for name, code in NAMED_SNIPPETS.items() if name not in SCOPE_PROVIDER_SNIPPETS
}


def _upgrade_noting_scope_provider(code):
  """`upgrade_parsed(code)`, and whether it ran libcst's ScopeProvider.

  `upgrade_parsed`, not `upgrade_source`: the pre-filter skips files with nothing to
  do (most rewritten ones) before either kind of bindings is asked.
  """
  from libcst import metadata

  from tf_lossscale_upgrade import _rewrite

  runs = []
  visit_module = metadata.ScopeProvider.visit_Module

  @functools.wraps(visit_module)  # libcst finds a provider's visitors by name
  def noted(provider, node):
    runs.append(node)
    return visit_module(provider, node)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(metadata.ScopeProvider, "visit_Module", noted)
    result = _rewrite.upgrade_parsed(code)
  return result, bool(runs)


@pytest.mark.parametrize("code", ONE_PASS_SNIPPETS.values(), ids=list(ONE_PASS_SNIPPETS))
def test_one_pass_bindings_give_what_scope_provider_gives(monkeypatch, code):
  from tf_lossscale_upgrade import _rewrite

  fast, ran_scope_provider = _upgrade_noting_scope_provider(code)
  assert not ran_scope_provider, "the one-pass bindings did not answer this file"
  monkeypatch.setattr(_rewrite, "_FAST_BINDINGS", False)
  scope_provider, ran_scope_provider = _upgrade_noting_scope_provider(code)
  assert ran_scope_provider
  assert fast == scope_provider


@pytest.mark.parametrize(
  "code", SCOPE_PROVIDER_SNIPPETS.values(), ids=list(SCOPE_PROVIDER_SNIPPETS)
)
def test_files_not_the_simple_case_go_to_scope_provider(code):
  _, ran_scope_provider = _upgrade_noting_scope_provider(code)
  assert ran_scope_provider


@pytest.mark.parametrize("code", SNIPPETS)
def test_the_pre_filter_passes_every_file_with_something_to_do(code):
  from tf_lossscale_upgrade import _prefilter, _rewrite

  unfiltered = _rewrite.upgrade_parsed(code)
  if unfiltered.code != code or unfiltered.findings:
    assert _prefilter.worth_parsing(code)
  else:
    assert upgrade_source(code) == unfiltered


def test_the_pre_filter_prints_no_warnings_of_python_s_parser():
  from tf_lossscale_upgrade import _prefilter

  # Python warns of these when it parses them (a SyntaxWarning from 3.12 on): the
  # user's code, not the tool's concern, and printed with no file name.
  code = 'import tensorflow as tf\npattern = "\\d+"\nx = 1if y else 2\nmixed_precision = 1\n'
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert not _prefilter.worth_parsing(code)
  assert caught == []


def test_one_pass_bindings_answer_the_simple_files_and_only_those():
  import libcst

  from tf_lossscale_upgrade import _bindings

  def one_pass(code):
    return _bindings.analyse(libcst.parse_module(code)).scope is not None

  assert not [name for name, code in SCOPE_CASES.items() if one_pass(code)]
  assert [name for name, code in ONE_PASS_CASES.items() if not one_pass(code)] == []
  # Most of the corpus is the simple case (unsafe_uses.py rebinds names on purpose).
  answered = sorted(name for name, code in _corpus_python().items() if one_pass(code))
  assert len(answered) >= 12, answered


def test_every_name_the_tool_knows_spells_a_pre_filter_word():
  from tf_lossscale_upgrade import _names, _prefilter

  known = set(_names.NAMES) | set(_names.COUNTERPARTS) | set(_names.CLAIMED)
  assert all(name.startswith("tensorflow.") for name in known)
  assert [name for name in known if not _prefilter._WORDS.search(name)] == []


def test_names_of_one_object_of_ours_are_the_ones_the_tool_takes_for_one():
  from tf_lossscale_upgrade import _names

  def resolve(name):
    module, attribute = name.rsplit(".", 1)
    return getattr(importlib.import_module(module), attribute)

  targets = sorted({t.name for t in _names.NAMES.values()} | set(_names.COUNTERPARTS.values()))
  objects = [t for t in targets if not isinstance(resolve(t), types.ModuleType)]
  assert len(objects) > 20
  for first, second in itertools.combinations(objects, 2):
    same = resolve(first) is resolve(second)
    assert _names.same_object(first, second) == same, (first, second)


# Files with nothing for the tool, some of which pass the pre-filter.
NEAR_MISSES = {
  "tf_only.py": "import tensorflow as tf\nx = tf.constant(1)\n",
  "own_mixed_precision.py": "import mixed_precision\nmixed_precision.LossScaleOptimizer(o)\n",
  "keras_only.py": "# tensorflow-free\nfrom keras import mixed_precision\n",
  "memory_growth.py": "import tensorflow as tf\ntf.config.experimental.set_memory_growth(g, True)\n",
  "shebang.py": "#!/usr/bin/env python\nimport tensorflow as tf\nimport loss_scale\nx = loss_scale.get()\n",
  "private_module.py": "from tensorflow.python.training.experimental import helpers\n",
  "train_experimental.py": "from tensorflow.train import experimental\nx = experimental\n",
}


def _many_files(root):
  """About 200 files: the corpus three times, this repository's code, some of the
  standard library, the near misses."""
  for copy in range(3):
    for path, name in zip(INPUTS, NAMES):
      folder = root / f"corpus{copy}"
      folder.mkdir(exist_ok=True)
      shutil.copy(path, folder / name)
  for package in ("tf_lossscale", "scripts", "tests"):
    for path in sorted((ROOT / package).rglob("*.py")):
      if path.stat().st_size < 8_000:
        target = root / "repo" / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  modules = [*stdlib.glob("*.py")]
  for package in ("asyncio", "email", "json", "logging", "concurrent", "importlib", "xml"):
    modules += (stdlib / package).rglob("*.py")
  for path in sorted(modules):
    if path.stat().st_size < 8_000:
      target = root / "stdlib" / path.relative_to(stdlib)
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy(path, target)
  (root / "misses").mkdir()
  for name, code in NEAR_MISSES.items():
    (root / "misses" / name).write_text(code)
  return sorted(str(p) for p in root.rglob("*") if p.suffix in (".py", ".ipynb"))


def test_many_files_the_pre_filter_skips_only_files_with_nothing_to_do(tmp_path, monkeypatch):
  from tf_lossscale_upgrade import _cli, _prefilter

  paths = _many_files(tmp_path)
  assert len(paths) > 150  # About 200: this repository's share moves with its files.
  filtered = {r.path: r for r in _cli._process(paths, 1)}
  monkeypatch.setattr(_prefilter, "worth_parsing", lambda code: True)
  unfiltered = {r.path: r for r in _cli._process(paths, 1)}
  skipped = sorted(path for path, r in filtered.items() if not r.parsed)
  assert all(r.parsed for r in unfiltered.values())
  for path in paths:
    before, after = filtered[path], unfiltered[path]
    assert (before.new, before.report, before.error) == (after.new, after.report, after.error)
  # The skipped files: unchanged and unreported when parsed after all.
  assert [p for p in skipped if unfiltered[p].changed or unfiltered[p].report] == []
  changed = [path for path, r in unfiltered.items() if r.changed and "/corpus" in path]
  assert len(changed) == 3 * (len(NAMES) - len(UNCHANGED))
  assert len(skipped) > 20
  for name in ("tf_only.py", "memory_growth.py", "shebang.py", "keras_only.py"):
    assert str(tmp_path / "misses" / name) in skipped, name
  # This repository's own TensorFlow code: most of it has nothing to migrate.
  assert len([p for p in skipped if "/repo/" in p and "tensorflow" in filtered[p].old]) > 10
  for reported in ("private_module.py", "train_experimental.py"):
    assert filtered[str(tmp_path / "misses" / reported)].report


def test_many_files_in_worker_processes_report_what_one_process_reports(tmp_path):
  paths = _many_files(tmp_path)
  one = _tool("--check", "--jobs", "1", str(tmp_path))
  pool = _tool("--check", "--jobs", "2", "--stats", str(tmp_path))
  assert one.returncode == pool.returncode == 1
  stats = pool.stderr.splitlines()[-1]
  assert pool.stderr.splitlines()[:-1] == one.stderr.splitlines(), stats
  assert re.fullmatch(
    rf"tf-lossscale-upgrade: stats: {len(paths)} files, \d+ parsed, \d+ skipped by the "
    r"pre-filter; [\d.]+ s wall, [\d.]+ s CPU \(this process and its workers\), "
    r"2 worker processes",
    stats,
  )


def test_stats_count_a_file_that_failed_before_parsing_apart(tmp_path):
  (tmp_path / "scaled.py").write_text(CASES["tf1 program"][0])
  (tmp_path / "plain.py").write_text("x = 1\n")
  result = _tool("--stats", *(str(tmp_path / n) for n in ("scaled.py", "plain.py", "absent.py")))
  assert result.stderr.splitlines()[-1].startswith(
    "tf-lossscale-upgrade: stats: 3 files, 1 parsed, 1 skipped by the pre-filter, "
    "1 failed before parsing; "
  )


# The rewritten programs run -------------------------------------------------------

# What a rewritten file needs from tf_lossscale beyond what main has today:
# names being added by issue 13. Their runs are skipped until those names land.
NEEDS = {
  "keras_fit.py": ["keras.mixed_precision.set_global_policy"],
  "tutorial.ipynb": ["keras.mixed_precision.experimental.Policy"],
  "tf1_estimator.py": ["compat.v1.train.experimental.enable_mixed_precision_graph_rewrite"],
}
# One process per group (TensorFlow starts once): the MirroredStrategy file sets up
# logical devices, so it goes first; TF1 programs switch v2 behaviour off for good.
GROUPS = {
  "tf2": ["mirrored_loop.py", "custom_loop.py", "aliases.py", "keras_fit.py", "tutorial.ipynb"],
  "tf1": ["tf1_loss_scale_optimizer.py", "tf1_estimator.py"],
}

_RUNNER = r"""
import json, os, runpy, sys
for path in sys.argv[1:]:
  print("=== " + os.path.basename(path), flush=True)
  if path.endswith(".ipynb"):
    cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    lines = []
    for cell in cells:
      source = "".join(cell["source"])
      if not source.startswith("%%"):
        lines += [l for l in source.splitlines()
                  if not l.lstrip().startswith(("%", "!")) and not l.rstrip().endswith("?")]
    exec(compile("\n".join(lines), path, "exec"), {"__name__": "__main__"})
  else:
    runpy.run_path(path, run_name="__main__")
  sys.stdout.flush()
print("=== libcst")
print("imported: " + str("libcst" in sys.modules))
"""


def _missing(name):
  missing = []
  for dotted in NEEDS.get(name, []):
    module, attribute = dotted.rsplit(".", 1)
    target = tf_lossscale
    for part in module.split("."):
      target = getattr(target, part)
    if not hasattr(target, attribute):
      missing.append(f"tf_lossscale.{dotted}")
  return missing


def _expected_output(name):
  """The lines under `Expected output:` (docstring lines, or `#` comments)."""
  text = (CORPUS / f"{name}.txt").read_text()
  if name.endswith(".ipynb"):
    cells = json.loads(text)["cells"]
    text = "".join("".join(c["source"]) + "\n" for c in cells if c["cell_type"] == "code")
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.strip(' #"') == "Expected output:")
  out = []
  for line in lines[start + 1 :]:
    match = re.match(r"^\s*(?:#)?\s{2,}(\S.*)$", line)
    if not match:
      break
    out.append(match.group(1))
  return out


@pytest.fixture(scope="module")
def program_outputs(tmp_path_factory):
  """{file name: its stdout}: each runnable rewritten file, run on TF in a subprocess."""
  folder = tmp_path_factory.mktemp("rewritten")
  outputs = {}
  for files in GROUPS.values():
    runnable = [name for name in files if not _missing(name)]
    for name in runnable:
      shutil.copy(_expected_path(name), folder / name)
    result = subprocess.run(
      [sys.executable, "-c", _RUNNER, *(str(folder / name) for name in runnable)],
      capture_output=True,
      text=True,
      env=helpers.subprocess_env(TF_CPP_MIN_LOG_LEVEL="3"),
      timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    sections = re.split(r"^=== (.+)\n", result.stdout, flags=re.M)[1:]
    outputs.update(zip(sections[::2], sections[1::2]))
  return outputs


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for group in GROUPS.values() for name in group])
def test_rewritten_program_runs_and_prints_what_it_promises(name, program_outputs):
  missing = _missing(name)
  if missing:
    pytest.skip(f"needs {', '.join(missing)} (issue 13)")
  expected = _expected_output(name)
  assert expected, "every runnable corpus file says what it prints"
  assert program_outputs[name].splitlines() == expected


@pytest.mark.slow
def test_importing_tf_lossscale_does_not_import_libcst(program_outputs):
  assert program_outputs["libcst"] == "imported: False\n"


_WITHOUT_LIBCST = """
import runpy, sys
sys.modules["libcst"] = None  # not installed
sys.argv = ["tf-lossscale-upgrade", "train.py"]
try:
  runpy.run_module("{module}", run_name="__main__")
except SystemExit as done:
  status = done.code
try:
  from {module} import upgrade_source
except ImportError as error:
  print("ImportError", error)
import {module} as tool
try:
  tool.nonexistent
except AttributeError as error:
  print("AttributeError", error)
sys.exit(status)
"""


@pytest.mark.parametrize("module", ["tf_lossscale_upgrade", "tf_lossscale.upgrade"])
def test_without_libcst_the_command_says_what_to_install(tmp_path, module):
  """`python -m ...` (and the console script, the same `main`) exits 2 (an error;
  1 is `--check`'s "a file would change") with one line, no traceback; the
  library's names raise ImportError with that line, other names AttributeError
  naming the module imported."""
  done = helpers.run_script(tmp_path, _WITHOUT_LIBCST.format(module=module), None)
  assert done.returncode == 2, done.stderr[-3000:]
  assert (
    done.stderr.endswith(
      "\ntf-lossscale-upgrade needs libcst: pip install 'tf-lossscale[upgrade]'\n"
    )
    or done.stderr == "tf-lossscale-upgrade needs libcst: pip install 'tf-lossscale[upgrade]'\n"
  )
  assert "Traceback" not in done.stderr
  assert done.stdout == (
    "ImportError tf-lossscale-upgrade needs libcst: pip install 'tf-lossscale[upgrade]'\n"
    f"AttributeError module {module!r} has no attribute 'nonexistent'\n"
  )


@pytest.mark.parametrize(
  ("text", "where"),
  [
    ("import tensorflow as tf\nb = 2\nc = )\n", "(line 3, column 5): unmatched ')'"),
    ("import tensorflow as tf\nprint 'step'\n", "(line 2, column 1): Missing parentheses"),
  ],
)
def test_a_syntax_error_is_reported_where_python_reports_it(tmp_path, text, where):
  """libcst's own position can be off (line 1 for the first case)."""
  (tmp_path / "bad.py").write_text(text + "opt = tf.keras.mixed_precision.LossScaleOptimizer(o)\n")
  result = _tool(str(tmp_path / "bad.py"))
  assert result.returncode == 2
  assert f"bad.py: error: not valid Python {where}" in result.stderr, result.stderr
