"""Keras LossScaleOptimizer: applying steps, per inner family, strategy and mode.

Also holds the helpers the other `test_keras_lso_*` files import.
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
from tf_lossscale._src import fast_paths
from tf_lossscale.keras import mixed_precision

FAMILIES = ["keras3", "tf_keras", "tf_keras_new"]
_MODULES = {
  "keras3": keras.optimizers,
  "tf_keras": tf_keras.optimizers.legacy,  # OptimizerV2, TF 2.4's optimizers
  "tf_keras_new": tf_keras.optimizers,
}


def make_inner(family, kind="SGD", **kwargs):
  """A fresh inner optimizer `kind` of `family` (see `_MODULES`)."""
  return getattr(_MODULES[family], kind)(**kwargs)


def momentum_slot(opt, var):
  """The SGD momentum slot of `var` in the wrapped optimizer `opt`."""
  inner = opt.inner_optimizer
  if isinstance(inner, keras.optimizers.Optimizer):
    return inner.momentums[inner._get_variable_index(var)].value
  if isinstance(inner, tf_keras.optimizers.Optimizer):
    return inner.momentums[inner._index_dict[inner._var_key(var)]]
  return inner.get_slot(var, "momentum")


def locals_of(strategy, value):
  """Every replica's copy of a variable, as numpy arrays."""
  if not isinstance(value, tf.Variable):  # A Keras 3 variable (not `keras.Variable` on 3.0).
    value = value.value
  return [np.asarray(v.numpy()) for v in strategy.experimental_local_results(value)]


def count(value):
  """An int from a (Keras, mirrored) integer variable."""
  if isinstance(value, keras.Variable):
    value = value.value
  return int(tf.convert_to_tensor(value).numpy())


_MIRRORED = []


def shared_strategy(name):
  """'default' (no strategy) or the shared MirroredStrategy over two logical CPUs."""
  if name == "default":
    return tf.distribute.get_strategy()
  if not _MIRRORED:
    _MIRRORED.append(helpers.make_strategy("mirrored"))
  return _MIRRORED[0]


@pytest.fixture(params=["default", "mirrored"])
def strategy(request):
  """Overrides the conftest fixture: one MirroredStrategy shared by these tests."""
  return shared_strategy(request.param)


@pytest.fixture(params=FAMILIES)
def family(request):
  return request.param


def _check_incoming_gradient(x, expected):
  """Identity whose backward pass asserts that the incoming gradient == expected."""

  @tf.custom_gradient
  def identity(x):
    def grad(dy):
      tf.debugging.assert_equal(dy, tf.fill(tf.shape(dy), expected))
      return dy

    return tf.identity(x), grad

  return identity(x)


def _custom_loop_step(strategy, mode, opt, var):
  """step(expected_scale, bad): one custom-loop step on every replica.

  The loss is sum(3 * var) per replica; the gradient reaching the identity
  must be 3 x the loss scale in use. With `bad`, the last replica's gradient
  is NaN.
  """
  last = strategy.num_replicas_in_sync - 1

  def replica_fn(expected_scale, bad):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(3.0 * _check_incoming_gradient(var, 3.0 * expected_scale))
      scaled_loss = opt.get_scaled_loss(loss)
    (grad,) = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [var]))
    grad = tf.cond(bad, lambda: helpers.replica_nan(grad, last), lambda: grad)
    opt.apply_gradients([(grad, var)])

  @mode
  def step(expected_scale, bad):
    strategy.run(replica_fn, args=(expected_scale, bad))

  return lambda expected_scale, bad=False: step(tf.constant(expected_scale), tf.constant(bad))


def test_dynamic_scale_sequence(family, strategy, mode):
  """Scale reaches the gradients, grows, halves on NaN (any replica); skips leave all untouched."""
  replicas = strategy.num_replicas_in_sync
  with strategy.scope():
    var = tf.Variable([1.0, 2.0])
    opt = mixed_precision.LossScaleOptimizer(
      make_inner(family, learning_rate=1.0, momentum=0.5), initial_scale=8, dynamic_growth_steps=2
    )
  step = _custom_loop_step(strategy, mode, opt, var)
  g = 3.0 * replicas  # the all-reduced (summed) gradient

  step(8.0)
  for value in locals_of(strategy, var):
    np.testing.assert_allclose(value, [1 - g, 2 - g])
  assert float(opt.loss_scale) == 8.0 and count(opt.dynamic_counter) == 1
  assert count(opt.iterations) == 1

  step(8.0, bad=True)  # NaN on the last replica only: every replica skips.
  for value in locals_of(strategy, var):
    np.testing.assert_allclose(value, [1 - g, 2 - g])
  for value in locals_of(strategy, momentum_slot(opt, var)):
    np.testing.assert_allclose(value, [-g, -g])
  assert float(opt.loss_scale) == 4.0 and count(opt.dynamic_counter) == 0
  assert count(opt.iterations) == 2

  step(4.0)
  step(4.0)  # second good step in a row: the scale doubles.
  assert float(opt.loss_scale) == 8.0 and count(opt.dynamic_counter) == 0
  assert count(opt.iterations) == 4
  for value in locals_of(strategy, var):
    np.testing.assert_allclose(value, [1 - 12.75 * replicas, 2 - 12.75 * replicas])
  for value in locals_of(strategy, momentum_slot(opt, var)):
    np.testing.assert_allclose(value, [-5.25 * replicas] * 2)


