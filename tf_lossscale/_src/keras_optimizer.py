"""The Keras `LossScaleOptimizer` of TF 2.4, for every inner-optimizer family.

One public class, `LossScaleOptimizer`, holds all the loss-scaling logic. Its
`__new__` finds the family of the inner optimizer (`families/`: Keras 3,
tf_keras's OptimizerV2, tf_keras's newer optimizers) and returns an instance
of a cached concrete class `(LossScaleOptimizer, family.optimizer_api)`: the
second base makes the object an optimizer of that framework. The wrapper
holds an adapter of that family for its inner optimizer, which knows how to
all-reduce gradients once, apply already-reduced gradients, count a skipped
step, delegate hyperparameters and (de)serialize the inner optimizer. The
experimental subclass goes through the same dispatch, so `isinstance` works
as in TF 2.4 both ways.

How a step is applied (`apply_gradients`), for every family:

1. In replica context the UNSCALED gradients are all-reduced once.
2. `merge_call` enters the cross-replica context, where the dynamic scale
   decides once, from the all-reduced gradients, whether they are all finite
   (`DynamicState.update(..., grads_in_sync=True)`): every replica reaches
   the same decision without more communication.
3. A `cond` either applies the reduced gradients through the inner optimizer
   on every replica (which must not reduce them again) or skips the step,
   only counting it in the inner optimizer's `iterations`.

With a fixed scale there is no check: the step is always applied. With
`experimental_aggregate_gradients=False` (the caller aggregates, or not),
step 1 is left out and step 2 counts each replica's own finiteness instead.
An inner optimizer that must sum the replicas' gradients itself (an
OptimizerV2 under CentralStorageStrategy, a narrowed one without
`skip_gradients_aggregation`) gets them as they are: step 2 decides on a
plain sum of its own (not through the inner optimizer's aggregation hook,
which runs once), so a sum that overflows is skipped there too.
"""

import contextlib
import inspect
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import tensorflow as tf

from tf_lossscale._src import families, framework_internals, scale_state, validation
from tf_lossscale._src import loss_scale as loss_scale_module

_DEFAULT_INITIAL_SCALE = 2.0**15
_DEFAULT_GROWTH_STEPS = 2000


class _Opaque:
  """A holder that `tf.distribute` does not look into.

  Mirrored variables passed through `call_for_each_replica` would otherwise be
  unwrapped into their per-replica components, while the inner optimizer
  needs the mirrored variables themselves.
  """

  __slots__ = ["value"]

  def __init__(self, value):
    self.value = value


class _BaseOptimizerPlaceholder(framework_internals.Trackable):
  """The empty `base_optimizer` child, for TF 2.2-era checkpoints.

  Up to TF 2.2 the wrapper tracked the inner optimizer as `base_optimizer`,
  so those checkpoints hold the slot variables under that node. Restoring one
  asks this object for the slots, which it creates on the inner optimizer. It
  has no variables of its own, so it adds no keys to new checkpoints.
  """

  def __init__(self, optimizer):
    self._optimizer = optimizer

  def get_slot_names(self):
    return self._optimizer.get_slot_names()

  def _create_or_restore_slot_variable(self, slot_variable_position, slot_name, variable):
    return framework_internals.v2_create_or_restore_slot_variable(
      self._optimizer, slot_variable_position, slot_name, variable
    )


# Each thread's token for the `scale_loss` marks (an object, never reused, where
# a thread id is once its thread ends).
_THREAD = threading.local()


def _here():
  """Where this call runs, for the `scale_loss` marks: (its thread's token, and
  inside a replica context of a tf.distribute strategy (strategy, replica id),
  else None)."""
  thread = getattr(_THREAD, "token", None)
  if thread is None:
    thread = _THREAD.token = object()
  if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
    return thread, None
  context = tf.distribute.get_replica_context()
  replica = tf.get_static_value(context.replica_id_in_sync_group)
  if replica is None:  # a TPU's: the thread alone
    return thread, None
  return thread, (weakref.ref(context.strategy), int(replica))


_MAX_PENDING = 1024  # `scale_loss` marks a graph keeps


class _ScaledLossMarks:
  """An optimizer's `scale_loss` calls (Keras 3's protocol) that no
  `apply_gradients` has taken yet: {graph: [where each ran]}, the graphs held
  weakly, so that a mark goes with its function's graph.

  A mark is taken by an `apply_gradients` of the same thread or, under a
  strategy, of the same replica: MirroredStrategy runs each `strategy.run` in
  new threads, one a replica (`scale_loss` and `apply_gradients` in two runs
  pair up), and OneDeviceStrategy in the caller's (one inside `strategy.run`,
  the other outside it, pair up). A graph keeps its newest `_MAX_PENDING`
  (`scale_loss` per micro-batch and one `apply_gradients` per window, eagerly,
  leave marks no step takes). Threads sharing an optimizer share its marks: a
  lock keeps each call whole.
  """

  def __init__(self):
    self._by_graph = weakref.WeakKeyDictionary()
    self._lock = threading.Lock()

  def add(self, graph):
    here = _here()
    with self._lock:
      places = self._by_graph.setdefault(graph, [])
      places.append(here)
      del places[:-_MAX_PENDING]

  def take(self, graph):
    """Takes a mark of `graph` or of a graph around it made here; returns
    (whether one was taken, whether one made here is pending in another graph)."""
    if not self._by_graph:  # every eager TF 2.4-style step comes here
      return False, False
    here = _here()
    with self._lock:
      return self._take(graph, here)

  def _take(self, graph, here):
    while True:
      places = self._by_graph.get(graph, ())
      for i, place in enumerate(places):
        if _same_place(place, here):
          del places[i]
          if not places:
            del self._by_graph[graph]
          return True, False
      # Only a function's graph has an outer graph: stop at the eager or TF1 graph.
      graph = getattr(graph, "outer_graph", None)
      if not hasattr(graph, "outer_graph"):
        break
    places = [place for places in self._by_graph.values() for place in places]
    return False, any(_same_place(place, here) for place in places)

  def drop(self, strategy=None):
    """Drops the marks made here, in every graph, and with `strategy` those
    of each of its replicas."""
    if not self._by_graph:  # every eager TF 2.4-style step comes here
      return
    here = _here()

    def dropped(place):
      return _same_place(place, here) or (
        strategy is not None and place[1] is not None and place[1][0]() is strategy
      )

    with self._lock:
      for graph, places in list(self._by_graph.items()):
        places[:] = [place for place in places if not dropped(place)]
        if not places:
          del self._by_graph[graph]


def _same_place(a, b):
  return a[0] is b[0] or (a[1] is not None and a[1] == b[1])


_SCALED_LOSS_MARKS = weakref.WeakKeyDictionary()  # {optimizer: _ScaledLossMarks}


_MARKS_MADE = threading.Lock()  # threads sharing a new optimizer make one table


def _marks(optimizer):
  marks = _SCALED_LOSS_MARKS.get(optimizer)
  if marks is None:  # Made once: this runs in every eager step.
    with _MARKS_MADE:
      marks = _SCALED_LOSS_MARKS.get(optimizer)
      if marks is None:
        marks = _SCALED_LOSS_MARKS[optimizer] = _ScaledLossMarks()
  return marks


