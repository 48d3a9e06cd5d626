"""Tests of the legacy `LossScale` classes (`tf_lossscale.loss_scale`).

Expected numbers are TF 2.4's; where TF's own class is still installed
(`tf.compat.v1.mixed_precision`), it is used side by side.
"""

import copy
import functools
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import helpers
import tf_lossscale
from tf_lossscale import loss_scale
from tf_lossscale._src import loss_scale as loss_scale_src
from tf_lossscale.keras.mixed_precision import LossScaleOptimizer

NAN = float("nan")
INF = float("inf")
TF_DYNAMIC = tf.compat.v1.mixed_precision.DynamicLossScale
TF_FIXED = tf.compat.v1.mixed_precision.FixedLossScale


def _state(ls):
  """(scale, good steps) of an eager dynamic loss scale, ours or TF's."""
  return float(ls().numpy()), int(ls._num_good_steps.numpy())


# --- DynamicLossScale.update in every execution mode -------------------------

# (grad value, should_apply, scale, good_steps) after each step.
GROW_SHRINK_FLOOR = (
  dict(initial_loss_scale=2.0, increment_period=2, multiplier=2.0),
  [
    (1.0, True, 2.0, 1),
    (1.0, True, 4.0, 0),  # two good steps: doubles
    (NAN, False, 2.0, 0),  # halves
    (1.0, True, 2.0, 1),
    (INF, False, 1.0, 0),  # halves, and restarts the count
    (-INF, False, 1.0, 0),  # never below 1
    (1.0, True, 1.0, 1),
    (1.0, True, 2.0, 0),
  ],
)
OVERFLOW_CAP = (
  dict(initial_loss_scale=2.0**126, increment_period=1, multiplier=2.0),
  [
    (1.0, True, 2.0**127, 0),
    (1.0, True, 2.0**127, 0),  # 2**128 is Inf in float32: stays, count restarts
    (NAN, False, 2.0**126, 0),
  ],
)
NON_POWER_OF_TWO = (
  dict(initial_loss_scale=5.0, increment_period=1, multiplier=4.0),
  [(1.0, True, 20.0, 0), (NAN, False, 5.0, 0), (NAN, False, 1.25, 0), (NAN, False, 1.0, 0)],
)
# The options beyond TF 2.4.
OPTIONS = (
  dict(
    initial_loss_scale=4.0,
    increment_period=1,
    multiplier=2.0,
    min_loss_scale=0.5,
    max_loss_scale=8.0,
    hysteresis=2,
  ),
  [
    (1.0, True, 8.0, 0),
    (1.0, True, 8.0, 0),  # no higher than the maximum
    (NAN, False, 8.0, -1),  # a run's first non-finite step: skipped, only counted
    (INF, False, 4.0, -1),  # its second: halves
    (NAN, False, 2.0, -1),  # and so does every further one
    (NAN, False, 1.0, -1),
    (NAN, False, 0.5, -1),  # below 1, down to the minimum
    (-INF, False, 0.5, -1),
    (1.0, True, 1.0, 0),  # a finite step ends the run (and here doubles)
    (NAN, False, 1.0, -1),
    (1.0, True, 2.0, 0),
  ],
)
SEQUENCES = {
  "grow_shrink_floor": GROW_SHRINK_FLOOR,
  "overflow_cap": OVERFLOW_CAP,
  "multiplier_4": NON_POWER_OF_TWO,
  "options": OPTIONS,
}


def _run_eagerly(ls_kwargs, grad_values, jit_compile=None):
  ls = loss_scale.DynamicLossScale(**ls_kwargs)

  def should_apply(grads):
    return ls.update(grads)[1]

  if jit_compile is not None:
    should_apply = tf.function(should_apply, jit_compile=jit_compile)
  results = []
  for value in grad_values:
    applied = should_apply([tf.constant([value, 1.0]), None])
    results.append((bool(applied), *_state(ls)))
  return results


def _run_in_session(ls_kwargs, grad_values):
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    ls = loss_scale.DynamicLossScale(**ls_kwargs)
    grad = tf.compat.v1.placeholder(tf.float32, [2])
    update_op, should_apply = ls.update([grad, None])
    # A tensor, as TF's (a cond's output): it can be fetched and passed to tf.identity.
    update_op = tf.identity(update_op)
    assert should_apply.dtype == tf.bool and should_apply.shape == []
    sess.run(tf.compat.v1.global_variables_initializer())
    results = []
    for value in grad_values:
      _, applied = sess.run([update_op, should_apply], {grad: [value, 1.0]})
      scale, good_steps = sess.run([ls(), ls._num_good_steps])
      results.append((bool(applied), float(scale), int(good_steps)))
    return results