def test_options_beyond_tf24_bound_the_scale_and_delay_its_halving(family, strategy, mode):
  """max/min bound the scale; with hysteresis 2 a run's first NaN is skipped but keeps the
  scale; `skipped_steps` counts skips once for all replicas; skipped steps change nothing."""
  with strategy.scope():
    var = tf.Variable([1.0, 2.0])
    opt = mixed_precision.LossScaleOptimizer(
      make_inner(family, learning_rate=1.0),
      initial_scale=4,
      dynamic_growth_steps=1,
      min_loss_scale=2,
      max_loss_scale=8,
      hysteresis=2,
    )
  step = _custom_loop_step(strategy, mode, opt, var)
  g = 3.0 * strategy.num_replicas_in_sync
  # (scale in use, NaN on the last replica) -> (scale, counter, skipped) after the step.
  sequence = [
    ((4.0, False), (8.0, 0, 0)),
    ((8.0, False), (8.0, 0, 0)),  # the maximum
    ((8.0, True), (8.0, -1, 1)),  # a run's first NaN: skipped, scale kept
    ((8.0, True), (4.0, -1, 2)),  # its second: halved
    ((4.0, True), (2.0, -1, 3)),
    ((2.0, True), (2.0, -1, 4)),  # the minimum
    ((2.0, False), (4.0, 0, 4)),  # a finite step ends the run
  ]
  for (scale, bad), expected in sequence:
    step(scale, bad)
    assert (float(opt.loss_scale), count(opt.dynamic_counter), count(opt.skipped_steps)) == (
      expected
    )
    for value in locals_of(strategy, opt.skipped_steps):
      assert value == expected[2]
  assert count(opt.iterations) == len(sequence)
  for value in locals_of(strategy, var):
    np.testing.assert_allclose(value, [1 - 3 * g, 2 - 3 * g])  # three steps applied


def test_fixed_scale_applies_as_given(family, strategy, mode):
  """A fixed scale reaches the gradients and nothing checks them: NaN is applied."""
  with strategy.scope():
    var = tf.Variable([1.0, 2.0])
    opt = mixed_precision.LossScaleOptimizer(
      make_inner(family, learning_rate=1.0), dynamic=False, initial_scale=16
    )
  step = _custom_loop_step(strategy, mode, opt, var)
  step(16.0)
  g = 3.0 * strategy.num_replicas_in_sync
  np.testing.assert_allclose(var.numpy(), [1 - g, 2 - g])
  assert opt.dynamic_counter is None and float(opt.loss_scale) == 16.0
  assert opt.skipped_steps is None  # nothing is ever skipped
  step(16.0, bad=True)
  assert np.isnan(var.numpy()).all()
  assert float(opt.loss_scale) == 16.0 and count(opt.iterations) == 2


def test_keras3_own_lso_lets_one_replica_nan_through():
  """Documented difference: Keras 3's LossScaleOptimizer checks before its all-reduce."""
  strategy = shared_strategy("mirrored")
  with strategy.scope():
    var = tf.Variable([1.0, 2.0])
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8.0)

  def replica_fn():
    opt.apply_gradients([(helpers.replica_nan(tf.constant([1.0, 1.0]), 1), var)])

  strategy.run(replica_fn)  # (eagerly: in a tf.function it fails to run at all)
  # The replica that got the NaN applied it (Keras >= 3.5 all-reduces first and
  # so every replica does); ours skips: see test_dynamic_scale_sequence.
  assert any(np.isnan(value).all() for value in locals_of(strategy, var))


def test_minimize(family, strategy, mode):
  with strategy.scope():
    var = tf.Variable([3.0])
    opt = mixed_precision.LossScaleOptimizer(make_inner(family, learning_rate=0.5), initial_scale=4)

  @mode
  def step():
    strategy.run(lambda: opt.minimize(lambda: var**2, var_list=[var]))

  step()
  # d/dvar var**2 = 6 per replica, summed over replicas.
  assert float(var.numpy()[0]) == pytest.approx(3.0 - 0.5 * 6.0 * strategy.num_replicas_in_sync)
  assert count(opt.dynamic_counter) == 1


def test_minimize_with_tape_and_tensor_loss(family):
  var = tf.Variable(2.0)
  opt = mixed_precision.LossScaleOptimizer(make_inner(family, learning_rate=0.25))
  tape = tf.GradientTape()
  with tape:
    loss = var**2
  opt.minimize(loss, var_list=[var], tape=tape)
  assert float(var.numpy()) == 1.0
  with pytest.raises(ValueError, match="`tape` is required"):
    opt.minimize(var**2, var_list=[var])


def test_float16_loss_keeps_dtype_and_overflow_skips(family):
  var = tf.Variable(2.0)
  opt = mixed_precision.LossScaleOptimizer(make_inner(family, learning_rate=1.0))
  with tf.GradientTape() as tape:
    loss = tf.cast(var, tf.float16) * tf.constant(4.0, tf.float16)
    scaled = opt.get_scaled_loss(loss)
  assert scaled.dtype == tf.float16
  assert np.isinf(scaled.numpy())  # 8 * 2**15 overflows float16
  (grad,) = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
  opt.apply_gradients([(grad, var)])
  assert float(var.numpy()) == 2.0 and float(opt.loss_scale) == 2.0**14
  with tf.GradientTape() as tape:
    scaled = opt.get_scaled_loss(tf.cast(var, tf.float16) * tf.constant(0.5, tf.float16))
  assert scaled.dtype == tf.float16 and float(scaled.numpy()) == 2.0**14
  (grad,) = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
  opt.apply_gradients([(grad, var)])
  assert float(var.numpy()) == 1.5


