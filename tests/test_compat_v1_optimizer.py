"""Tests of the compat.v1 `MixedPrecisionLossScaleOptimizer`.

Expected numbers come from a NumPy model of momentum SGD and of TF 2.4's
dynamic loss scale, and from TensorFlow's own
`tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` run on the
same data (under the default strategy and under MirroredStrategy).
"""

import contextlib
import re
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import helpers
import tf_lossscale
from tf_lossscale import loss_scale as ls_module

Ours = tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
TFs = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
# The loss-scale module each optimizer class accepts.
LOSS_SCALES = {Ours: ls_module, TFs: tf.compat.v1.mixed_precision}

NAN = float("nan")
INF = float("inf")
LR = 0.5
MOMENTUM = 0.9
COEFFS = np.array([1.0, -2.0], np.float32)
INITIAL_VAR = np.array([1.0, 2.0], np.float32)
MODES = ["graph", "eager", "function"]


def momentum():
  return tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM)


class Trainer:
  """A linear model trained by one optimizer, in graph, eager or tf.function mode.

  The loss is `m * sum(var * COEFFS)` with `m` fed per step, so the gradient
  is `m * COEFFS` per replica (summed over replicas by the v1 optimizer). `m`
  may be NaN or Inf, on every replica or on replica `bad` only.
  """

  def __init__(self, mode, strategy="default", opt_cls=Ours, loss_scale=None, inner=momentum):
    """`loss_scale` and `inner` are factories, called in the trainer's graph and scope."""
    self.mode = mode
    self.graph = tf.compat.v1.Graph() if mode == "graph" else None
    with self._context():
      self.strategy = helpers.make_strategy(strategy)
      with self.strategy.scope():
        self.var = tf.compat.v1.Variable(INITIAL_VAR, name="var", use_resource=True)
        if mode == "graph":
          self.global_step = tf.compat.v1.train.get_or_create_global_step()
        else:
          self.global_step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
          )
        if loss_scale is None:
          self.loss_scale = LOSS_SCALES[opt_cls].DynamicLossScale(8.0, increment_period=3)
        else:
          self.loss_scale = loss_scale()
        self.opt = opt_cls(inner(), self.loss_scale)
      if mode == "graph":
        self._m = tf.compat.v1.placeholder(tf.float32, [])
        self._bad = tf.compat.v1.placeholder(tf.int32, [])
        out = self.strategy.run(self._replica_step, args=(self._m, self._bad))
        self._train_op = tf.group(self.strategy.experimental_local_results(out))
        self._scale = self.loss_scale()
        self.sess = tf.compat.v1.Session(graph=self.graph)
        self.sess.run(tf.compat.v1.global_variables_initializer())
      elif mode == "function":
        self._run = tf.function(self._distributed_step)
      else:
        self._run = self._distributed_step

  def _context(self):
    return self.graph.as_default() if self.graph is not None else contextlib.nullcontext()

  def _replica_step(self, m, bad):
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    m = tf.where(tf.equal(replica, bad), tf.constant(NAN), m)

    def loss():
      return m * tf.reduce_sum(self.var * COEFFS)

    # TF1 style in graph mode: a loss tensor; eagerly the loss must be callable.
    return self.opt.minimize(
      loss() if self.mode == "graph" else loss,
      global_step=self.global_step,
      var_list=[self.var],
    )

  def _distributed_step(self, m, bad):
    self.strategy.run(self._replica_step, args=(m, bad))

  def step(self, m, bad=-1):
    """One training step, multiplying the loss by `m` (NaN on replica `bad`)."""
    if self.mode == "graph":
      self.sess.run(self._train_op, {self._m: m, self._bad: bad})
    else:
      self._run(tf.constant(m, tf.float32), tf.constant(bad))

  def read(self, value):
    """`value`'s per-replica components (one when not mirrored), as NumPy."""
    components = self.strategy.experimental_local_results(value)
    if self.mode == "graph":
      return self.sess.run(list(components))
    return [np.asarray(c) for c in components]

  def state(self):
    """(var, first slot, global_step, loss scale), replica 0's copy each."""
    inner = self.opt._optimizer  # TF's class does not reach the slots itself
    names = inner.get_slot_names()
    slot = inner.get_slot(self.var, names[0]) if names else None  # None before step 1
    scale = self._scale if self.mode == "graph" else self.loss_scale()
    with self._context():
      return tuple(self.read(x)[0] for x in (self.var, slot, self.global_step, scale))


