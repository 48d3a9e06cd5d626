"""Speed-ups of the algorithm in `algorithm.py`: the same numbers, sooner.

`scale_state.py` calls these instead of the plain functions while `enabled()`
and no op callbacks run (check-numerics);
setting the environment variable `TF_LOSSSCALE_FAST_PATHS=0` before importing
tf_lossscale turns every one of them off (docs/benchmarks.md measures each).

* The check reads each float32/float64 gradient once, with a sum: a finite
  total proves every element finite; only a non-finite total (an Inf or NaN,
  or an overflow of finite values) runs TF 2.4's element-wise check, so no
  finite step is ever skipped (`quick_and_exact`). Under XLA and on a GPU
  the element-wise check runs by itself, with no sums and no If; under XLA
  it reads small gradients concatenated, and on a CPU large ones by
  products with zeros, which XLA runs as library calls.
* In a TF1 graph one Switch gates the apply (`switch_cond`); in a function
  graph the If ops are lowered, as any `tf.cond`'s (`cond`). Each branch
  assigns the state for its own verdict, with the fewest ops
  (`next_state_given`): only the taken one runs, and under XLA on a GPU
  XLA can then turn the conditional into selects; under XLA on a CPU the
  state is assigned after the conditional (`_state_in_branches`).
  On a CPU the check has an If of its own: one If for both would trace the apply
  twice (it must run after the quick check and after the exact one), which
  made the first step slower and, called as one traced function, every step
  too.
* Eagerly, the check, the transition and the assigns (skipped-step count
  included) run as one call of a graph function (`OneCall`), and so does the
  unscale of many gradients.
"""

import collections
import dataclasses
import functools
import os

import tensorflow as tf

from tf_lossscale._src import algorithm, framework_internals

ENABLED = os.environ.get("TF_LOSSSCALE_FAST_PATHS", "1") != "0"


def enabled():
  """Whether the speed-ups are used (`TF_LOSSSCALE_FAST_PATHS`, default on)."""
  return ENABLED


# Gradients this small are handled together with the others of their shape:
# one op per group instead of one per gradient, for a temporary of at most
# this many elements per group...
_GROUPED_MAX_ELEMENTS = 1 << 16
# ...and, in the exact check, of at most this many elements per stacked chunk.
_STACKED_MAX_ELEMENTS = 1 << 20
# Under XLA on a CPU, gradients with at most this many columns (last axis) are
# checked by products with a matrix of zeros that many rows tall.
_PRODUCT_MAX_COLUMNS = 1 << 14


def _in_xla(graph=None):
  return framework_internals.in_xla_context(graph or tf.compat.v1.get_default_graph())


def _grouped(values):
  """Splits `values` into lists of small tensors of one dtype and shape, and the others."""
  groups, others = {}, []
  for v in values:
    if v.shape.is_fully_defined() and v.shape.num_elements() <= _GROUPED_MAX_ELEMENTS:
      groups.setdefault((v.dtype, tuple(v.shape.as_list())), []).append(v)
    else:
      others.append(v)
  return list(groups.values()), others


def _all(flags):
  return flags[0] if len(flags) == 1 else tf.reduce_all(tf.stack(flags))


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


