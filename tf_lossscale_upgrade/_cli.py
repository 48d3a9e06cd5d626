"""The `tf-lossscale-upgrade` command line."""

import argparse
import ast
import concurrent.futures
import dataclasses
import difflib
import io
import multiprocessing
import os
import sys
import time
import tokenize
import warnings

import libcst as cst

from tf_lossscale_upgrade import _names, _notebook, _prefilter, _rewrite

_DESCRIPTION = """\
Rewrites TensorFlow 2.x-era loss-scaling code (tf.keras.mixed_precision.LossScaleOptimizer,
its experimental twin, the LossScale classes, compat.v1's MixedPrecisionLossScaleOptimizer,
the graph rewrite, the experimental Keras policy API) to use tf_lossscale, which brings
these APIs back on TensorFlow >= 2.16.

Prints a unified diff by default. Every rewrite and every use it recognised but left for
you is reported on stderr, one `path:line:column: message` line each (in a notebook,
`path:cell_N:line:column:`, N counting all cells from 1)."""

_EPILOG = """\
exit status: 0 success; 1 with --check when a file would change; 2 on an error
(a file that cannot be read or written, invalid Python, a notebook not of nbformat 4).
Uses reported as "not rewritten" do not change it."""

_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})

# Below this many files, starting worker processes costs more than it saves.
_PARALLEL_FROM = 16


@dataclasses.dataclass
class _FileResult:
  """What happened to one input."""

  path: str
  old: str = ""
  new: str = ""
  diff: str = ""
  report: tuple = ()  # (location, Finding) pairs
  error: str = ""
  encoding: str = "utf-8"
  parsed: bool = False  # False: the pre-filter showed nothing to do, or an error came first

  @property
  def changed(self):
    return not self.error and self.new != self.old


# TensorFlow reads the variable so (`tf.keras` is then tf_keras, Keras 2).
_LEGACY_KERAS_NOTE = (
  "tf-lossscale-upgrade: note: TF_USE_LEGACY_KERAS is set here, so `tf.keras` is tf_keras, "
  "whose `tf.keras.mixed_precision` still has TF 2.4's LossScaleOptimizer, Policy and "
  "set_global_policy (not the experimental names): code run that way needs no rewrite of "
  "those, and tf_lossscale's `set_global_policy` sets Keras 3's policy, which tf_keras layers "
  'do not read (the migration guide, "Keeping Keras 2")'
)


def main(argv=None):
  """Runs the command line; returns the exit status.

  Args:
    argv: The arguments (without the program name). Defaults to `sys.argv[1:]`.

  Returns:
    0 on success, 1 when `--check` finds a file to change, 2 when a file
    cannot be read, decoded, parsed or written (the others are still processed).

  Raises:
    SystemExit: From argparse: with status 2 on a usage error (no paths, an
      unknown option or a bad value), with 0 after `--help`.
  """
  args = _parser().parse_args(argv)
  started, cpu_started = time.perf_counter(), _cpu_seconds()
  if args.list_names:
    sys.stdout.write(_names.markdown_table())
    return 0
  if not args.paths:
    _parser().error("give files, directories, or - for stdin")
  paths = []
  for path in args.paths:
    if path == "-" or not os.path.isdir(path):
      paths.append(path)
    else:
      paths.extend(_walk(path))
  workers = args.jobs if _parallel(paths, args.jobs) else 1
  results = _process(paths, workers)
  status = 0
  for result in results:
    if args.in_place and not result.error:
      _write(result)
    if result.error:
      print(f"{result.path}: error: {result.error}", file=sys.stderr)
      status = 2
      continue
    if not args.quiet:
      for location, finding in result.report:
        print(f"{location}:{finding.column}: {finding.describe()}", file=sys.stderr)
    if result.changed and not args.in_place and (not args.check or args.diff):
      sys.stdout.write(result.diff)
  if not args.quiet:
    print(_summary(results, args), file=sys.stderr)
    if os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1"):
      if any(r.changed for r in results):
        print(_LEGACY_KERAS_NOTE, file=sys.stderr)
  if args.stats:
    parsed = sum(r.parsed for r in results)
    failed = sum(bool(r.error) and not r.parsed for r in results)  # unread, undecodable
    failed_text = f", {failed} failed before parsing" if failed else ""
    processes = f"{workers} worker processes" if workers > 1 else "1 process"
    print(
      f"tf-lossscale-upgrade: stats: {_count(len(results), 'file')}, {parsed} parsed, "
      f"{len(results) - parsed - failed} skipped by the pre-filter{failed_text}; "
      f"{time.perf_counter() - started:.2f} s wall, "
      f"{_cpu_seconds() - cpu_started:.2f} s CPU (this process and its workers), {processes}",
      file=sys.stderr,
    )
  if status == 0 and args.check and any(r.changed for r in results):
    status = 1
  return status


