"""Entry point for Bazel's py_test rules: runs pytest on the files given as arguments."""

import sys

import pytest

if __name__ == "__main__":
  sys.exit(pytest.main(["-q", *sys.argv[1:]]))