_CONCRETE_CLASSES = {}


def concrete_class(public_cls, family):
  """The cached class `(public_cls, family.optimizer_api)`, named like `public_cls`."""
  key = (public_cls, family)
  if key not in _CONCRETE_CLASSES:
    concrete = type(
      public_cls.__name__,
      (public_cls, family.optimizer_api),
      {
        "__module__": public_cls.__module__,
        "__qualname__": public_cls.__qualname__,
        "__doc__": public_cls.__doc__,
        "_public_class": public_cls,
        "_family": family,
      },
    )
    name, deserialized_class = families.registration(public_cls)
    own_name = family.registered_name(public_cls)
    if own_name is not None:  # A user's subclass registered itself: saved and loaded as itself.
      name, deserialized_class = own_name, public_cls
    family.register_serializable(concrete, name, deserialized_class)
    _CONCRETE_CLASSES[key] = concrete
  return _CONCRETE_CLASSES[key]


def _raise_if_strategy_unsupported():
  """Refuses the strategies whose variables are not replicated per replica.

  As TF 2.4: the gradients would be unscaled once per compute replica but
  should be once per variable replica. TF 2.4 also refused
  CentralStorageStrategy, which works here.
  """
  if not tf.distribute.has_strategy():
    return
  strategy = tf.distribute.get_strategy()
  if isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
    raise ValueError(
      "Loss scaling is not supported with TPUStrategy. Loss scaling is unnecessary "
      "with TPUs, since they support bfloat16 instead of float16 and bfloat16 does "
      "not require loss scaling. You should remove the use of the "
      "LossScaleOptimizer when TPUs are used."
    )
  if isinstance(
    strategy,
    (
      tf.distribute.experimental.ParameterServerStrategy,
      tf.compat.v1.distribute.experimental.ParameterServerStrategy,
    ),
  ):
    raise ValueError(
      "Loss scaling is not supported with the tf.distribute.Strategy: "
      f"{strategy.__class__.__name__}. Try using a different Strategy, e.g. a "
      "MirroredStrategy"
    )


def _check_arguments(dynamic, initial_scale):
  """The constructor's argument checks, run before anything is created or
  the inner optimizer is marked as wrapped."""
  if not isinstance(dynamic, bool):
    # Catches the second positional argument of the experimental class
    # (a loss scale) passed to this class.
    raise TypeError(
      f'"dynamic" argument to LossScaleOptimizer.__init__ must be a bool, but got: {dynamic!r}'
    )
  if initial_scale is not None:
    # NaN, Inf and 0 would train with NaN weights or never apply a step.
    validation.check_finite_above("initial_scale", initial_scale, 0)


def _inner_property(name):
  """A property that reads and sets the inner optimizer's attribute `name`."""
  return property(
    lambda self: getattr(self._optimizer, name),
    lambda self, value: setattr(self._optimizer, name, value),
    doc=f"The inner optimizer's `{name}`.",
  )


def _scale_options(dynamic, **options):
  """The options beyond TF 2.4 that were given, as `DynamicLossScale` keywords
  (which checks their values); refused with a fixed scale."""
  given = {name: value for name, value in options.items() if value is not None}
  if given and not dynamic:
    name, value = next(iter(given.items()))
    raise ValueError(
      f'"{name}" must be None if "dynamic" is False (a fixed loss scale never changes), '
      f"but got: {value!r}"
    )
  return given


def _not_an_optimizer_error(inner_optimizer):
  return TypeError(
    '"inner_optimizer" must be an instance of `tf.keras.optimizers.Optimizer`, '
    f"but got: {inner_optimizer}."
  )


class InitSignature:
  """A class's `__signature__`: its `__init__`'s, without `self`.

  `inspect.signature` (hence `help`) shows a class's `__new__` when the
  class defines one beside its `__init__`: `(*args, **kwargs)` for the
  classes whose `__new__` picks the class to make. Read from a subclass, it
  gives that subclass's `__init__`.

  >>> inspect.signature(LossScaleOptimizer).parameters['dynamic']
  <Parameter "dynamic: bool = True">
  """

  def __get__(self, instance, owner):
    signature = inspect.signature(owner.__init__)
    return signature.replace(parameters=tuple(signature.parameters.values())[1:])


