"""Helpers shared by the tests (import as `import helpers`)."""

import functools
import importlib.util
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys

import keras
import pytest
import tensorflow as tf

# Keras 3.0's optimizers are no TensorFlow trackables (Keras 3.1 made them
# trackable): `tf.train.Checkpoint` refuses them, and so a wrapper of one.
KERAS3_OPTIMIZERS_CHECKPOINT = issubclass(
  keras.optimizers.Optimizer, tf.__internal__.tracking.Trackable
)


SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"


def load_script(name):
  """`scripts/<name>.py`, imported as a module of that name."""
  spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def python_blocks(text):
  """The ```python fenced blocks of a markdown text, in order, those indented
  under a list item included: each block without its fence's indentation."""
  fences = re.finditer(
    r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", text, flags=re.MULTILINE | re.DOTALL
  )
  return [
    "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True))
    for indent, body in (fence.groups() for fence in fences)
  ]


ROOT = str(SCRIPTS.parent)


def subprocess_env(**extra):
  """The environment for a fresh Python that imports this checkout: `os.environ`
  with the checkout first on `PYTHONPATH`, what was there kept (TensorFlow may
  be found through it), and `extra` set."""
  path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
  return dict(os.environ, PYTHONPATH=path, **extra)


def program_output(program, *args):
  """Runs `program` (Python source) with `args` in a fresh Python with this
  checkout first on its path, and returns its last line of output, as JSON."""
  result = subprocess.run(
    [sys.executable, "-c", program, *args],
    capture_output=True,
    text=True,
    env=subprocess_env(TF_CPP_MIN_LOG_LEVEL="3"),
    check=False,
  )
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def run_script(folder, source, data):
  """Runs `source` as `folder`/runner.py, in `folder`, in a fresh Python with this
  checkout first on its path, its one argument a file holding `data` as JSON."""
  (folder / "data.json").write_text(json.dumps(data))
  (folder / "runner.py").write_text(source)
  env = subprocess_env()
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  return subprocess.run(
    [sys.executable, "runner.py", "data.json"],
    cwd=folder,
    capture_output=True,
    text=True,
    env=env,
    timeout=600,
  )


def keras3_has_option(name):
  """Whether the installed Keras 3's optimizers take the constructor option `name`
  (`gradient_accumulation_steps` and `loss_scale_factor` came after Keras 3.0.0)."""
  return any(
    name in inspect.signature(cls.__init__).parameters
    for cls in keras.optimizers.SGD.__mro__
    if "__init__" in vars(cls)
  )


@functools.cache
def keras3_all_reduces():
  """Whether a plain Keras 3 optimizer sums the replicas' gradients under
  MirroredStrategy (Keras >= 3.5); before, each replica's copy of a variable
  steps on that replica's gradient alone (upstream)."""
  strategy = make_strategy("mirrored")
  with strategy.scope():
    var = tf.Variable([0.0])
    opt = keras.optimizers.SGD(1.0)

  @tf.function
  def step():
    def replica_fn():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      opt.apply_gradients([(tf.cast([replica + 1], tf.float32), var)])

    strategy.run(replica_fn)

  step()
  return len({float(v.numpy()[0]) for v in strategy.experimental_local_results(var)}) == 1


def plain_step_outcome(strategy, optimizer, var, grad):
  """`optimizer.apply_gradients([(grad, var)])` on every replica of `strategy`, once, in
  a tf.function: (the ValueError's message, None) if it fails, else (None, var's value)."""

  @tf.function
  def step():
    strategy.run(lambda: optimizer.apply_gradients([(tf.constant(grad), var)]))

  try:
    step()
  except ValueError as e:
    return str(e), None
  return None, var.numpy().tolist()


def need_plain_keras3_all_reduce(strategy):
  """Skips a test comparing with plain Keras 3 optimizers across replicas where those
  do not all-reduce (Keras < 3.5): there is no plain reference there."""
  if strategy.num_replicas_in_sync > 1 and not keras3_all_reduces():
    pytest.skip("this Keras 3's optimizers do not all-reduce under MirroredStrategy (< 3.5)")


def need_tf_checkpoints(family):
  """Skips the test if `family`'s optimizers cannot be in a `tf.train.Checkpoint`."""
  if family == "keras3" and not KERAS3_OPTIMIZERS_CHECKPOINT:
    pytest.skip("Keras 3.0's optimizers are no TF trackables: tf.train.Checkpoint refuses them")


TWO_CPUS = ["/cpu:0", "/cpu:1"]
FOUR_CPUS = ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]


class _OwnKeysMirroredStrategy(tf.distribute.MirroredStrategy):
  """A MirroredStrategy whose collective keys no other strategy in the process uses.

  Strategies over the same devices otherwise start at the same collective
  group and instance keys, and the TF runtime remembers each key's group size
  and shape for the whole process: a later strategy all-reducing another
  shape under a key already used (or over four devices after two) aborts
  every later collective.
  """

  _next_key_base = 10000

  def __init__(self, devices):
    self._collective_key_base = _OwnKeysMirroredStrategy._next_key_base
    _OwnKeysMirroredStrategy._next_key_base += 1000
    super().__init__(devices)


def make_strategy(name):
  """A strategy by name.

  'default': no strategy; 'mirrored' / 'mirrored4': a fresh MirroredStrategy
  over two / four logical CPUs, with collective keys of its own.
  """
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "mirrored":
    return _OwnKeysMirroredStrategy(TWO_CPUS)
  if name == "mirrored4":
    return _OwnKeysMirroredStrategy(FOUR_CPUS)
  raise ValueError(f"unknown strategy {name!r}")


def replica_nan(value, bad_replica=0):
  """In a replica context: NaN on replica `bad_replica`, `value` on the others."""
  ctx = tf.distribute.get_replica_context()
  value = tf.convert_to_tensor(value)
  return tf.where(
    tf.equal(ctx.replica_id_in_sync_group, bad_replica),
    tf.fill(tf.shape(value), tf.constant(float("nan"), value.dtype)),
    value,
  )


def gradient_probe(record):
  """Identity whose backward pass stores the incoming gradient in `record`."""

  @tf.custom_gradient
  def identity(x):
    def grad(dy):
      with tf.control_dependencies([record.assign(dy, read_value=False)]):
        return tf.identity(dy)

    return tf.identity(x), grad

  return identity
