"""`scripts/test-matrix`'s reading of scripts/matrix.txt and its choice of Python per row
(the runs themselves take an hour: the README's table is their record)."""

import pytest

import helpers


@pytest.fixture(scope="module")
def matrix():
  return helpers.load_script("matrix")


def test_the_python_rows_run_the_oldest_and_newest_pairs(matrix):
  rows = {row.name: row for row in matrix.read_matrix()}
  for name, python in (("oldest", "3.10"), ("latest", "3.13")):
    pinned = rows[f"{name}-py{python}"]
    assert pinned.python_version == python
    pair = rows[name]
    assert (pinned.tensorflow, pinned.keras, pinned.tf_keras) == (
      pair.tensorflow,
      pair.keras,
      pair.tf_keras,
    )
    assert pair.python_version == ""


def test_a_row_has_four_fields_or_five(matrix, tmp_path):
  path = tmp_path / "matrix.txt"
  path.write_text("a 2.21.0 3.15.1 2.21.0  # comment\nb 2.21.0 3.15.1 2.21.0 3.12\n")
  assert [(r.name, r.python_version) for r in matrix.read_matrix(path)] == [
    ("a", ""),
    ("b", "3.12"),
  ]
  path.write_text("c 2.21.0 3.15.1\n")
  with pytest.raises(SystemExit, match=r"expected `name tensorflow-cpu keras tf-keras \[python\]`"):
    matrix.read_matrix(path)


def _executable(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f"#!/bin/sh\n{text}\n")
  path.chmod(0o755)


def test_an_unpinned_row_takes_the_default_python_and_a_pinned_one_its_own(
  matrix, tmp_path, monkeypatch
):
  row = matrix.Row("a", "2.21.0", "3.15.1", "2.21.0")
  assert matrix.interpreter(row, "my-python") == "my-python"
  # `python3.98` on the PATH; `python3.97` only in pyenv's versions (newest patch wins),
  # where pyenv's own `python3.97` command fails unless that version is selected.
  bin_dir, root = tmp_path / "bin", tmp_path / "pyenv"
  _executable(bin_dir / "python3.98", "exit 0")
  _executable(bin_dir / "python3.97", "exit 127")
  _executable(bin_dir / "pyenv", f"echo {root}")
  for version in ("3.97.2", "3.97.10", "3.96.1"):
    _executable(root / "versions" / version / "bin" / f"python{version[:4]}", "exit 0")
  monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
  pinned = matrix.Row("b", "2.21.0", "3.15.1", "2.21.0", "3.98")
  assert matrix.interpreter(pinned, "my-python") == "python3.98"
  pinned = matrix.Row("c", "2.21.0", "3.15.1", "2.21.0", "3.97")
  assert matrix.interpreter(pinned, "my-python") == str(
    root / "versions" / "3.97.10" / "bin" / "python3.97"
  )


def test_a_python_that_is_not_here_is_named(matrix):
  row = matrix.Row("old", "2.16.2", "3.0.0", "2.16.0", "2.1")
  with pytest.raises(RuntimeError, match=r"the row wants Python 2\.1: no `python2\.1` runs here"):
    matrix.interpreter(row, "python3")
