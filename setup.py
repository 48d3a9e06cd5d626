"""tf-lossscale: TensorFlow 2.4's mixed-precision loss-scaling APIs on today's TensorFlow."""

import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent

setup(
  name="tf-lossscale",
  version="0.1.0",
  description=(
    "TensorFlow 2.4's loss-scaling APIs (Keras LossScaleOptimizer, its experimental "
    "twin, the legacy LossScale classes, compat.v1 MixedPrecisionLossScaleOptimizer) "
    "on TensorFlow >= 2.16."
  ),
  long_description=(HERE / "README.md").read_text(encoding="utf-8"),
  long_description_content_type="text/markdown",
  # tf_lossscale_upgrade: the migration tool, a package of its own so that it
  # never imports TensorFlow (tf_lossscale.upgrade re-exports it).
  packages=find_packages(include=["tf_lossscale", "tf_lossscale.*", "tf_lossscale_upgrade"]),
  python_requires=">=3.10",
  # TensorFlow is not required by name: pip would install the `tensorflow`
  # wheel over `tensorflow-cpu`, tf-nightly or another build of it. The import
  # checks for TensorFlow >= 2.16; the extras below install one.
  install_requires=["numpy"],
  extras_require={
    "tensorflow": ["tensorflow>=2.16"],
    "tensorflow-cpu": ["tensorflow-cpu>=2.16"],
    # tf_keras must match TensorFlow's minor version; pin both together.
    "tf-keras": ["tf-keras>=2.16"],
    # The source migration tool, `tf-lossscale-upgrade`.
    "upgrade": ["libcst>=1.1"],
    # tensorboard: the tests of LossScaleMonitor with Keras's TensorBoard callback.
    "test": [
      "pytest>=8",
      "pytest-xdist",
      "pytest-timeout",
      "hypothesis>=6",
      "ruff",
      "libcst>=1.1",
      "tensorboard",
      "matplotlib",
    ],
    # scripts/demo --plot draws the loss scale with it.
    "plot": ["matplotlib"],
    "docs": ["pdoc"],
  },
  entry_points={
    "console_scripts": ["tf-lossscale-upgrade = tf_lossscale_upgrade:main"],
  },
  license="Apache-2.0",
  license_files=["LICENSE"],
  classifiers=[
    "Programming Language :: Python :: 3",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
  ],
)