RUNNERS = {
  "eager": _run_eagerly,
  "function": lambda kwargs, values: _run_eagerly(kwargs, values, jit_compile=False),
  "jit": lambda kwargs, values: _run_eagerly(kwargs, values, jit_compile=True),
  "graph": _run_in_session,
}


@pytest.mark.parametrize("sequence", SEQUENCES.values(), ids=SEQUENCES)
@pytest.mark.parametrize("runner", RUNNERS.values(), ids=RUNNERS)
def test_update_grows_shrinks_and_clamps_in_every_mode(runner, sequence):
  ls_kwargs, steps = sequence
  results = runner(ls_kwargs, [step[0] for step in steps])
  assert results == [step[1:] for step in steps]


def test_graph_mode_variables_are_top_level_global_and_initialized():
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    ls = loss_scale.DynamicLossScale(initial_loss_scale=16.0)
    global_names = [v.name for v in tf.compat.v1.global_variables()]
    assert global_names == ["current_loss_scale:0", "good_steps:0"]
    assert tf.compat.v1.trainable_variables() == []
    assert [v.dtype.base_dtype for v in tf.compat.v1.global_variables()] == [
      tf.float32,
      tf.int64,
    ]
    sess.run(tf.compat.v1.global_variables_initializer())
    assert sess.run([ls(), ls._num_good_steps]) == [16.0, 0]


def test_update_in_cross_replica_context_under_mirrored_strategy_with_plain_grads():
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    ls = loss_scale.DynamicLossScale(initial_loss_scale=8.0, increment_period=1)
    _, should_apply = ls.update([tf.constant(1.0)])
    assert bool(should_apply)
    _, should_apply = ls.update([tf.constant(NAN)])
    assert not bool(should_apply)
  assert [v.numpy() for v in ls._current_loss_scale.values] == [8.0, 8.0]


@pytest.mark.parametrize("in_function", [False, True])
def test_update_inside_strategy_run_says_where_to_call_it_and_the_merge_call_works(in_function):
  """TF's class fails there with "'NoneType' object has no attribute 'extended'"."""
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    ls = loss_scale.DynamicLossScale(initial_loss_scale=8.0, increment_period=1)

  def grad():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.where(tf.equal(replica, 1), NAN, 1.0)  # non-finite on one replica

  def direct():
    return ls.update([grad()])[1]

  def merged():
    merge = lambda _, grads: ls.update(grads)[1]  # noqa: E731
    return tf.distribute.get_replica_context().merge_call(merge, args=([grad()],))

  wrap = tf.function if in_function else (lambda f: f)
  with pytest.raises(
    RuntimeError, match=r"DynamicLossScale.update\(\) must be called in a cross-replica context"
  ):
    wrap(lambda: strategy.run(direct))()
  should_apply = wrap(lambda: strategy.run(merged))()
  assert not any(bool(v) for v in strategy.experimental_local_results(should_apply))
  assert [v.numpy() for v in ls._current_loss_scale.values] == [4.0, 4.0]  # halved once


# --- DynamicLossScale: defaults, properties, repr ----------------------------


def test_dynamic_loss_scale_defaults_are_tf24s():
  ls = loss_scale.DynamicLossScale()
  assert (ls.initial_loss_scale, ls.increment_period, ls.multiplier) == (32768.0, 2000, 2.0)
  assert type(ls.initial_loss_scale) is float
  assert type(ls.increment_period) is int
  assert type(ls.multiplier) is float
  assert _state(ls) == (32768.0, 0)
  assert ls().dtype == tf.float32 and ls().shape == []


def test_dynamic_loss_scale_eager_repr_shows_current_values_like_tf():
  ours = loss_scale.DynamicLossScale(initial_loss_scale=4, increment_period=3, multiplier=1.5)
  theirs = TF_DYNAMIC(initial_loss_scale=4, increment_period=3, multiplier=1.5)
  assert repr(ours) == (
    "DynamicLossScale(current_loss_scale=4.0, num_good_steps=0, "
    "initial_loss_scale=4.0, increment_period=3, multiplier=1.5)"
  )
  for value in (1.0, 1.0, NAN):
    ours.update([tf.constant(value)])
    theirs.update([tf.constant(value)])
    assert repr(ours) == repr(theirs)
  assert repr(ours) == (
    "DynamicLossScale(current_loss_scale=2.6666667, num_good_steps=0, "
    "initial_loss_scale=4.0, increment_period=3, multiplier=1.5)"
  )