def _each_finite(values):
  """TF 2.4's element-wise check, on stacked chunks of same-shaped gradients."""
  all_of = functools.partial(_over_all_axes(), tf.raw_ops.All)
  groups, others = _grouped(values)
  flags = [all_of(tf.math.is_finite(v)) for v in others]
  for same_shape in groups:
    per_chunk = max(1, _STACKED_MAX_ELEMENTS // max(1, same_shape[0].shape.num_elements()))
    for i in range(0, len(same_shape), per_chunk):
      chunk = same_shape[i : i + per_chunk]
      flags.append(all_of(tf.math.is_finite(chunk[0] if len(chunk) == 1 else tf.stack(chunk))))
  return _all(flags)


def _concatenated_finite(values):
  """TF 2.4's element-wise check in few reductions, for XLA.

  Gradients of up to `_GROUPED_MAX_ELEMENTS` elements are flattened and
  concatenated, per dtype, into chunks of at most `_STACKED_MAX_ELEMENTS`
  elements; larger ones are read one by one. A reduction per gradient meant
  one to three more kernels per gradient for XLA to compile (MobileNetV2,
  158 gradients: the fallback alone was 423 of the step's 1,932).
  """
  chunks, flat = [], None
  for dtype in sorted({v.dtype for v in values}, key=lambda d: d.name):
    chunk, size = [], 0
    for v in values:
      if v.dtype != dtype:
        continue
      n = v.shape.num_elements()
      if n is None or n > _GROUPED_MAX_ELEMENTS:
        chunks.append(v)
        continue
      if chunk and size + n > _STACKED_MAX_ELEMENTS:
        chunks.append(tf.concat(chunk, 0))
        chunk, size = [], 0
      if v.shape.rank != 1:  # One shape constant for all: tracing time is mostly the ops made.
        flat = tf.constant([-1]) if flat is None else flat
        v = tf.reshape(v, flat)
      chunk.append(v)
      size += n
    if chunk:
      chunks.append(chunk[0] if len(chunk) == 1 else tf.concat(chunk, 0))
  all_of = functools.partial(_over_all_axes(), tf.raw_ops.All)
  return _all([all_of(tf.math.is_finite(c)) for c in chunks])


def _by_products(v):
  """Whether `_products_finite` checks `v` (under XLA on a CPU-only machine:
  a GPU may round float32 products' inputs to TensorFloat-32, where a finite
  value near the float32 maximum becomes Inf): a large float32/float64
  gradient of rank 2 or more, not too wide for its zeros."""
  return (
    v.dtype in (tf.float32, tf.float64)
    and v.shape.is_fully_defined()
    and v.shape.rank >= 2
    and v.shape.num_elements() > _GROUPED_MAX_ELEMENTS
    and v.shape[-1] <= _PRODUCT_MAX_COLUMNS
  )


def _products_finite(values, zero_from):
  """TF 2.4's element-wise check of large gradients, as matrix products, for
  XLA on a CPU.

  Each gradient, seen as a matrix `G` (its last axis the columns), times a
  matrix of zeros `Z` gives `V`, an entry per row: zero where the row is
  finite, NaN where it holds an Inf or a NaN (Inf x 0 is NaN; a finite value
  times zero is zero, so no sum can overflow); `V^T V` reduces `V` the same
  way. XLA's CPU backend runs such products as library calls, so LLVM
  compiles no kernel per gradient, where a reduction is one to three
  (docs/benchmarks.md), and they read a large gradient faster. `Z` has two
  columns: XLA compiles a product with a single column into a kernel of its
  own. The zeros are the first element of `zero_from` times zero (NaN if
  that element is not finite, which is then the right answer): unlike a
  constant, nothing a compiler could fold away. `zero_from` is best a small
  gradient: reading a large one too keeps it alive beside its unscaled copy
  (XLA unscales a gradient in place only when nothing else reads it).
  """
  zero = tf.reshape(zero_from, [-1])[0] * 0
  zeros, products = {}, []
  for v in values:
    rows = tf.reshape(v, [-1, v.shape[-1]])
    key = (rows.shape[1], v.dtype)
    if key not in zeros:
      zeros[key] = tf.fill([rows.shape[1], 2], tf.cast(zero, v.dtype))
    per_row = tf.matmul(rows, zeros[key])
    products.append(tf.cast(tf.matmul(per_row, per_row, transpose_a=True), tf.float32))
  return tf.math.is_finite(tf.reduce_sum(products[0] if len(products) == 1 else tf.add_n(products)))


def _xla_finite(values):
  """TF 2.4's element-wise check under XLA: large float32/float64 gradients
  by products on a CPU, the others concatenated."""
  flags = []
  if _cpu_only():
    by_products = [_by_products(v) for v in values]
    if any(by_products):
      large = [v for v, p in zip(values, by_products) if p]
      values = [v for v, p in zip(values, by_products) if not p]
      small = [v for v in values if v.shape.num_elements()]
      # The last: variables are mostly listed in the order their layers run,
      # and backprop computes the last layer's gradients first, so its zeros
      # are ready before the large gradients (waiting on a later one kept a
      # reshaped copy of a large gradient alive until then: MobileNetV2).
      zero_from = small[-1] if small else min(large, key=lambda v: v.shape.num_elements())
      flags.append(_products_finite(large, zero_from))
  if values:
    flags.append(_concatenated_finite(values))
  return _all(flags)


def quick_and_exact(values):
  """The check in two parts: `(quick, exact)`.

  `quick` is a scalar bool tensor, True only when every value is finite. It
  reads each float32/float64 gradient once, with a sum: a sum that includes
  an Inf or a NaN is never finite, so a finite total proves every element
  finite. A non-finite total may also be an overflow of finite values, so
  when `quick` is False, `exact()` decides, and a finite step is never
  skipped. float16 and bfloat16 sums overflow too often to pay off: those
  are checked element by element in `quick` already. `exact` is None when
  `quick` is exact by itself.

  Under XLA `quick` is exact by itself, with no sums and no If: large
  float32/float64 gradients are checked by matrix products on a CPU
  (`_products_finite`), the others element by element, small ones
  concatenated (`_concatenated_finite`). XLA compiles the If's skip branch
  whether it runs or not, and a reduction per gradient is a kernel or two
  more to compile: with 500 gradients the sums and the If made the first
  call 1.46–1.64x a plain step's against 1.30–1.43x, and the step was as
  fast either way (docs/benchmarks.md). XLA on a CPU splits a large
  reduction in two and writes its input out first: a boolean per element
  there costs a quarter of the float32 a sum would write.

  On a machine with a GPU `quick` is the element-wise check too: the If
  deciding whether `exact()` runs waits for its predicate on the host, and
  the GPU reads every element as fast as it sums them.
  """
  if not values:
    return tf.constant(True), None
  if _in_xla():
    return _xla_finite(values), None
  if not _cpu_only():
    return _each_finite(values), None
  sum_all = _summer()
  flags, summed = [], False
  for dtype in sorted({v.dtype for v in values}, key=lambda d: d.name):
    same_dtype = [v for v in values if v.dtype == dtype]
    if dtype not in (tf.float32, tf.float64):
      flags.append(_each_finite(same_dtype))
      continue
    summed = True
    groups, others = _grouped(same_dtype)
    sums = [sum_all(v) for v in others]
    sums += [sum_all(g[0] if len(g) == 1 else tf.add_n(g)) for g in groups]
    flags.append(tf.math.is_finite(sums[0] if len(sums) == 1 else tf.add_n(sums)))
  if not summed:
    return _all(flags), None
  return _all(flags), lambda: _each_finite(values)


def _check(values):
  quick, exact = quick_and_exact(values)
  if exact is None:
    return quick
  return cond(quick, lambda: tf.constant(True), exact)


class OneCall:
  """Runs `fn(tensors, *extra)` eagerly as one call of a graph function.

  Op by op, each gradient costs a few Python dispatches; `tf.function`'s own
  `__call__` binds every argument in Python and cost even more with hundreds
  of gradients. This keeps one concrete function per signature and calls it
  with the flat list of tensors. The signature is the dtypes, and the shapes
  too with `static_shapes` (for functions that are faster when they know
  them); otherwise the function is traced for tensors of any shape.

  Each is traced by a `tf.function` of its own, and beyond `_MAX_SIGNATURES`
  the least recently used is dropped (a sweep over many model shapes in one
  process kept them all). A signature dropped that comes back runs op by op:
  a cycle of more signatures than are kept (more models than that trained in
  turn) would otherwise trace on every call, 20-30x slower.
  """

  _MAX_SIGNATURES = 64

  def __init__(self, fn, static_shapes=False):
    self._fn = fn
    self._static_shapes = static_shapes
    self._concrete = collections.OrderedDict()
    self._dropped = collections.OrderedDict()  # an ordered set, of bounded size

  def __call__(self, tensors, *extra):
    static = self._static_shapes
    signature = tuple((t.dtype, tuple(t.shape) if static else None) for t in (*tensors, *extra))
    concrete = self._concrete.get(signature)
    if concrete is None:
      if signature in self._dropped:
        return self._fn(list(tensors), *extra)
      if len(self._concrete) >= self._MAX_SIGNATURES:
        self._dropped[self._concrete.popitem(last=False)[0]] = None
        if len(self._dropped) > 16 * self._MAX_SIGNATURES:
          self._dropped.popitem(last=False)
      specs = [tf.TensorSpec(shape, dtype) for dtype, shape in signature]
      function = tf.function(self._fn, autograph=False)
      concrete = function.get_concrete_function(specs[: len(tensors)], *specs[len(tensors) :])
      self._concrete[signature] = concrete
    elif signature in self._concrete:  # (not dropped by another thread meanwhile)
      self._concrete.move_to_end(signature)
    return framework_internals.call_concrete_function(concrete, [*tensors, *extra])


def eager_outside_strategies():
  """Whether ops run eagerly with no `tf.distribute` strategy in scope."""
  return tf.executing_eagerly() and not tf.distribute.has_strategy()


# Shapes let it sum small gradients in groups.
_check_call = OneCall(_check, static_shapes=True)


@tf.autograph.experimental.do_not_convert
def all_finite(grads):
  """`algorithm.all_finite`, faster: same decision on every input.

  >>> bool(all_finite([tf.constant([3e38, 3e38])]))  # finite; only the sum overflows
  True
  >>> bool(all_finite([tf.constant([1., float("nan")]), None]))
  False
  """
  values = algorithm.checked_values(grads)
  sparse = any(isinstance(g, tf.IndexedSlices) for g in grads)  # New shapes every step.
  if values and not sparse and eager_outside_strategies():
    return _check_call(values)
  return _check(values)


@functools.cache
def _cpu_only():
  return all(d.device_type == "CPU" for d in tf.config.list_logical_devices())


def _plain_graph():
  """Whether ops go into a TF1 graph (not a function's) outside strategies,
  XLA and TF1 control-flow contexts (False when that cannot be known)."""
  if tf.executing_eagerly():
    return False
  graph = tf.compat.v1.get_default_graph()
  if graph.building_function or tf.distribute.has_strategy():
    return False
  return framework_internals.in_v1_control_flow(graph) is False and _in_xla(graph) is False


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


def switch_cond(pred, true_fn, false_fn):
  """`tf.cond` for a TF1 graph with one Switch and one Merge per output.

  As TF1's own `cond` does, each branch's ops get a control input from a
  pivot, one of the Switch's two outputs, and do not run when it is dead:
  but the tensors a branch uses from outside are not passed through a Switch
  each, which with hundreds of gradients and variables cost more than the
  apply. As in a function's branch, every op the taken branch makes runs,
  also those it does not return. Ops it makes under
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
  """`algorithm.cond`, faster in a TF1 graph: one Switch gates the branches
  (`switch_cond`). In a function the If is lowered, as any `tf.cond`'s, so
  that Grappler rewrites the step as it does a plain one. Kept as a call of
  its branch functions, an If stepped faster with hundreds of variables, but
  Grappler's arithmetic optimizer then rewrote the step otherwise: RMSprop,
  Adadelta, Ftrl and Adafactor updates came out 1-2 ulps apart from a plain
  step's (with that optimizer off, the two agreed), and on TensorFlow 2.16
  even with only the check's If kept so."""
  static_pred = tf.get_static_value(pred)
  if static_pred is not None:
    return true_fn() if static_pred else false_fn()
  if _plain_graph():
    return switch_cond(pred, true_fn, false_fn)
  return tf.cond(pred, true_fn, false_fn)


def _settings_as_tensors(settings):
  """The settings as tensors: eagerly a constant operand would let Grappler
  turn the division by the multiplier into a multiplication by its
  reciprocal, 1 ulp away from the op-by-op result."""
  return [tf.constant(getattr(settings, f.name)) for f in dataclasses.fields(settings)]


_NUM_SETTINGS = len(dataclasses.fields(algorithm.ScaleSettings))


def _settings_from(tensors):
  return algorithm.ScaleSettings(*tensors)


def _check_and_step(values, *handles_and_settings):
  """The check and the transition, assigned to the state variables.

  `handles_and_settings`: the handles of the scale, the counter and, when
  counted, the skipped-step variables, then the settings' tensors.
  """
  handles = handles_and_settings[:-_NUM_SETTINGS]
  settings = _settings_from(handles_and_settings[-_NUM_SETTINGS:])
  finite = _check(values)
  scale = tf.raw_ops.ReadVariableOp(resource=handles[0], dtype=tf.float32)
  counter = tf.raw_ops.ReadVariableOp(resource=handles[1], dtype=tf.int64)
  next_scale, next_counter = algorithm.next_scale_and_counter(scale, counter, finite, settings)
  tf.raw_ops.AssignVariableOp(resource=handles[0], value=next_scale)
  tf.raw_ops.AssignVariableOp(resource=handles[1], value=next_counter)
  if len(handles) > 2:
    skipped = tf.cast(tf.logical_not(finite), tf.int64)
    tf.raw_ops.AssignAddVariableOp(resource=handles[2], value=skipped)
  return finite, scale, counter


_check_and_step_call = OneCall(_check_and_step, static_shapes=True)
_next_state_call = OneCall(
  lambda state: algorithm.next_scale_and_counter(*state[:3], _settings_from(state[3:]))
)


def _eager_one_call(variables, grads):
  """Whether the update can run as `_check_and_step_call`: eagerly outside
  strategies, with plain resource variables (not a strategy's, made in its
  scope: a handle is one replica's) and dense gradients (IndexedSlices have
  new shapes every step)."""
  return (
    eager_outside_strategies()
    and not any(isinstance(v, tf.distribute.DistributedValues) for v in variables)
    and all(getattr(v, "handle", None) is not None for v in variables)
    and any(g is not None for g in grads)
    and not any(isinstance(g, tf.IndexedSlices) for g in grads)
  )


@tf.autograph.experimental.do_not_convert
def update_scale_variables(
  scale_var,
  counter_var,
  grads,
  settings,
  grads_in_sync=False,
  apply_fn=None,
  skip_fn=None,
  skipped_var=None,
  count_skip=None,
):
  """`algorithm.update_scale_variables`, faster: same arguments, same numbers."""
  flat = tf.nest.flatten(grads)
  variables = [v for v in (scale_var, counter_var, skipped_var) if v is not None]
  if _eager_one_call(variables, flat):
    values = algorithm.checked_values(flat)
    finite, scale, counter = _check_and_step_call(
      values, *[v.handle for v in variables], *_settings_as_tensors(settings)
    )
    if apply_fn is not None:
      try:
        cond(finite, apply_fn, skip_fn)
      except Exception:
        # The state moved before the apply: an apply that raises leaves it
        # as it was, as `algorithm`'s order (the apply first) does.
        scale_var.assign(scale)
        counter_var.assign(counter)
        if skipped_var is not None and not finite:
          skipped_var.assign_sub(1)
        raise
    _count_if_skipped(count_skip, finite)
    return None, finite
  finite = algorithm.replicas_all_finite(flat, grads_in_sync, check=all_finite)
  if apply_fn is not None and _state_in_branches():
    state = (scale_var, counter_var, skipped_var, settings)
    apply = _branch_with_state(apply_fn, True, *state, None)
    skip = _branch_with_state(skip_fn, False, *state, count_skip)
    return cond(finite, apply, skip), finite
  ops = []
  if apply_fn is not None:
    ops = [op for op in tf.nest.flatten(cond(finite, apply_fn, skip_fn)) if op is not None]
  state = [tf.convert_to_tensor(scale_var), tf.convert_to_tensor(counter_var), finite]
  if eager_outside_strategies():
    next_scale, next_counter = _next_state_call(state + _settings_as_tensors(settings))
  else:
    next_scale, next_counter = algorithm.next_scale_and_counter(*state, settings)
  assigns = algorithm.assign_state(
    scale_var, counter_var, skipped_var, next_scale, next_counter, finite
  )
  with tf.control_dependencies(ops):
    assigns.append(_count_if_skipped(count_skip, finite))
  return tf.group(*[op for op in (*ops, *assigns) if op is not None]), finite


def _count_if_skipped(count_skip, finite):
  """Calls `count_skip`, if given, with whether the step was skipped: in a
  graph `not finite`; eagerly, where the verdict is known, on a skipped step
  only."""
  if count_skip is None:
    return None
  known = tf.get_static_value(finite)
  if known:
    return None
  return count_skip(tf.logical_not(finite) if known is None else tf.constant(True))


def _state_in_branches():
  """Whether each branch of the step's conditional assigns the state for its
  own verdict: everywhere but under XLA on a CPU.

  Outside XLA only the taken branch runs, and it knows its verdict: a finite
  step runs the good step's transition alone (12 ops with TF 2.4's
  settings), a skipped one the skip's (7, the step counters included): the
  transition for either verdict after the conditional ran 12 to 20 ops
  more on every step. On a GPU each op is a kernel to launch, and ours ran
  0.3-0.5 ms a step above floor+cond there (docs/benchmarks.md).

  Under XLA the whole step compiles as one program. XLA turns a conditional
  whose branches are element-wise into selects, the apply computed and kept
  or dropped per element, but keeps it when a branch does nothing (XLA's
  `ConditionalSimplifier`), as a skip that only leaves the variables be
  does. On a GPU a conditional waits for its predicate on the host, and the
  host cannot queue the next step meanwhile: at 16.8M parameters in 8
  variables with Adam, 0.51 ms a step against a plain step's 0.28 (an H100).
  With the state in both branches, as TF 2.4's `DynamicLossScale` had it,
  the skip branch halves the scale, and the step takes 0.32 ms. On a CPU
  the conditional is the faster: there the skip branch writes nothing (and
  where XLA cannot be told apart, as if it compiled the step).

  Eagerly outside strategies the transition for either verdict is one call
  (`_next_state_call`), cheaper than a dozen ops dispatched one by one.
  """
  if eager_outside_strategies():
    return False
  return not (_cpu_only() and _in_xla() is not False)


def _static(settings):
  return all(
    isinstance(getattr(settings, f.name), (int, float)) for f in dataclasses.fields(settings)
  )


def next_state_given(finite, scale, counter, settings):
  """`algorithm.next_scale_and_counter` for a verdict known in Python: the
  same numbers from fewer ops, each `tf.where` on the verdict decided here,
  and, with settings known in Python, what is an identity for them left
  out: with TF 2.4's (a hysteresis of 1, no cap) the run of non-finite
  steps and the cap.

  >>> s, c = next_state_given(True, 8., 1, algorithm.ScaleSettings(growth_steps=2))
  >>> float(s), int(c)
  (16.0, 0)
  """
  if not _static(settings):
    return algorithm.next_scale_and_counter(scale, counter, tf.constant(finite), settings)
  scale = tf.convert_to_tensor(scale, tf.float32)
  counter = tf.convert_to_tensor(counter, tf.int64)
  # As `algorithm`'s constants, so that a graph rewrite treats both alike.
  multiplier = tf.cast(settings.multiplier, tf.float32)
  zero = tf.constant(0, tf.int64)
  if finite:
    good = tf.maximum(counter, zero) + 1
    grows = good >= tf.cast(settings.growth_steps, tf.int64)
    grown = scale * multiplier
    grown = tf.where(tf.math.is_finite(grown), grown, scale)
    if settings.max_scale != float("inf"):
      grown = tf.minimum(grown, tf.cast(settings.max_scale, tf.float32))
    return tf.where(grows, grown, scale), tf.where(grows, zero, good)
  shrunk = tf.maximum(scale / multiplier, tf.cast(settings.min_scale, tf.float32))
  if settings.hysteresis == 1:
    return shrunk, zero
  run = tf.maximum(-counter, zero) + 1
  hysteresis = tf.cast(settings.hysteresis, tf.int64)
  return tf.where(run >= hysteresis, shrunk, scale), -tf.minimum(run, hysteresis - 1)


def _branch_with_state(fn, finite, scale_var, counter_var, skipped_var, settings, count_skip):
  """`fn` (`apply_fn` or `skip_fn`), then the state's assigns for a step
  whose gradients are `finite` (a Python bool), as one branch; a skip
  counts itself (`skipped_var`, `count_skip`)."""

  def branch():
    done = [op for op in tf.nest.flatten(fn()) if op is not None]
    with tf.control_dependencies(done):
      scale, counter = next_state_given(finite, scale_var, counter_var, settings)
      ops = [
        scale_var.assign(scale, read_value=False),
        counter_var.assign(counter, read_value=False),
      ]
      if not finite and skipped_var is not None:
        ops.append(skipped_var.assign_add(tf.constant(1, tf.int64), read_value=False))
      if not finite and count_skip is not None:
        ops.append(count_skip(tf.constant(True)))
      return tf.group(*[op for op in ops if op is not None])

  return branch


def _times(values, reciprocal):
  factors = {}
  for v in values:
    if v.dtype not in factors:
      factors[v.dtype] = tf.cast(reciprocal, v.dtype)
  return [tf.raw_ops.Mul(x=v, y=factors[v.dtype]) for v in values]


_times_call = OneCall(_times)
# With few gradients, op by op is faster.
_ONE_CALL_FROM = 16


def multiply_all(values, reciprocal):
  """Each of `values` times `reciprocal` cast to its dtype; eagerly, with many
  gradients, as one call."""
  if len(values) >= _ONE_CALL_FROM and eager_outside_strategies():
    return _times_call(values, reciprocal)
  return _times(values, reciprocal)