@pytest.mark.parametrize(
  "clip, expected",
  [
    ({"clipnorm": 1.0}, [1 - 0.6, 1 - 0.8]),
    ({"clipvalue": 1.0}, [1 - 1.0, 1 - 1.0]),
    ({"global_clipnorm": 1.0}, [1 - 0.6, 1 - 0.8]),
  ],
)
def test_clipping_applies_to_unscaled_gradients_and_nan_is_skipped(family, clip, expected):
  var = tf.Variable([1.0, 1.0])
  opt = mixed_precision.LossScaleOptimizer(
    make_inner(family, learning_rate=1.0, **clip), initial_scale=2.0**10
  )
  assert getattr(opt, next(iter(clip))) == 1.0
  with tf.GradientTape() as tape:
    scaled = opt.get_scaled_loss(tf.reduce_sum(var * tf.constant([3.0, 4.0])))
  grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
  opt.apply_gradients(zip(grads, [var], strict=True))
  np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6)
  opt.apply_gradients([(tf.constant([float("inf"), 1.0]), var)])
  np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6)
  assert float(opt.loss_scale) == 2.0**9


def test_get_unscaled_gradients_keeps_none_and_indexed_slices(family):
  opt = mixed_precision.LossScaleOptimizer(make_inner(family), dynamic=False, initial_scale=4)
  sparse = tf.IndexedSlices(tf.constant([[4.0, 8.0]]), tf.constant([1]), tf.constant([3, 2]))
  dense, none, unscaled_sparse = opt.get_unscaled_gradients([tf.constant(2.0), None, sparse])
  assert float(dense) == 0.5 and none is None
  assert isinstance(unscaled_sparse, tf.IndexedSlices)
  np.testing.assert_allclose(unscaled_sparse.values.numpy(), [[1.0, 2.0]])
  np.testing.assert_array_equal(unscaled_sparse.indices.numpy(), [1])


def test_get_unscaled_gradients_takes_any_iterable(family):
  """As TF 2.4's list comprehension: a generator too."""
  opt = mixed_precision.LossScaleOptimizer(make_inner(family), dynamic=False, initial_scale=4)
  dense, none = opt.get_unscaled_gradients(g for g in [tf.constant(8.0), None])
  assert float(dense) == 2.0 and none is None


def _variables_of(optimizer):
  variables = optimizer.variables
  return list(variables() if callable(variables) else variables)


def _none_then_both(family, strategy, mode, wrap):
  """A first step where `a` has no gradient, then one where it has: the inner
  optimizer's variable count after each, and `a` and `b` on every replica."""
  with strategy.scope():
    a, b = tf.Variable([1.0, 2.0]), tf.Variable(3.0)
    opt = make_inner(family, "Adam", learning_rate=0.5)
    opt = mixed_precision.LossScaleOptimizer(opt) if wrap else opt
  inner = opt.inner_optimizer if wrap else opt

  def step(grad_a, grad_b):  # A new function each: OptimizerV2 makes slots in the second.
    def replica_fn():  # Gradients made in the replica, as a tape's are.
      grads = [None if g is None else tf.constant(g) for g in (grad_a, grad_b)]
      opt.apply_gradients(zip(grads, [a, b], strict=True))

    mode(lambda: strategy.run(replica_fn))()

  step(None, 2.0)
  built = len(_variables_of(inner))
  step([1.0, -1.0], 1.0)
  return built, len(_variables_of(inner)), locals_of(strategy, a), locals_of(strategy, b)


def test_a_variable_without_a_gradient_on_the_first_step_is_updated_later(family, strategy, mode):
  """Built as the plain optimizer is: Keras 3 and new tf_keras for every
  variable passed, OptimizerV2 for those with a gradient; the same numbers."""
  if family == "keras3":
    helpers.need_plain_keras3_all_reduce(strategy)
  # The plain optimizer eagerly: plain Keras 3 fails this under MirroredStrategy in a
  # tf.function ("You must feed a value for placeholder tensor"); ours does not.
  plain = _none_then_both(family, strategy, lambda fn: fn, wrap=False)
  ours = _none_then_both(family, strategy, mode, wrap=True)
  assert ours[:2] == plain[:2]
  for ours_replicas, plain_replicas in zip(ours[2:], plain[2:], strict=True):
    np.testing.assert_array_equal(ours_replicas, plain_replicas)
  assert not np.array_equal(plain[2][0], [1.0, 2.0])  # The second step moved `a`.


def test_get_scaled_loss_callable(family):
  opt = mixed_precision.LossScaleOptimizer(make_inner(family), dynamic=False, initial_scale=4)
  scaled = opt.get_scaled_loss(lambda: tf.constant(3.0))
  assert callable(scaled) and float(scaled()) == 12.0


def test_get_scaled_loss_of_a_float64_callable_is_computed_in_float64(family):
  opt = mixed_precision.LossScaleOptimizer(make_inner(family), dynamic=False, initial_scale=3)
  loss = tf.constant(1.0 / 3.0 + 1e-12, tf.float64)  # float32 would round it
  scaled = opt.get_scaled_loss(lambda: loss)()
  assert scaled.dtype == tf.float64
  assert scaled.numpy() == opt.get_scaled_loss(loss).numpy() == np.float64(1.0 / 3.0 + 1e-12) * 3


def test_sparse_gradient_applied(family, strategy):
  with strategy.scope():
    var = tf.Variable([[1.0], [2.0], [3.0]])
    opt = mixed_precision.LossScaleOptimizer(make_inner(family, learning_rate=1.0), initial_scale=8)

  def replica_fn():
    with tf.GradientTape() as tape:
      loss = opt.get_scaled_loss(tf.reduce_sum(tf.gather(var, [1])))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
    assert isinstance(grads[0], tf.IndexedSlices)
    opt.apply_gradients(zip(grads, [var], strict=True))

  tf.function(lambda: strategy.run(replica_fn))()
  replicas = strategy.num_replicas_in_sync
  np.testing.assert_allclose(var.numpy(), [[1.0], [2.0 - replicas], [3.0]])


