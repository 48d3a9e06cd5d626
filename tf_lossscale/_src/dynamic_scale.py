"""The dynamic loss-scale algorithm, in one place.

Three layers, each usable on its own:

* `all_finite(grads)`: one scalar "every gradient is finite" decision.
* `next_scale_and_counter(...)`: the pure state transition, from the current
  (scale, counter) and that decision to the next (scale, counter).
* `update_scale_variables(...)`: applies the transition to the two state
  variables, deciding once for all replicas of a `tf.distribute` strategy.

The legacy `DynamicLossScale`, both Keras `LossScaleOptimizer` classes and the
compat.v1 `MixedPrecisionLossScaleOptimizer` all update their scale through
`update_scale_variables`; the optimizers also hand it their apply, so that in
a function graph one If op does both (see docs/index.md, "the hot path", for what each
speed-up buys and where it is not taken). `cond` and `OneCall` are the two
helpers behind that: a conditional that costs little with hundreds of
inputs (an If kept as a function call where safe; in a TF1 graph one Switch
gating the branch), and eager work run as one graph call.

Nothing here needs AutoGraph (it runs as is eagerly, in tf.function and in
TF1 graphs): the entry points are marked `do_not_convert`, as are the ones
of `scaling.py` and the optimizers', since converting them cost more than
tracing the rest of a step.
"""

import functools

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.ops import control_flow_util  # No public way to ask "am I in XLA?".


def _values(grad):
  return grad.values if isinstance(grad, tf.IndexedSlices) else grad


# Gradients this small are handled together with the others of their shape:
# one op per group instead of one per gradient (eager and tf.function pay per
# op), for a temporary of at most this many elements per group...
_GROUPED_MAX_ELEMENTS = 1 << 16
# ...and, in the exact check, of at most this many elements per stacked chunk.
_STACKED_MAX_ELEMENTS = 1 << 20
# Under XLA, up to this many gradients are checked exactly in one pass with no
# If (see `_quick_and_exact`); more compile faster with the If.
_XLA_IF_FREE_UP_TO = 16


def _grouped(values, group):
  """Splits `values` into lists of small tensors of one dtype and shape, and the others."""
  groups, others = {}, []
  for v in values:
    if group and v.shape.is_fully_defined() and v.shape.num_elements() <= _GROUPED_MAX_ELEMENTS:
      groups.setdefault((v.dtype, tuple(v.shape.as_list())), []).append(v)
    else:
      others.append(v)
  return list(groups.values()), others


def _all(flags):
  return flags[0] if len(flags) == 1 else tf.reduce_all(tf.stack(flags))