class Reference:
  """NumPy model: momentum SGD behind TF 2.4's dynamic loss scale."""

  def __init__(self, scale=8.0, increment_period=3, replicas=1):
    self.var = INITIAL_VAR.astype(np.float64)
    self.accum = np.zeros(2)
    self.global_step = 0
    self.scale = scale
    self.good_steps = 0
    self.increment_period = increment_period
    self.replicas = replicas

  def step(self, m, bad=-1):
    if np.isfinite(m) and not 0 <= bad < self.replicas:
      self.accum = MOMENTUM * self.accum + self.replicas * m * COEFFS
      self.var = self.var - LR * self.accum
      self.global_step += 1
      self.good_steps += 1
      if self.good_steps == self.increment_period:
        self.scale, self.good_steps = self.scale * 2, 0
    else:
      self.scale, self.good_steps = max(self.scale / 2, 1.0), 0

  def assert_matches(self, trainer):
    var, slot, global_step, scale = trainer.state()
    np.testing.assert_allclose(var, self.var, rtol=1e-6)
    np.testing.assert_allclose(slot, self.accum, rtol=1e-6)
    assert int(global_step) == self.global_step
    assert float(scale) == self.scale


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
  "loss_scale", [ls_module.FixedLossScale(128), "dynamic"], ids=["fixed", "dynamic"]
)
def test_loss_scale_reaches_the_gradients_and_is_removed_from_them(mode, loss_scale):
  expected_scale = 128.0 if isinstance(loss_scale, ls_module.FixedLossScale) else 2.0**15
  graph = tf.compat.v1.Graph() if mode == "graph" else None
  with graph.as_default() if graph else contextlib.nullcontext():
    w = tf.compat.v1.Variable(1.5, use_resource=True)
    record = tf.compat.v1.Variable(0.0, trainable=False, use_resource=True)
    opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(1.0), loss_scale)

    def loss():
      return 2.0 * helpers.gradient_probe(record)(3.0 * w)

    def grads():
      return opt.compute_gradients(loss if mode != "graph" else loss(), var_list=[w])

    if mode == "graph":
      [(grad, _)] = grads()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        grad_value = sess.run(grad)
        seen = sess.run(record)  # read after, not racing, the backward pass
    else:
      [(grad, _)] = (tf.function(grads) if mode == "function" else grads)()
      grad_value, seen = grad.numpy(), record.numpy()
  assert seen == 2.0 * expected_scale  # d(scaled loss)/d(probe output)
  assert grad_value == 6.0  # d(loss)/dw, unscaled


def test_scaled_loss_keeps_the_loss_dtype():
  w = tf.Variable(tf.constant(2.0, tf.float16))
  opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(1.0), 1024)
  [(grad, _)] = opt.compute_gradients(lambda: w * w, var_list=[w])
  assert grad.dtype == tf.float16
  assert float(grad) == 4.0
  with tf.Graph().as_default():  # the scaling itself, seen in a TF1 graph
    w = tf.compat.v1.Variable(tf.constant(2.0, tf.float16))
    loss = w * w
    opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(1.0), 1024)
    opt.compute_gradients(loss, var_list=[w])
    consumers = loss.consumers()
    assert consumers and all(op.outputs[0].dtype == tf.float16 for op in consumers), [
      (op.type, op.outputs[0].dtype) for op in consumers
    ]


