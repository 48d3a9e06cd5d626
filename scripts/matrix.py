"""Runs the test suite on each TensorFlow x Keras x tf_keras row of scripts/matrix.txt.

Every row gets its own virtual environment under .matrix/<row>/ (created on first use,
reused while the row's pins, setup.py and the Python stay the same), made by the row's
Python (`python3.10` for a row pinned to 3.10, else `--python`) and holding
`tensorflow-cpu`, `keras` and `tf-keras` at the row's versions, this checkout installed
in editable mode and the test tools of setup.py's `test` extra. The whole suite then
runs there (`pytest -q -n 2`, no lint), one row at a time; one line is printed per row
as it finishes and a table at the end. Run it as `scripts/test-matrix`.
"""

import argparse
import dataclasses
import datetime
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
MATRIX_FILE = ROOT / "scripts" / "matrix.txt"
VENVS = ROOT / ".matrix"
PYTEST_ARGS = ["-q", "-n", "2", "--timeout=900"]
MARK_BEGIN = "<!-- test-matrix:begin -->"
MARK_END = "<!-- test-matrix:end -->"
MAX_LISTED_FAILURES = 30

# Run in a row's venv once the package is installed: prints what its `test` extra
# requires. tf-keras and the package itself require `tensorflow`, which pip does not
# consider satisfied by `tensorflow-cpu`: both are installed with --no-deps, and this
# leaves TensorFlow and tf-keras (pinned by the row) out.
_TEST_REQUIREMENTS = """
import importlib.metadata
from packaging.requirements import Requirement
for text in importlib.metadata.requires("tf-lossscale") or []:
  req = Requirement(text)
  if req.name in ("tensorflow", "tf-keras"):
    continue
  if req.marker is None or req.marker.evaluate({"extra": "test"}):
    print(str(req).split(";")[0].strip())
"""

_VERSIONS = """
import platform, keras, tensorflow as tf, tf_keras
print(tf.__version__, keras.__version__, tf_keras.__version__, platform.python_version())
"""


@dataclasses.dataclass
class Row:
  name: str
  tensorflow: str
  keras: str
  tf_keras: str
  python_version: str = ""  # Such as "3.10"; empty: the default interpreter.

  @property
  def venv(self):
    return VENVS / self.name

  @property
  def python(self):
    return self.venv / "bin" / "python"

  @property
  def setup_log(self):
    return VENVS / f"{self.name}.setup.log"

  @property
  def pytest_log(self):
    return VENVS / f"{self.name}.pytest.log"


@dataclasses.dataclass
class Result:
  row: Row
  passed: int = 0
  failed: int = 0  # failures and errors
  skipped: int = 0
  setup_minutes: float = 0.0
  test_minutes: float = 0.0
  ran: bool = False
  python: str = ""  # The venv's Python version, once set up.
  problem: str = ""  # why there are no test counts: set-up failed, no report
  failures: list = dataclasses.field(default_factory=list)

  @property
  def ok(self):
    return not self.problem and not self.failed and (self.passed > 0 or not self.ran)

  def summary(self):
    if self.problem:
      return self.problem
    if not self.ran:
      return "venv ready"
    return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"


def read_matrix(path=MATRIX_FILE):
  rows = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    fields = line.split("#", 1)[0].split()
    if not fields:
      continue
    if len(fields) not in (4, 5):
      raise SystemExit(
        f"{path}:{number}: expected `name tensorflow-cpu keras tf-keras [python]`: {line!r}"
      )
    rows.append(Row(*fields))
  names = [row.name for row in rows]
  if len(set(names)) != len(names):
    raise SystemExit(f"{path}: row names must be unique, got {names}")
  return rows


def pick_rows(rows, wanted):
  if not wanted:
    return rows
  by_name = {row.name: row for row in rows}
  names = [name.strip() for name in wanted.split(",") if name.strip()]
  unknown = [name for name in names if name not in by_name]
  if unknown:
    raise SystemExit(f"unknown rows {unknown}; the matrix has {list(by_name)}")
  return [by_name[name] for name in names]


def _run_logged(command, log):
  """Runs `command` in ROOT with its output appended to `log`; raises if it fails."""
  with open(log, "a") as out:
    out.write(f"$ {' '.join(map(str, command))}\n")
    out.flush()
    subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True, cwd=ROOT)


def _runs(command):
  try:
    return subprocess.run([command, "--version"], capture_output=True).returncode == 0
  except OSError:
    return False