class LossScaleOptimizer(framework_internals.DelegatingTrackableMixin):
  """An optimizer that applies loss scaling to prevent numeric underflow.

  Loss scaling is a technique to prevent numeric underflow in intermediate
  gradients when float16 is used. The loss is multiplied ("scaled") by a
  factor called the loss scale, so every intermediate gradient is multiplied
  by it too; the final gradients are divided ("unscaled") by the same factor
  before they are applied.

  `LossScaleOptimizer` wraps another optimizer and applies loss scaling to it.
  The inner optimizer can be a Keras 3 optimizer (`tf.keras.optimizers.*`,
  `keras.optimizers.*`) or, when tf_keras is installed, a
  `tf_keras.optimizers.legacy.*` (OptimizerV2) or `tf_keras.optimizers.*`
  optimizer; the wrapper is an optimizer of the same framework, so it can be
  passed to that framework's `Model.compile` (which then does not add a loss
  scale optimizer of its own, even under a `mixed_float16` policy).

  By default the loss scale is dynamic: `minimize` scales the loss, unscales
  the gradients and updates the loss scale, so wrapping the optimizer is all
  that is needed:

  >>> from tf_lossscale.keras import mixed_precision
  >>> opt = tf.keras.optimizers.SGD(0.25)
  >>> opt = mixed_precision.LossScaleOptimizer(opt)
  >>> var = tf.Variable(1.)
  >>> loss_fn = lambda: var ** 2
  >>> # 'minimize' applies loss scaling and updates the loss sale.
  >>> opt.minimize(loss_fn, var_list=var)
  >>> print(var.numpy())
  0.5

  With a `tf.GradientTape`, scale the loss and unscale the gradients yourself
  with `get_scaled_loss` and `get_unscaled_gradients`:

  >>> with tf.GradientTape() as tape:
  ...   loss = loss_fn()
  ...   scaled_loss = opt.get_scaled_loss(loss)
  >>> scaled_grad = tape.gradient(scaled_loss, var)
  >>> (grad,) = opt.get_unscaled_gradients([scaled_grad])
  >>> opt.apply_gradients([(grad, var)])  # Loss scale is updated here
  >>> print(var.numpy())
  0.25

  Warning: call each of `get_scaled_loss` and `get_unscaled_gradients` exactly
  once per step when using a `tf.GradientTape`.

  `apply_gradients` takes unscaled gradients. Under a `tf.distribute` strategy
  it all-reduces them first and, with a dynamic loss scale, skips the whole
  step on every replica when any gradient of any replica is Inf or NaN
  (variables and slots untouched, `iterations` still incremented but under
  Keras 3's `gradient_accumulation_steps`), halving the loss scale. Every
  `dynamic_growth_steps` consecutive finite steps the loss scale doubles.
  With a fixed loss scale (`dynamic=False`) gradients are applied as given.
  Gradient clipping set on the inner optimizer (`clipnorm`, `clipvalue`,
  `global_clipnorm`) applies to the unscaled gradients.

  Keras 3's `Model.fit` calls `scale_loss(loss)` and then passes the SCALED
  gradients to `apply_gradients`: `scale_loss` marks the next
  `apply_gradients` of the same thread and graph, which then unscales the
  gradients first. `get_scaled_loss` and `get_unscaled_gradients` (TF 2.4's
  protocol) drop a mark left pending.

  Hyperparameters can be read and set through the wrapper, which delegates
  them to the inner optimizer:

  >>> opt = tf.keras.optimizers.Adam(beta_1=0.8, epsilon=1e-5)
  >>> opt = mixed_precision.LossScaleOptimizer(opt)
  >>> opt.beta_1  # Equivalent to `opt.inner_optimizer.beta_1`
  0.8
  >>> opt.beta_1 = 0.7  # Equivalent to `opt.inner_optimizer.beta_1 = 0.7`
  >>> opt.beta_1
  0.7
  >>> opt.inner_optimizer.beta_1
  0.7

  Other attributes are not delegated. Adam's `epsilon` is not a
  hyperparameter (TF 2.4's Adam never called `_set_hyper` on it):

  >>> opt.inner_optimizer.epsilon
  1e-05
  >>> opt.epsilon
  Traceback (most recent call last):
  ...
  AttributeError: 'LossScaleOptimizer' object has no attribute 'epsilon'
  >>> opt.epsilon = 1e-4  # This does NOT set epsilon on `opt.inner_optimizer`
  >>> opt.inner_optimizer.epsilon
  1e-05

  The delegated names are `learning_rate`/`lr`, `iterations`, `clipnorm`,
  `clipvalue`, `global_clipnorm` and the hyperparameters TF 2.4's optimizer
  of that kind had (SGD: momentum, decay; Adam, Adamax, Nadam: beta_1, beta_2,
  decay; RMSprop: rho, momentum, decay; Adadelta: rho, decay; Adagrad: decay;
  Ftrl: learning_rate_power, l1_regularization_strength,
  l2_regularization_strength, beta, decay; a tf_keras OptimizerV2: its
  `_hyper` names), when the inner optimizer has them. `dir()` lists them.

  Config comparison: Keras 3.15 and later name default optimizers uniquely
  (`sgd`, `sgd_1`, ...), so the configs of two freshly built wrappers differ in the
  inner optimizer's name. `comparable_config()` is `get_config()` without such
  an automatic inner name; compare those to check that two optimizers are
  configured alike.

  Beyond TF 2.4, keyword-only options bound a dynamic loss scale
  (`min_loss_scale`, `max_loss_scale`) and let it halve only after several
  consecutive non-finite steps (`hysteresis`); at their defaults the
  behaviour is TF 2.4's, and they are in `get_config()` only when given, so
  TF-era configs still compare equal. `skipped_steps` counts skipped steps:

  >>> opt = mixed_precision.LossScaleOptimizer(
  ...     tf.keras.optimizers.SGD(0.), initial_scale=4, dynamic_growth_steps=2,
  ...     max_loss_scale=8, hysteresis=2)
  >>> var = tf.Variable(1.)
  >>> scales = []
  >>> for grad in [1., 1., 1., 1., float('nan'), float('nan')]:
  ...   opt.apply_gradients([(tf.constant(grad), var)])
  ...   scales.append(float(opt.loss_scale))
  >>> scales  # Doubles once (then 8 is the maximum), halves at the 2nd NaN
  [4.0, 8.0, 8.0, 8.0, 8.0, 4.0]
  >>> int(opt.skipped_steps)
  2
  >>> {k: v for k, v in opt.get_config().items() if k != 'inner_optimizer'}
  {'dynamic': True, 'initial_scale': 4.0, 'dynamic_growth_steps': 2, 'max_loss_scale': 8.0, 'hysteresis': 2}

  Args:
    inner_optimizer: The optimizer to wrap.
    dynamic: Bool, whether the loss scale is dynamic. Defaults to True. If
      False, `initial_scale` must be given and is used as the fixed scale.
    initial_scale: The initial loss scale. Defaults to `2 ** 15` when
      `dynamic` is True. Start high: a scale too high falls within a few
      steps, one too low rises only every `dynamic_growth_steps` steps.
    dynamic_growth_steps: Consecutive steps with finite gradients after which
      a dynamic loss scale doubles. Defaults to 2000. Only with
      `dynamic=True`.
    min_loss_scale: Keyword-only, beyond TF 2.4: a dynamic loss scale never
      halves below it. A finite number greater than 0, below 1 allowed.
      Defaults to 1 (TF 2.4).
    max_loss_scale: Keyword-only, beyond TF 2.4: a dynamic loss scale never
      doubles above it. At least `min_loss_scale` and `initial_scale`;
      defaults to unbounded (TF 2.4; the scale still never becomes Inf).
    hysteresis: Keyword-only, beyond TF 2.4: the number of consecutive
      non-finite steps at which a dynamic loss scale halves (each one is
      skipped all the same); every further non-finite step of the run
      halves it too, and a finite step ends the run. An int of at least 1;
      defaults to 1 (TF 2.4: every non-finite step halves the scale).

  Raises:
    TypeError: If `inner_optimizer` is not a supported optimizer or is a
      `LossScaleOptimizer`, or if `dynamic` is not a bool.
    ValueError: If `initial_scale` is not a finite number > 0, if
      `inner_optimizer` is already wrapped, if `dynamic` is False and
      `initial_scale` is missing or `dynamic_growth_steps`,
      `min_loss_scale`, `max_loss_scale` or `hysteresis` given, or if one of
      these three is outside what is allowed above.
    TypeError, ValueError or OverflowError: If `dynamic_growth_steps` is
      not an int (`int()`'s own error for it, as TF 2.4), or ValueError if
      it is outside int64.
  """

  # The constructor's name for the inner optimizer (the experimental class's differs).
  _INNER_ARGUMENT = "inner_optimizer"
  __signature__ = InitSignature()

  def __new__(cls, *args, **kwargs):
    inner_optimizer = args[0] if args else kwargs.get(cls._INNER_ARGUMENT)
    own_family = getattr(cls, "_family", None)
    if inner_optimizer is None and own_family is not None:
      # copy / pickle protocol: the concrete class is already known.
      return super().__new__(cls)
    family = families.for_optimizer(inner_optimizer)
    if family is None:
      raise _not_an_optimizer_error(inner_optimizer)
    if own_family is not None and "_family" not in cls.__dict__:
      # A subclass of a concrete class, as Horovod makes of `type(opt)` to
      # rebuild the optimizer with `cls.from_config(...)`: it is what was asked for.
      if family is not own_family:
        raise TypeError(
          f"{cls.__name__} subclasses the LossScaleOptimizer class of {own_family.__name__} "
          f"inner optimizers and cannot wrap {inner_optimizer}: wrap it with "
          "LossScaleOptimizer, or subclass LossScaleOptimizer itself"
        )
      return super().__new__(cls)
    concrete = concrete_class(getattr(cls, "_public_class", cls), family)
    instance = super().__new__(concrete)
    if not issubclass(concrete, cls):
      # `type(opt)(inner)` with an inner optimizer of another family: Python
      # initializes only instances of the class called.
      instance.__init__(*args, **kwargs)
    return instance

  def __init__(
    self,
    inner_optimizer: Any,
    dynamic: bool = True,
    initial_scale: float | None = None,
    dynamic_growth_steps: int | None = None,
    *,
    min_loss_scale: float | None = None,
    max_loss_scale: float | None = None,
    hysteresis: int | None = None,
  ) -> None:
    _check_arguments(dynamic, initial_scale)
    if isinstance(inner_optimizer, LossScaleOptimizer) or self._family.is_loss_scale_optimizer(
      inner_optimizer
    ):
      raise TypeError(
        f"LossScaleOptimizer cannot wrap another LossScaleOptimizer, but got: {inner_optimizer}"
      )
    _raise_if_strategy_unsupported()
    if framework_internals.is_wrapped(inner_optimizer):
      # Wrapper and inner optimizer share one checkpoint node: two wrappers of
      # one optimizer would fight over it.
      raise ValueError(
        '"inner_optimizer" is already wrapped by a LossScaleOptimizer. An '
        "optimizer can only be wrapped by a single LossScaleOptimizer"
      )
    options = _scale_options(
      dynamic, min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale, hysteresis=hysteresis
    )
    if dynamic:
      initial_scale = _DEFAULT_INITIAL_SCALE if initial_scale is None else initial_scale
      if dynamic_growth_steps is None:
        dynamic_growth_steps = _DEFAULT_GROWTH_STEPS
      with tf.init_scope():
        loss_scale = loss_scale_module.DynamicLossScale(
          initial_scale,
          validation.int64("dynamic_growth_steps", dynamic_growth_steps),
          2.0,
          **options,
        )
      state = loss_scale_module.dynamic_state(loss_scale)
    else:
      if initial_scale is None:
        raise ValueError('"initial_scale" must be specified if "dynamic" is False')
      if dynamic_growth_steps is not None:
        raise ValueError(
          '"dynamic_growth_steps" must be None if "dynamic" is False, '
          f"but got: {dynamic_growth_steps}"
        )
      loss_scale, state = float(initial_scale), None
    self._family.init_wrapper(self)
    self._set_internal("_optimizer", inner_optimizer)
    self._set_internal("_adapter", self._family(inner_optimizer))
    self._set_internal("_loss_scale", loss_scale)
    self._set_internal("_state", state)
    self._set_internal("_warned_of_marks_elsewhere", False)
    framework_internals.mark_wrapped(inner_optimizer)
    # From here on the checkpoint node of the wrapper is the inner
    # optimizer's; the scale state and the placeholder hang from it.
    if not framework_internals.delegate_tracking(self, inner_optimizer):
      return
    if self.dynamic:
      framework_internals.track_child(self, loss_scale, "loss_scale", overwrite=True)
    if hasattr(inner_optimizer, "get_slot_names"):
      # Only optimizers with slot variables (OptimizerV2) existed in TF 2.2.
      framework_internals.track_child(
        self, _BaseOptimizerPlaceholder(inner_optimizer), "base_optimizer", overwrite=True
      )

  def _set_internal(self, name, value):
    """Sets an attribute with no framework tracking or delegation."""
    object.__setattr__(self, name, value)

  # --- Loss-scale attributes -------------------------------------------------

  @property
  def dynamic(self) -> bool:
    """Bool, whether the loss scale is dynamic.

    >>> LossScaleOptimizer(tf.keras.optimizers.SGD()).dynamic
    True
    """
    return self._state is not None

  @property
  def loss_scale(self) -> tf.Tensor:
    """The current loss scale as a float32 scalar tensor.

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(), dynamic=False,
    ...                          initial_scale=8)
    >>> float(opt.loss_scale)
    8.0
    """
    if self.dynamic:
      return tf.convert_to_tensor(self._state.scale)
    return tf.convert_to_tensor(self._loss_scale, tf.float32)

  @property
  def dynamic_counter(self) -> tf.Variable | None:
    """The dynamic loss scale's step counter (a variable); None if fixed.

    A finite step adds 1 to it, or sets it to 1 if it is negative; on
    reaching `dynamic_growth_steps` the scale doubles and it restarts at 0.
    With `hysteresis` 1 (the default) a non-finite step halves the scale and
    resets it to 0, as in TF 2.4. With a `hysteresis` above 1 a non-finite
    step sets it to minus the length of the run of consecutive non-finite
    steps so far, capped at `hysteresis - 1`, the steps that halve the scale
    included (those from the `hysteresis`-th of the run on).

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD())
    >>> int(opt.dynamic_counter)
    0
    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(), initial_scale=8,
    ...                          hysteresis=2)
    >>> var = tf.Variable(1.)
    >>> for grad in [1., float('nan'), float('nan'), float('nan')]:
    ...   _ = opt.apply_gradients([(tf.constant(grad), var)])
    ...   print(int(opt.dynamic_counter), float(opt.loss_scale))
    1 8.0
    -1 8.0
    -1 4.0
    -1 2.0
    """
    if self.dynamic:
      return self._state.counter
    return None

  @property
  def skipped_steps(self) -> tf.Variable | None:
    """The number of steps skipped so far (an int64 variable); None if fixed.

    A step with an Inf or NaN gradient is skipped (no variable or slot
    changes) and adds one, in the same cross-replica update as the loss
    scale, so every replica and worker holds the same count. It counts the
    steps of this optimizer object since it was created: it is not
    checkpointed (TF 2.4's checkpoints have no such key): a restore leaves
    it as it was, and an optimizer made anew counts from 0. It is None with
    a fixed loss scale, which never skips, and when the optimizer was made
    in a TF1 graph (there, a step is skipped exactly when a gradient given
    to `apply_gradients` holds an Inf or NaN on any replica: fetch that
    check with the train op).

    Whether one step was applied is whether the count did not move; in a
    `tf.function` read it before and after `apply_gradients`:

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(1.), initial_scale=8)
    >>> var = tf.Variable(1.)
    >>> @tf.function
    ... def step(grad):
    ...   skipped_before = opt.skipped_steps.read_value()
    ...   opt.apply_gradients([(grad, var)])
    ...   return opt.skipped_steps == skipped_before  # True: applied
    >>> bool(step(tf.constant(float('nan')))), bool(step(tf.constant(0.5)))
    (False, True)
    >>> int(opt.skipped_steps), int(opt.iterations.numpy()), float(var.numpy())
    (1, 2, 0.5)
    """
    if self.dynamic:
      return self._state.skipped
    return None

  @property
  def min_loss_scale(self) -> float | None:
    """A dynamic loss scale never halves below it (1 unless set); None if fixed.

    >>> LossScaleOptimizer(tf.keras.optimizers.SGD(),
    ...                    min_loss_scale=2.**-4).min_loss_scale
    0.0625
    """
    if self.dynamic:
      return self._state.settings.min_scale
    return None

  @property
  def max_loss_scale(self) -> float | None:
    """A dynamic loss scale never doubles above it (Inf: unbounded, unless
    set); None if fixed.

    >>> LossScaleOptimizer(tf.keras.optimizers.SGD()).max_loss_scale
    inf
    """
    if self.dynamic:
      return self._state.settings.max_scale
    return None

  @property
  def hysteresis(self) -> int | None:
    """Consecutive non-finite steps at which a dynamic loss scale halves (1
    unless set); None if fixed.

    >>> LossScaleOptimizer(tf.keras.optimizers.SGD(), hysteresis=3).hysteresis
    3
    """
    if self.dynamic:
      return self._state.settings.hysteresis
    return None

  @property
  def initial_scale(self) -> float:
    """The initial loss scale (the only one when `dynamic` is False).

    >>> LossScaleOptimizer(tf.keras.optimizers.SGD()).initial_scale
    32768.0
    """
    if self.dynamic:
      return self._state.settings.initial_scale
    return self._loss_scale

  @property
  def dynamic_growth_steps(self) -> int | None:
    """Finite steps before a dynamic loss scale doubles; None if fixed.

    >>> LossScaleOptimizer(tf.keras.optimizers.SGD(),
    ...                    dynamic_growth_steps=10).dynamic_growth_steps
    10
    """
    if self.dynamic:
      return self._state.settings.growth_steps
    return None

  @property
  def inner_optimizer(self) -> Any:
    """The optimizer this `LossScaleOptimizer` wraps.

    >>> sgd = tf.keras.optimizers.SGD()
    >>> LossScaleOptimizer(sgd).inner_optimizer is sgd
    True
    """
    return self._optimizer

  # --- Scaling ----------------------------------------------------------------

  @tf.autograph.experimental.do_not_convert
  def get_scaled_loss(self, loss: tf.Tensor | Callable[[], tf.Tensor]) -> Any:
    """Multiplies the loss by the loss scale.

    Only needed when computing gradients yourself, e.g. with a
    `tf.GradientTape`; then call `get_unscaled_gradients` on the gradients.
    `minimize` does both itself.

    Args:
      loss: A tensor, or a callable returning one.

    Returns:
      `loss` times `loss_scale`, in the loss's dtype (a callable for a
      callable).

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(), dynamic=False,
    ...                          initial_scale=4)
    >>> opt.get_scaled_loss(tf.constant(1.5, tf.float16))
    <tf.Tensor: shape=(), dtype=float16, numpy=6.0>
    """
    _marks(self).drop()  # TF 2.4's protocol: no `scale_loss` is pending.
    return self._scaled(loss)

  def _scaled(self, loss):
    if callable(loss):
      return scale_state.scale_loss(loss, lambda: self.loss_scale)
    return scale_state.scale_loss(loss, self.loss_scale)

  @tf.autograph.experimental.do_not_convert
  def get_unscaled_gradients(self, grads: Iterable[Any]) -> list[Any]:
    """Divides every gradient by the loss scale.

    Args:
      grads: A list (or any iterable) of gradients (tensors or
        `tf.IndexedSlices`); None entries are kept as None.

    Returns:
      A new list of the same length, every non-None gradient divided by
      `loss_scale`, `tf.IndexedSlices` kept as such.

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(), dynamic=False,
    ...                          initial_scale=4)
    >>> [g if g is None else float(g)
    ...  for g in opt.get_unscaled_gradients([tf.constant(2.), None])]
    [0.5, None]
    """
    _marks(self).drop()  # TF 2.4's protocol: no `scale_loss` is pending.
    return scale_state.unscale_gradients(grads, self.loss_scale)

  @tf.autograph.experimental.do_not_convert
  def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
    """Keras 3's training-loop hook: scales `loss`, expects scaled gradients.

    Keras 3's `Model.fit` calls it and then passes the gradients of the
    scaled loss to `apply_gradients`. The next `apply_gradients` of this
    thread (or, under a tf.distribute strategy, of this replica, in any
    `strategy.run`) in the same graph (or in a conditional or loop of the same
    function) therefore unscales the gradients before anything else; each
    `scale_loss` call is paired with one `apply_gradients`, which takes it
    even if it then fails. `get_scaled_loss` and `get_unscaled_gradients`
    (TF 2.4's protocol) drop the marks left pending, and an `apply_gradients`
    that finds a mark only in another graph (`scale_loss` in another
    function) warns, once, and takes the gradients as unscaled. Custom loops
    use `get_scaled_loss` and `get_unscaled_gradients` instead.

    Args:
      loss: The loss tensor.

    Returns:
      `loss` times `loss_scale`.

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(1.), dynamic=False,
    ...                          initial_scale=4)
    >>> var = tf.Variable(1.)
    >>> with tf.GradientTape() as tape:
    ...   loss = opt.scale_loss(var * 3.)
    >>> _ = opt.apply_gradients([(tape.gradient(loss, var), var)])
    >>> print(var.numpy())
    -2.0
    """
    _marks(self).add(tf.compat.v1.get_default_graph())
    return self._scaled(loss)

  def _take_scaled_loss_mark(self):
    """Takes one `scale_loss` mark of this graph, or of the function around
    the conditional or loop body it is (`if` on a tensor in a `tf.function`).

    A mark left in another graph (`scale_loss` in another function, or
    eagerly around a function that applies, or a `fit` step with nothing to
    apply) is not taken: the gradients are taken as unscaled, as TF 2.4's
    `apply_gradients` takes them, with a warning, once.
    """
    taken, elsewhere = _marks(self).take(tf.compat.v1.get_default_graph())
    if elsewhere and not self._warned_of_marks_elsewhere:
      self._set_internal("_warned_of_marks_elsewhere", True)
      tf.get_logger().warning(
        "LossScaleOptimizer.apply_gradients takes these gradients as unscaled: a "
        "`scale_loss` call is pending in another tf.function (or eagerly, outside this one), "
        "with no `apply_gradients` of its own there (as in a `fit` of a model with no "
        "trainable weights). If these are gradients of that scaled loss, call `scale_loss` "
        "and `apply_gradients` in the same function, or unscale them with "
        "`get_unscaled_gradients` first."
      )
    return taken

  # --- Applying ---------------------------------------------------------------

  def minimize(
    self,
    loss: tf.Tensor | Callable[[], tf.Tensor],
    var_list: Any,
    grad_loss: tf.Tensor | None = None,
    name: str | None = None,
    tape: tf.GradientTape | None = None,
  ) -> tf.Operation | None:
    """Minimizes `loss` over `var_list`, with loss scaling.

    Scales the loss, computes the gradients, unscales them and calls
    `apply_gradients`.

    Args:
      loss: A callable returning the loss, or a tensor when `tape` is given.
      var_list: A variable, a list of variables, or a callable returning one.
      grad_loss: Optional tensor, the gradient of the loss.
      name: Optional name for the returned operation.
      tape: The `tf.GradientTape` that computed a tensor `loss`.

    Returns:
      What `apply_gradients` returns.

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.5))
    >>> var = tf.Variable(3.)
    >>> opt.minimize(lambda: var ** 2, var_list=[var])
    >>> print(var.numpy())
    0.0
    """
    if isinstance(grad_loss, tf.GradientTape):
      # tf_keras's newer optimizers take the tape third: `minimize(loss,
      # var_list, tape)`. No gradient of the loss is a tape.
      grad_loss, tape = None, grad_loss
    grads_and_vars = self._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
    return self.apply_gradients(grads_and_vars, name=name)

  def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
    """`minimize`'s first half: the unscaled (gradient, variable) pairs of `loss`.

    OptimizerV2's hook, as in TF 2.4: its `minimize` (and so tf_keras's `fit`)
    goes through it, and gradient-aggregation wrappers override it (Horovod's
    `DistributedOptimizer` all-reduces the pairs it returns). The loss is
    scaled, the inner optimizer's family computes the gradients (an
    OptimizerV2 with its own `_compute_gradients`, as TF 2.4's wrapper did)
    and they are unscaled.

    Args:
      loss: A callable returning the loss, or a tensor when `tape` is given.
      var_list: A variable, a list of variables, or a callable returning one.
      grad_loss: Optional tensor, the gradient of the loss.
      tape: The `tf.GradientTape` that computed a tensor `loss`.

    Returns:
      A list of (unscaled gradient or None, variable) pairs.

    Raises:
      ValueError: For a tensor `loss` without `tape`.
    """
    if not callable(loss) and tape is None:
      raise ValueError("`tape` is required when a `Tensor` loss is passed.")
    tape = tf.GradientTape() if tape is None else tape
    with tape:
      scaled_loss = self.get_scaled_loss(loss)
    grads_and_vars = self._adapter.compute_gradients(scaled_loss, var_list, grad_loss, tape)
    grads = self.get_unscaled_gradients([g for g, _ in grads_and_vars])
    return list(zip(grads, [v for _, v in grads_and_vars], strict=True))

  # Nothing on this path needs AutoGraph (the same code runs eagerly and in
  # TF1 graphs); converting it, down to the finiteness check, took longer
  # than tracing the rest of the step (docs/benchmarks.md, "Tracing").
  @tf.autograph.experimental.do_not_convert
  def apply_gradients(
    self,
    grads_and_vars: Iterable[tuple[Any, tf.Variable]],
    name: str | None = None,
    experimental_aggregate_gradients: bool = True,
    *,
    skip_gradients_aggregation: bool = False,
  ) -> tf.Operation | None:
    """Applies UNSCALED gradients, skipping non-finite steps.

    Under a `tf.distribute` strategy the gradients are all-reduced first
    (unless `experimental_aggregate_gradients` is False or
    `skip_gradients_aggregation` True, for gradients you already reduced).
    With a dynamic loss scale, one decision for all replicas: if any gradient
    is Inf or NaN, no variable or slot changes, the loss scale halves and only
    `iterations` counts the step (not with Keras 3's
    `gradient_accumulation_steps`, where a skipped micro-step is dropped from
    its window); otherwise the inner optimizer applies the gradients and the
    loss scale is updated.

    Args:
      grads_and_vars: Iterable of (unscaled gradient, variable) pairs.
      name: Optional name for the returned operation.
      experimental_aggregate_gradients: Whether to sum the gradients of all
        replicas first. Defaults to True.
      skip_gradients_aggregation: Keyword-only, the newer optimizers'
        spelling (tf_keras's, whose wrapper takes it too): True is
        `experimental_aggregate_gradients=False`. Defaults to False.

    Returns:
      The op applying the step, for an OptimizerV2 inner optimizer in a TF1
      graph (as TF 2.4), and in a `tf.function` with a dynamic loss scale a
      bool tensor, whether the step was applied (with a fixed one the op);
      None otherwise (as tf_keras's wrapper of its newer
      optimizers), which a `tf.function` can return.

    Raises:
      TypeError: For an item that is not a (gradient, variable) pair, or,
        with a tf_keras inner optimizer, a gradient of another dtype than its
        variable.
      ValueError: In a cross-replica context, if no gradient is given, for a
        gradient whose shape does not fit its variable's, or for a variable
        a Keras 3 or new tf_keras inner optimizer was not built for. Each
        check runs before anything changes.

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(1.), initial_scale=8)
    >>> var = tf.Variable(1.)
    >>> opt.apply_gradients([(tf.constant(float('nan')), var)])
    >>> float(var.numpy()), float(opt.loss_scale), int(opt.iterations.numpy())
    (1.0, 4.0, 1)
    """
    # Taken before the checks: a step that fails takes its mark with it.
    scaled = self._take_scaled_loss_mark()
    if tf.distribute.in_cross_replica_context():
      # The replicas' marks of the `strategy.run` this step was to apply go too.
      _marks(self).drop(tf.distribute.get_strategy())
      raise ValueError("apply_gradients() must be called in a replica context.")
    # Checked here too: the optimizer is often built outside the strategy.
    _raise_if_strategy_unsupported()
    grads_and_vars = self._checked_gradients(grads_and_vars)
    aggregate = experimental_aggregate_gradients and not skip_gradients_aggregation
    if scaled:
      grads_and_vars = self._unscaled_pairs(grads_and_vars)
    # As the plain optimizer's (Keras 3's builds even for None gradients); in
    # a graph named as the family's own wrapper named them. Not for no pairs
    # (a frozen model's tf_keras `fit`): a new tf_keras optimizer built for no
    # variable refuses every later one.
    in_conditional = self.dynamic and self._family.built_in_apply_conditional
    with scale_state.tf24_apply_name_scope() if in_conditional else contextlib.nullcontext():
      if grads_and_vars:
        self._adapter.build(grads_and_vars)
    validation.warn_missing_gradients(grads_and_vars)
    grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
    unknown = self._adapter.unknown_variables([v for _, v in grads_and_vars])
    if unknown:
      raise ValueError(
        f"apply_gradients got a gradient for variable {_path(unknown[0])!r}, which the inner "
        f"{type(self._optimizer).__name__} was not built for: build it with every variable "
        "it will update (`optimizer.build(variables)`) before its first step, or use a new "
        "optimizer"
      )
    # Reduced here, the gradients are the same on every replica and one
    # replica's finiteness is everyone's. Without aggregation (the caller's
    # choice) each replica's finiteness counts; where the inner optimizer must
    # aggregate itself, the decision is on a sum made for it.
    inner_aggregates = aggregate and not self._adapter.can_apply_reduced()
    in_sync = aggregate and not inner_aggregates
    if in_sync:
      grads_and_vars = self._adapter.reduce_gradients(grads_and_vars)
    args = ([g for g, _ in grads_and_vars], _Opaque([v for _, v in grads_and_vars]))
    args += (name, in_sync, inner_aggregates)
    if tf.distribute.has_strategy():
      step_op = tf.distribute.get_replica_context().merge_call(self._apply_cross_replica, args)
    else:
      # In the default replica context, as a plain optimizer applies: a lone
      # replica's mirrored variable, stepped outside its strategy, works there.
      step_op = self._apply_cross_replica(tf.distribute.get_strategy(), *args)
    return step_op if self._family.returns_step_op else None

  def _checked_gradients(self, grads_and_vars):
    """`apply_gradients`' checks, before the scale, a variable or a slot changes.

    Returns:
      The pairs, as a list of tuples.

    Raises:
      TypeError: For an item that is not a (gradient, variable) pair, a
        gradient whose dtype the inner optimizer cannot take, or a Keras 3
        variable for a tf_keras inner optimizer.
      ValueError: If no gradient is given (an empty list only where the
        inner optimizer refuses one), or one does not fit its variable's
        shape.
    """
    pairs = validation.gradient_pairs(grads_and_vars)
    keras3 = []
    if not self._family.updates_keras3_variables:  # Nothing to scan per step otherwise.
      keras3 = [v for _, v in pairs if families.is_keras3_variable(v)]
    if keras3:
      raise TypeError(
        f"apply_gradients got the Keras 3 variable {_path(keras3[0])!r}, which the inner "
        f"{type(self._optimizer).__name__}, a tf_keras optimizer, cannot update: for a Keras 3 "
        "model wrap a Keras 3 optimizer (`keras.optimizers`, or `tf.keras.optimizers` without "
        "TF_USE_LEGACY_KERAS), or build the model with tf_keras"
      )
    if not pairs and self._family.applies_no_gradients:
      return pairs
    if all(g is None for g, _ in pairs):
      # TF 2.4's wording.
      raise ValueError(f"No gradients provided for any variable: {[v.name for _, v in pairs]}.")
    validation.check_gradients_fit(pairs, self._family.gradient_dtype_must_match)
    return pairs

  def _unscaled_pairs(self, grads_and_vars):
    """The pairs with their gradients unscaled, after `scale_loss`.

    A Keras 3 variable with `overwrite_with_gradient` (the scales of float8
    training) takes its "gradient" as its new value: left as it is, as Keras
    3's own wrapper leaves it.
    """
    pairs = list(grads_and_vars)
    scaled = [i for i, (_, v) in enumerate(pairs) if not families.overwritten_with_gradient(v)]
    unscaled = scale_state.unscale_gradients([pairs[i][0] for i in scaled], self.loss_scale)
    for i, grad in zip(scaled, unscaled, strict=True):
      pairs[i] = (grad, pairs[i][1])
    return pairs

  def _apply_cross_replica(self, strategy, grads, wrapped_vars, name, in_sync, inner_aggregates):
    """The step, in cross-replica context under a strategy (else in the default one)."""
    distributed = tf.distribute.has_strategy()

    def apply_fn():
      if not grads:  # An empty list (`Family.applies_no_gradients`): the plain apply does nothing.
        return tf.no_op()
      if not distributed:
        results = self._adapter.apply(grads, wrapped_vars.value, name, inner_aggregates)
      else:
        results = strategy.extended.call_for_each_replica(
          lambda g, v: self._adapter.apply(g, v.value, name, inner_aggregates),
          args=(grads, wrapped_vars),
        )
      return tf.group(*[op for op in tf.nest.flatten(results) if op is not None])

    if not self.dynamic:
      return apply_fn()
    # The cond runs in cross-replica context: the inner optimizer's apply
    # calls merge_call, which a cond in replica context cannot contain. A
    # skipped step is counted after it, or in its skip branch: see
    # `Family.count_skipped_step`.
    checked = grads
    if inner_aggregates and grads and distributed:
      # Finite on every replica, the inner optimizer's sum may still overflow.
      variables = strategy.experimental_local_results(wrapped_vars)[0].value
      checked = strategy.extended.batch_reduce_to(
        tf.distribute.ReduceOp.SUM, list(zip(grads, variables, strict=True))
      )
    update_op, _ = self._state.update(
      checked,
      grads_in_sync=in_sync or inner_aggregates,
      apply_fn=apply_fn,
      skip_fn=tf.no_op,
      count_skip=self._adapter.count_skipped_step,
    )
    return update_op

  # --- Delegation to the inner optimizer -----------------------------------

  @property
  def iterations(self):
    """The inner optimizer's step counter (skipped steps included, but under
    Keras 3's `gradient_accumulation_steps`, where a skipped micro-step is dropped)."""
    return self._optimizer.iterations

  @iterations.setter
  def iterations(self, variable):
    # Keras 3 optimizers count steps in a variable of their own, created with
    # them; Keras < 3.5 let the attribute be rebound, which would leave the
    # counter the optimizer tracks and saves behind: refused on every Keras 3.
    if not issubclass(self._family, families.keras3.Keras3Family):
      self._optimizer.iterations = variable
      return
    raise AttributeError(
      f"The inner {type(self._optimizer).__name__} (a Keras 3 optimizer) cannot be given a "
      "new `iterations` variable; assign a value instead: "
      "`opt.iterations.assign(value)`."
    )

  learning_rate = _inner_property("learning_rate")
  lr = learning_rate
  clipnorm = _inner_property("clipnorm")
  clipvalue = _inner_property("clipvalue")
  global_clipnorm = _inner_property("global_clipnorm")

  def _delegated_hyperparameter(self, name):
    """`name` as the inner optimizer knows it if delegated, else None."""
    try:
      adapter = object.__getattribute__(self, "_adapter")
    except AttributeError:
      return None
    name = "learning_rate" if name == "lr" else name
    return name if name in adapter.hyperparameter_names() else None

  def __repr__(self):
    """Names the inner optimizer, hence which Keras the wrapper is for (an
    error of the other Keras's `compile` shows it)."""
    try:
      inner = object.__getattribute__(self, "_optimizer")
    except AttributeError:  # Not initialized.
      return object.__repr__(self)
    return f"<{type(self).__name__} at {id(self):#x} wrapping {inner!r}>"

  def __getattr__(self, name):
    # Only reached when normal lookup fails.
    hyper = None if name.startswith("__") else self._delegated_hyperparameter(name)
    if hyper is None:
      raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
    return self._adapter.get_hyperparameter(hyper)

  def __setattr__(self, name, value):
    hyper = self._delegated_hyperparameter(name)
    if hyper is not None and not self._has_own_attribute(name):
      self._adapter.set_hyperparameter(hyper, value)
    else:
      super().__setattr__(name, value)

  def _has_own_attribute(self, name):
    try:
      object.__getattribute__(self, name)
    except AttributeError:
      return False
    return True

  def __dir__(self):
    names = set(super().__dir__())
    adapter = self.__dict__.get("_adapter")
    if adapter is not None:
      hypers = adapter.hyperparameter_names()
      names |= hypers
      if "learning_rate" in hypers:
        names.add("lr")
    return sorted(names)

  # --- Config -------------------------------------------------------------------

  def get_config(self) -> dict[str, Any]:
    """Returns the config: the serialized inner optimizer and the scale settings.

    >>> opt = LossScaleOptimizer(tf.keras.optimizers.SGD(name='sgd'),
    ...                          dynamic=False, initial_scale=8)
    >>> config = opt.get_config()
    >>> config['inner_optimizer']['class_name'], config['initial_scale']
    ('SGD', 8.0)
    >>> type(opt).from_config(config).initial_scale
    8.0
    """
    config = {
      "inner_optimizer": self._adapter.serialize(),
      "dynamic": self.dynamic,
      "initial_scale": self.initial_scale,
      "dynamic_growth_steps": self.dynamic_growth_steps,
    }
    if self.dynamic:
      config.update(loss_scale_module.options_config(self._loss_scale))
    return config

  def comparable_config(self) -> dict[str, Any]:
    """`get_config()` without the inner optimizer's automatic name.

    Keras 3.15 and later name each default optimizer uniquely (`sgd`,
    `sgd_1`, ...), so two freshly built, identically configured optimizers
    have different configs. This config drops the inner `name` when it is
    such an automatic name (or, before Keras 3.15, the class's default name),
    so equal configurations compare equal on every Keras. Names you chose are
    kept, unless they have that automatic form (`sgd_7`).

    Returns:
      A dict, `get_config()` possibly without `inner_optimizer.config.name`.

    >>> opt1 = LossScaleOptimizer(tf.keras.optimizers.SGD())
    >>> opt2 = LossScaleOptimizer(tf.keras.optimizers.SGD())
    >>> opt1.comparable_config() == opt2.comparable_config()
    True
    """
    config = self.get_config()
    if self._adapter.has_automatic_name():
      inner = dict(config["inner_optimizer"])
      inner["config"] = {k: v for k, v in inner["config"].items() if k != "name"}
      config["inner_optimizer"] = inner
    return config

  @classmethod
  def from_config(
    cls, config: dict[str, Any], custom_objects: dict[str, Any] | None = None
  ) -> "LossScaleOptimizer":
    """Creates a `LossScaleOptimizer` from `get_config()`'s output.

    Also accepts the config of TF 2.3's experimental class (keys `optimizer`
    and `loss_scale`).

    Args:
      config: The config dict.
      custom_objects: Optional dict of user-defined objects used by the
        inner optimizer's config.

    Returns:
      A new `LossScaleOptimizer`.

    Raises:
      ValueError: For an old config whose loss scale is neither a
        `FixedLossScale` nor a `DynamicLossScale` with multiplier 2.

    >>> old = {'optimizer': {'class_name': 'SGD', 'config': {'name': 'sgd'}},
    ...        'loss_scale': {'class_name': 'FixedLossScale',
    ...                       'config': {'loss_scale_value': 16.}}}
    >>> opt = LossScaleOptimizer.from_config(old)
    >>> opt.dynamic, opt.initial_scale
    (False, 16.0)
    """
    # Copied through: the frameworks' `from_config` replace nested settings
    # (a schedule's config by the schedule) in the dict they are given.
    config = copied_config(config)
    if "loss_scale" in config:
      config.update(settings_from_legacy_loss_scale(config.pop("loss_scale"), deserializing=True))
      config["inner_optimizer"] = config.pop("optimizer")
    inner = config.pop("inner_optimizer")
    if isinstance(inner, dict):
      inner = deserialize_inner(cls, inner, custom_objects)
    # Keywords: a subclass's constructor may take only keywords (Horovod's).
    return cls(inner_optimizer=inner, **config)