def test_none_gradients_stay_none():
  used, unused = tf.Variable(1.0), tf.Variable(5.0)
  opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(1.0), "dynamic")
  grads_and_vars = opt.compute_gradients(lambda: 3.0 * used, var_list=[used, unused])
  assert grads_and_vars[1] == (None, unused)
  opt.apply_gradients(grads_and_vars)
  assert (float(used.numpy()), float(unused.numpy())) == (-2.0, 5.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_non_finite_steps_are_skipped_finite_steps_applied(mode, strategy):
  trainer = Trainer(mode, strategy)
  reference = Reference(replicas=trainer.strategy.num_replicas_in_sync)
  for m in [1.0, NAN, 2.0, INF, 1.0, 1.0, 1.0, -1.0]:
    before = trainer.state()
    trainer.step(m)
    reference.step(m)
    reference.assert_matches(trainer)
    if not np.isfinite(m):  # nothing moved but the scale, which halved
      after = trainer.state()
      for old, new in zip(before[:3], after[:3], strict=True):
        np.testing.assert_array_equal(old, new)
      assert after[3] == before[3] / 2
  assert (reference.global_step, reference.scale) == (6, 4.0)  # 8, 4, 2, then grew to 4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [0, 1])
def test_nan_on_one_replica_makes_every_replica_skip(mode, bad):
  trainer = Trainer(mode, "mirrored")
  trainer.step(1.0)
  before = trainer.state()
  trainer.step(1.0, bad=bad)
  var, slot, global_step, scale = trainer.state()
  np.testing.assert_array_equal(var, before[0])
  np.testing.assert_array_equal(slot, before[1])
  assert int(global_step) == 1
  assert float(scale) == 4.0  # halved once, not once per replica
  with trainer._context():
    for replica_var in trainer.read(trainer.var):  # every replica kept its copy
      np.testing.assert_array_equal(replica_var, before[0])


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_skipped_steps_counts_refused_steps_once_for_all_replicas(mode, strategy):
  trainer = Trainer(mode, strategy)
  last = trainer.strategy.num_replicas_in_sync - 1
  for m, bad, expected in [(1.0, -1, 0), (NAN, -1, 1), (1.0, last, 2), (1.0, -1, 2), (INF, 0, 3)]:
    trainer.step(m, bad=bad)
    assert trainer.read(trainer.opt.skipped_steps) == [expected] * (
      trainer.strategy.num_replicas_in_sync
    )
  assert trainer.opt.skipped_steps is trainer.loss_scale.skipped_steps


@pytest.mark.parametrize(
  "mode, loss_scale",
  [
    ("eager", lambda: ls_module.FixedLossScale(4)),
    ("eager", lambda: EveryOtherStep()),  # noqa: PLW0108 (defined below)
    ("graph", lambda: ls_module.DynamicLossScale(8.0)),
  ],
  ids=["fixed", "custom", "tf1_graph"],
)
def test_skipped_steps_is_none_without_a_count(mode, loss_scale):
  trainer = Trainer(mode, loss_scale=loss_scale)
  trainer.step(1.0)
  assert trainer.opt.skipped_steps is None


class LoggedDynamic(ls_module.DynamicLossScale):
  """A DynamicLossScale whose own `update` passes every step on."""

  def update(self, grads):
    self.seen = getattr(self, "seen", 0) + 1
    return super().update(grads)


def test_skipped_steps_of_a_dynamic_subclass_with_its_own_update():
  trainer = Trainer("eager", loss_scale=lambda: LoggedDynamic(8.0))
  for m in (1.0, NAN, 1.0, INF):
    trainer.step(m)
  assert trainer.loss_scale.seen == 4
  assert trainer.opt.skipped_steps is trainer.loss_scale.skipped_steps
  assert trainer.read(trainer.opt.skipped_steps) == [2]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_fixed_scale_applies_every_step_as_tf_did(mode, strategy):
  trainer = Trainer(mode, strategy, loss_scale=lambda: ls_module.FixedLossScale(4))
  replicas = trainer.strategy.num_replicas_in_sync
  trainer.step(1.0)
  var, _, global_step, scale = trainer.state()
  np.testing.assert_allclose(var, INITIAL_VAR - LR * replicas * COEFFS)
  assert (int(global_step), float(scale)) == (1, 4.0)
  trainer.step(NAN)  # no finiteness check: the NaN is applied, as by TF's class
  var, _, global_step, scale = trainer.state()
  assert np.isnan(var).all()
  assert (int(global_step), float(scale)) == (2, 4.0)


class EveryOtherStep(ls_module.LossScale):
  """A user loss scale: applies every second step and counts its updates."""

  def __init__(self):
    super().__init__()
    self.updates = self._add_weight("updates", 0, tf.int64)

  def __call__(self):
    return tf.constant(16.0)

  def update(self, grads):
    del grads
    count = self.updates.assign_add(1)
    return count, tf.equal(count % 2, 0)

  def get_config(self):
    return {}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_a_custom_loss_scale_decides_when_to_apply(mode, strategy):
  trainer = Trainer(
    mode,
    strategy,
    loss_scale=EveryOtherStep,
    inner=lambda: tf.compat.v1.train.GradientDescentOptimizer(LR),
  )
  replicas = trainer.strategy.num_replicas_in_sync
  trainer.step(1.0)  # update 1: skipped
  with trainer._context():
    var, global_step = trainer.read(trainer.var)[0], trainer.read(trainer.global_step)[0]
  np.testing.assert_array_equal(var, INITIAL_VAR)
  assert int(global_step) == 0
  trainer.step(1.0)  # update 2: applied
  with trainer._context():
    var, global_step = trainer.read(trainer.var)[0], trainer.read(trainer.global_step)[0]
    updates = trainer.read(trainer.loss_scale.updates)[0]
  np.testing.assert_allclose(var, INITIAL_VAR - LR * replicas * COEFFS)
  assert (int(global_step), int(updates)) == (1, 2)


class FiniteOnly(ls_module.LossScale):
  """A user loss scale with no state: its `update` returns no op (None)."""

  def __call__(self):
    return tf.constant(4.0)

  def update(self, grads):
    finite = [tf.reduce_all(tf.math.is_finite(g)) for g in tf.nest.flatten(grads) if g is not None]
    return None, tf.reduce_all(finite)

  def get_config(self):
    return {}


@pytest.mark.parametrize("mode", MODES)
def test_a_custom_loss_scale_whose_update_returns_no_op(mode):
  """Its None op failed `tf.group` in a function and in a TF1 graph."""
  trainer = Trainer(mode, loss_scale=FiniteOnly)
  trainer.step(1.0)
  trainer.step(INF)  # skipped by the custom scale's verdict
  var, _, global_step, scale = trainer.state()
  np.testing.assert_allclose(var, INITIAL_VAR - LR * COEFFS)
  assert (int(global_step), float(scale)) == (1, 4.0)


class CountedApplies(EveryOtherStep):
  """A user loss scale that always applies: its verdict needs none of its op."""

  def update(self, grads):
    del grads
    return self.updates.assign_add(1), True


@pytest.mark.parametrize("mode", MODES)
def test_the_train_op_runs_a_loss_scale_s_own_update(mode):
  """The update op of a custom `LossScale`, and the scale changes of a
  `DynamicLossScale` subclass's own `update`, whose verdicts do not depend
  on them: a TF1 train op that dropped them kept the scale as it was."""
  counted = Trainer(mode, loss_scale=CountedApplies)
  logged = Trainer(mode, loss_scale=lambda: LoggedDynamic(8.0))
  for _ in range(2):
    counted.step(1.0)
    logged.step(NAN)
  with counted._context():
    assert counted.read(counted.loss_scale.updates) == [2]
  var, _, global_step, scale = logged.state()
  np.testing.assert_array_equal(var, INITIAL_VAR)
  assert (int(global_step), float(scale)) == (0, 2.0)  # skipped twice: 8, 4, 2


@pytest.mark.parametrize("mode", MODES)
def test_indexed_slices_gradients_are_unscaled_and_applied_sparsely(mode):
  graph = tf.compat.v1.Graph() if mode == "graph" else None
  with graph.as_default() if graph else contextlib.nullcontext():
    table = tf.compat.v1.Variable(np.ones((4, 2), np.float32), use_resource=True)
    loss_scale = ls_module.DynamicLossScale(64.0)
    opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(1.0), loss_scale)
    ids = tf.constant([1, 3, 1])

    def step(m):
      def loss():
        return m * tf.reduce_sum(tf.nn.embedding_lookup(table, ids))

      grads_and_vars = opt.compute_gradients(loss if mode != "graph" else loss(), [table])
      [(grad, _)] = grads_and_vars
      assert isinstance(grad, tf.IndexedSlices)
      with tf.control_dependencies([opt.apply_gradients(grads_and_vars)]):
        return tf.identity(grad.values), tf.identity(grad.indices)

    if mode == "graph":
      m = tf.compat.v1.placeholder(tf.float32, [])
      out, scale_tensor = step(m), loss_scale()
      sess = tf.compat.v1.Session()
      sess.run(tf.compat.v1.global_variables_initializer())

      def run(value):
        return sess.run(out, {m: value}), sess.run([table, scale_tensor])

    else:
      fn = tf.function(step) if mode == "function" else step

      def run(value):
        out = fn(tf.constant(value))
        return [t.numpy() for t in out], [table.numpy(), loss_scale().numpy()]

    (values, indices), (table_value, scale) = run(2.0)
    np.testing.assert_array_equal(values, np.full((3, 2), 2.0))  # unscaled
    np.testing.assert_array_equal(indices, [1, 3, 1])
    np.testing.assert_array_equal(table_value, [[1, 1], [-3, -3], [1, 1], [-1, -1]])
    assert scale == 64.0
    _, (table_after_nan, scale) = run(NAN)
    np.testing.assert_array_equal(table_after_nan, table_value)
    assert scale == 32.0


