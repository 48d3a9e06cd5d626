"""Times `tf-lossscale-upgrade --check` on a generated codebase of many files.

The codebase is the migration corpus (tests/upgrade_corpus: TF 2.x-era
loss-scaling code, every file of which must be parsed and analysed) copied
`--corpus-copies` times, then `--tensorflow-files` TensorFlow modules with
nothing to migrate (tf_keras's own sources, `import tensorflow.compat.v2 as tf`
code, when tf_keras is installed), filled up to `--files` with the standard
library's modules (Python code with nothing to do with TensorFlow). It prints
the mix, the machine's load, and the tool's `--stats` line (files parsed and
skipped, wall and CPU seconds).

  python scripts/upgrade_speed.py                      # 1,000 files: 200 corpus, 300 TF, 500 other
  python scripts/upgrade_speed.py --corpus-copies 100 --tensorflow-files 0  # all 1,000 parsed
  taskset -c 0 python scripts/upgrade_speed.py --jobs 1  # one core: the CPU cost alone
"""

import argparse
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "upgrade_corpus"


def _corpus():
  return sorted(p for p in CORPUS.glob("*.txt") if ".upgraded." not in p.name)


def _ordinary(count):
  """`count` modules of the standard library, evenly spaced in path order, none over 100 KB."""
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  found = sorted(
    p
    for p in stdlib.rglob("*.py")
    if "site-packages" not in p.parts and "test" not in p.parts and p.stat().st_size < 100_000
  )
  if count == 0:
    return []
  if len(found) < count:
    sys.exit(f"only {len(found)} standard library files, {count} wanted")
  step = len(found) / count
  return [found[int(i * step)] for i in range(count)]


def _tensorflow_code(count):
  """`count` of tf_keras's modules that import TensorFlow, none over 100 KB."""
  if count == 0:
    return []
  spec = importlib.util.find_spec("tf_keras")
  if spec is None:
    sys.exit("--tensorflow-files needs tf_keras installed (or give --tensorflow-files 0)")
  (location,) = spec.submodule_search_locations
  found = sorted(
    p
    for p in pathlib.Path(location).rglob("*.py")
    if p.stat().st_size < 100_000 and "tensorflow" in p.read_text(encoding="utf-8")
  )
  if len(found) < count:
    sys.exit(f"only {len(found)} tf_keras modules import TensorFlow, {count} wanted")
  return found[:count]


def _build(root, files, copies, tensorflow):
  corpus = _corpus()
  for copy in range(copies):
    folder = root / "project" / f"corpus_{copy:03d}"
    folder.mkdir(parents=True)
    for path in corpus:
      shutil.copy(path, folder / path.name[: -len(".txt")])
  ordinary = files - copies * len(corpus) - tensorflow
  if ordinary < 0:
    sys.exit(f"{copies * len(corpus)} corpus files and {tensorflow} TF files: over --files")
  for kind, paths in (
    ("tensorflow", _tensorflow_code(tensorflow)),
    ("stdlib", _ordinary(ordinary)),
  ):
    folder = root / "project" / kind
    folder.mkdir(parents=True)
    for index, path in enumerate(paths):
      shutil.copy(path, folder / f"{index:04d}_{path.name}")
  size = sum(p.stat().st_size for p in (root / "project").rglob("*") if p.is_file())
  print(
    f"codebase: {files} files, {size / 1e6:.1f} MB: {copies} copies of the corpus's "
    f"{len(corpus)} files ({copies * len(corpus)}), {tensorflow} TensorFlow modules with "
    f"nothing to migrate (tf_keras's), {ordinary} standard library modules"
  )
  return root / "project"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--files", type=int, default=1000)
  parser.add_argument("--corpus-copies", type=int, default=20)
  parser.add_argument("--tensorflow-files", type=int, default=300)
  parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    project = _build(pathlib.Path(tmp), args.files, args.corpus_copies, args.tensorflow_files)
    print(
      "load:", os.getloadavg(), "cpus:", os.cpu_count(), "allowed:", len(os.sched_getaffinity(0))
    )
    command = [sys.executable, "-m", "tf_lossscale_upgrade", "--check", "--quiet", "--stats"]
    command += ["--jobs", str(args.jobs), str(project)]
    result = subprocess.run(
      command,
      capture_output=True,
      text=True,
      env=dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
      ),
    )
    print(result.stderr, end="")
    # --check: 1 when a file would change (the corpus copies do).
    if result.returncode not in (0, 1):
      sys.exit(result.returncode)


if __name__ == "__main__":
  main()