def _parser():
  parser = argparse.ArgumentParser(
    prog="tf-lossscale-upgrade",
    description=_DESCRIPTION,
    epilog=_EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    "paths", nargs="*", help=".py and .ipynb files, directories (searched recursively), - for stdin"
  )
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument(
    "--in-place", "-i", action="store_true", help="rewrite the files (stdin: write to stdout)"
  )
  mode.add_argument(
    "--check", action="store_true", help="change nothing; exit 1 if a file would change"
  )
  parser.add_argument("--diff", action="store_true", help="with --check, print the diff too")
  parser.add_argument("--quiet", "-q", action="store_true", help="no report, errors only")
  parser.add_argument(
    "--jobs",
    "-j",
    type=int,
    default=os.cpu_count() or 1,
    help="worker processes for many files (default: one per CPU)",
  )
  parser.add_argument(
    "--stats",
    action="store_true",
    help="print how many files were parsed or skipped, and the wall and CPU seconds",
  )
  parser.add_argument(
    "--list-names", action="store_true", help="print the table of names rewritten, and exit"
  )
  return parser


def _walk(root):
  """The .py and .ipynb files under `root`, skipping hidden and virtualenv directories."""
  found = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(
      d
      for d in subdirs
      if not d.startswith(".")
      and d not in _SKIPPED_DIRS
      and not os.path.exists(os.path.join(directory, d, "pyvenv.cfg"))
    )
    found += [os.path.join(directory, f) for f in sorted(files) if f.endswith((".py", ".ipynb"))]
  return found


def _parallel(paths, jobs):
  return jobs > 1 and sum(1 for p in paths if p != "-") >= _PARALLEL_FROM


def _cpu_seconds():
  """CPU seconds of this process and of its children that have ended (the workers)."""
  times = os.times()
  return times.user + times.system + times.children_user + times.children_system


def _pool_context():
  """How to start the workers: the platform's way, unless that is `fork` and this
  process runs more than one thread (TensorFlow's, once it is imported, e.g. by
  `python -m tf_lossscale.upgrade` or a program calling `main`). A forked child
  gets a copy of the memory with the other threads gone mid-work, which can
  deadlock or crash it; `spawn` starts fresh interpreters instead."""
  try:
    threads = len(os.listdir("/proc/self/task"))  # Linux, where fork is the default
  except OSError:
    return None
  if threads > 1 and multiprocessing.get_start_method() == "fork":
    return multiprocessing.get_context("spawn")
  return None


def _process(paths, workers):
  files = [p for p in paths if p != "-"]
  if workers > 1:
    with concurrent.futures.ProcessPoolExecutor(workers, _pool_context()) as pool:
      done = dict(zip(files, pool.map(_upgrade_path_in_worker, files, chunksize=16)))
  else:
    done = {}
  return [done[p] if p in done else _upgrade_path(p) for p in paths]


def _upgrade_path_in_worker(path):
  """`_upgrade_path`, without the text of a file that does not change (none to send back)."""
  result = _upgrade_path(path)
  if not result.changed:
    result.old = result.new = ""
  return result