def _train_with_saver(opt_cls, steps, path):
  trainer = Trainer("graph", opt_cls=opt_cls)
  for m in steps:
    trainer.step(m)
  with trainer._context():
    tf.compat.v1.train.Saver().save(trainer.sess, path)
  return trainer


@pytest.mark.parametrize(
  "writer, reader",
  [(Ours, Ours), (TFs, Ours), (Ours, TFs)],
  ids=["ours", "tf-to-ours", "ours-to-tf"],
)
def test_saver_round_trip_of_slots_and_loss_scale(tmp_path, writer, reader):
  steps = [1.0, 1.0, NAN, 2.0, 1.0]  # ends at scale 4 with 2 good steps
  source = _train_with_saver(writer, steps, str(tmp_path / "model"))
  target = Trainer("graph", opt_cls=reader)
  saved = source.state()
  for old, new in zip(saved, target.state(), strict=True):
    assert not np.array_equal(old, new)  # the restore below has work to do
  with target._context():
    tf.compat.v1.train.Saver().restore(target.sess, str(tmp_path / "model"))
    good_steps = target.sess.run(tf.compat.v1.global_variables("good_steps")[0])
  for old, new in zip(saved, target.state(), strict=True):
    np.testing.assert_array_equal(old, new)
  assert good_steps == 2
  source.step(1.0)  # both continue identically: one more good step grows the scale
  target.step(1.0)
  for old, new in zip(source.state(), target.state(), strict=True):
    np.testing.assert_array_equal(old, new)
  assert target.state()[3] == 8.0


def _checkpoint(trainer):
  return tf.train.Checkpoint(var=trainer.var, step=trainer.global_step, optimizer=trainer.opt)


@pytest.mark.parametrize(
  "writer, reader", [(TFs, Ours), (Ours, TFs)], ids=["tf-to-ours", "ours-to-tf"]
)
def test_object_checkpoints_move_between_tf_class_and_ours(tmp_path, writer, reader):
  source = Trainer("eager", opt_cls=writer)
  for m in [1.0, NAN, 1.0, 1.0]:
    source.step(m)
  path = _checkpoint(source).save(str(tmp_path / "ckpt"))
  target = Trainer("eager", opt_cls=reader)
  _checkpoint(target).restore(path).assert_consumed()
  # Slots are restored when the wrapped optimizer creates them, on the next step.
  source.step(-1.0)
  target.step(-1.0)
  for old, new in zip(source.state(), target.state(), strict=True):
    np.testing.assert_array_equal(old, new)
  assert target.state()[2:] == (4, 8.0)  # 4 good steps; the 3rd since the NaN grew it
  # The same object graph, key for key.
  other = tmp_path / "other"
  keys = {name for name, _ in tf.train.list_variables(path)}
  other_keys = {name for name, _ in tf.train.list_variables(_checkpoint(target).save(str(other)))}
  assert keys == other_keys
  assert "optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE" in keys
  assert "optimizer/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE" in keys
  assert any("optimizer/base_optimizer/momentum" in key for key in keys)