def test_apply_gradients_in_cross_replica_context_raises(family):
  strategy = shared_strategy("mirrored")
  with strategy.scope():
    var = tf.Variable([1.0])
    opt = mixed_precision.LossScaleOptimizer(make_inner(family))
    with pytest.raises(
      ValueError, match=r"^apply_gradients\(\) must be called in a replica context\.$"
    ):
      opt.apply_gradients([(tf.constant([1.0]), var)])


def test_iterations_setter_and_skipped_steps_tf_keras():
  opt = mixed_precision.LossScaleOptimizer(make_inner("tf_keras"), initial_scale=2)
  opt.iterations = tf.Variable(7, dtype=tf.int64)
  assert count(opt.inner_optimizer.iterations) == 7
  var = tf.Variable(1.0)
  opt.apply_gradients([(tf.constant(float("nan")), var)])
  assert count(opt.iterations) == 8 and float(var.numpy()) == 1.0


def test_iterations_of_a_keras3_inner_are_assigned_not_replaced():
  opt = mixed_precision.LossScaleOptimizer(make_inner("keras3"), initial_scale=2)
  with pytest.raises(AttributeError, match=r"SGD \(a Keras 3 optimizer\).*iterations.assign"):
    opt.iterations = tf.Variable(7, dtype=tf.int64)
  opt.iterations.assign(7)
  var = keras.Variable(1.0)
  opt.apply_gradients([(tf.constant(float("nan")), var)])
  assert count(opt.iterations) == 8 and float(var.numpy()) == 1.0


def test_weights_methods(family):
  var = tf.Variable([1.0, 2.0])
  opt = mixed_precision.LossScaleOptimizer(make_inner(family, momentum=0.9))
  opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
  inner = opt.inner_optimizer
  if family != "tf_keras":
    # Keras 3 also holds the learning rate as a variable.
    assert opt.variables is not None and len(opt.variables) == (3 if family == "keras3" else 2)
    assert [id(v) for v in opt.variables] == [id(v) for v in inner.variables]
  else:
    assert opt.variables() == inner.variables() and opt.weights == inner.weights
    weights = opt.get_weights()
    assert len(weights) == 2 and int(weights[0]) == 1
    opt.set_weights([np.int64(5), np.array([3.0, 4.0], np.float32)])
    assert count(inner.iterations) == 5
    np.testing.assert_allclose(opt.get_slot(var, "momentum").numpy(), [3.0, 4.0])
    assert opt.get_slot_names() == ["momentum"]


@pytest.mark.parametrize("mode_name", ["eager", "function"])
def test_differential_against_tf_keras_lso(family, strategy, mode_name):
  """Same data, NaN steps included: identical variables, slots and scale to tf_keras's class."""
  wrap = tf.function if mode_name == "function" else (lambda f: f)
  runs = []
  for make in (
    lambda: mixed_precision.LossScaleOptimizer(
      make_inner(family, learning_rate=0.1, momentum=0.9), initial_scale=4, dynamic_growth_steps=3
    ),
    lambda: tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.legacy.SGD(learning_rate=0.1, momentum=0.9),
      initial_scale=4,
      dynamic_growth_steps=3,
    ),
  ):
    with strategy.scope():
      var = tf.Variable([0.5, -1.5, 2.0])
      opt = make()

    def replica_fn(x, bad, opt=opt, var=var):
      with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum((var * x) ** 2))
      (grad,) = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
      grad = tf.cond(bad, lambda: helpers.replica_nan(grad, 0), lambda: grad)
      opt.apply_gradients([(grad, var)])

    step = wrap(lambda x, bad, replica_fn=replica_fn: strategy.run(replica_fn, args=(x, bad)))
    history = []
    for i, bad in enumerate([False, True, False, False, False, True, False]):
      step(tf.constant([1.0, 0.5, 0.25]) * (i + 1), tf.constant(bad))
      history.append((var.numpy().copy(), float(opt.loss_scale), count(opt.iterations)))
    runs.append(history)
  for ours, theirs in zip(*runs, strict=True):
    if fast_paths._cpu_only():
      np.testing.assert_array_equal(ours[0], theirs[0])
    else:  # On a GPU another family's momentum kernel may fuse a multiply-add: 1 ulp.
      np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6, atol=0)
    assert ours[1:] == theirs[1:]


def test_tf_keras_graph_mode_minimize_and_get_gradients():
  """OptimizerV2 in a TF1 graph under a Session: skip, halve, grow, as eagerly."""
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    var = tf.compat.v1.Variable([1.0, 2.0], use_resource=True)
    opt = mixed_precision.LossScaleOptimizer(
      make_inner("tf_keras", learning_rate=1.0, momentum=0.5),
      initial_scale=8,
      dynamic_growth_steps=2,
    )
    bad = tf.compat.v1.placeholder(tf.bool, [])
    train = opt.minimize(
      lambda: tf.reduce_sum(var * tf.where(bad, float("nan"), 3.0)), var_list=[var]
    )
    grads = opt.get_gradients(tf.reduce_sum(var * 2.0), [var])
    sess.run(tf.compat.v1.global_variables_initializer())
    results = []
    for is_bad in [False, True, False, False]:
      sess.run(train, {bad: is_bad})
      results.append(sess.run([var, opt.loss_scale, opt.iterations, opt.dynamic_counter]))
    np.testing.assert_array_equal(results[1][0], [-2.0, -1.0])
    assert [r[1:] for r in results] == [[8.0, 1, 1], [4.0, 2, 0], [4.0, 3, 1], [8.0, 4, 0]]
    np.testing.assert_array_equal(results[3][0], [-11.75, -10.75])
    np.testing.assert_array_equal(sess.run(grads)[0], [2.0, 2.0])