def _each_finite(values):
  """TF 2.4's element-wise check, on stacked chunks of same-shaped gradients."""
  all_of = functools.partial(_over_all_axes(), tf.raw_ops.All)
  groups, others = _grouped(values, group=True)
  flags = [all_of(tf.math.is_finite(v)) for v in others]
  for same_shape in groups:
    per_chunk = max(1, _STACKED_MAX_ELEMENTS // max(1, same_shape[0].shape.num_elements()))
    for i in range(0, len(same_shape), per_chunk):
      chunk = same_shape[i : i + per_chunk]
      flags.append(all_of(tf.math.is_finite(chunk[0] if len(chunk) == 1 else tf.stack(chunk))))
  return _all(flags)


def _times_zero_finite(values, sum_all):
  """Exact as well: finite * 0 is 0, Inf * 0 and NaN * 0 are NaN, and a sum of
  zeros cannot overflow. XLA fuses the multiply into the reduction."""
  zeros, sums = {}, []
  for v in values:
    if v.dtype not in zeros:
      zeros[v.dtype] = tf.zeros([], v.dtype)
    sums.append(tf.cast(sum_all(tf.raw_ops.Mul(x=v, y=zeros[v.dtype])), tf.float32))
  return tf.math.is_finite(sums[0] if len(sums) == 1 else tf.add_n(sums))


def _over_all_axes():
  """`reduce(raw_op, v)`: `v` reduced over all its axes by `tf.raw_ops.Sum`
  or `All`, sharing one axes constant per rank (with hundreds of gradients,
  tracing time and a TF1 graph's size are mostly the ops created)."""
  axes = {}

  def reduce(raw_op, v):
    rank = v.shape.rank
    if rank is None:
      return raw_op(input=v, axis=tf.range(tf.rank(v)))
    if rank not in axes:
      axes[rank] = tf.constant(list(range(rank)), tf.int32)
    return raw_op(input=v, axis=axes[rank])

  return reduce


def _summer():
  return functools.partial(_over_all_axes(), tf.raw_ops.Sum)


def _quick_and_exact(values):
  """The check in two parts: `(quick, exact)`.

  `quick` is a scalar bool tensor, True only when every value is finite. It
  reads each float32/float64 gradient once, with a sum: a sum that includes
  an Inf or a NaN is never finite, so a finite total proves every element
  finite. A non-finite total may also be an overflow of finite values, so
  when `quick` is False, `exact()` decides, and a finite step is never
  skipped. float16 and bfloat16 sums overflow too often to pay off: those
  are checked element by element in `quick` already. `exact` is None when
  `quick` is exact by itself.

  Under XLA with few gradients `quick` is exact by itself: sums of the
  gradients times zero, which XLA fuses into one read each. The If that
  the fallback needs made XLA copy large variables once more a step on a
  CPU (16.8M parameters in 8 variables, Keras 3 SGD: 109 ms against 95 ms,
  plain 71 ms); with many gradients the If-free check compiles twice as
  slowly (100 variables: 9.0 s against 4.6 s) and runs slower.
  """
  xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
  if_free = xla and len(values) <= _XLA_IF_FREE_UP_TO
  sum_all = _summer()
  flags, summed = [], False
  for dtype in sorted({v.dtype for v in values}, key=lambda d: d.name):
    same_dtype = [v for v in values if v.dtype == dtype]
    if dtype not in (tf.float32, tf.float64):
      flags.append(_each_finite(same_dtype))
      continue
    if if_free:
      flags.append(_times_zero_finite(same_dtype, sum_all))
      continue
    summed = True
    groups, others = _grouped(same_dtype, group=not xla)  # XLA compiles a wide add_n slowly.
    sums = [sum_all(v) for v in others]
    sums += [sum_all(g[0] if len(g) == 1 else tf.add_n(g)) for g in groups]
    flags.append(tf.math.is_finite(sums[0] if len(sums) == 1 else tf.add_n(sums)))
  if not summed:
    return _all(flags) if flags else tf.constant(True), None
  if xla:
    return _all(flags), lambda: _times_zero_finite(values, _summer())
  return _all(flags), lambda: _each_finite(values)


def _all_finite(values):
  quick, exact = _quick_and_exact(values)
  if exact is None:
    return quick
  return cond(quick, lambda: tf.constant(True), exact)


def _returning(value, fn):
  """A cond branch running `fn` and then returning the bool `value`."""

  def branch():
    done = [x for x in tf.nest.flatten(fn()) if x is not None]
    with tf.control_dependencies(done):
      return tf.constant(value)

  return branch


def _fuse_check_and_apply():
  """Whether the check and the apply can share one If: in a function graph,
  outside strategies (whose verdict is reduced across replicas first) and
  outside XLA, which would compile the apply twice (it is in both branches;
  500 variables with a tf_keras SGD: 127 s against 40 s for tf_keras's LSO).
  A TF1 graph gates the apply with one Switch instead (see `_switch_cond`)."""
  if tf.executing_eagerly() or tf.distribute.has_strategy() or _plain_graph():
    return False
  return not control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _apply_if_finite(values, apply_fn, skip_fn):
  """`all_finite` and the conditional apply in one If op when the quick check
  passes (the common case), two nested ones when it does not."""
  quick, exact = _quick_and_exact(values)
  apply, skip = _returning(True, apply_fn), _returning(False, skip_fn)
  if exact is None:
    return cond(quick, apply, skip)
  return cond(quick, apply, lambda: cond(exact(), apply, skip))


class OneCall:
  """Runs `fn(tensors, *extra)` eagerly as one call of a graph function.

  Op by op, each gradient costs a few Python dispatches; `tf.function`'s own
  `__call__` binds every argument in Python and cost even more with hundreds
  of gradients. This keeps one concrete function per signature and calls it
  with the flat list of tensors. The signature is the dtypes, and the shapes
  too with `static_shapes` (for functions that are faster when they know
  them); otherwise the function is traced for tensors of any shape.
  """

  _MAX_SIGNATURES = 32

  def __init__(self, fn, static_shapes=False):
    self._function = tf.function(fn, autograph=False)
    self._static_shapes = static_shapes
    self._concrete = {}

  def __call__(self, tensors, *extra):
    static = self._static_shapes
    signature = tuple((t.dtype, tuple(t.shape) if static else None) for t in (*tensors, *extra))
    concrete = self._concrete.get(signature)
    if concrete is None:
      if len(self._concrete) >= self._MAX_SIGNATURES:
        self._concrete.clear()
      specs = [tf.TensorSpec(shape, dtype) for dtype, shape in signature]
      concrete = self._function.get_concrete_function(specs[: len(tensors)], *specs[len(tensors) :])
      self._concrete[signature] = concrete
    return concrete._call_flat([*tensors, *extra], concrete.captured_inputs)  # pylint: disable=protected-access


def eager_outside_strategies():
  """Whether ops run eagerly with no `tf.distribute` strategy in scope."""
  return tf.executing_eagerly() and not tf.distribute.has_strategy()


# Shapes let it sum small gradients in groups. 500 gradients: 8.4 -> 2.4 ms.
_all_finite_call = OneCall(_all_finite, static_shapes=True)


@tf.autograph.experimental.do_not_convert
def all_finite(grads):
  """Returns a scalar bool tensor: True when no gradient holds an Inf or NaN.

  Args:
    grads: A flat list of gradients (tensors or `tf.IndexedSlices`); `None`
      entries are ignored.

  Returns:
    A scalar `tf.bool` tensor.

  >>> bool(all_finite([tf.constant([1., 2.]), None]))
  True
  >>> bool(all_finite([tf.constant([1., float("inf")])]))
  False
  >>> bool(all_finite([tf.constant([3e38, 3e38])]))  # finite; only the sum overflows
  True
  """
  values = [_values(g) for g in grads if g is not None]
  sparse = any(isinstance(g, tf.IndexedSlices) for g in grads)  # New shapes every step.
  if values and not sparse and eager_outside_strategies():
    return _all_finite_call(values)
  return _all_finite(values)


@functools.cache
def _cpu_only():
  return all(d.device_type == "CPU" for d in tf.config.list_logical_devices())


def _resource_device(tensor):
  """The device of a resource tensor, following captures out of functions.

  Returns "" for a handle no device is assigned to (the placer then puts it
  with the others) and None when the device is only known at run time.
  """
  while not tensor.device:
    graph = tensor.graph
    if tensor.op.type in ("VarHandleOp", "VariableV2"):
      return ""
    outer = {id(internal): external for external, internal in getattr(graph, "captures", ())}
    if id(tensor) not in outer:
      return None  # A function argument.
    tensor = outer[id(tensor)]
  return tf.DeviceSpec.from_string(tensor.device).to_string()


def _run_branches_as_functions(if_op):
  """Keeps `if_op` a call of its branch functions instead of lowering it.

  Lowered, an If becomes a Switch per input and a Merge per output, each
  scheduled on every step: with hundreds of gradients and variables that was
  most of a tf.function step's loss-scaling overhead. The If kernel runs its
  branches on one device, so this is done only on a CPU-only machine, outside
  any strategy, when every resource the branches use lives on one device.
  """
  if tf.distribute.has_strategy() or not _cpu_only():
    return
  devices = {_resource_device(t) for t in if_op.inputs[1:] if t.dtype == tf.resource}
  devices.discard("")
  if None not in devices and len(devices) <= 1:
    if_op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))  # pylint: disable=protected-access


