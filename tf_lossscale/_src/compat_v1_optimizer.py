"""The compat.v1 `MixedPrecisionLossScaleOptimizer`.

Wraps a `tf.compat.v1.train.Optimizer`: `compute_gradients` multiplies the
loss by the loss scale and divides the gradients by it; `apply_gradients`
hands the gradients to the loss scale's `update` (once, in a cross-replica
context) and lets the wrapped optimizer apply them only when `update` says so.
"""

from typing import Any

import tensorflow as tf

from tf_lossscale._src import framework_internals, scale_state, validation
from tf_lossscale._src import loss_scale as loss_scale_module

_V1Optimizer = tf.compat.v1.train.Optimizer

# Strategies loss scaling cannot serve, refused in TF 2.4's Keras
# LossScaleOptimizer's words, adapted (TF's compat.v1 class did not check).
# TPUs train in bfloat16, which needs no loss scaling; ParameterServerStrategy's
# workers step asynchronously, so no single skip-or-apply decision holds for
# all of them.
# CentralStorageStrategy and the compat.v1 ParameterServerStrategy do work, as
# with TF's own class.
_TPU_STRATEGIES = (
  tf.distribute.TPUStrategy,
  tf.distribute.experimental.TPUStrategy,
  tf.compat.v1.distribute.experimental.TPUStrategy,
)
_ASYNC_STRATEGIES = (tf.distribute.experimental.ParameterServerStrategy,)


def _raise_if_strategy_unsupported():
  """Refuses, by name, the strategies under which loss scaling cannot work."""
  if not tf.distribute.has_strategy():
    return
  strategy = tf.distribute.get_strategy()
  name = type(strategy).__name__
  if isinstance(strategy, _TPU_STRATEGIES):
    raise ValueError(
      f"Loss scaling is not supported with {name}. Loss scaling is unnecessary "
      "with TPUs, since they support bfloat16 instead of float16 and bfloat16 "
      "does not require loss scaling. Remove the MixedPrecisionLossScaleOptimizer "
      "when TPUs are used."
    )
  if isinstance(strategy, _ASYNC_STRATEGIES):
    raise ValueError(
      f"Loss scaling is not supported with the tf.distribute.Strategy: {name}. "
      "Try using a different Strategy, e.g. a MirroredStrategy."
    )


def _checked_gradients(grads_and_vars):
  """`apply_gradients`' checks, before the scale, a variable or a slot changes.

  TF's own class made them (in TF's words) only once the scale had been
  updated, and not at all under a strategy; a dtype mismatch reached the
  inner optimizer's kernel, which can abort the process.
  """
  pairs = validation.gradient_pairs(grads_and_vars)
  if not pairs:
    raise ValueError("No variables provided.")
  if all(g is None for g, _ in pairs):
    raise ValueError(f"No gradients provided for any variable: {[str(v) for _, v in pairs]}.")
  validation.check_gradients_fit(pairs, dtype_must_match=True)
  validation.check_variables_in_their_strategy([v for g, v in pairs if g is not None])
  return pairs


