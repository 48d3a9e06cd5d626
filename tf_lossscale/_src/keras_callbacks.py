"""`LossScaleMonitor`: the loss scale and skipped steps of a Keras `fit`, in view.

One public class serves Keras 3's and tf_keras's `fit`. Callbacks never see
the model's framework before `fit` runs, so the object must already be a
callback of both: while tf_keras is imported, `LossScaleMonitor(...)` returns
an instance of a cached subclass that also inherits
`tf_keras.callbacks.Callback` (Keras 3's base comes first, so Keras 3's
`set_model` and `model` serve both). A monitor made before tf_keras is
imported is a Keras 3 callback, which tf_keras's `fit` runs as well: it
answers what tf_keras asks of its callbacks (`TfKerasBatchHooks`).

What it reads, after every batch (every execution with `steps_per_execution`
above 1): the optimizer's `iterations`, `skipped_steps` and `loss_scale`.
"""

import inspect
import numbers
import os
import sys
import warnings

import keras
import numpy as np
import tensorflow as tf

from tf_lossscale._src import framework_internals, keras_optimizer

_ON_MIN_SCALE = ("warn", "raise", "ignore")
# What TensorBoard's scalar summaries carry, so that TensorBoard shows ours as
# scalars; written with `tf.summary.write`, which needs no tensorboard package.
_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
  plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
)


class LossScaleMinimumWarning(UserWarning):
  """The loss scale sat at its minimum through a run of skipped steps."""


def is_chief(strategy):
  """Whether this process writes the summaries of a `fit` under `strategy`.

  Every process of a multi-worker cluster computes the same numbers; one
  writes them: the task of type `chief`, or, in a cluster without one,
  worker 0. Without a cluster (no strategy, MirroredStrategy) the process
  is the chief. Read from the strategy's public `cluster_resolver`.

  Args:
    strategy: A `tf.distribute.Strategy`, or None.

  Returns:
    A bool.

  >>> is_chief(tf.distribute.get_strategy())
  True
  """
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return True
  if resolver.task_type == "chief":
    return True
  cluster = resolver.cluster_spec().as_dict()
  return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in cluster


def _number(value):
  """A Python number from a scalar (Keras or mirrored) variable or tensor."""
  if isinstance(value, keras.Variable):
    value = value.value
  return tf.convert_to_tensor(value).numpy().item()