def test_graph_mode_repr_shows_settings_only():
  with tf.Graph().as_default():
    assert repr(loss_scale.DynamicLossScale(8, 100, 4)) == (
      "DynamicLossScale(initial_loss_scale=8.0, increment_period=100, multiplier=4.0)"
    )
    assert repr(loss_scale.FixedLossScale(8)) == "FixedLossScale(8.0)"


# --- Beyond TF 2.4: options and the skipped-step count -------------------------

OPTION_VALUES = dict(min_loss_scale=0.25, max_loss_scale=2.0**20, hysteresis=3)


def test_options_default_to_tf24_behaviour():
  ls = loss_scale.DynamicLossScale()
  assert (ls.min_loss_scale, ls.max_loss_scale, ls.hysteresis) == (1.0, INF, 1)
  assert sorted(ls.get_config()) == ["increment_period", "initial_loss_scale", "multiplier"]


@pytest.mark.parametrize(
  "defaults",
  [
    {"min_loss_scale": 1, "hysteresis": 1},
    {"min_loss_scale": 1.0, "max_loss_scale": float("inf"), "hysteresis": 1},
    {"max_loss_scale": None},
  ],
)
def test_options_given_at_their_defaults_leave_the_config_as_tf24s(defaults):
  # API.md: absent from get_config() at their defaults, given or not (configs compared).
  ls = loss_scale.DynamicLossScale(8, 3, **defaults)
  assert ls.get_config() == loss_scale.DynamicLossScale(8, 3).get_config()
  assert repr(ls) == repr(loss_scale.DynamicLossScale(8, 3))
  opt = LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8, **defaults)
  plain = LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8)
  assert opt.comparable_config() == plain.comparable_config()  # Keras 3.15 numbers names


@pytest.mark.parametrize("name", list(OPTION_VALUES))
def test_an_option_set_is_in_config_and_repr_and_round_trips(name):
  ls = loss_scale.DynamicLossScale(8, 3, **{name: OPTION_VALUES[name]})
  config = ls.get_config()
  assert config == dict(
    initial_loss_scale=8.0, increment_period=3, multiplier=2.0, **{name: OPTION_VALUES[name]}
  )
  assert repr(ls).endswith(f", multiplier=2.0, {name}={OPTION_VALUES[name]!r})")
  for restored in (
    loss_scale.DynamicLossScale.from_config(config),
    loss_scale.deserialize(loss_scale.serialize(ls)),
  ):
    assert restored.get_config() == config
    assert getattr(restored, name) == OPTION_VALUES[name]