class MixedPrecisionLossScaleOptimizer(_V1Optimizer):
  """A `tf.compat.v1.train.Optimizer` that applies loss scaling.

  Loss scaling multiplies the loss by a factor, the loss scale, before the
  gradients are computed and divides the gradients by the same factor
  afterwards. Mathematically nothing changes; numerically, small intermediate
  float16 gradients no longer underflow to zero.

  The scale is a `LossScale`: a `FixedLossScale` keeps one value and always
  applies the gradients; a `DynamicLossScale` adapts the value and skips any
  step whose gradients hold an Inf or NaN (no variable, slot or `global_step`
  changes on such a step; under a `tf.distribute` strategy a non-finite
  gradient on any replica makes every replica skip).

  The wrapped optimizer is checkpointed as `base_optimizer` (it owns the
  slots) and the scale as `loss_scale`, as by TensorFlow's own class, so
  checkpoints move between the two.

  >>> var = tf.Variable(1.0)
  >>> opt = MixedPrecisionLossScaleOptimizer(
  ...     tf.compat.v1.train.GradientDescentOptimizer(0.5), loss_scale=128)
  >>> _ = opt.minimize(lambda: 3.0 * var, var_list=[var])
  >>> float(var.numpy())  # 1 - 0.5 * 3
  -0.5
  """

  def __init__(self, opt: tf.compat.v1.train.Optimizer, loss_scale: Any) -> None:
    """Wraps `opt`.

    Args:
      opt: The `tf.compat.v1.train.Optimizer` that applies the gradients.
      loss_scale: Anything `tf_lossscale.loss_scale.get` accepts except None:
        `'dynamic'`, a Python int or float (a fixed scale), a `LossScale`
        (a user's own subclass included) or a serialized loss scale.

    Raises:
      ValueError: If `opt` is not a `tf.compat.v1.train.Optimizer` (a Keras
        optimizer is not), if `loss_scale` is None, or if `loss_scale` cannot
        be interpreted.
      TypeError: If `loss_scale` is a serialized loss scale whose `config`
        has keys that are not the class's arguments, as in TF 2.4.
    """
    if not isinstance(opt, _V1Optimizer):
      raise ValueError(f'"opt" must be an instance of Optimizer, but got: {type(opt)}')
    super().__init__(framework_internals.v1_optimizer_use_locking(opt), opt.get_name())
    self._optimizer = opt
    self._loss_scale = loss_scale_module.get(loss_scale)
    if self._loss_scale is None:
      raise ValueError("loss_scale cannot be None")
    framework_internals.track_child(self, self._optimizer, "base_optimizer")
    framework_internals.track_child(self, self._loss_scale, "loss_scale")

  @property
  def skipped_steps(self) -> tf.Variable | None:
    """The steps this optimizer's `DynamicLossScale` skipped (int64 variable).

    Beyond TF 2.4: `DynamicLossScale.skipped_steps` of the loss scale, which
    counts every step it refused (any Inf or NaN gradient on any replica) and
    is not checkpointed (a subclass overriding `update` counts what its
    `update` passes on to `DynamicLossScale.update`). None for any other
    loss scale (a `FixedLossScale` never skips) and in a TF1 graph, where
    the loss scale has no such variable (a default `Saver` would save it).
    There, a step is skipped exactly when a gradient given to
    `apply_gradients` holds an Inf or NaN (on any replica): fetch
    `tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g, _ in
    grads_and_vars if g is not None])` with the train op.

    >>> var = tf.Variable(1.0)
    >>> opt = MixedPrecisionLossScaleOptimizer(
    ...     tf.compat.v1.train.GradientDescentOptimizer(1.0), 'dynamic')
    >>> _ = opt.apply_gradients([(tf.constant(float('nan')), var)])
    >>> int(opt.skipped_steps), float(var.numpy())
    (1, 1.0)
    """
    if isinstance(self._loss_scale, loss_scale_module.DynamicLossScale):
      return self._loss_scale.skipped_steps
    return None

  def get_name(self):
    """Returns the wrapped optimizer's name, which this optimizer shares.

    >>> opt = MixedPrecisionLossScaleOptimizer(
    ...     tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), 'dynamic')
    >>> opt.get_name()
    'Momentum'
    """
    return super().get_name()

  def compute_gradients(
    self,
    loss,
    var_list=None,
    gate_gradients=_V1Optimizer.GATE_OP,
    aggregation_method=None,
    colocate_gradients_with_ops=False,
    grad_loss=None,
  ):
    """Returns the unscaled gradients of the scaled `loss`.

    The loss is multiplied by the loss scale (cast to the loss's dtype), the
    wrapped optimizer computes the gradients, and each gradient is divided by
    the loss scale again. `tf.IndexedSlices` stay `tf.IndexedSlices` and
    `None` stays `None`.

    Args:
      loss: A tensor, or (required when eager) a callable taking no arguments
        that returns the loss.
      var_list: Optional list of variables; defaults to the trainable
        variables (of the graph, or those the callable reads when eager).
      gate_gradients: `GATE_NONE`, `GATE_OP` or `GATE_GRAPH` (graph mode).
      aggregation_method: How gradient terms are combined (graph mode).
      colocate_gradients_with_ops: Whether to colocate gradients with their
        ops (graph mode).
      grad_loss: Optional tensor holding the gradient computed for `loss`.

    Returns:
      A list of `(gradient, variable)` pairs; a gradient may be None.

    Raises:
      RuntimeError: If eager and `loss` is not callable (from the wrapped
        optimizer).

    >>> var = tf.Variable(2.0)
    >>> opt = MixedPrecisionLossScaleOptimizer(
    ...     tf.compat.v1.train.GradientDescentOptimizer(1.0), loss_scale=1024)
    >>> [(grad, _)] = opt.compute_gradients(lambda: var * var, var_list=[var])
    >>> float(grad)  # d(var**2)/dvar, not 1024 times it
    4.0
    """
    grads_and_vars = self._optimizer.compute_gradients(
      loss=scale_state.scale_loss(loss, self._loss_scale()),
      var_list=var_list,
      gate_gradients=gate_gradients,
      aggregation_method=aggregation_method,
      colocate_gradients_with_ops=colocate_gradients_with_ops,
      grad_loss=grad_loss,
    )
    grads = scale_state.unscale_gradients([g for g, _ in grads_and_vars], self._loss_scale())
    return list(zip(grads, [v for _, v in grads_and_vars], strict=True))

  # No AutoGraph needed here (see the Keras LossScaleOptimizer.apply_gradients).
  @tf.autograph.experimental.do_not_convert
  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Applies the gradients if the loss scale says so, and updates the scale.

    The loss scale's `update` sees every gradient once, in a cross-replica
    context. When it answers "apply" (a `FixedLossScale` always does; a
    `DynamicLossScale` does when every gradient on every replica is finite)
    the wrapped optimizer applies the gradients and increments `global_step`;
    otherwise no variable, slot or `global_step` changes. The scale itself is
    updated either way.

    Args:
      grads_and_vars: `(gradient, variable)` pairs, as `compute_gradients`
        returns them (unscaled).
      global_step: Optional variable to increment by one when the gradients
        are applied.
      name: Optional name of the returned operation; defaults to the
        optimizer's name.

    Returns:
      The operation that updates the loss scale and, when allowed, applies
      the gradients (None when eager).

    Raises:
      TypeError: For an item that is not a (gradient, variable) pair, a
        gradient whose dtype is not its variable's, or a `global_step` that
        is not a variable.
      ValueError: In a cross-replica context, under a strategy that loss
        scaling does not support (the TPU strategies and TF2's
        `tf.distribute.experimental.ParameterServerStrategy`), if no pair or
        no gradient is given, for a gradient whose shape does not fit its
        variable's, or for a variable mirrored over several replicas
        stepped outside its strategy. Each check runs before anything
        changes.

    >>> import tf_lossscale
    >>> var = tf.Variable(1.0)
    >>> step = tf.Variable(0, dtype=tf.int64)
    >>> loss_scale = tf_lossscale.loss_scale.DynamicLossScale(initial_loss_scale=8.)
    >>> opt = MixedPrecisionLossScaleOptimizer(
    ...     tf.compat.v1.train.GradientDescentOptimizer(1.0), loss_scale)
    >>> _ = opt.apply_gradients([(tf.constant(float('nan')), var)], step)
    >>> float(var.numpy()), int(step.numpy()), float(loss_scale())  # skipped
    (1.0, 0, 4.0)
    >>> _ = opt.apply_gradients([(tf.constant(0.25), var)], step)
    >>> float(var.numpy()), int(step.numpy()), float(loss_scale())  # applied
    (0.75, 1, 4.0)
    """
    if tf.distribute.in_cross_replica_context():
      raise ValueError("apply_gradients() must be called in a replica context.")
    _raise_if_strategy_unsupported()
    grads_and_vars = _checked_gradients(grads_and_vars)
    if global_step is not None and not hasattr(global_step, "assign_add"):
      # TF's class failed in the inner optimizer, after the scale and the
      # variables had changed.
      raise TypeError(
        "global_step must be None or a variable (e.g. "
        f"tf.compat.v1.train.get_or_create_global_step()), but got: {global_step!r}"
      )
    return tf.distribute.get_replica_context().merge_call(
      self._apply_if_scale_allows, args=(tuple(grads_and_vars), global_step, name)
    )

  def _apply_if_scale_allows(self, strategy, grads_and_vars, global_step=None, name=None):
    """The cross-replica part of `apply_gradients`: one decision for all."""
    name = self.get_name() if name is None else name
    grads = [g for g, _ in grads_and_vars]
    state = loss_scale_module.dynamic_state(self._loss_scale)

    def apply_in(scope):
      def apply():
        with scope:
          per_replica_ops = strategy.extended.call_for_each_replica(
            self._optimizer.apply_gradients,
            args=(grads_and_vars, global_step, name + "-wrapped"),
          )
          return strategy.group(per_replica_ops)

      return apply

    if state is not None:
      # Our own update: it runs the apply itself, in the update's own
      # conditional beside the scale's assigns.
      apply = apply_in(scale_state.tf24_apply_name_scope())
      update_op, _ = state.update(grads, apply_fn=apply, skip_fn=tf.no_op)
      return tf.group(update_op, name=name)
    update_scale, should_apply = self._loss_scale.update(grads)
    # A DynamicLossScale subclass's own `update`: TF 2.4's conditional, when
    # the verdict is not known in Python, took the name after those the update
    # took. With any other loss scale TF applied outside any conditional.
    is_dynamic = isinstance(self._loss_scale, loss_scale_module.DynamicLossScale)
    if is_dynamic and tf.get_static_value(should_apply) is None:
      scope = scale_state.tf24_apply_name_scope(update_made=True)
    else:
      scope = scale_state.outer_name_scope()
    ops = [scale_state.cond(should_apply, apply_in(scope), tf.no_op)]
    # A custom LossScale's `update` may return None for its op (a stateless one).
    return tf.group(*ops, *([] if update_scale is None else [update_scale]), name=name)

  # TF's name for it, which callers in a cross-replica context use.
  _distributed_apply = _apply_if_scale_allows

  def minimize(
    self,
    loss,
    global_step=None,
    var_list=None,
    gate_gradients=_V1Optimizer.GATE_OP,
    aggregation_method=None,
    colocate_gradients_with_ops=False,
    name=None,
    grad_loss=None,
  ):
    """`compute_gradients` followed by `apply_gradients`.

    Args:
      loss: A tensor, or (required when eager) a callable returning the loss.
      global_step: Optional variable incremented when the step is applied.
      var_list: Optional list of variables to update.
      gate_gradients: `GATE_NONE`, `GATE_OP` or `GATE_GRAPH` (graph mode).
      aggregation_method: How gradient terms are combined (graph mode).
      colocate_gradients_with_ops: Whether to colocate gradients with their
        ops (graph mode).
      name: Optional name of the returned operation.
      grad_loss: Optional tensor holding the gradient computed for `loss`.

    Returns:
      The operation of `apply_gradients` (None when eager).

    Raises:
      ValueError: If no variable has a gradient, or as `apply_gradients`.

    >>> var = tf.Variable(1.0)
    >>> opt = MixedPrecisionLossScaleOptimizer(
    ...     tf.compat.v1.train.GradientDescentOptimizer(0.1), 'dynamic')
    >>> _ = opt.minimize(lambda: var * var, var_list=[var])
    >>> round(float(var.numpy()), 6)  # 1 - 0.1 * 2
    0.8
    """
    return super().minimize(
      loss,
      global_step=global_step,
      var_list=var_list,
      gate_gradients=gate_gradients,
      aggregation_method=aggregation_method,
      colocate_gradients_with_ops=colocate_gradients_with_ops,
      name=name,
      grad_loss=grad_loss,
    )

  def get_slot(self, var, name):
    """Returns the wrapped optimizer's slot `name` for `var`, or None.

    Args:
      var: A variable passed to `minimize` or `apply_gradients`.
      name: The slot's name, one of `get_slot_names()`.

    Returns:
      The slot variable, or None if the wrapped optimizer has not created it.

    >>> var = tf.Variable(1.0)
    >>> opt = MixedPrecisionLossScaleOptimizer(
    ...     tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9), 'dynamic')
    >>> _ = opt.minimize(lambda: 2.0 * var, var_list=[var])
    >>> float(opt.get_slot(var, 'momentum').numpy())
    2.0
    """
    return self._optimizer.get_slot(var, name)

  def get_slot_names(self):
    """Returns the sorted names of the wrapped optimizer's slots.

    Returns:
      A list of strings.

    >>> opt = MixedPrecisionLossScaleOptimizer(
    ...     tf.compat.v1.train.AdamOptimizer(), 'dynamic')
    >>> var = tf.Variable(1.0)
    >>> _ = opt.minimize(lambda: var, var_list=[var])
    >>> opt.get_slot_names()
    ['m', 'v']
    """
    return self._optimizer.get_slot_names()

  def __dir__(self):
    # TF's checkpointing treats every object whose dir() lists
    # `get_slot_names` as the owner of the slots it reports. The slots belong
    # to the wrapped optimizer (checkpointed as `base_optimizer`, as by TF's
    # own class); claiming them here too makes saving fail.
    return [name for name in super().__dir__() if name != "get_slot_names"]

  def variables(self):
    """Returns the wrapped optimizer's variables, then the loss scale's.

    As for any `tf.compat.v1.train.Optimizer`, only variables of the current
    graph are listed.

    Returns:
      A list of variables.

    >>> opt = MixedPrecisionLossScaleOptimizer(
    ...     tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), 'dynamic')
    >>> var = tf.Variable(1.0, name='w')
    >>> _ = opt.minimize(lambda: var, var_list=[var])
    >>> [v.name for v in opt.variables()]
    ['w/Momentum...:0', 'current_loss_scale:0', 'good_steps:0']
    """
    # The loss scale's checkpointed children are its variables of this graph.
    children = tf.train.TrackableView.children(self._loss_scale).values()
    return self._optimizer.variables() + [v for v in children if isinstance(v, tf.Variable)]

  # The wrapped optimizer applies the gradients: these hooks of the base class
  # are never reached.
  def _apply_dense(self, grad, var):
    raise RuntimeError("This function should never be called")

  def _apply_sparse(self, grad, var):
    raise RuntimeError("This function should never be called")

  def _resource_apply_dense(self, grad, handle):
    raise RuntimeError("This function should never be called")

  def _resource_apply_sparse(self, grad, handle, indices):
    raise RuntimeError("This function should never be called")
