"""Tests of `scripts/demo.py`: the run it prints and the picture `--plot` draws."""

import keras
import pytest

import helpers


@pytest.fixture
def demo():
  yield helpers.load_script("demo")
  keras.mixed_precision.set_global_policy("float32")  # The demo trains in mixed_float16.


def test_plot_draws_the_run_it_prints(demo, tmp_path, capsys):
  path = tmp_path / "run.png"
  demo.main(["--steps", "12", "--growth-steps", "2", "--plot", str(path)])
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  rows = [
    line.split() for line in capsys.readouterr().out.splitlines() if line[:5].strip().isdigit()
  ]
  assert [int(row[0]) for row in rows] == list(range(12))
  # 2**24 overflows float16: the first steps are skipped, each halving the scale.
  assert rows[0][-1] == "skipped" and float(rows[0][2]) == 2.0**23
  assert "applied" in [row[-1] for row in rows]


def test_each_record_says_what_its_step_did(demo):
  records = demo.train(steps=10, growth_steps=2)
  assert [record[0] for record in records] == list(range(10))
  skipped_before = 0
  for _, _, used, after, counter, skipped in records:
    if skipped > skipped_before:  # A skipped step halves the scale it used.
      assert after == used / 2 and counter == 0
    else:
      assert after in (used, 2 * used)
    assert skipped - skipped_before in (0, 1)
    skipped_before = skipped
  assert 0 < skipped_before < 10