def _plain_graph():
  """Whether ops go into a TF1 graph (not a function's) outside strategies,
  XLA and TF1 control-flow contexts."""
  graph = tf.compat.v1.get_default_graph()
  return not (
    tf.executing_eagerly()
    or graph.building_function
    or tf.distribute.has_strategy()
    or graph._get_control_flow_context() is not None  # pylint: disable=protected-access
    or control_flow_util.GraphOrParentsInXlaContext(graph)
  )


def _gated_leaves(pivot, new_ops):
  """The ops of `new_ops` that depend on `pivot` and that nothing uses yet."""
  gated = {pivot.op}
  for op in new_ops:  # In creation order, so inputs come first.
    if any(t.op in gated for t in op.inputs) or any(c in gated for c in op.control_inputs):
      gated.add(op)
  used = {t.op for op in new_ops for t in op.inputs} | {
    c for op in new_ops for c in op.control_inputs
  }
  return [op for op in new_ops if op in gated and op not in used]


def _switch_cond(pred, true_fn, false_fn):
  """`tf.cond` for a TF1 graph with one Switch and one Merge per output.

  As TF1's own `cond` does, each branch's ops get a control input from a
  pivot, one of the Switch's two outputs, and do not run when it is dead:
  but the tensors a branch uses from outside are not passed through a Switch
  each. With 500 gradients and variables a gated apply then costs about as
  much as an ungated one (a kept If cost 0.65 ms more a step, lowered 0.8).
  As in a function's branch, every op the taken branch makes runs, also
  those it does not return. Ops it makes under
  `tf.control_dependencies(None)` (slots and other variables made on the
  first call) are not gated, as in TF1's `cond`.
  A branch returns tensors (both the same structure and dtypes), or
  operations or None: the result is then an operation.
  """
  graph = tf.compat.v1.get_default_graph()
  off, on = tf.raw_ops.Switch(data=pred, pred=pred)
  branches = []
  for side, fn in ((off, false_fn), (on, true_fn)):
    pivot = tf.identity(side)
    known = len(graph.get_operations())
    with tf.control_dependencies([pivot]):
      result = fn()
    flat = tf.nest.flatten(result)
    present = [x for x in flat if x is not None]
    with tf.control_dependencies([pivot, *_gated_leaves(pivot, graph.get_operations()[known:])]):
      if present and not all(isinstance(x, tf.Operation) for x in present):
        outputs = [tf.identity(x) for x in flat]
      else:
        result, outputs = None, [tf.identity(pivot)]
    branches.append((result, outputs))
  (false_result, false_out), (true_result, true_out) = branches
  try:
    tf.nest.assert_same_structure(true_result, false_result)
    same = [x.dtype for x in true_out] == [x.dtype for x in false_out]
  except (TypeError, ValueError):
    same = False
  if not same:
    raise ValueError(
      f"cond: both branches must return the same structure of tensors of the same dtypes,"
      f" or operations; got {true_result!r} and {false_result!r}"
    )
  merged = [tf.raw_ops.Merge(inputs=pair).output for pair in zip(false_out, true_out, strict=True)]
  if true_result is None:
    return merged[0].op
  return tf.nest.pack_sequence_as(true_result, merged)