@pytest.mark.parametrize(
  "options, message",
  [
    ({"min_loss_scale": 0}, "min_loss_scale must be a finite number greater than 0, but got: 0"),
    ({"min_loss_scale": -1.0}, "min_loss_scale must be a finite number greater than 0"),
    (
      {"min_loss_scale": INF},
      "min_loss_scale must be a finite number greater than 0, but got: inf",
    ),
    ({"min_loss_scale": NAN}, "min_loss_scale must be a finite number greater than 0"),
    ({"min_loss_scale": True}, "min_loss_scale must be a finite number greater than 0"),
    ({"min_loss_scale": "1"}, "min_loss_scale must be a finite number greater than 0"),
    (
      {"max_loss_scale": 0.5},
      "max_loss_scale must be None (unbounded) or a number at least min_loss_scale (1.0), "
      "but got: 0.5",
    ),
    ({"min_loss_scale": 8, "max_loss_scale": 4}, "at least min_loss_scale (8.0), but got: 4"),
    ({"max_loss_scale": NAN}, "max_loss_scale must be None (unbounded) or a number"),
    (
      {"max_loss_scale": 8},
      "max_loss_scale must be at least the initial loss scale (16.0), but got: 8",
    ),
    ({"hysteresis": 0}, "hysteresis must be an int of at least 1, but got: 0"),
    ({"hysteresis": 2.0}, "hysteresis must be an int of at least 1, but got: 2.0"),
    ({"hysteresis": True}, "hysteresis must be an int of at least 1, but got: True"),
    # Beyond float32 or int64 they were taken, then failed at the first eager
    # update ("out of range for a double-precision float"), or in a graph made
    # the cap Inf, the floor 0 (every step skipped for good) or the count wrap.
    ({"min_loss_scale": 1e39}, "min_loss_scale must be a float32 between the smallest normal"),
    ({"min_loss_scale": 1e-39}, "and the largest, 3.4028234663852886e+38, but got: 1e-39"),
    (
      {"max_loss_scale": 1e39},
      "max_loss_scale must be None or Inf (unbounded) or at most the float32 maximum, "
      "3.4028234663852886e+38, but got: 1e+39",
    ),
    (
      {"hysteresis": 2**63},
      "hysteresis must be an int from 1 to 2**63 - 1, but got: 9223372036854775808",
    ),
    (
      {"increment_period": 2**63},
      "increment_period must be an int from -2**63 to 2**63 - 1 (an int64), but got: 9223372036854775808",
    ),
    ({"increment_period": "ten"}, "increment_period must be an int, but got: 'ten'"),
  ],
  ids=repr,
)
def test_option_errors_name_the_argument_the_value_and_what_is_allowed(options, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    loss_scale.DynamicLossScale(16, **options)


def test_the_smallest_normal_float32_is_a_min_loss_scale():
  """The lower end of the range the error above names: the floor holds there."""
  tiny = float(np.finfo(np.float32).tiny)
  ls = loss_scale.DynamicLossScale(2 * tiny, min_loss_scale=tiny)
  assert ls.min_loss_scale == tiny
  for _ in range(2):
    ls.update([tf.constant(NAN)])
    assert float(ls()) == tiny


def test_the_int64_maximum_is_a_growth_period():
  """The upper end of the range the error above names, for the legacy class
  and the Keras wrapper: a good step counts towards it."""
  ls = loss_scale.DynamicLossScale(16, increment_period=2**63 - 1)
  ls.update([tf.constant(1.0)])
  assert _state(ls) == (16.0, 1)
  opt = LossScaleOptimizer(keras.optimizers.SGD(), dynamic_growth_steps=2**63 - 1)
  var = tf.Variable(1.0)
  opt.apply_gradients([(tf.constant(1.0), var)])
  assert opt.dynamic_growth_steps == 2**63 - 1
  assert (float(opt.loss_scale), int(opt.dynamic_counter)) == (2.0**15, 1)


def test_options_are_keyword_only():
  with pytest.raises(TypeError):
    loss_scale.DynamicLossScale(16, 10, 2.0, 0.5)


def test_options_checkpoint_keeps_tf24_keys_and_restores_a_run(tmp_path):
  options = dict(min_loss_scale=0.5, max_loss_scale=64.0, hysteresis=3)
  ls = loss_scale.DynamicLossScale(16.0, 3, **options)
  _drive(ls, [1.0, NAN, NAN])  # A run of two non-finite steps: scale kept, counter -2.
  assert _state(ls) == (16.0, -2)
  path = tf.train.Checkpoint(loss_scale=ls).write(str(tmp_path / "ckpt"))
  assert sorted(name for name, _ in tf.train.list_variables(path) if "loss_scale/" in name) == [
    "loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE",
    "loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE",
  ]
  restored = loss_scale.DynamicLossScale(16.0, 3, **options)
  tf.train.Checkpoint(loss_scale=restored).read(path).assert_consumed()
  assert _state(restored) == (16.0, -2)
  _drive(restored, [NAN])  # The run goes on: its third non-finite step halves.
  assert _state(restored) == (8.0, -2)
  assert int(restored.skipped_steps) == 1  # Not checkpointed: counted from the restore.


def test_skipped_steps_counts_skipped_updates_in_every_mode():
  ls = loss_scale.DynamicLossScale(8.0, 2)
  update = tf.function(lambda g: ls.update([g, None])[1])
  for value, expected in [(1.0, 0), (NAN, 1), (1.0, 1), (INF, 2), (-INF, 3), (1.0, 3)]:
    ls.update([tf.constant(value)])
    update(tf.constant(value))
    assert int(ls.skipped_steps) == 2 * expected
  assert ls.skipped_steps.dtype == tf.int64 and not ls.skipped_steps.trainable


def test_skipped_steps_is_one_count_for_all_replicas():
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    ls = loss_scale.DynamicLossScale(8.0)

  @tf.function
  def step(bad_replica):
    def replica_fn():
      grad = helpers.replica_nan([1.0], bad_replica)
      tf.distribute.get_replica_context().merge_call(lambda _, g: ls.update([g]), args=(grad,))

    strategy.run(replica_fn)

  step(-1)
  step(1)
  assert [int(v) for v in strategy.experimental_local_results(ls.skipped_steps)] == [1, 1]


def test_tf1_graph_has_no_skipped_steps_variable():
  with tf.Graph().as_default():
    ls = loss_scale.DynamicLossScale(hysteresis=2)
    assert ls.skipped_steps is None
    assert [v.name for v in tf.compat.v1.global_variables()] == [
      "current_loss_scale:0",
      "good_steps:0",
    ]


# --- FixedLossScale ----------------------------------------------------------


@pytest.mark.parametrize("value, expected", [(1, 1.0), (128, 128.0), (2.5, 2.5), (1e20, 1e20)])
def test_fixed_loss_scale_returns_its_value_as_float32(value, expected):
  ls = loss_scale.FixedLossScale(value)
  assert ls().dtype == tf.float32 and ls().shape == []
  assert float(ls()) == float(tf.constant(expected, tf.float32))
  assert repr(ls) == f"FixedLossScale({expected})" == repr(TF_FIXED(value))
  assert ls.get_config() == {"loss_scale_value": expected} == TF_FIXED(value).get_config()


@pytest.mark.parametrize("grad", [1.0, NAN, INF])
def test_fixed_loss_scale_update_always_applies_and_never_changes(grad):
  ls = loss_scale.FixedLossScale(64)
  _, should_apply = ls.update([tf.constant(grad)])
  assert should_apply is True
  assert float(ls()) == 64.0


def test_fixed_loss_scale_update_returns_an_op_in_graph_mode():
  with tf.Graph().as_default():
    update_op, should_apply = loss_scale.FixedLossScale(2).update([tf.constant(NAN)])
    assert isinstance(update_op, tf.Operation)
    assert should_apply is True


@pytest.mark.parametrize("cls", [loss_scale.FixedLossScale, TF_FIXED], ids=["ours", "tf"])
@pytest.mark.parametrize(
  "value, message",
  [
    ("8", "loss_scale_value must be a Python int or float."),
    (None, "loss_scale_value must be a Python int or float."),
    ([8], "loss_scale_value must be a Python int or float."),
    (tf.constant(8.0), "loss_scale_value must be a Python int or float."),
    (0, "loss_scale_value must be at least 1."),
    (0.999, "loss_scale_value must be at least 1."),
    (-4, "loss_scale_value must be at least 1."),
  ],
  ids=lambda x: type(x).__name__ if isinstance(x, tf.Tensor) else repr(x),
)
def test_fixed_loss_scale_rejects_non_numbers_and_values_below_one(cls, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    cls(value)


# --- Checkpoints -------------------------------------------------------------


def _drive(ls, grad_values):
  for value in grad_values:
    ls.update([tf.constant(value)])


# From (16, 0): two good steps, a NaN, two good steps -> scale 8, 2 good steps.
WRITER_STEPS = [1.0, 1.0, NAN, 1.0, 1.0]
WRITTEN_STATE = (8.0, 2)


def test_checkpoint_keys_are_current_loss_scale_and_good_steps(tmp_path):
  ls = loss_scale.DynamicLossScale(16.0, 3)
  _drive(ls, WRITER_STEPS)
  path = tf.train.Checkpoint(loss_scale=ls).write(str(tmp_path / "ckpt"))
  values = {
    name: tf.train.load_variable(path, name)
    for name, _ in tf.train.list_variables(path)
    if name.startswith("loss_scale/")
  }
  assert values == {
    "loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE": 8.0,
    "loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE": 2,
  }


@pytest.mark.parametrize(
  "writer_cls, reader_cls",
  [(TF_DYNAMIC, loss_scale.DynamicLossScale), (loss_scale.DynamicLossScale, TF_DYNAMIC)],
  ids=["tf_into_ours", "ours_into_tf"],
)
def test_checkpoint_restores_across_tf_and_ours(tmp_path, writer_cls, reader_cls):
  writer = writer_cls(16.0, 3)
  _drive(writer, WRITER_STEPS)
  assert _state(writer) == WRITTEN_STATE
  path = tf.train.Checkpoint(loss_scale=writer).write(str(tmp_path / "ckpt"))

  reader = reader_cls()
  tf.train.Checkpoint(loss_scale=reader).read(path).assert_consumed()
  assert _state(reader) == WRITTEN_STATE


def _graph_saver_roundtrip(cls, path, save):
  """In a fresh graph: `cls`'s state written by a default `Saver`, or read back."""
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    ls = cls(16.0, 3)
    grad = tf.compat.v1.placeholder(tf.float32, [])
    update_op, _ = ls.update([grad])
    saver = tf.compat.v1.train.Saver()
    if save:
      sess.run(tf.compat.v1.global_variables_initializer())
      for value in WRITER_STEPS:
        sess.run(update_op, {grad: value})
      saver.save(sess, path)
    else:
      saver.restore(sess, path)
    scale, good_steps = sess.run([ls(), ls._num_good_steps])
    return float(scale), int(good_steps)


@pytest.mark.parametrize(
  "writer_cls, reader_cls",
  [(TF_DYNAMIC, loss_scale.DynamicLossScale), (loss_scale.DynamicLossScale, TF_DYNAMIC)],
  ids=["tf_into_ours", "ours_into_tf"],
)
def test_graph_mode_saver_restores_across_tf_and_ours(tmp_path, writer_cls, reader_cls):
  path = str(tmp_path / "model")
  assert _graph_saver_roundtrip(writer_cls, path, save=True) == WRITTEN_STATE
  assert _graph_saver_roundtrip(reader_cls, path, save=False) == WRITTEN_STATE


# --- User subclasses and _add_weight -----------------------------------------


class HalvingLossScale(loss_scale.LossScale):
  """A user loss scale: halves on every update; its weight is created on demand."""

  def __init__(self, initial=1024.0):
    super().__init__()
    self._initial = initial
    self._scale = None

  def build(self):
    self._scale = self._add_weight("scale", self._initial)

  def __call__(self):
    return tf.convert_to_tensor(self._scale)

  def update(self, grads):
    del grads
    self._scale.assign(self._scale / 2.0)
    return None, True

  def get_config(self):
    return {"initial": self._initial}


def test_a_traced_update_exports_to_a_saved_model_and_runs_there(tmp_path):
  """The skipped-step count a traced update writes is in the SavedModel (TF's
  class exports too); checkpoints keep TF's two keys (a test above)."""
  module = tf.Module()
  module.scale = loss_scale.DynamicLossScale(8.0, 2)
  module.update = tf.function(
    lambda g: module.scale.update([g])[1], input_signature=[tf.TensorSpec([], tf.float32)]
  )
  module.update(tf.constant(1.0))
  tf.saved_model.save(module, str(tmp_path / "saved"))
  loaded = tf.saved_model.load(str(tmp_path / "saved"))
  assert not bool(loaded.update(tf.constant(float("nan"))))
  assert bool(loaded.update(tf.constant(1.0)))
  assert float(loaded.scale.current_loss_scale.numpy()) == 4.0  # 8, halved at the NaN step
  assert int(loaded.scale.good_steps.numpy()) == 1
  assert int(loaded.scale.skipped_steps.numpy()) == 1


def test_user_subclass_works_and_checkpoints_its_weights(tmp_path):
  ls = HalvingLossScale()
  ls.build()
  ls.update([])
  assert float(ls()) == 512.0
  assert loss_scale.get(ls) is ls
  path = tf.train.Checkpoint(loss_scale=ls).write(str(tmp_path / "ckpt"))
  assert tf.train.load_variable(path, "loss_scale/scale/.ATTRIBUTES/VARIABLE_VALUE") == 512.0

  restored = HalvingLossScale()
  status = tf.train.Checkpoint(loss_scale=restored).read(path)
  restored.build()  # Created after the read: restored on creation.
  status.assert_consumed()
  assert float(restored()) == 512.0


def test_user_subclass_round_trips_through_custom_objects():
  config = loss_scale.serialize(HalvingLossScale(64.0))
  assert config == {"class_name": "HalvingLossScale", "config": {"initial": 64.0}}
  restored = loss_scale.deserialize(config, custom_objects={"HalvingLossScale": HalvingLossScale})
  assert type(restored) is HalvingLossScale and restored.get_config() == {"initial": 64.0}


def test_add_weight_twice_with_one_name_raises_runtime_error():
  ls = HalvingLossScale()
  ls.build()
  with pytest.raises(RuntimeError, match="Duplicate variables detected"):
    ls.build()


def test_weights_of_one_name_are_kept_per_graph_and_checkpointable(tmp_path):
  ls = HalvingLossScale(8.0)
  ls.build()
  ls.update([])
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    ls.build()  # Same name, other graph: a second variable, no error.
    sess.run(tf.compat.v1.global_variables_initializer())
    path = tf.compat.v1.train.Checkpoint(loss_scale=ls).save(str(tmp_path / "graph"), session=sess)
    assert tf.train.load_variable(path, "loss_scale/scale/.ATTRIBUTES/VARIABLE_VALUE") == 8.0
  path = tf.train.Checkpoint(loss_scale=ls).write(str(tmp_path / "eager"))
  assert tf.train.load_variable(path, "loss_scale/scale/.ATTRIBUTES/VARIABLE_VALUE") == 4.0


def test_loss_scale_is_abstract():
  with pytest.raises(TypeError, match="abstract"):
    loss_scale.LossScale()

  class NoConfig(loss_scale.LossScale):
    def __call__(self):
      return tf.constant(1.0)

    def update(self, grads):
      return None, True

  with pytest.raises(TypeError, match="get_config"):
    NoConfig()


# --- get, serialize, deserialize, get_config, from_config --------------------


def test_get_none_is_none():
  assert loss_scale.get(None) is None


def test_get_dynamic_is_a_default_dynamic_loss_scale():
  ls = loss_scale.get("dynamic")
  assert type(ls) is loss_scale.DynamicLossScale
  assert ls.get_config() == {
    "initial_loss_scale": 32768.0,
    "increment_period": 2000,
    "multiplier": 2.0,
  }
  assert loss_scale.get("dynamic") is not ls


@pytest.mark.parametrize("value", [1, 8, 2.5])
def test_get_number_is_a_fixed_loss_scale(value):
  ls = loss_scale.get(value)
  assert type(ls) is loss_scale.FixedLossScale and float(ls()) == value


@pytest.mark.parametrize(
  "ls", [loss_scale.FixedLossScale(4), loss_scale.DynamicLossScale()], ids=["fixed", "dynamic"]
)
def test_get_of_a_loss_scale_is_identity(ls):
  assert loss_scale.get(ls) is ls


@pytest.mark.parametrize(
  "ls",
  [
    lambda: loss_scale.FixedLossScale(3),
    lambda: loss_scale.DynamicLossScale(),
    lambda: loss_scale.DynamicLossScale(initial_loss_scale=2, increment_period=7, multiplier=4),
  ],
  ids=["fixed", "dynamic_default", "dynamic_custom"],
)
def test_config_round_trips(ls):
  ls = ls()
  config = ls.get_config()
  for restored in (
    type(ls).from_config(config),
    loss_scale.deserialize(loss_scale.serialize(ls)),
    loss_scale.get(loss_scale.serialize(ls)),
  ):
    assert type(restored) is type(ls)
    assert restored.get_config() == config
    assert restored is not ls
  assert loss_scale.serialize(ls) == {"class_name": type(ls).__name__, "config": config}


def test_dynamic_config_equals_tfs():
  args = dict(initial_loss_scale=2, increment_period=7, multiplier=4)
  assert loss_scale.DynamicLossScale(**args).get_config() == TF_DYNAMIC(**args).get_config()


def test_deserialize_starts_from_the_initial_scale():
  ls = loss_scale.DynamicLossScale(initial_loss_scale=16, increment_period=1)
  ls.update([tf.constant(1.0)])
  restored = loss_scale.deserialize(loss_scale.serialize(ls))
  assert _state(ls) == (32.0, 0) and _state(restored) == (16.0, 0)


@pytest.mark.parametrize("identifier", ["foo", "Dynamic", "", [8], (8,), {8}, b"dynamic"], ids=repr)
def test_get_rejects_unknown_identifiers(identifier):
  with pytest.raises(
    ValueError, match=re.escape(f"Could not interpret loss scale identifier: {identifier}")
  ):
    loss_scale.get(identifier)


def test_deserialize_rejects_unknown_class_names():
  config = loss_scale.serialize(HalvingLossScale())
  with pytest.raises(ValueError, match="Unknown loss scale: HalvingLossScale"):
    loss_scale.deserialize(config)
  with pytest.raises(ValueError, match="Unknown loss scale: LossScale"):
    loss_scale.deserialize({"class_name": "LossScale", "config": {}})


@pytest.mark.parametrize(
  "config",
  [
    "FixedLossScale",
    ["FixedLossScale", {"loss_scale_value": 2.0}],
    {"class_name": "FixedLossScale"},
    {"config": {"loss_scale_value": 2.0}},
    {},
  ],
  ids=repr,
)
@pytest.mark.parametrize("fn", [loss_scale.deserialize, loss_scale.get], ids=["deserialize", "get"])
def test_malformed_configs_are_rejected(fn, config):
  if fn is loss_scale.get and not isinstance(config, dict):
    message = "Could not interpret loss scale identifier"
  else:
    message = "A serialized loss scale must be a dict with keys 'class_name' and 'config'"
  with pytest.raises(ValueError, match=re.escape(message)):
    fn(config)


# --- Public names --------------------------------------------------------------

# Each group: dotted paths that must all reach one object.
ALIAS_GROUPS = {
  name: [f"{namespace}.{name}" for namespace in namespaces]
  for name, namespaces in {
    **dict.fromkeys(
      ["LossScale", "FixedLossScale", "DynamicLossScale"],
      [
        "tf_lossscale",
        "tf_lossscale.loss_scale",
        "tf_lossscale.mixed_precision.experimental",
        "tf_lossscale.compat.v1.mixed_precision",
        "tf_lossscale.compat.v1.mixed_precision.experimental",
        "tf_lossscale.compat.v1.train.experimental",
      ],
    ),
    **dict.fromkeys(["get", "serialize", "deserialize"], ["tf_lossscale.loss_scale"]),
    "LossScaleOptimizer": ["tf_lossscale", "tf_lossscale.keras.mixed_precision"],
    "MixedPrecisionLossScaleOptimizer": [
      "tf_lossscale",
      "tf_lossscale.compat.v1.mixed_precision",
      "tf_lossscale.compat.v1.train.experimental",
    ],
  }.items()
}
LEGACY_NAMES = [
  "LossScale",
  "FixedLossScale",
  "DynamicLossScale",
  "get",
  "serialize",
  "deserialize",
]


def _resolve(path):
  return functools.reduce(getattr, path.split(".")[1:], tf_lossscale)


@pytest.mark.parametrize("name", ALIAS_GROUPS)
def test_public_name_is_one_object_everywhere(name):
  objects = [_resolve(path) for path in ALIAS_GROUPS[name]]
  assert all(obj is objects[0] for obj in objects), ALIAS_GROUPS[name]
  assert objects[0].__module__.startswith("tf_lossscale._src.")
  if name in LEGACY_NAMES:
    assert objects[0] is getattr(loss_scale_src, name)


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copied_dynamic_loss_scale_updates_as_tfs(how):
  """A shallow copy shares the original's variables, a deep copy has its own."""

  def scales(cls):
    original = cls(8.0, 2, 2.0)
    copied = how(original)
    copied.update([tf.constant(float("nan"))])
    copied.update([tf.constant(1.0)])
    return float(copied()), float(original()), int(copied._num_good_steps.numpy())

  assert scales(loss_scale.DynamicLossScale) == scales(TF_DYNAMIC)
  assert scales(TF_DYNAMIC)[0] == 4.0


def test_a_deep_copied_compat_v1_optimizer_applies_as_tfs():
  def step(optimizer_cls, scale_cls):
    var = tf.Variable(1.0)
    opt = copy.deepcopy(
      optimizer_cls(tf.compat.v1.train.GradientDescentOptimizer(1.0), scale_cls(8.0, 2, 2.0))
    )
    opt.apply_gradients([(tf.constant(float("nan")), var)])
    opt.apply_gradients([(tf.constant(0.5), var)])
    return float(opt._loss_scale()), float(var.numpy())

  ours = step(
    tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
    loss_scale.DynamicLossScale,
  )
  assert ours == step(tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer, TF_DYNAMIC)
  assert ours == (4.0, 0.5)


def test_an_increment_period_int_cannot_take_is_a_type_error_as_tf_s():
  with pytest.raises(TypeError, match=re.escape("increment_period must be an int, but got: None")):
    loss_scale.DynamicLossScale(16, increment_period=None)
  with pytest.raises(TypeError):
    TF_DYNAMIC(16, increment_period=None)


def test_float32_s_largest_as_printed_is_a_max_loss_scale():
  """3.4028235e+38 is above the float64 value of float32's largest, but is it
  as a float32: it was refused for a while."""
  ls = loss_scale.DynamicLossScale(16, max_loss_scale=3.4028235e38)
  assert ls.get_config()["max_loss_scale"] == 3.4028235e38