def _tf_keras_fit_in_a_graph(lso_class):
  """tf_keras's TF1 `fit` (a graph, its own session): 8 steps, 2 of them
  overflowing; the weights, scale, iterations and counter after it."""
  with tf.Graph().as_default():
    model = tf_keras.Sequential(
      [tf_keras.Input((2,)), tf_keras.layers.Dense(1, kernel_initializer="ones")]
    )
    opt = lso_class(
      make_inner("tf_keras", learning_rate=0.01, momentum=0.5),
      initial_scale=8,
      dynamic_growth_steps=2,
    )
    model.compile(optimizer=opt, loss="mse")
    x = np.ones((8, 2), np.float32)
    x[4:6] = 1e30  # The third batch's gradients overflow, in both epochs.
    model.fit(x, np.ones((8, 1)), batch_size=2, epochs=2, verbose=0, shuffle=False)
    get = tf_keras.backend.get_value
    return model.get_weights(), [
      get(v) for v in (opt.loss_scale, opt.iterations, opt.dynamic_counter)
    ]


def test_tf_keras_fit_in_a_graph_initializes_the_scale_and_matches_tf_keras():
  """As TF 2.4's: the scale's variables are registered with tf_keras's session."""
  weights, state = _tf_keras_fit_in_a_graph(mixed_precision.LossScaleOptimizer)
  peer_weights, peer_state = _tf_keras_fit_in_a_graph(tf_keras.mixed_precision.LossScaleOptimizer)
  assert state == peer_state == [8.0, 8, 1]  # 16 after 2 steps, 8 at the skip; twice.
  for ours, peer in zip(weights, peer_weights, strict=True):
    np.testing.assert_array_equal(ours, peer)


def test_without_aggregation_applied_once_and_any_replica_nan_skips(family):
  strategy = shared_strategy("mirrored")
  with strategy.scope():
    var = tf.Variable([0.0, 0.0])
    opt = mixed_precision.LossScaleOptimizer(make_inner(family, learning_rate=0.5), initial_scale=8)

  @tf.function
  def step(bad, reduce_first):
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      grad = tf.cast(ctx.replica_id_in_sync_group, tf.float32) * 2.0 + tf.constant([1.0, 1.0])
      grad = tf.cond(bad, lambda: helpers.replica_nan(grad, 1), lambda: grad)
      if reduce_first:
        grad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grad)
      opt.apply_gradients([(grad, var)], experimental_aggregate_gradients=False)

    strategy.run(replica_fn)

  step(tf.constant(False), True)  # 1 + 3 reduced by the caller: applied once.
  for value in locals_of(strategy, var):
    np.testing.assert_allclose(value, [-2.0, -2.0])
  step(tf.constant(True), False)  # not aggregated, NaN on replica 1 only: all skip.
  for value in locals_of(strategy, var):
    np.testing.assert_allclose(value, [-2.0, -2.0])
  assert float(opt.loss_scale) == 4.0 and count(opt.iterations) == 2


def test_slots_restored_before_the_first_step_reach_every_replica(family, tmp_path):
  # A checkpoint restored before the inner optimizer is built restores its
  # slots when the first step builds it: on every replica, not only the first.
  helpers.need_tf_checkpoints(family)
  strategy = helpers.make_strategy("mirrored")

  def build():
    with strategy.scope():
      var = keras.Variable([1.0, 2.0]) if family == "keras3" else tf.Variable([1.0, 2.0])
      opt = mixed_precision.LossScaleOptimizer(make_inner(family, learning_rate=0.1, momentum=0.9))

    @tf.function
    def step():
      strategy.run(lambda: opt.apply_gradients([(tf.constant([1.0, 1.0]), var)]))

    return var, opt, step

  var, opt, step = build()
  step()
  path = tf.train.Checkpoint(var=var, opt=opt).write(str(tmp_path / "ckpt"))
  var, opt, step = build()
  tf.train.Checkpoint(var=var, opt=opt).read(path)  # deferred until built
  step()
  assert count(opt.iterations) == 2
  # Two replicas sum gradient 2: velocity -0.2, then 0.9 * -0.2 - 0.2 = -0.38
  # (-0.2 again, without the restored slot): 1 - 0.2 - 0.38 = 0.42.
  for replica_value in locals_of(strategy, var):
    np.testing.assert_allclose(replica_value, [0.42, 1.42], rtol=1e-6)


# Keras 3's protocol: each scale_loss pairs with the next apply_gradients ------


def _scale_loss_steps(opt, in_function):
  """Two variables, each with its own scaled loss, applied one after the other:
  in a `tf.function` with each apply under an `if` on a tensor."""
  a, b = tf.Variable(1.0), tf.Variable(2.0)
  if hasattr(opt, "build"):  # Not an OptimizerV2 (tf_keras's legacy optimizers).
    opt.build([a, b])

  def step(do):
    with tf.GradientTape(persistent=True) as tape:
      loss_a, loss_b = opt.scale_loss(a * 3.0), opt.scale_loss(b * b)
    grads = tape.gradient(loss_a, a), tape.gradient(loss_b, b)
    if do:
      opt.apply_gradients([(grads[0], a)])
    if do:
      opt.apply_gradients([(grads[1], b)])

  (tf.function(step) if in_function else step)(tf.constant(True))
  return a.numpy(), b.numpy()


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_each_scale_loss_is_unscaled_by_one_apply_as_keras3_does(in_function):
  """Two scale_loss calls before two applies, and applies in a conditional
  of the function: every gradient is unscaled once (both were applied
  scaled, 1024x, the second eagerly and both in the function)."""
  plain = _scale_loss_steps(
    keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.125), initial_scale=1024),
    in_function,
  )
  np.testing.assert_array_equal(plain, [1.0 - 0.125 * 3.0, 2.0 - 0.125 * 4.0])
  for family in FAMILIES:
    opt = mixed_precision.LossScaleOptimizer(
      make_inner(family, learning_rate=0.125), dynamic=False, initial_scale=1024
    )
    np.testing.assert_array_equal(_scale_loss_steps(opt, in_function), plain, err_msg=family)