def _full_state(trainer):
  """`state()` and every variable of the wrapped optimizer (Adam's too)."""
  with trainer._context():
    inner_variables = [trainer.read(v)[0] for v in trainer.opt._optimizer.variables()]
  return [*trainer.state(), *inner_variables]


# Multipliers fed on 50 steps: finite stretches long enough for the scale to
# grow, with NaN and Inf steps in between (and in a row).
DIFFERENTIAL_STEPS = [
  NAN if i % 11 == 5 else INF if i % 13 == 9 else 1.0 + (i % 4) / 4 for i in range(50)
]
DIFFERENTIAL_STEPS[30:32] = [INF, NAN]


@pytest.mark.parametrize("mode", MODES)
def test_differential_against_tf_class_for_50_steps(mode):
  inner = momentum if mode != "graph" else tf.compat.v1.train.AdamOptimizer
  ours = Trainer(mode, opt_cls=Ours, inner=inner)
  theirs = Trainer(mode, opt_cls=TFs, inner=inner)
  scales = set()
  for m in DIFFERENTIAL_STEPS:
    ours.step(m)
    theirs.step(m)
    for mine, reference in zip(_full_state(ours), _full_state(theirs), strict=True):
      np.testing.assert_array_equal(mine, reference)
    scales.add(float(ours.state()[3]))
  assert int(ours.state()[2]) == 39  # 11 of the 50 steps were skipped
  assert max(scales) > 8.0 > min(scales)  # the scale both grew and shrank


@pytest.mark.parametrize("mode", ["graph", "function"])
def test_differential_against_tf_class_under_mirrored_strategy(mode):
  # TF's legacy DynamicLossScale also reduces the replicas' decisions, so its
  # class is a reference here too, with NaN on one replica only.
  ours = Trainer(mode, "mirrored", opt_cls=Ours)
  theirs = Trainer(mode, "mirrored", opt_cls=TFs)
  steps = [(1.0, -1), (2.0, 1), (1.0, -1), (NAN, -1), (1.0, 0), *[(0.5, -1)] * 4, (INF, -1)]
  model = Reference(replicas=2)
  for m, bad in steps:
    ours.step(m, bad)
    theirs.step(m, bad)
    model.step(m, bad)
    for mine, reference in zip(_full_state(ours), _full_state(theirs), strict=True):
      np.testing.assert_array_equal(mine, reference)
    model.assert_matches(ours)
  assert (model.global_step, model.scale) == (6, 1.0)


def test_slots_variables_and_name_reach_the_wrapped_optimizer():
  trainer = Trainer("eager")
  trainer.step(1.0)
  opt, inner = trainer.opt, trainer.opt._optimizer
  slot = opt.get_slot(trainer.var, "momentum")
  assert slot is inner.get_slot(trainer.var, "momentum")
  np.testing.assert_allclose(slot.numpy(), COEFFS)  # momentum after one step
  assert opt.get_slot(trainer.var, "nonexistent") is None
  assert opt.get_slot_names() == ["momentum"]
  assert opt.get_name() == "Momentum"
  names = [v.name for v in opt.variables()]
  assert names[-2:] == ["current_loss_scale:0", "good_steps:0"]
  assert opt.variables()[:-2] == inner.variables() and slot in inner.variables()
  # TF's own class left this gap open.
  theirs = Trainer("eager", opt_cls=TFs)
  theirs.step(1.0)
  assert theirs.opt.get_slot(theirs.var, "momentum") is None
  assert theirs.opt.get_slot_names() == []


# A TF1 program as codebases still run it: v2 behaviour disabled, so reference
# variables and v1 control flow. It needs a process of its own.
TF1_PROGRAM = textwrap.dedent("""
    import json
    import tensorflow as tf
    tf.compat.v1.disable_v2_behavior()
    import tf_lossscale

    def train(cls, loss_scales):
      with tf.compat.v1.Graph().as_default():
        var = tf.compat.v1.Variable([1.0, 2.0], name="var")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        m = tf.compat.v1.placeholder(tf.float32, [])
        loss_scale = loss_scales.DynamicLossScale(8.0, increment_period=3)
        opt = cls(tf.compat.v1.train.MomentumOptimizer(0.5, 0.9), loss_scale)
        train_op = opt.minimize(m * tf.reduce_sum(var * [1.0, -2.0]), global_step)
        slot = opt._optimizer.get_slot(var, "momentum")
        history = []
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          for value in [1.0, float("nan"), 2.0, 1.0, 1.0, float("inf"), 1.0]:
            sess.run(train_op, {m: value})
            v, s, step, scale = sess.run([var, slot, global_step, loss_scale()])
            history.append([v.tolist(), s.tolist(), int(step), float(scale)])
        return type(var).__name__, history

    print(json.dumps({
        "ours": train(tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
                      tf_lossscale.loss_scale),
        "tf": train(tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
                    tf.compat.v1.mixed_precision),
    }))
""")