@tf.autograph.experimental.do_not_convert
def cond(pred, true_fn, false_fn):
  """`tf.cond`, decided in Python when `pred` is known (eager, Python bool).

  In a TF1 graph the branches are gated by one Switch (`_switch_cond`). In a
  function graph, the If op is not lowered to Switch/Merge where that is
  safe (see `_run_branches_as_functions`): the branch not taken then costs
  nothing.
  """
  static_pred = tf.get_static_value(pred)
  if static_pred is not None:
    return true_fn() if static_pred else false_fn()
  if _plain_graph():
    return _switch_cond(pred, true_fn, false_fn)
  graph = tf.compat.v1.get_default_graph()
  known = len(graph.get_operations())
  result = tf.cond(pred, true_fn, false_fn)
  for op in graph.get_operations()[known:]:
    lowering = op.node_def.attr.get("_lower_using_switch_merge")
    if op.type in ("If", "StatelessIf") and lowering is not None and lowering.b:
      _run_branches_as_functions(op)
  return result


@tf.autograph.experimental.do_not_convert
def next_scale_and_counter(scale, counter, finite, growth_steps, multiplier):
  """The pure transition of the dynamic loss scale.

  A finite step counts one more good step; on reaching `growth_steps` the
  scale is multiplied by `multiplier` (kept as is if the product would be
  Inf) and the counter restarts at 0. A non-finite step divides the scale by
  `multiplier`, never going below 1, and restarts the counter.

  Args:
    scale: float32 scalar, the current loss scale.
    counter: int64 scalar, good steps since the scale last changed.
    finite: bool scalar, whether this step's gradients were all finite.
    growth_steps: Python int, good steps needed to grow the scale.
    multiplier: Python float, the growth and shrink factor.

  Returns:
    `(next_scale, next_counter)`, float32 and int64 scalar tensors.

  >>> s, c = next_scale_and_counter(8., 1, True, 2, 2.)
  >>> float(s), int(c)
  (16.0, 0)
  >>> s, c = next_scale_and_counter(8., 1, False, 2, 2.)
  >>> float(s), int(c)
  (4.0, 0)
  """
  scale = tf.convert_to_tensor(scale, tf.float32)
  counter = tf.convert_to_tensor(counter, tf.int64)
  grows = counter + 1 >= growth_steps
  grown = scale * multiplier
  grown = tf.where(tf.math.is_finite(grown), grown, scale)
  shrunk = tf.maximum(scale / multiplier, 1.0)
  next_scale = tf.where(finite, tf.where(grows, grown, scale), shrunk)
  zero = tf.zeros_like(counter)
  next_counter = tf.where(finite, tf.where(grows, zero, counter + 1), zero)
  return next_scale, next_counter


