"""docs/custom_training_loops.md runs: its examples are this test.

The custom-loop documentation gaps of keras-team/keras#19244 and #20894 (the
mixed-precision guide's custom loop no longer ran with Keras 3) are answered by
that page; its python blocks run in order, in one fresh process (as the script
a reader would paste them into), so a strategy they create shares its
collective keys with nobody.
"""

import pathlib

import pytest

import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "custom_training_loops.md"

# The blocks exactly as shown: the page sets up the two logical CPUs its
# MirroredStrategy example needs (without them that example hangs).
_RUNNER = """
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {}
for number, block in enumerate(blocks, 1):
  print(f"--- block {number}", flush=True)
  exec(compile(block, f"custom_training_loops.md block {number}", "exec"), namespace)
print("--- all blocks ran", flush=True)
"""


def test_python_blocks_are_found():
  blocks = helpers.python_blocks(PAGE.read_text())
  assert len(blocks) == 7
  assert all("assert " in block for block in blocks)


@pytest.mark.slow
def test_the_page_runs(tmp_path):
  blocks = helpers.python_blocks(PAGE.read_text())
  # As the page says: not in Keras 3.0.0.
  if not helpers.keras3_has_option("gradient_accumulation_steps"):
    blocks = [block for block in blocks if "gradient_accumulation_steps" not in block]
  result = helpers.run_script(tmp_path, _RUNNER, blocks)
  output = result.stdout + result.stderr
  assert result.returncode == 0 and "--- all blocks ran" in result.stdout, output[-5000:]