# A DynamicLossScale subclass with an `update` of its own: TF's class named the
# apply's conditional after the conditionals that update made (Adam's
# `cond_1/beta1_power` after the scale's own); ours named Adam's variables
# `beta1_power`, and TF's checkpoints did not restore. With any other loss
# scale TF applied unconditionally: `beta1_power`.
TF1_SUBCLASS_NAMES = textwrap.dedent("""
    import json
    import tensorflow as tf
    tf.compat.v1.disable_v2_behavior()
    import tf_lossscale

    def variants(loss_scales):
      def finite(grads):
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])

      class Super(loss_scales.DynamicLossScale):
        def update(self, grads):
          return super().update(grads)

      class OwnCond(loss_scales.DynamicLossScale):
        def update(self, grads):
          ok = finite(grads)
          return tf.cond(ok, tf.no_op, tf.no_op), ok

      class NoCond(loss_scales.DynamicLossScale):
        def update(self, grads):
          return tf.no_op(), finite(grads)

      class Custom(loss_scales.LossScale):
        def __call__(self):
          return tf.constant(4.0)

        def update(self, grads):
          return tf.no_op(), finite(grads)

        def get_config(self):
          return {}

      return [lambda: Super(8.0), lambda: OwnCond(8.0), lambda: NoCond(8.0), Custom]

    def names(cls, loss_scales):
      found = []
      for make_loss_scale in variants(loss_scales):
        with tf.compat.v1.Graph().as_default():
          var = tf.compat.v1.Variable([1.0, 2.0], name="var")
          opt = cls(tf.compat.v1.train.AdamOptimizer(0.1), make_loss_scale())
          opt.minimize(tf.reduce_sum(var))
          found.append(sorted(v.op.name for v in tf.compat.v1.global_variables()))
      return found

    print(json.dumps([
        names(tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
              tf_lossscale.loss_scale),
        names(tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
              tf.compat.v1.mixed_precision),
    ]))
""")


def test_tf1_variable_names_with_a_loss_scale_s_own_update_are_tf_s():
  ours, tfs = helpers.program_output(TF1_SUBCLASS_NAMES)
  prefixes = [{n.partition("/")[0] for n in names if "beta1_power" in n} for names in tfs]
  assert prefixes == [{"cond_1"}, {"cond_1"}, {"cond"}, {"beta1_power"}]
  assert ours == tfs


# A DynamicLossScale subclass whose `update` gives its verdict as a Python
# bool: TF's class applied outside any conditional, so Adam's variables keep
# their plain names under the name scope, with either control flow.
STATIC_VERDICT_NAMES = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    if sys.argv[1] == "tf1":
      tf.compat.v1.disable_v2_behavior()
    import tf_lossscale

    def names(cls, loss_scales):
      class AlwaysApply(loss_scales.DynamicLossScale):
        def update(self, grads):
          update_op, _ = super().update(grads)
          return update_op, True

      with tf.compat.v1.Graph().as_default(), tf.name_scope("train"):
        var = tf.compat.v1.Variable([1.0, 2.0], name="var", use_resource=True)
        opt = cls(tf.compat.v1.train.AdamOptimizer(0.1), AlwaysApply(8.0))
        opt.minimize(tf.reduce_sum(var))
        return sorted(v.op.name for v in tf.compat.v1.global_variables())

    print(json.dumps([
        names(tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
              tf_lossscale.loss_scale),
        names(tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
              tf.compat.v1.mixed_precision),
    ]))