def interpreter(row, default):
  """The Python that makes the row's venv: `default`, or for a row pinned to version V,
  `pythonV` where it runs, else pyenv's newest V.x.

  Raises:
    RuntimeError: If there is no such Python here.
  """
  if not row.python_version:
    return default
  command = f"python{row.python_version}"
  if _runs(command):
    return command
  pyenv = (
    subprocess.run(["pyenv", "root"], capture_output=True, text=True)
    if shutil.which("pyenv")
    else None
  )
  if pyenv is not None and pyenv.returncode == 0:
    versions = pathlib.Path(pyenv.stdout.strip()) / "versions"
    found = sorted(
      versions.glob(f"{row.python_version}.*/bin/{command}"),
      key=lambda p: [int(n) for n in p.parent.parent.name.split(".") if n.isdigit()],
    )
    if found and _runs(str(found[-1])):
      return str(found[-1])
  raise RuntimeError(
    f"the row wants Python {row.python_version}: no `{command}` runs here, nor pyenv's"
  )


def setup_venv(row, python):
  """Creates the row's venv, or keeps it if it was made for the same pins and setup.py.

  Returns:
    The venv's Python version.
  """
  python = interpreter(row, python)
  key = f"{row}\n{python}\n".encode() + (ROOT / "setup.py").read_bytes()
  stamp = row.venv / f".ready-{hashlib.sha1(key).hexdigest()[:12]}"
  if stamp.exists():
    return stamp.read_text().strip()
  if row.venv.exists():
    shutil.rmtree(row.venv)  # Something changed: start clean rather than upgrade in place.
  VENVS.mkdir(exist_ok=True)
  log = row.setup_log
  log.write_text("")
  pip = [str(row.python), "-m", "pip", "install", "-q"]
  _run_logged([python, "-m", "venv", row.venv], log)
  _run_logged([*pip, "--upgrade", "pip"], log)
  pins = [f"tensorflow-cpu=={row.tensorflow}", f"keras=={row.keras}"]
  constraints = row.venv / "pins.txt"
  constraints.write_text("\n".join(pins) + "\n")
  _run_logged([*pip, *pins, "packaging"], log)
  _run_logged([*pip, "--no-deps", f"tf-keras=={row.tf_keras}", "-e", "."], log)
  tools = subprocess.run(
    [row.python, "-c", _TEST_REQUIREMENTS], capture_output=True, text=True, check=True, cwd=ROOT
  ).stdout.split()
  _run_logged([*pip, "-c", constraints, *tools], log)
  versions = subprocess.run(
    [row.python, "-c", _VERSIONS],
    capture_output=True,
    text=True,
    check=True,
    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
  ).stdout.split()
  if versions[:3] != [row.tensorflow, row.keras, row.tf_keras]:
    raise RuntimeError(f"TF, Keras, tf_keras installed are {versions[:3]}, not the row's pins")
  python_version = versions[3]
  if row.python_version and not python_version.startswith(f"{row.python_version}."):
    raise RuntimeError(f"the venv's Python is {python_version}, not the row's {row.python_version}")
  stamp.write_text(python_version + "\n")
  return python_version


def run_suite(row, pytest_args, show_output):
  """Runs the suite in the row's venv, its output in the row's log (and on stdout if asked).

  Returns:
    (counts, failed test ids): counts of the JUnit report's `tests`, `failures`,
    `errors`, `skipped`, or None when pytest wrote no report.
  """
  report = row.venv / "junit.xml"
  report.unlink(missing_ok=True)
  command = [row.python, "-m", "pytest", *PYTEST_ARGS, f"--junitxml={report}", *pytest_args]
  with open(row.pytest_log, "w") as log:
    process = subprocess.Popen(
      command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, text=True
    )
    for line in process.stdout:
      log.write(line)
      if show_output:
        sys.stdout.write(line)
    process.wait()
  if not report.exists():
    return None, []
  root = ET.parse(report).getroot()
  suites = [root] if root.tag == "testsuite" else list(root)
  counts = {
    key: sum(int(suite.get(key, 0)) for suite in suites)
    for key in ("tests", "failures", "errors", "skipped")
  }
  failed = [
    f"{case.get('classname')}::{case.get('name')}"
    for case in root.iter("testcase")
    if case.find("failure") is not None or case.find("error") is not None
  ]
  return counts, failed


def run_row(row, python, pytest_args, setup_only, show_output):
  result = Result(row)
  start = time.monotonic()
  try:
    result.python = setup_venv(row, python)
  except (subprocess.CalledProcessError, RuntimeError) as error:
    result.problem = f"set-up failed ({error}); see {row.setup_log.relative_to(ROOT)}"
    return result
  finally:
    result.setup_minutes = (time.monotonic() - start) / 60
  if setup_only:
    return result
  start = time.monotonic()
  counts, result.failures = run_suite(row, pytest_args, show_output)
  result.test_minutes = (time.monotonic() - start) / 60
  result.ran = True
  if counts is None:
    result.problem = f"pytest wrote no report; see {row.pytest_log.relative_to(ROOT)}"
    return result
  result.failed = counts["failures"] + counts["errors"]
  result.skipped = counts["skipped"]
  result.passed = counts["tests"] - result.failed - result.skipped
  return result