@pytest.mark.parametrize("split", ["scaled_in_function", "applied_in_function"])
def test_scale_loss_in_another_function_than_apply_warns_once(split, caplog):
  """The mark pairs `scale_loss` with the next `apply_gradients` of its own
  graph: one in another graph is not taken (the gradients are applied as
  given, as TF 2.4's `apply_gradients` applies them), and said so."""
  var = keras.Variable(1.0)
  opt = mixed_precision.LossScaleOptimizer(
    keras.optimizers.SGD(0.125), dynamic=False, initial_scale=4
  )

  def grads():
    with tf.GradientTape() as tape:
      loss = opt.scale_loss(var * 3.0)
    return tape.gradient(loss, [var])

  def apply(grads):
    opt.apply(grads, [var])

  if split == "scaled_in_function":
    grads = tf.function(grads)
  else:
    apply = tf.function(apply)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    for _ in range(2):
      apply(grads())
  warnings = [r for r in caplog.records if "pending in another tf.function" in r.getMessage()]
  assert len(warnings) == 1
  assert float(var.numpy()) == 1.0 - 2 * 0.125 * 3.0 * 4


def test_scale_loss_marks_only_the_next_apply_and_fit_leaves_no_mark():
  """A `fit` (Keras 3's protocol), then TF 2.4's `apply_gradients` of a
  gradient given as it is: applied as given."""
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=1024)
  model.compile(optimizer=opt, loss="mse")
  model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
  kernel = model.layers[0].kernel
  before = kernel.numpy()
  opt.apply_gradients([(tf.ones([2, 1]), kernel)])
  np.testing.assert_array_equal(kernel.numpy(), before - 1.0)
  var = tf.Variable(1.0)
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=1024)
  with tf.GradientTape() as tape:
    loss = opt.scale_loss(var * 3.0)
  opt.apply_gradients([(tape.gradient(loss, var), var)])  # unscaled: 3
  opt.apply_gradients([(tf.constant(3.0), var)])  # given unscaled: 3
  assert float(var.numpy()) == 1.0 - 2 * 3.0


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("family", FAMILIES)
def test_scale_loss_and_apply_in_two_runs_of_a_strategy_pair_up(strategy, family, in_function):
  """Gradients computed in one `strategy.run` and applied in the next (a
  replica's threads are new in each): each replica's mark is its own, and
  both steps were 1024x (Keras 3's wrapper: -0.1 per replica)."""
  if family == "keras3":
    helpers.need_plain_keras3_all_reduce(strategy)
  with strategy.scope():
    var = keras.Variable(0.0) if family == "keras3" else tf.Variable(0.0)
    opt = mixed_precision.LossScaleOptimizer(
      make_inner(family, learning_rate=0.1), initial_scale=1024
    )

  def grads():
    with tf.GradientTape() as tape:
      loss = opt.scale_loss(var * 1.0)
    return tape.gradient(loss, var)

  def step():
    grad = strategy.run(grads)
    strategy.run(lambda grad: opt.apply_gradients([(grad, var)]), args=(grad,))

  (tf.function(step) if in_function else step)()
  replicas = strategy.num_replicas_in_sync
  for value in locals_of(strategy, var):
    np.testing.assert_allclose(value, -0.1 * replicas, rtol=1e-6)
  assert count(opt.iterations) == 1 and float(opt.loss_scale) == 1024


@pytest.mark.parametrize("split", ["scaled_in_run", "applied_in_run", "function_scaled_in_run"])
def test_scale_loss_and_apply_pair_up_across_a_one_device_run(split):
  """OneDeviceStrategy runs `strategy.run` in the caller's thread: a `scale_loss`
  inside it and an `apply_gradients` outside it (or the reverse) are one
  thread's, and pair up (Keras 3's wrapper: -0.1)."""
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  with strategy.scope():
    var = keras.Variable(0.0)
    opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1024)

  def grads():
    with tf.GradientTape() as tape:
      loss = opt.scale_loss(var * 1.0)
    return tape.gradient(loss, var)

  def apply(grad):
    opt.apply_gradients([(grad, var)])

  if split == "applied_in_run":
    strategy.run(apply, args=(grads(),))
  else:
    step = lambda: apply(strategy.run(grads))  # noqa: E731
    (tf.function(step) if split.startswith("function") else step)()
  np.testing.assert_allclose(var.numpy(), -0.1, rtol=1e-6)


@pytest.mark.parametrize("strategy_name", ["one_device", "mirrored"])
def test_an_apply_refused_in_cross_replica_context_takes_its_marks(strategy_name):
  """`scale_loss` in `strategy.run`, then `apply_gradients` in its scope
  (refused): a later apply of gradients given unscaled was divided by the
  scale (under MirroredStrategy, each replica's mark was left)."""
  if strategy_name == "one_device":
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  else:
    strategy = shared_strategy(strategy_name)
  with strategy.scope():
    var = keras.Variable(0.0)
    opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1024)
    opt.build([var])
  strategy.run(lambda: opt.scale_loss(var * 1.0))
  with strategy.scope(), pytest.raises(ValueError, match="must be called in a replica context"):
    opt.apply_gradients([(tf.constant(1.0), var)])
  strategy.run(lambda: opt.apply_gradients([(tf.constant(1.0), var)]))
  for value in locals_of(strategy, var):
    np.testing.assert_allclose(value, -0.1 * strategy.num_replicas_in_sync, rtol=1e-6)