_next_state_call = OneCall(lambda state: next_scale_and_counter(*state))


def _check_and_step(values, scale_handle, counter_handle, growth_steps, multiplier):
  """`all_finite` and the transition, assigned to the two variables."""
  finite = _all_finite(values)
  scale = tf.raw_ops.ReadVariableOp(resource=scale_handle, dtype=tf.float32)
  counter = tf.raw_ops.ReadVariableOp(resource=counter_handle, dtype=tf.int64)
  next_scale, next_counter = next_scale_and_counter(
    scale, counter, finite, growth_steps, multiplier
  )
  tf.raw_ops.AssignVariableOp(resource=scale_handle, value=next_scale)
  tf.raw_ops.AssignVariableOp(resource=counter_handle, value=next_counter)
  return finite


# Eagerly, check and state update in one call (the check's grouping needs the
# shapes): the update for 6 gradients of 1M floats in all, 1.55 -> 0.52 ms.
_check_and_step_call = OneCall(_check_and_step, static_shapes=True)


def _eager_one_call(variables, grads):
  """Whether the update can run as `_check_and_step_call`: eagerly outside
  strategies, with resource variables and dense gradients (IndexedSlices
  have new shapes every step)."""
  return (
    eager_outside_strategies()
    and all(getattr(v, "handle", None) is not None for v in variables)
    and any(g is not None for g in grads)
    and not any(isinstance(g, tf.IndexedSlices) for g in grads)
  )