""")


@pytest.mark.parametrize("control_flow", ["tf1", "tf2"])
def test_variable_names_with_a_python_verdict_of_a_subclass_are_tf_s(control_flow):
  ours, tfs = helpers.program_output(STATIC_VERDICT_NAMES, control_flow)
  assert {"train/beta1_power", "train/beta2_power", "train/var/Adam"} <= set(tfs)
  assert ours == tfs


def test_tf1_program_with_v2_behavior_disabled_matches_tf_class():
  runs = helpers.program_output(TF1_PROGRAM)
  assert runs["ours"] == runs["tf"]
  variable_type, history = runs["ours"]
  assert variable_type == "RefVariable"
  assert [step for _, _, step, _ in history] == [1, 1, 2, 3, 4, 4, 5]
  assert [scale for *_, scale in history] == [8.0, 4.0, 4.0, 4.0, 8.0, 4.0, 4.0]
  assert history[1][:2] == history[0][:2]  # the NaN step moved nothing
  np.testing.assert_allclose(history[0][0], INITIAL_VAR - LR * COEFFS)


# Adam's non-slot variables take the name scope of the apply's conditional under
# TF1 control flow (TF 2.4: `cond_1/beta1_power`): a Saver checkpoint moves
# between TF's class and ours only if ours names them the same.
def test_distributed_apply_is_tf_s_cross_replica_entry_point():
  """TF's classes have it (its `apply_gradients` docs send callers in a
  cross-replica context there): the same steps as TF's class."""
  results = []
  for cls in (TFs, Ours):
    strategy = helpers.make_strategy("mirrored")
    with strategy.scope():
      var = tf.Variable([1.0, 2.0])
      opt = cls(tf.compat.v1.train.MomentumOptimizer(0.5, 0.9), "dynamic")

    @tf.function
    def step(grad, opt=opt, var=var, strategy=strategy):
      with strategy.scope():  # A cross-replica context.
        pairs = strategy.extended.call_for_each_replica(lambda: [(tf.identity(grad), var)])
        opt._distributed_apply(strategy, pairs)

    history = []
    for grad in ([1.0, -1.0], [float("nan"), 1.0], [2.0, 1.0]):
      step(tf.constant(grad))
      history.append((var.numpy().tolist(), float(opt._loss_scale())))
    results.append(history)
  assert results[0] == results[1]
  assert results[1][1] == (results[1][0][0], 2.0**14)  # the NaN step skipped


def test_graph_minimize_trains_the_trainable_variables_only():
  with tf.compat.v1.Graph().as_default():
    var = tf.compat.v1.Variable(INITIAL_VAR, use_resource=True)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(LR), "dynamic")
    train_op = opt.minimize(tf.reduce_sum(var * COEFFS), global_step)  # no var_list
    scale_names = {v.name for v in opt.variables()}
    assert scale_names == {"current_loss_scale:0", "good_steps:0"}  # no slots for SGD
    assert not scale_names & {v.name for v in tf.compat.v1.trainable_variables()}
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for _ in range(3):
        sess.run(train_op)
      var_value, step, good_steps = sess.run([var, global_step, opt.variables()[1]])
  np.testing.assert_allclose(var_value, INITIAL_VAR - 3 * LR * COEFFS)
  assert (step, good_steps) == (3, 3)


def test_variables_lists_only_the_current_graph():
  with tf.compat.v1.Graph().as_default():
    opt = Ours(momentum(), "dynamic")
    var = tf.compat.v1.Variable(1.0, use_resource=True)
    opt.minimize(var, var_list=[var])
    assert [v.name for v in opt.variables()] == [
      "Variable/Momentum:0",
      "current_loss_scale:0",
      "good_steps:0",
    ]
  with tf.compat.v1.Graph().as_default():
    assert opt.variables() == []


@pytest.mark.parametrize("loss_scale", ["dynamic", 128])
@pytest.mark.parametrize("name", [None, "my_train"])
def test_graph_train_op_is_named_as_by_tf_class(name, loss_scale):
  """The returned op takes the name given to `apply_gradients`, else the
  optimizer's, as with TF's class: not `<name>_1`, after the wrapped
  optimizer's apply (TF's class named that one `<name>-wrapped`)."""
  names = []
  for cls in (Ours, TFs):
    with tf.compat.v1.Graph().as_default():
      var = tf.compat.v1.Variable(INITIAL_VAR, use_resource=True)
      global_step = tf.compat.v1.train.get_or_create_global_step()
      opt = cls(momentum(), loss_scale)
      loss = tf.reduce_sum(var * COEFFS)
      if name is None:
        train_op = opt.minimize(loss, global_step)
      else:
        train_op = opt.apply_gradients(opt.compute_gradients(loss), global_step, name=name)
      names.append(train_op.name)
  assert names == [name or "Momentum"] * 2


@pytest.mark.parametrize("cls", [Ours, TFs], ids=["ours", "tf"])
@pytest.mark.parametrize(
  "make_opt",
  [object, tf.keras.optimizers.SGD, lambda: "sgd"],
  ids=["object", "keras", "string"],
)
def test_only_v1_optimizers_are_wrapped(cls, make_opt):
  opt = make_opt()
  message = f'"opt" must be an instance of Optimizer, but got: {type(opt)}'
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    cls(opt, "dynamic")


@pytest.mark.parametrize("cls", [Ours, TFs], ids=["ours", "tf"])
def test_loss_scale_cannot_be_none(cls):
  with pytest.raises(ValueError, match="^loss_scale cannot be None$"):
    cls(momentum(), None)


def test_eager_loss_must_be_callable():
  var = tf.Variable(1.0)
  opt = Ours(momentum(), "dynamic")
  with pytest.raises(RuntimeError, match="should be a function when eager execution is enabled"):
    opt.compute_gradients(3.0 * var, var_list=[var])


def test_loss_scale_must_be_interpretable():
  with pytest.raises(ValueError, match="^Could not interpret loss scale identifier: dynamik$"):
    Ours(momentum(), "dynamik")