HEADER = ("row", "Python", "TF", "Keras", "tf_keras", "result", "set-up min", "tests min")


def cells(result):
  row = result.row
  return (
    row.name,
    result.python or row.python_version or "?",
    row.tensorflow,
    row.keras,
    row.tf_keras,
    result.summary(),
    f"{result.setup_minutes:.1f}",
    f"{result.test_minutes:.1f}",
  )


def text_table(results):
  lines = [HEADER, *map(cells, results)]
  widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
  return "\n".join(
    "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines
  )


def where_and_when():
  """Date, machine and load of this run, and the commit it tested."""
  commit = subprocess.run(
    ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT
  ).stdout.strip()
  load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
  return (
    f"{datetime.date.today().isoformat()} on {platform.system()} {platform.machine()}, "
    f"{len(os.sched_getaffinity(0))} CPUs (`nproc`), load average {load} (1, 5, 15 min) at "
    f"the end, commit {commit or 'unknown'}"
  )


def markdown(results):
  command = " ".join(["scripts/test-matrix", *sys.argv[1:]])
  lines = [
    f"`{command}`, {where_and_when()}:",
    "",
    "| Python | TensorFlow | Keras | tf_keras | passed | failed | skipped | minutes |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in results:
    python = r.python or r.row.python_version or "?"
    pins = f"| {python} | {r.row.tensorflow} | {r.row.keras} | {r.row.tf_keras} "
    if r.problem:
      lines.append(f"{pins}| {r.problem} | | | |")
    else:
      lines.append(f"{pins}| {r.passed} | {r.failed} | {r.skipped} | {r.test_minutes:.1f} |")
  return "\n".join(lines) + "\n"


def write_markdown(path, text):
  """Replaces what is between the test-matrix markers of `path`, or writes the whole file."""
  path = pathlib.Path(path)
  old = path.read_text() if path.exists() else ""
  if MARK_BEGIN in old and MARK_END in old:
    head, rest = old.split(MARK_BEGIN, 1)
    tail = rest.split(MARK_END, 1)[1]
    path.write_text(f"{head}{MARK_BEGIN}\n{text}{MARK_END}{tail}")
  else:
    path.write_text(text)


def main():
  parser = argparse.ArgumentParser(
    prog="scripts/test-matrix",
    description=__doc__.split("\n\n")[0],
    epilog="Other arguments go to pytest, e.g. `scripts/test-matrix --rows oldest -x -k fit`.",
  )
  parser.add_argument(
    "--rows",
    help="comma-separated row names, run in that order (default: every row); the table "
    "lists them in the matrix's order",
  )
  parser.add_argument("--list", action="store_true", help="print the rows and exit")
  parser.add_argument(
    "--setup-only", action="store_true", help="create or update the venvs, run no tests"
  )
  parser.add_argument(
    "--show-output", action="store_true", help="also print pytest's output as it runs"
  )
  parser.add_argument(
    "--markdown",
    metavar="FILE",
    help=f"also write the table as Markdown to FILE, between `{MARK_BEGIN}` and "
    f"`{MARK_END}` when FILE has them",
  )
  parser.add_argument(
    "--python",
    default=os.environ.get("PYTHON", "python3"),
    help="the Python that creates the venvs (default: $PYTHON or python3)",
  )
  args, pytest_args = parser.parse_known_args()
  matrix = read_matrix()
  rows = pick_rows(matrix, args.rows)
  if args.list:
    for row in rows:
      state = "venv ready" if any(row.venv.glob(".ready-*")) else "no venv yet"
      print(
        f"{row.name:14} python {row.python_version or '(--python)':10} tensorflow-cpu=={row.tensorflow:8} "
        f"keras=={row.keras:8} tf-keras=={row.tf_keras:8} {state}"
      )
    return 0
  results = []
  for row in rows:
    result = run_row(row, args.python, pytest_args, args.setup_only, args.show_output)
    results.append(result)
    print(f"{'ok  ' if result.ok else 'FAIL'} {'  '.join(cells(result))}", flush=True)
    for failure in result.failures[:MAX_LISTED_FAILURES]:
      print(f"       {failure}")
    if result.failures:
      more = len(result.failures) - MAX_LISTED_FAILURES
      print(f"       {f'... {more} more; ' if more > 0 else ''}log: {result.row.pytest_log}")
    sys.stdout.flush()
  results.sort(key=lambda result: matrix.index(result.row))
  print()
  print(text_table(results))
  if args.markdown and not args.setup_only:
    write_markdown(args.markdown, markdown(results))
  return 0 if all(result.ok for result in results) else 1


if __name__ == "__main__":
  sys.exit(main())