@tf.autograph.experimental.do_not_convert
def replicas_all_finite(grads, grads_in_sync):
  """One finiteness decision shared by every replica and worker.

  Must be called in a cross-replica context (or with no strategy at all).

  Args:
    grads: Gradients as seen in the cross-replica context: per-replica values
      under a strategy, plain tensors otherwise.
    grads_in_sync: True when `grads` were already all-reduced, so that every
      replica sees the same values: replica 0's decision is then everyone's
      and no further communication is needed. False reduces the per-replica
      decisions so that one non-finite replica makes all of them skip.

  Returns:
    A scalar bool tensor (local to this worker, equal on every worker).
  """
  if not tf.distribute.has_strategy():
    return all_finite(grads)
  strategy = tf.distribute.get_strategy()
  if grads_in_sync:
    per_replica = strategy.extended.call_for_each_replica(all_finite, args=(grads,))
    return strategy.experimental_local_results(per_replica)[0]
  # Booleans cannot be all-reduced: count the finite replicas instead.
  per_replica = strategy.extended.call_for_each_replica(
    lambda g: tf.cast(all_finite(g), tf.float32), args=(grads,)
  )
  finite_count = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
  return tf.equal(finite_count, strategy.num_replicas_in_sync)


@tf.autograph.experimental.do_not_convert
def update_scale_variables(
  scale_var,
  counter_var,
  grads,
  growth_steps,
  multiplier,
  grads_in_sync=False,
  apply_fn=None,
  skip_fn=None,
):
  """Updates the scale state from `grads` and says whether to apply them.

  Call in a cross-replica context under a strategy: the variables are
  mirrored and are assigned once, from one decision (see
  `replicas_all_finite`).

  Args:
    scale_var: float32 scalar variable holding the loss scale.
    counter_var: int64 scalar variable holding the good-step counter.
    grads: Nested structure of unscaled gradients; `None` entries ignored.
    growth_steps: Python int.
    multiplier: Python float.
    grads_in_sync: See `replicas_all_finite`.
    apply_fn, skip_fn: Optional callables taking no arguments: one of them
      is run, `apply_fn` when the gradients are finite, and the returned op
      includes it. Outside strategies, in a function graph (not XLA's), the
      check and this choice then share one If op (see `_fuse_check_and_apply`).

  Returns:
    `(update_op, should_apply_gradients)`: the op assigning the state (and
    running `apply_fn` or `skip_fn`; None when eager) and a scalar bool
    tensor.
  """
  flat = tf.nest.flatten(grads)
  maybe_apply = None
  if _eager_one_call((scale_var, counter_var), flat):
    finite = _check_and_step_call(
      [g for g in flat if g is not None],
      scale_var.handle,
      counter_var.handle,
      tf.constant(growth_steps, tf.int64),  # Tensors, as below.
      tf.constant(multiplier, tf.float32),
    )
    if apply_fn is not None:
      cond(finite, apply_fn, skip_fn)
    return None, finite
  if apply_fn is not None and _fuse_check_and_apply():
    finite = _apply_if_finite([_values(g) for g in flat if g is not None], apply_fn, skip_fn)
  else:
    finite = replicas_all_finite(flat, grads_in_sync)
    if apply_fn is not None:
      maybe_apply = cond(finite, apply_fn, skip_fn)
  if eager_outside_strategies():
    # One call instead of a dozen eager ops. The multiplier goes in as a
    # tensor, as eagerly: a graph constant would let Grappler turn the
    # division into a multiplication by its reciprocal (1 ulp apart).
    next_scale, next_counter = _next_state_call(
      [
        tf.convert_to_tensor(scale_var),
        tf.convert_to_tensor(counter_var),
        finite,
        tf.constant(growth_steps, tf.int64),
        tf.constant(multiplier, tf.float32),
      ]
    )
  else:
    next_scale, next_counter = next_scale_and_counter(
      scale_var, counter_var, finite, growth_steps, multiplier
    )
  update_op = tf.group(
    *[op for op in tf.nest.flatten(maybe_apply) if op is not None],
    scale_var.assign(next_scale, read_value=False),
    counter_var.assign(next_counter, read_value=False),
  )
  return update_op, finite