def test_scale_loss_marks_no_step_takes_are_bounded():
  """`scale_loss` per micro-batch and one apply per window (eagerly): the
  marks left over stay at most `_MAX_PENDING` a graph; each apply still unscales."""
  from tf_lossscale._src import keras_optimizer

  var = keras.Variable(0.0)
  opt = mixed_precision.LossScaleOptimizer(
    keras.optimizers.SGD(1.0), dynamic=False, initial_scale=4
  )
  opt.build([var])
  for _ in range(keras_optimizer._MAX_PENDING + 10):
    opt.scale_loss(tf.constant(1.0))
  marks = keras_optimizer._marks(opt)._by_graph
  assert [len(places) for places in marks.values()] == [keras_optimizer._MAX_PENDING]
  opt.apply_gradients([(tf.constant(8.0), var)])  # scaled: 2 after the unscale
  assert float(var.numpy()) == -2.0


def test_a_scale_loss_mark_is_its_thread_s():
  """Outside a strategy the marks are per thread: a `scale_loss` pending in
  one thread leaves another thread's TF 2.4-style step as it is."""
  import threading

  opt = mixed_precision.LossScaleOptimizer(
    keras.optimizers.SGD(1.0), dynamic=False, initial_scale=4
  )
  var = keras.Variable(1.0)
  opt.build([var])
  scaled = threading.Event()
  threading.Thread(target=lambda: (opt.scale_loss(tf.constant(1.0)), scaled.set())).start()
  assert scaled.wait(60)
  opt.apply_gradients([(tf.constant(3.0), var)])  # given unscaled: applied as given
  assert float(var.numpy()) == 1.0 - 3.0
  with tf.GradientTape() as tape:
    loss = opt.scale_loss(var * 3.0)
  opt.apply_gradients([(tape.gradient(loss, var), var)])  # this thread's mark: unscaled
  assert float(var.numpy()) == 1.0 - 2 * 3.0


@pytest.mark.parametrize("family", FAMILIES)
def test_a_step_abandoned_after_scale_loss_leaves_tf24_steps_unscaled_once(family):
  """`scale_loss`, then an `apply_gradients` that raises (no gradient): the
  next TF 2.4-style step divided its gradients by the scale twice."""
  opt = mixed_precision.LossScaleOptimizer(
    make_inner(family, learning_rate=1.0), dynamic=False, initial_scale=1024
  )
  var, other = tf.Variable(1.0), tf.Variable(1.0)
  if hasattr(opt, "build"):
    opt.build([var, other])
  with tf.GradientTape() as tape:
    loss = opt.scale_loss(other * 3.0)
  with pytest.raises(ValueError, match="No gradients provided"):
    opt.apply_gradients([(tape.gradient(loss, var), var)])
  with tf.GradientTape() as tape:
    scaled = opt.get_scaled_loss(var * 3.0)
  opt.apply_gradients(zip(opt.get_unscaled_gradients(tape.gradient(scaled, [var])), [var]))
  assert float(var.numpy()) == 1.0 - 3.0
  # Mixed in one step, the gradients are still unscaled once.
  with tf.GradientTape() as tape:
    scaled = opt.scale_loss(var * 3.0)
  opt.apply_gradients(zip(opt.get_unscaled_gradients(tape.gradient(scaled, [var])), [var]))
  assert float(var.numpy()) == 1.0 - 2 * 3.0


@pytest.mark.parametrize("family", FAMILIES)
def test_get_scaled_loss_drops_a_pending_scale_loss_mark(family):
  """A `scale_loss` left pending, then a TF 2.4-style step that unscales by
  hand: the gradient is applied as given, not divided by the scale again."""
  opt = mixed_precision.LossScaleOptimizer(
    make_inner(family, learning_rate=1.0), dynamic=False, initial_scale=4
  )
  var = tf.Variable(1.0)
  opt.scale_loss(tf.constant(0.0))
  with tf.GradientTape() as tape:
    scaled = opt.get_scaled_loss(var * 3.0)
  opt.apply_gradients([(tape.gradient(scaled, var) / opt.loss_scale, var)])
  assert float(var.numpy()) == 1.0 - 3.0


class _Logged(logging.Handler):
  def __init__(self):
    super().__init__()
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


@pytest.mark.parametrize("family", FAMILIES)
def test_a_missing_gradient_is_logged_in_tf24s_words(family):
  """TF 2.4 (and tf_keras's wrapper, which adds a hint) log the variables
  without a gradient; the inner optimizer never sees them here."""
  a, b = tf.Variable(1.0, name="a"), tf.Variable(1.0, name="b")
  logged = _Logged()
  tf.get_logger().addHandler(logged)
  try:
    peer = tf_keras.mixed_precision.LossScaleOptimizer(make_inner("tf_keras"))
    peer.apply_gradients([(tf.constant(1.0), a), (None, b)])
    ours = mixed_precision.LossScaleOptimizer(make_inner(family))
    ours.apply_gradients([(tf.constant(1.0), a), (None, b)])
  finally:
    tf.get_logger().removeHandler(logged)
  tf24 = "Gradients do not exist for variables ['b:0'] when minimizing the loss."
  peer_said, *ours_said = [m for m in logged.messages if m.startswith("Gradients do not")]
  assert peer_said.startswith(tf24)
  assert ours_said == [tf24]


