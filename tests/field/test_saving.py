"""Saving and resuming: ModelCheckpoint, SavedModel, tf.train.Checkpoint with slots.

Reproduces keras-team/keras#17275 and #18112 (`ModelCheckpoint` failing with
mixed precision), keras-team/keras#15709 (checkpointing the optimizer state of
a loss-scaled model: "A slot variable was re-used as a dependency") and
tensorflow/tensorflow#48862 (one optimizer wrapped by two loss-scale
optimizers breaks checkpointing). The issue also lists keras-team/tf-keras#349
and #203, which could not be read here; tf_keras's formats are covered below.

Every test of a format that keeps the optimizer's state saves mid-training, keeps
training, then loads into a fresh model and trains the same steps: the
continuation must be identical. Where tf_keras keeps none (an OptimizerV2 in a
.keras file or a SavedModel), what comes back is compared with a plain one's. The file formats
run under MirroredStrategy for one representative each (loading under a
strategy is the same code for every family); `tf.train.Checkpoint` runs under
both strategies for every family.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
from field import common
from tf_lossscale.keras import mixed_precision

LSO = mixed_precision.LossScaleOptimizer


def _make_lso(family):
  return LSO(
    common.make_inner(family, "Adam", learning_rate=0.1), initial_scale=8, dynamic_growth_steps=2
  )


def _fit(model, epochs, callbacks=()):
  model.fit(
    common.X, common.Y, batch_size=4, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks
  )


def _assert_same_training_state(resumed, uninterrupted):
  for ours, theirs in zip(resumed.get_weights(), uninterrupted.get_weights(), strict=True):
    np.testing.assert_array_equal(ours, theirs)
  assert common.as_int(resumed.optimizer.iterations) == common.as_int(
    uninterrupted.optimizer.iterations
  )


def test_keras3_model_checkpoint_to_keras_file_resumes_identically(
  strategy, mixed_float16, tmp_path
):
  path = str(tmp_path / "model.keras")
  with strategy.scope():
    model = common.dense_model(keras)
    model.compile(_make_lso("keras3"), loss="mse")
  _fit(model, 2, [keras.callbacks.ModelCheckpoint(path)])  # saved after 4 steps
  _fit(model, 1)
  with strategy.scope():
    resumed = keras.models.load_model(path)
  assert isinstance(resumed.optimizer, LSO)
  assert float(resumed.optimizer.loss_scale) == 32.0  # 8, doubled every 2 steps
  _fit(resumed, 1)
  _assert_same_training_state(resumed, model)
  assert float(resumed.optimizer.loss_scale) == float(model.optimizer.loss_scale) == 64.0


def test_keras3_weights_h5_checkpoint_resumes_identically(mixed_float16, tmp_path):
  """Keras 3 loads optimizer variables only into a built optimizer, wrapped or not."""
  strategy = common.strategy("default")
  path = str(tmp_path / "model.weights.h5")
  with strategy.scope():
    model = common.dense_model(keras)
    model.compile(_make_lso("keras3"), loss="mse")
  _fit(model, 2, [keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
  _fit(model, 1)
  with strategy.scope():
    resumed = common.dense_model(keras)
    resumed.compile(_make_lso("keras3"), loss="mse")
    resumed.optimizer.build(resumed.trainable_variables)
  resumed.load_weights(path)
  assert float(resumed.optimizer.loss_scale) == 32.0
  assert common.as_int(resumed.optimizer.iterations) == 4
  _fit(resumed, 1)
  _assert_same_training_state(resumed, model)
  assert float(resumed.optimizer.loss_scale) == 64.0


@pytest.mark.skipif(
  keras.__version__ == "3.0.0",
  reason="Keras 3.0.0's wrapper saves its inner optimizer's state in a layout of its own",
)
def test_keras3_weights_h5_of_keras3_s_own_wrapper_restores_the_inner_state(tmp_path):
  """What docs/migration.md says: the model and the inner optimizer's state come
  back; the scale starts again from `initial_scale` (Keras 3's is its own)."""
  path = str(tmp_path / "model.weights.h5")
  model = common.dense_model(keras)
  peer = keras.mixed_precision.LossScaleOptimizer(
    keras.optimizers.Adam(0.1), initial_scale=8, dynamic_growth_steps=2
  )
  model.compile(peer, loss="mse")
  _fit(model, 2, [keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
  resumed = common.dense_model(keras)
  resumed.compile(_make_lso("keras3"), loss="mse")
  resumed.optimizer.build(resumed.trainable_variables)
  resumed.load_weights(path)
  for ours, theirs in zip(resumed.get_weights(), model.get_weights(), strict=True):
    np.testing.assert_array_equal(ours, theirs)
  inner, peer_inner = resumed.optimizer.inner_optimizer, peer.inner_optimizer
  for ours, theirs in zip(inner.variables, peer_inner.variables, strict=True):
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
  assert common.as_int(inner.iterations) == common.as_int(peer_inner.iterations) == 4
  assert float(peer.dynamic_scale.numpy()) == 32.0
  assert float(resumed.optimizer.loss_scale) == 8.0


@pytest.mark.parametrize(
  "family, strategy_name",
  [
    ("tf_keras", "default"),
    ("tf_keras", "mirrored"),
    ("tf_keras_new", "default"),
  ],
)
def test_tf_keras_h5_model_checkpoint_restores_weights_slots_and_iterations(
  family, strategy_name, tmp_path
):
  """The .h5 format stores the inner optimizer's weights only: the scale restarts.

  As in TF 2.4 and tf_keras's own wrapper, the loss scale comes back at its
  initial value; weights, slots and `iterations` continue exactly.
  """
  path = str(tmp_path / "model.h5")
  strategy = common.strategy(strategy_name)
  with strategy.scope():
    model = common.dense_model(tf_keras)
    model.compile(_make_lso(family), loss="mse")
  _fit(model, 2, [tf_keras.callbacks.ModelCheckpoint(path)])
  _fit(model, 1)
  with strategy.scope():
    resumed = tf_keras.models.load_model(path)
  assert isinstance(resumed.optimizer, LSO)
  assert float(resumed.optimizer.loss_scale) == 8.0
  assert common.as_int(resumed.optimizer.iterations) == 4
  _fit(resumed, 1)
  _assert_same_training_state(resumed, model)


def test_tf_keras_keras_file_restores_the_new_optimizers_state(tmp_path):
  """tf_keras's .keras format: weights, slots, iterations; the scale restarts (as tf_keras's)."""
  strategy = common.strategy("default")
  path = str(tmp_path / "model.keras")
  with strategy.scope():
    model = common.dense_model(tf_keras)
    model.compile(_make_lso("tf_keras_new"), loss="mse")
  _fit(model, 2, [tf_keras.callbacks.ModelCheckpoint(path)])
  _fit(model, 1)
  with strategy.scope():
    resumed = tf_keras.models.load_model(path)
  assert isinstance(resumed.optimizer, LSO)
  assert common.as_int(resumed.optimizer.iterations) == 4
  assert float(resumed.optimizer.loss_scale) == 8.0
  _fit(resumed, 1)
  _assert_same_training_state(resumed, model)


def test_tf_keras_keras_file_keeps_an_optimizer_v2_wrappers_configuration_only(tmp_path):
  """tf_keras's .keras format saves no OptimizerV2's state, wrapped or not.

  The weights and the wrapper's configuration come back; `iterations`, the slots
  and the scale start afresh, exactly as a plain OptimizerV2's do.
  """
  saved, loaded = {}, {}
  for name, make in (
    ("plain", lambda: common.make_inner("tf_keras", "Adam", learning_rate=0.1)),
    ("ours", lambda: _make_lso("tf_keras")),
  ):
    model = common.dense_model(tf_keras)
    model.compile(make(), loss="mse")
    _fit(model, 2)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    saved[name], loaded[name] = model, tf_keras.models.load_model(path)
    for ours, theirs in zip(loaded[name].get_weights(), model.get_weights(), strict=True):
      np.testing.assert_array_equal(ours, theirs)
    assert common.as_int(model.optimizer.iterations) == 4
  assert common.as_int(loaded["plain"].optimizer.iterations) == 0
  resumed = loaded["ours"].optimizer
  assert isinstance(resumed, LSO)
  assert isinstance(resumed.inner_optimizer, tf_keras.optimizers.legacy.Adam)
  assert resumed.comparable_config() == saved["ours"].optimizer.comparable_config()
  assert common.as_int(resumed.iterations) == 0 and float(resumed.loss_scale) == 8.0
  assert resumed.get_slot_names() == loaded["plain"].optimizer.get_slot_names() == []


def _custom_loop(strategy, model, opt):
  """step(bad): one custom-loop step on every replica; NaN on the last replica when `bad`."""
  last = strategy.num_replicas_in_sync - 1

  @tf.function
  def step(x, y, bad):
    def replica_fn(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
        scaled = opt.get_scaled_loss(loss)
      grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
      grads = tf.cond(
        bad, lambda: [helpers.replica_nan(g, last) for g in grads], lambda: list(grads)
      )
      opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    strategy.run(replica_fn, args=(x, y))

  data = [(common.X[i : i + 4], common.Y[i : i + 4]) for i in (0, 4)]
  return lambda i, bad=False: step(*data[i % 2], tf.constant(bad))


def _optimizer_state(opt, model):
  """The inner optimizer's variables in a fixed order (OptimizerV2: by slot)."""
  if isinstance(opt.inner_optimizer, tf_keras.optimizers.legacy.Optimizer):
    # OptimizerV2's variables() are in creation order, which restoring changes.
    return [opt.iterations] + [
      opt.get_slot(var, name) for var in model.trainable_variables for name in opt.get_slot_names()
    ]
  return opt.variables


def _assert_scale_state(opt, scale, counter, strategy=None):
  """`opt`'s loss scale is `scale` and its `dynamic_counter` `counter` (on every replica)."""
  assert float(opt.loss_scale) == scale
  common.assert_on_every_replica(
    strategy or common.strategy("default"), opt.dynamic_counter, counter
  )


def test_tf_train_checkpoint_with_slots_resumes_identically(family, strategy, tmp_path):
  helpers.need_tf_checkpoints(family)

  def build():
    with strategy.scope():
      model = common.dense_model(common.framework(family))
      opt = _make_lso(family)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)
    return model, opt, checkpoint, _custom_loop(strategy, model, opt)

  model, opt, checkpoint, step = build()
  step(0)
  step(1, bad=True)
  step(0)
  path = checkpoint.write(str(tmp_path / "ckpt"))
  _assert_scale_state(opt, 4.0, 1, strategy)  # 8 halved by the bad step, then 1 finite step
  for i in (1, 0, 1):
    step(i)
  resumed_model, resumed_opt, resumed_checkpoint, resumed_step = build()
  resumed_checkpoint.read(path).assert_existing_objects_matched()
  # A fresh wrapper's (8, 0) would end at the same scale, but with another counter.
  _assert_scale_state(resumed_opt, 4.0, 1, strategy)
  for i in (1, 0, 1):
    resumed_step(i)
  pairs = list(zip(resumed_model.trainable_variables, model.trainable_variables, strict=True))
  pairs += zip(
    _optimizer_state(resumed_opt, resumed_model), _optimizer_state(opt, model), strict=True
  )
  for ours, theirs in pairs:
    common.assert_on_every_replica(strategy, ours, common.replica_values(strategy, theirs)[0])
  # (4, 1) -> (8, 0) at the first step after the write, then (8, 1) -> (16, 0).
  _assert_scale_state(opt, 16.0, 0, strategy)
  _assert_scale_state(resumed_opt, 16.0, 0, strategy)
  assert common.as_int(resumed_opt.iterations) == common.as_int(opt.iterations) == 6


def _checkpoint_resumes_identically(family, named, tmp_path):
  """Fit, write `tf.train.Checkpoint(model=..., optimizer=<named>)`, read it into a fresh model.

  The scale grows every 3 steps: the 4 steps before the write leave (16, 1),
  which a fresh wrapper's (8, 0) would not reach in the 2 steps after it.
  """
  helpers.need_tf_checkpoints(family)

  def build():
    inner = common.make_inner(family, "Adam", learning_rate=0.1)
    model = common.dense_model(common.framework(family))
    model.compile(LSO(inner, initial_scale=8, dynamic_growth_steps=3), loss="mse")
    return model, tf.train.Checkpoint(model=model, optimizer=named(model))

  model, checkpoint = build()
  _fit(model, 2)
  path = checkpoint.write(str(tmp_path / "ckpt"))
  _assert_scale_state(model.optimizer, 16.0, 1)
  resumed, resumed_checkpoint = build()
  resumed_checkpoint.read(path).assert_existing_objects_matched()
  _assert_scale_state(resumed.optimizer, 16.0, 1)
  _fit(model, 1)
  _fit(resumed, 1)
  _assert_same_training_state(resumed, model)
  _assert_scale_state(model.optimizer, 32.0, 0)
  _assert_scale_state(resumed.optimizer, 32.0, 0)


@pytest.mark.parametrize("family", ["keras3", "tf_keras_new"])
def test_checkpoint_naming_the_inner_optimizer_beside_the_wrapper(family, tmp_path):
  """keras-team/keras#15709: `optimizer=inner` saved beside a model compiled with the wrapper."""
  _checkpoint_resumes_identically(family, lambda model: model.optimizer.inner_optimizer, tmp_path)


def test_optimizer_v2_checkpoint_naming_the_inner_optimizer_beside_the_wrapper_is_refused(
  tmp_path,
):
  """keras-team/keras#15709 with an OptimizerV2 inner: the documented limitation (as TF 2.4).

  The wrapper keeps TF 2.4's checkpoint layout: its node holds the inner
  optimizer's variables and lists its slots. Named beside it, the inner
  OptimizerV2 lists the same slots from a second node, which TensorFlow's
  checkpointing refuses when writing; nothing is written.
  """
  inner = common.make_inner("tf_keras", "Adam", learning_rate=0.1)
  model = common.dense_model(tf_keras)
  model.compile(LSO(inner, initial_scale=8), loss="mse")
  _fit(model, 1)
  with pytest.raises(NotImplementedError, match="A slot variable was re-used"):
    tf.train.Checkpoint(model=model, optimizer=inner).write(str(tmp_path / "ckpt"))
  assert not list(tmp_path.iterdir())


def test_checkpoint_naming_the_wrapper_resumes_identically(family, tmp_path):
  """The documented way for every family: name the wrapper (`model.optimizer`), not the inner."""
  _checkpoint_resumes_identically(family, lambda model: model.optimizer, tmp_path)


class _UserSubclass(LSO):
  """A user's subclass of the wrapper (one that adds logging, say)."""


@pytest.mark.parametrize("family, filename", [("keras3", "model.keras"), ("tf_keras", "model.h5")])
def test_a_subclass_does_not_take_over_the_wrappers_saved_name(
  family, filename, tmp_path, restore_serialization_registries
):
  fw = common.framework(family)
  model = common.dense_model(fw)
  model.compile(LSO(common.make_inner(family)), loss="mse")  # the wrapper's class exists first
  _UserSubclass(common.make_inner(family))  # then some code instantiates a subclass
  _fit(model, 1)
  model.save(str(tmp_path / filename))
  loaded = fw.models.load_model(str(tmp_path / filename))
  assert type(loaded.optimizer) is type(model.optimizer)


def test_savedmodel_export_serves_the_trained_model(family, tmp_path):
  fw = common.framework(family)
  model = common.dense_model(fw)
  model.compile(_make_lso(family), loss="mse")
  _fit(model, 1)
  path = str(tmp_path / "saved_model")
  if family == "keras3":
    model.export(path)  # (no `verbose=False`: Keras 3.5 and older do not take it)
    restored = tf.saved_model.load(path)  # kept: its variables die with it
    served = restored.serve(common.X)
  else:
    model.save(path, save_format="tf")
    loaded = tf_keras.models.load_model(path)
    assert isinstance(loaded.optimizer, LSO)
    assert loaded.optimizer.comparable_config() == model.optimizer.comparable_config()
    served = loaded(common.X)
  np.testing.assert_array_equal(served.numpy(), model.predict(common.X, verbose=0))


def test_a_second_wrapper_is_refused_before_it_can_break_checkpoints(family, tmp_path):
  """tensorflow#48862: the second wrapper used to fail only when checkpointing."""
  helpers.need_tf_checkpoints(family)

  def build():
    inner = common.make_inner(family, learning_rate=0.5)
    opt = LSO(inner, initial_scale=8, dynamic_growth_steps=3)
    var = tf.Variable([1.0])
    return inner, opt, var, tf.train.Checkpoint(optimizer=opt, var=var)

  inner, opt, var, checkpoint = build()
  with pytest.raises(ValueError, match="already wrapped by a LossScaleOptimizer"):
    LSO(inner)
  opt.apply_gradients([(tf.constant([float("nan")]), var)])  # skipped: scale 8 -> 4
  opt.apply_gradients([(tf.constant([1.0]), var)])  # applied: 1 - 0.5 * 1, counter 1
  path = checkpoint.write(str(tmp_path / "ckpt"))
  # The checkpoint holds the first wrapper's state, which a fresh one restores.
  _, resumed, resumed_var, resumed_checkpoint = build()
  resumed_checkpoint.read(path).assert_existing_objects_matched()
  np.testing.assert_array_equal(resumed_var.numpy(), var.numpy())
  np.testing.assert_array_equal(var.numpy(), [0.5])
  assert common.as_int(resumed.iterations) == common.as_int(opt.iterations) == 2
  _assert_scale_state(opt, 4.0, 1)
  _assert_scale_state(resumed, 4.0, 1)