def _path(variable):
  """A variable's name with its layer's (Keras 3's `path`), else its name."""
  return getattr(variable, "path", None) or variable.name


def copied_config(config):
  """`config` with each dict and list in it copied, the rest shared."""
  if isinstance(config, dict):
    return {key: copied_config(value) for key, value in config.items()}
  if isinstance(config, list):
    return [copied_config(value) for value in config]
  return config


def deserialize_inner(cls, config, custom_objects):
  """Deserializes an inner optimizer config for `cls.from_config`: with the
  family of `cls` when it is a concrete class, else the family that wrote it."""
  family = getattr(cls, "_family", None) or families.for_config(config, custom_objects)
  inner = family.deserialize(config, custom_objects)
  if not family.accepts(inner):
    raise ValueError(
      f"The inner optimizer config {config!r} gave {inner!r}, not an optimizer: give its "
      "class in `custom_objects`"
    )
  return inner


def settings_only_scope():
  """Where a loss scale made only to carry settings makes its variables: in a
  TF1 graph a graph of their own (in the model's they took the names of the
  optimizer's, which became `current_loss_scale_1`); eagerly, as any."""
  if tf.compat.v1.executing_eagerly_outside_functions():
    return contextlib.nullcontext()
  return tf.Graph().as_default()


def settings_from_legacy_loss_scale(loss_scale, deserializing=False):
  """Constructor settings (`dynamic`, ...) equivalent to a TF1 loss scale.

  Args:
    loss_scale: `'dynamic'`, a number, a `FixedLossScale`, a
      `DynamicLossScale` (multiplier 2 only), or a serialized one (as TF
      2.4's `get` took).
    deserializing: Whether `loss_scale` comes from an old config.

  Returns:
    A dict of `LossScaleOptimizer` keyword arguments.

  Raises:
    ValueError: For a number that is not finite and > 0, and as the
      experimental `LossScaleOptimizer` documents.
  """
  if isinstance(loss_scale, dict):
    with settings_only_scope():
      loss_scale = loss_scale_module.deserialize(loss_scale)
  if isinstance(loss_scale, bool) or loss_scale is None:
    pass
  elif isinstance(loss_scale, (int, float)):
    validation.check_finite_above("loss_scale", loss_scale, 0)
    return {"dynamic": False, "initial_scale": loss_scale}
  elif isinstance(loss_scale, str) and loss_scale == "dynamic":
    return {"dynamic": True}
  if isinstance(loss_scale, loss_scale_module.FixedLossScale):
    return {"dynamic": False, "initial_scale": loss_scale.get_config()["loss_scale_value"]}
  if isinstance(loss_scale, loss_scale_module.DynamicLossScale):
    if loss_scale.multiplier != 2:
      if deserializing:
        raise ValueError(
          "Cannot deserialize LossScaleOptimizer with a DynamicLossScale whose "
          f"multiplier is not 2. Got DynamicLossScale: {loss_scale}"
        )
      raise ValueError(
        'When passing a DynamicLossScale to "loss_scale", '
        f"DynamicLossScale.multiplier must be 2. Got: {loss_scale}"
      )
    return {
      "dynamic": True,
      "initial_scale": loss_scale.initial_loss_scale,
      "dynamic_growth_steps": loss_scale.increment_period,
      **loss_scale_module.options_config(loss_scale),
    }
  if isinstance(loss_scale, loss_scale_module.LossScale):
    if deserializing:
      raise ValueError(
        "Serialized LossScaleOptimizers with a LossScale that is neither a "
        "FixedLossScale nor a DynamicLossScale can no longer be deserialized"
      )
    raise TypeError(
      "Passing a LossScale that is not a FixedLossScale or a DynamicLossScale "
      f"is no longer supported. Got: {loss_scale}"
    )
  raise ValueError(
    'Invalid value passed to loss_scale. loss_scale must be the string "dynamic" '
    "(recommended), an int, a float, a FixedLossScale, or a DynamicLossScale. Got "
    f"value: {loss_scale}{loss_scale_module.tensorflow_class_hint(loss_scale)}"
  )


families.register_public_class(LossScaleOptimizer, "LossScaleOptimizer")