@pytest.mark.parametrize("jit", [False, True])
def test_keras3_weight_average_after_a_skipped_first_step_starts_from_the_variables(
  strategy, mode, jit
):
  """A skipped first step (the usual start under `mixed_float16`) counts in
  `iterations`, as in TF 2.4; Keras 3's weight average (`use_ema`) would then
  blend from its zero start, and `fit` ends by writing that average into the
  model. It starts from the variables instead, as tf_keras's average starts:
  as the plain optimizer's after a first step that moves nothing. (Keras < 3.0.5
  starts its average at its first applied step, by a flag: as a plain
  optimizer's that never saw the skipped step.)"""
  if strategy.num_replicas_in_sync > 1 and mode is tf.function:
    pytest.skip(
      "a plain Keras 3 optimizer with use_ema fails there (destinations can not be empty)"
    )
  ema = dict(use_ema=True, ema_momentum=0.5)
  probe = keras.optimizers.SGD(**ema)
  probe.build([tf.Variable(1.0)])
  starts_at_its_first_apply = hasattr(probe, "_ema_vars_initialized")  # Keras < 3.0.5
  if starts_at_its_first_apply and mode is tf.function:
    pytest.skip("this Keras starts the average by a Python flag, read once when traced")
  runs = {}
  for name, first_grads in (("ours", [[float("nan"), 0.0]]), ("plain", [[0.0, 0.0]])):
    if name == "plain" and starts_at_its_first_apply:
      first_grads = []
    with strategy.scope():
      var = tf.Variable([1.0, 2.0])
      inner = keras.optimizers.SGD(0.1, **ema)
      opt = mixed_precision.LossScaleOptimizer(inner, initial_scale=8) if name == "ours" else inner

    def replica_fn(grad, opt=opt, var=var):
      opt.apply_gradients([(grad, var)])

    def run(grad, replica_fn=replica_fn):
      strategy.run(replica_fn, args=(grad,))

    run = tf.function(run, jit_compile=True) if jit and mode is tf.function else mode(run)
    for grad in [*first_grads, [1.0, 1.0], [2.0, -1.0]]:
      run(tf.constant(grad))
    assert count(inner.iterations) == 2 + len(first_grads)
    (average,) = inner._model_variables_moving_average
    runs[name] = (opt, var, locals_of(strategy, average))
  (opt, var, average), (_, plain_var, plain_average) = runs["ours"], runs["plain"]
  assert float(opt.loss_scale) == 4.0
  np.testing.assert_allclose(average, plain_average)
  np.testing.assert_allclose(locals_of(strategy, var), locals_of(strategy, plain_var))
  assert not np.allclose(average, locals_of(strategy, var))  # An average of several steps.
  opt.finalize_variable_values([var])
  np.testing.assert_allclose(locals_of(strategy, var), plain_average)


@pytest.mark.parametrize("family", ["keras3", "tf_keras_new"])
@pytest.mark.parametrize("by", ["var_names", "var_list"])
def test_exclude_from_weight_decay_reaches_the_inner_optimizer(family, by):
  """As on the plain optimizer (Keras 3's and tf_keras's wrappers keep it to themselves:
  the bias decays there)."""
  results = []
  for wrap in (False, True):
    kernel, bias = tf.Variable(1.0, name="kernel"), tf.Variable(1.0, name="bias")
    inner = make_inner(family, "AdamW", learning_rate=0.1, weight_decay=0.5)
    opt = mixed_precision.LossScaleOptimizer(inner) if wrap else inner
    opt.exclude_from_weight_decay(**{by: ["bias"] if by == "var_names" else [bias]})
    opt.apply_gradients([(tf.constant(0.0), kernel), (tf.constant(0.0), bias)])
    results.append((float(kernel.numpy()), float(bias.numpy())))
  assert results[1] == results[0] == (np.float32(0.95), 1.0)


@pytest.mark.parametrize("clip", [{"clipnorm": 1.0}, {"global_clipnorm": 1.0}, {"clipvalue": 1.0}])
@pytest.mark.parametrize("family", FAMILIES)
def test_clipping_under_mirrored_strategy_clips_the_replicas_sum_as_tf24(family, clip):
  """The wrapper sums the replicas' gradients first (one finiteness verdict for
  all), and the inner optimizer clips the sum: as TF 2.4's and tf_keras's
  optimizers and wrappers do. A plain Keras 3 optimizer clips each replica's
  gradients before summing them: with a Keras 3 inner, this step differs there."""
  strategy = shared_strategy("mirrored")
  results = []
  for make in (
    lambda: mixed_precision.LossScaleOptimizer(make_inner(family, learning_rate=1.0, **clip)),
    lambda: tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.legacy.SGD(learning_rate=1.0, **clip)
    ),
  ):
    with strategy.scope():
      var, opt = tf.Variable([0.0, 0.0]), make()

    def replica_fn(opt=opt, var=var):
      first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
      opt.apply_gradients([(tf.where(first, [3.0, 0.0], [0.5, 4.0]), var)])

    tf.function(lambda replica_fn=replica_fn: strategy.run(replica_fn))()
    results.append(locals_of(strategy, var))
  ours, tf_keras_lso = results
  np.testing.assert_allclose(ours, tf_keras_lso, rtol=1e-6)
  summed_then_clipped = {"clipvalue": [-1.0, -1.0]}.get(next(iter(clip)), [-0.658505, -0.752577])
  np.testing.assert_allclose(ours[0], summed_then_clipped, rtol=1e-5)