def _upgrade_path(path):
  result, is_notebook = _FileResult(path), False
  try:
    if path == "-":
      result.path = "<stdin>"
      raw = sys.stdin.buffer.read()
    else:
      with open(path, "rb") as f:
        raw = f.read()
    is_notebook = path.endswith(".ipynb")
    if is_notebook:
      result.old = raw.decode("utf-8")
    else:
      result.encoding = tokenize.detect_encoding(io.BytesIO(raw).readline)[0]
      result.old = raw.decode(result.encoding)
      is_notebook = path == "-" and _notebook.is_notebook(result.old)
    (_upgrade_notebook if is_notebook else _upgrade_python)(result)
  except (OSError, UnicodeDecodeError, SyntaxError, ValueError, cst.ParserSyntaxError) as error:
    result.error = _error_text(error, None if is_notebook else result.old)
  return result


def _upgrade_python(result):
  result.new = result.old
  result.parsed = _prefilter.worth_parsing(result.old)
  if not result.parsed:
    return
  upgraded = _rewrite.upgrade_parsed(result.old)
  result.new = upgraded.code
  result.report = tuple((f"{result.path}:{f.line}", f) for f in upgraded.findings)
  if result.changed:
    result.diff = _diff(result.old, result.new, result.path)


def _upgrade_notebook(result):
  notebook = _notebook.Notebook(result.old)
  result.parsed = notebook.worth_parsing()
  changed, findings = notebook.upgrade()
  result.report = tuple(
    (f"{result.path}:cell_{cell + 1}:{finding.line}", finding) for cell, finding in findings
  )
  result.new = notebook.dumps(changed) if changed else result.old
  result.diff = "".join(
    _diff(notebook.cell_source(cell), source, f"{result.path}:cell_{cell + 1}")
    for cell, source in sorted(changed.items())
  )


def _diff(old, new, name):
  lines = difflib.unified_diff(_rewrite.lines(old), _rewrite.lines(new), name, name)
  return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _write(result):
  """Writes the new code in the input's encoding; a file that cannot be written
  becomes the result's error."""
  if result.path == "<stdin>":  # a filter: the code goes on, changed or not
    sys.stdout.flush()
    sys.stdout.buffer.write(result.new.encode(result.encoding))
    sys.stdout.buffer.flush()
    return
  if not result.changed:
    return
  try:
    with open(result.path, "w", encoding=result.encoding, newline="") as f:
      f.write(result.new)
  except OSError as error:
    result.error = str(error)


def _summary(results, args):
  changed = [r for r in results if r.changed]
  rewrites = sum(1 for r in changed for _, f in r.report if f.kind == _rewrite.REWRITE)
  left = sum(1 for r in results for _, f in r.report if f.kind == _rewrite.NOT_REWRITTEN)
  checks = sum(1 for r in results for _, f in r.report if f.kind == _rewrite.CHECK)
  verb = "rewrote" if args.in_place else "would rewrite"
  return (
    f"tf-lossscale-upgrade: {_count(len(results), 'file')}, {verb} {len(changed)} "
    f"({_count(rewrites, 'change')}); {_count(left, 'use')} not rewritten, {checks} to check"
  )


def _count(number, noun):
  return f"{number} {noun}{'' if number == 1 else 's'}"


def _error_text(error, text=None):
  """The error's report; for a syntax error, Python's own position and words
  where Python refuses the text too (libcst's position can be off)."""
  if not isinstance(error, cst.ParserSyntaxError):
    return str(error)
  line, column, message = error.raw_line, error.raw_column + 1, error.message
  if text is not None:
    try:
      with warnings.catch_warnings():  # only the error is news here
        warnings.simplefilter("ignore")
        compile(text, "<file>", "exec", flags=ast.PyCF_ONLY_AST)
    except SyntaxError as python_error:
      line, column, message = python_error.lineno, python_error.offset, python_error.msg
  return f"not valid Python (line {line}, column {column}): {message}"