@pytest.mark.parametrize(
  "loss_scale",
  ["dynamic", 64, 64.0, {"class_name": "FixedLossScale", "config": {"loss_scale_value": 64}}],
)
def test_loss_scale_takes_every_identifier_get_takes(loss_scale):
  var = tf.Variable(1.0)
  opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(1.0), loss_scale)
  [(grad, _)] = opt.compute_gradients(lambda: 3.0 * var, [var])
  assert float(grad) == 3.0
  tracked = dict(opt._trackable_children())["loss_scale"]
  assert isinstance(tracked, ls_module.LossScale)
  assert float(tracked()) == (2.0**15 if loss_scale == "dynamic" else 64.0)


def test_apply_gradients_in_cross_replica_context_is_refused():
  strategy = helpers.make_strategy("mirrored")
  with strategy.scope():
    var = tf.Variable(1.0)
    opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(1.0), "dynamic")
    with pytest.raises(
      ValueError, match=r"^apply_gradients\(\) must be called in a replica context\.$"
    ):
      opt.apply_gradients([(tf.constant(1.0), var)])
  assert float(var.numpy()) == 1.0


@pytest.mark.parametrize(
  "strategy_cls, message",
  [
    (tf.distribute.TPUStrategy, "Loss scaling is not supported with TPUStrategyV2. "),
    (tf.distribute.experimental.TPUStrategy, "Loss scaling is not supported with TPUStrategy. "),
    (
      tf.compat.v1.distribute.experimental.TPUStrategy,
      "Loss scaling is not supported with TPUStrategyV1. ",
    ),
    (
      tf.distribute.experimental.ParameterServerStrategy,
      "Loss scaling is not supported with the tf.distribute.Strategy: "
      "ParameterServerStrategyV2. Try using a different Strategy, e.g. a MirroredStrategy.",
    ),
  ],
)
def test_strategies_loss_scaling_cannot_serve_are_refused_by_name(
  monkeypatch, strategy_cls, message
):
  # These strategies need TPUs or a cluster; an uninitialized instance stands
  # in for the current strategy.
  var = tf.Variable(1.0)
  opt = Ours(tf.compat.v1.train.GradientDescentOptimizer(1.0), "dynamic")
  monkeypatch.setattr(tf.distribute, "has_strategy", lambda: True)
  monkeypatch.setattr(tf.distribute, "get_strategy", lambda: object.__new__(strategy_cls))
  with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
    opt.apply_gradients([(tf.constant(1.0), var)])
  assert float(var.numpy()) == 1.0


def _two_steps_under(strategy, wrapper, dynamic_loss_scale):
  """A finite step, then a NaN one; the variable after each and the final scale."""
  with strategy.scope():
    var = tf.Variable([1.0, 2.0])
    loss_scale = dynamic_loss_scale(8.0)
    opt = wrapper(tf.compat.v1.train.GradientDescentOptimizer(1.0), loss_scale)

  @tf.function
  def step(m):
    def replica_step():
      opt.minimize(lambda: m * tf.reduce_sum(var * COEFFS), var_list=[var])

    strategy.run(replica_step)

  after = []
  for m in (1.0, NAN):
    step(tf.constant(m))
    after.append(var.numpy())
  return after, float(loss_scale())


@pytest.mark.parametrize("strategy", ["central_storage", "one_device"])
def test_other_strategies_work_as_with_tf_class(strategy):
  devices = helpers.TWO_CPUS
  made = {
    "central_storage": lambda: tf.distribute.experimental.CentralStorageStrategy(devices),
    "one_device": lambda: tf.distribute.OneDeviceStrategy(devices[0]),
  }[strategy]
  ours = _two_steps_under(made(), Ours, ls_module.DynamicLossScale)
  theirs = _two_steps_under(made(), TFs, tf.compat.v1.mixed_precision.DynamicLossScale)
  replicas = made().num_replicas_in_sync
  expected = INITIAL_VAR - replicas * COEFFS
  for after in (ours[0], theirs[0]):
    np.testing.assert_allclose(after[0], expected)  # applied
    np.testing.assert_allclose(after[1], expected)  # skipped
  assert ours[1] == theirs[1] == 4.0


@pytest.mark.parametrize("hook", ["_apply_dense", "_apply_sparse", "_resource_apply_dense"])
def test_base_class_apply_hooks_are_never_used(hook):
  opt = Ours(momentum(), "dynamic")
  with pytest.raises(RuntimeError, match="^This function should never be called$"):
    getattr(opt, hook)(tf.constant(1.0), tf.Variable(1.0))


def test_resource_apply_sparse_hook_is_never_used():
  opt = Ours(momentum(), "dynamic")
  with pytest.raises(RuntimeError, match="^This function should never be called$"):
    opt._resource_apply_sparse(tf.constant([1.0]), tf.Variable([1.0]).handle, tf.constant([0]))


def test_public_names_are_one_class():
  assert tf_lossscale.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer is Ours
  assert tf_lossscale.MixedPrecisionLossScaleOptimizer is Ours
  assert issubclass(Ours, tf.compat.v1.train.Optimizer)