class LossScaleMonitor(keras.callbacks.Callback, framework_internals.TfKerasBatchHooks):
  """Shows the loss scale and skipped steps of a `fit`, and watches the minimum.

  For a model compiled with a tf_lossscale `LossScaleOptimizer` (Keras 3 or
  tf_keras; dynamic or fixed loss scale), it:

  * adds to each epoch's logs, hence to the progress bar and `History`:
    `loss_scale` (at the epoch's end), `skipped_steps` (skipped in the
    epoch) and `skipped_steps_total` (skipped by the optimizer since it was
    created; not checkpointed);
  * writes the scalars `loss_scale` and `skipped_steps` (the total) at the
    step `optimizer.iterations` (training steps, skipped ones included but
    under Keras 3's `gradient_accumulation_steps`),
    every `update_freq` steps or at each epoch's end, to `<log_dir>/train`
    of the `tensorboard` given: a `TensorBoard` callback of either framework
    (with the writer of its own training scalars, into its event file, while
    it is in the same `fit`) or a log directory (with a writer of the
    monitor's own); else to the default summary writer while one is set
    (such as the one a `TensorBoard` callback with a batch-level
    `update_freq` sets during training; its recording condition applies),
    else nowhere. Callbacks do not see each other: a `TensorBoard` callback
    elsewhere in the list is only found through the default writer it sets.
    Placed before a `TensorBoard` callback in the list, the epoch logs also
    reach it as `epoch_loss_scale`, ...;
  * when `min_scale_patience` consecutive steps run with the scale at the
    optimizer's `min_loss_scale` were all skipped (training is then going
    nowhere), warns once per `fit` with the numbers
    (`LossScaleMinimumWarning`), raises `RuntimeError` (stopping `fit`), or
    does nothing, as `on_min_scale` says.

  Under a `tf.distribute` strategy the numbers are the same on every replica
  and worker; only the chief writes summaries (`is_chief`), and with
  `on_min_scale='raise'` every worker raises at the same step. With
  `steps_per_execution` above 1, the numbers are read once per execution:
  summaries are written at the first execution's end at or after each
  multiple of `update_freq` (at most one point per execution), and an
  execution adds to a run at the minimum only when every one of its steps
  was skipped.

  >>> import numpy as np
  >>> from tf_lossscale.keras.mixed_precision import LossScaleOptimizer
  >>> model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
  >>> model.compile(LossScaleOptimizer(tf.keras.optimizers.SGD(), initial_scale=8),
  ...               loss='mse')
  >>> x = np.array([[1.], [np.nan], [1.], [1.]], 'float32')  # A NaN in batch 2
  >>> history = model.fit(x, np.zeros((4, 1)), batch_size=1, epochs=2,
  ...                     shuffle=False, verbose=0, callbacks=[LossScaleMonitor()])
  >>> history.history['loss_scale'], history.history['skipped_steps']
  ([4.0, 2.0], [1, 1])
  >>> history.history['skipped_steps_total']
  [1, 2]

  Args:
    update_freq: `'epoch'`, or an integer: write the summaries every that
      many training steps (`'batch'`: 1, as for Keras's `TensorBoard`).
    tensorboard: Where to write the summaries: a `TensorBoard` callback (its
      `log_dir`), a directory, or None (the default writer, if any).
    min_scale_patience: The number of consecutive skipped steps run with
      the scale at its minimum that `on_min_scale` acts on (counted in
      `iterations`: under Keras 3's `gradient_accumulation_steps`, whose
      skipped micro-steps do not count, it does not act).
    on_min_scale: `'warn'` (once per `fit`), `'raise'` or `'ignore'`.

  Raises:
    ValueError: For an argument outside what is allowed above; from `fit`,
      when the model's optimizer is not a tf_lossscale `LossScaleOptimizer`.
  """

  __signature__ = keras_optimizer.InitSignature()

  def __new__(cls, *args, **kwargs):
    del args, kwargs
    if cls is LossScaleMonitor and sys.modules.get("tf_keras") is not None:
      cls = _tf_keras_class()
    return super().__new__(cls)

  def __reduce_ex__(self, protocol):
    # Pickled (and copied) through the public class: pickle finds the tf_keras
    # subclass by no name, and `__new__` makes it again where tf_keras is imported.
    reduced = super().__reduce_ex__(protocol)
    if type(self) is LossScaleMonitor:
      return reduced
    return (_new_monitor, (), *reduced[2:])

  def __init__(
    self,
    update_freq: str | int = "epoch",
    tensorboard: object | str | os.PathLike | None = None,
    min_scale_patience: int = 10,
    on_min_scale: str = "warn",
  ) -> None:
    super().__init__()
    self._check_arguments(update_freq, tensorboard, min_scale_patience, on_min_scale)
    if update_freq == "batch":
      update_freq = 1
    self.update_freq = update_freq if update_freq == "epoch" else int(update_freq)
    self.min_scale_patience = int(min_scale_patience)
    self.on_min_scale = on_min_scale
    self._log_dir = getattr(tensorboard, "log_dir", tensorboard)
    # A `TensorBoard` callback lends its own writer (`_summary_writer`).
    self._tensorboard = tensorboard if hasattr(tensorboard, "log_dir") else None
    self._writer = None

  @staticmethod
  def _check_arguments(update_freq, tensorboard, min_scale_patience, on_min_scale):
    def positive_integer(value):
      return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1

    if update_freq not in ("epoch", "batch") and not positive_integer(update_freq):
      raise ValueError(
        "update_freq must be 'epoch', 'batch' or an integer of at least 1, "
        f"but got: {update_freq!r}"
      )
    log_dir = getattr(tensorboard, "log_dir", tensorboard)
    if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
      raise ValueError(
        "tensorboard must be a TensorBoard callback, a log directory or None, "
        f"but got: {tensorboard!r}"
      )
    if not positive_integer(min_scale_patience):
      raise ValueError(
        f"min_scale_patience must be an integer of at least 1, but got: {min_scale_patience!r}"
      )
    if on_min_scale not in _ON_MIN_SCALE:
      raise ValueError(f"on_min_scale must be one of {_ON_MIN_SCALE}, but got: {on_min_scale!r}")

  # --- Reading the optimizer ----------------------------------------------------

  def _optimizer(self):
    optimizer = getattr(self.model, "optimizer", None)
    if not isinstance(optimizer, keras_optimizer.LossScaleOptimizer):
      raise ValueError(
        "LossScaleMonitor needs a model compiled with a tf_lossscale LossScaleOptimizer "
        "(tf_lossscale.keras.mixed_precision.LossScaleOptimizer), but the model's optimizer "
        f"is: {optimizer!r}"
      )
    return optimizer

  def _read(self):
    """(iterations, skipped steps in all, loss scale) now."""
    optimizer = self._opt
    skipped = optimizer.skipped_steps
    return (
      _number(optimizer.iterations),
      0 if skipped is None else _number(skipped),
      _number(optimizer.loss_scale),
    )

  # --- Callback hooks -------------------------------------------------------------

  def on_train_begin(self, logs=None):
    """Finds the optimizer and reads its numbers.

    The run at the minimum and the once-per-`fit` warning start afresh.

    Raises:
      ValueError: If the model's optimizer is not a tf_lossscale
        `LossScaleOptimizer`.
    """
    self._opt = self._optimizer()
    strategy = getattr(self.model, "distribute_strategy", None)
    self._chief = is_chief(strategy)
    self._close_writer()  # A `fit` stopped by an error never reached `on_train_end`.
    self._last = self._read()
    self._epoch_start_skipped = self._last[1]
    self._run = 0  # Consecutive skipped steps with the scale at its minimum.
    self._warned = False

  def on_epoch_begin(self, epoch, logs=None):
    """Notes the skipped total that the epoch's `skipped_steps` counts from."""
    self._epoch_start_skipped = self._last[1]

  def on_train_batch_end(self, batch, logs=None):
    """Reads the numbers, watches the minimum, writes summaries when due.

    Summaries are written here only for an int `update_freq`.

    Raises:
      RuntimeError: With `on_min_scale='raise'`, once the scale has sat at
        its minimum through `min_scale_patience` consecutive skipped steps.
    """
    previous, self._last = self._last, self._read()
    self._watch_minimum(previous, self._last)
    # Written at the first read at or after each multiple of update_freq.
    if self.update_freq != "epoch" and (
      self._last[0] // self.update_freq > previous[0] // self.update_freq
    ):
      self._write(*self._last)

  def on_epoch_end(self, epoch, logs=None):
    """Adds the epoch's numbers to `logs`; writes summaries for `'epoch'`.

    The keys added are `loss_scale`, `skipped_steps` and
    `skipped_steps_total`; summaries are written when `update_freq` is
    `'epoch'`.
    """
    step, skipped, scale = self._last = self._read()
    if logs is not None:
      logs["loss_scale"] = scale
      logs["skipped_steps"] = skipped - self._epoch_start_skipped
      logs["skipped_steps_total"] = skipped
    if self.update_freq == "epoch":
      self._write(step, skipped, scale)

  def on_train_end(self, logs=None):
    """Closes the monitor's own summary writer, if it opened one."""
    self._close_writer()

  def _close_writer(self):
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  # --- Summaries and the minimum -----------------------------------------------------

  def _write(self, step, skipped, scale):
    if not self._chief:
      return
    if self._log_dir is None:
      self._scalars(step, skipped, scale)  # Writes only while a default writer is set.
      return
    writer = self._summary_writer()
    # Every point due: a `TensorBoard` callback's batch-level recording
    # condition, set around the batches, is for its own summaries.
    with writer.as_default(), tf.summary.record_if(True):
      self._scalars(step, skipped, scale)
    writer.flush()

  def _summary_writer(self):
    """The writer for `<log_dir>/train`: the `TensorBoard` callback's own.

    A second writer there would start a second event file in the run, and a
    running TensorBoard reads only the newest one: the callback's scalars
    would stop. The monitor opens its own for a directory, or for a callback
    whose writer it cannot use (not in this `fit`).
    """
    writer = framework_internals.tensorboard_train_writer(self._tensorboard)
    if writer is not None:
      return writer
    if self._writer is None:
      self._writer = tf.summary.create_file_writer(os.path.join(os.fspath(self._log_dir), "train"))
    return self._writer

  @staticmethod
  def _scalars(step, skipped, scale):
    for tag, value in (("loss_scale", scale), ("skipped_steps", skipped)):
      tf.summary.write(tag, tf.constant(value, tf.float32), step=step, metadata=_SCALAR_METADATA)

  def _watch_minimum(self, previous, now):
    minimum = self._opt.min_loss_scale
    steps, skipped = now[0] - previous[0], now[1] - previous[1]
    if minimum is None or steps <= 0:
      return
    # The steps since the last read ran at the minimum if it was there then
    # (the step that brings it there ran above it).
    at_minimum = previous[2] <= np.float32(minimum)
    self._run = self._run + steps if (at_minimum and skipped == steps) else 0
    if self._run < self.min_scale_patience or self.on_min_scale == "ignore":
      return
    message = (
      f"The loss scale has sat at its minimum ({now[2]:g}, min_loss_scale) through the last "
      f"{self._run} training steps, every one of them skipped for Inf or NaN gradients "
      f"(at step {now[0]}; {now[1]} steps skipped in all): training is not progressing. "
      "Look for Inf or NaN in the inputs, the loss or the model, or lower the learning rate "
      "or min_loss_scale."
    )
    if self.on_min_scale == "raise":
      self._close_writer()  # `fit` calls no `on_train_end` after an error.
      raise RuntimeError(message)
    if not self._warned:
      self._warned = True
      # Once per `fit`: a registry of its own, or Python's default filter
      # shows a text it has shown from here before (a rerun) only once.
      caller = inspect.currentframe().f_back
      warnings.warn_explicit(
        message,
        LossScaleMinimumWarning,
        caller.f_code.co_filename,
        caller.f_lineno,
        module=__name__,
        registry={},
      )


def _new_monitor():
  return LossScaleMonitor.__new__(LossScaleMonitor)


_TF_KERAS_CLASS = []


def _tf_keras_class():
  """`LossScaleMonitor` that is a tf_keras callback too (made once)."""
  if not _TF_KERAS_CLASS:
    tf_keras = sys.modules["tf_keras"]  # Imported already (see the module docstring).
    _TF_KERAS_CLASS.append(
      type(
        LossScaleMonitor.__name__,
        (LossScaleMonitor, tf_keras.callbacks.Callback),
        {"__module__": LossScaleMonitor.__module__, "__qualname__": LossScaleMonitor.__qualname__},
      )
    )
  return _TF_KERAS_CLASS[0]
