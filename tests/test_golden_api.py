"""Golden API test: the package against TF 2.4's names and signatures (tests/golden/tf24_api.txt).

The listing's header states the rules; this module parses the listing and
checks the installed package against it. Each check returns a list of
problems, so that the tests at the end can also show that a changed listing
is caught.
"""

import __future__

import ast
import dataclasses
import importlib
import inspect
import pathlib
import pkgutil
import types

import keras
import pytest
import tensorflow as tf

GOLDEN = pathlib.Path(__file__).parent / "golden" / "tf24_api.txt"
EXTRAS_SECTION = "== deliberate extras =="
_OURS = "tf_lossscale"
_ANY_DEFAULT = object()


# --- The listing -----------------------------------------------------------------


@dataclasses.dataclass
class Param:
  name: str
  kind: object  # an inspect.Parameter kind
  default: object = inspect.Parameter.empty  # _ANY_DEFAULT: any default


@dataclasses.dataclass
class Member:
  kind: str  # method, classmethod, property, constant, framework
  name: str
  params: list | None = None
  value: object = None
  keras3_differs: bool = False
  extra: bool = False
  reason: str = ""


@dataclasses.dataclass
class ExtraParam:
  method: str
  param: Param
  planned: bool
  reason: str


@dataclasses.dataclass
class ClassEntry:
  path: str
  tf_path: str = ""
  extends: str = ""
  keras3: str = ""
  optimizer: bool = False
  members: dict = dataclasses.field(default_factory=dict)
  extra_params: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class FunctionEntry:
  path: str
  params: list
  tf_path: str = ""
  keras3: str = ""


@dataclasses.dataclass
class NamespaceEntry:
  name: str
  target: str  # "module", "omitted" or an object's path
  extra: bool = False
  reason: str = ""


@dataclasses.dataclass
class Namespace:
  path: str
  tf_path: str = ""
  partial: bool = False
  entries: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Listing:
  namespaces: dict = dataclasses.field(default_factory=dict)
  classes: dict = dataclasses.field(default_factory=dict)
  functions: dict = dataclasses.field(default_factory=dict)
  errors: list = dataclasses.field(default_factory=list)


def parse_params(text):
  """`'(self, a, b=1, *, c=...)'` -> a list of `Param`."""
  args = ast.parse(f"def _f{text}: pass").body[0].args
  positional = args.posonlyargs + args.args
  defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
  params = []
  for arg, default in zip(positional, defaults):
    params.append(Param(arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, _default(default)))
  if args.vararg:
    params.append(Param(args.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
  for arg, default in zip(args.kwonlyargs, args.kw_defaults):
    params.append(Param(arg.arg, inspect.Parameter.KEYWORD_ONLY, _default(default)))
  if args.kwarg:
    params.append(Param(args.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
  return params


def _default(node):
  if node is None:
    return inspect.Parameter.empty
  if isinstance(node, ast.Constant) and node.value is Ellipsis:
    return _ANY_DEFAULT
  return eval(compile(ast.Expression(node), "<golden>", "eval"), {"tf": tf})  # noqa: S307


def _split_call(text):
  """`'name(a, b) rest'` -> `('name', '(a, b)', 'rest')`, parentheses balanced."""
  start = text.index("(")
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return text[:start], text[start : i + 1], text[i + 1 :].strip()
  raise ValueError(f"unbalanced parentheses: {text}")


def parse_listing(text):
  """Parses the golden listing (syntax in its header)."""
  listing = Listing()
  extra = False
  block = None
  for number, raw in enumerate(text.splitlines(), 1):
    if raw.strip() == EXTRAS_SECTION:
      extra, block = True, None
      continue
    line = raw.split("#", 1)[0].rstrip()
    if not line.strip():
      continue
    content, _, reason = line.partition(" -- ")
    try:
      if not line[0].isspace():
        block = _parse_block_header(listing, content.strip(), extra, reason)
      elif isinstance(block, Namespace):
        name, _, target = content.strip().partition(": ")
        if extra and not reason:
          raise ValueError("a deliberate extra needs a reason after ' -- '")
        block.entries[name] = NamespaceEntry(name, target.strip(), extra, reason.strip())
      elif isinstance(block, ClassEntry):
        _parse_member(block, content.strip(), extra, reason.strip())
      else:
        raise ValueError("an indented line outside a namespace or class")
    except (ValueError, SyntaxError) as e:
      listing.errors.append(f"line {number}: {e}: {raw.strip()}")
  return listing


def _parse_block_header(listing, content, extra, reason):
  keyword, _, rest = content.partition(" ")
  if keyword == "namespace":
    words = rest.split()
    namespace = listing.namespaces.setdefault(words[0], Namespace(words[0]))
    if not extra:
      namespace.tf_path = words[1] if len(words) > 1 and words[1] != "partial" else ""
      namespace.partial = "partial" in words
    return namespace
  if keyword == "class":
    words = rest.split()
    entry = listing.classes.setdefault(words[0], ClassEntry(words[0]))
    options = iter(words[1:])
    for word in options:
      if word == "extends":
        entry.extends = next(options)
      elif word == "keras3":
        entry.keras3 = next(options)
      elif word == "optimizer":
        entry.optimizer = True
      else:
        entry.tf_path = word
    return entry
  if keyword == "function":
    if extra and not reason:
      raise ValueError("a deliberate extra needs a reason after ' -- '")
    path, params, options = _split_call(rest)
    words = options.split()
    entry = FunctionEntry(path, parse_params(params))
    for i, word in enumerate(words):
      if word == "keras3":
        entry.keras3 = words[i + 1]
      elif i == 0:
        entry.tf_path = word
    listing.functions[path] = entry
    return None
  raise ValueError(f"unknown entry {keyword!r}")


def _parse_member(entry, content, extra, reason):
  if extra and not reason:
    raise ValueError("a deliberate extra needs a reason after ' -- '")
  if content.startswith(("__init__(", "__call__(")):
    content = "method " + content
  kind, _, rest = content.partition(" ")
  if kind in ("method", "classmethod"):
    name, params, flags = _split_call(rest)
    entry.members[name] = Member(
      kind,
      name,
      parse_params(params),
      keras3_differs="keras3-differs" in flags,
      extra=extra,
      reason=reason,
    )
  elif kind in ("property", "framework"):
    entry.members[rest] = Member(kind, rest, extra=extra, reason=reason)
  elif kind == "constant":
    name, _, value = rest.partition(" = ")
    entry.members[name] = Member(kind, name, value=ast.literal_eval(value), extra=extra)
  elif kind == "param":
    if not extra:
      raise ValueError("`param` lines belong to the deliberate extras")
    method, params, flags = _split_call(rest)
    for param in parse_params(params):
      entry.extra_params.append(ExtraParam(method, param, "planned" in flags.split(), reason))
  else:
    raise ValueError(f"unknown member kind {kind!r}")


def merged(listing, path):
  """A class entry with the entries of the classes it `extends` folded in."""
  entry = listing.classes[path]
  if not entry.extends:
    return entry
  base = merged(listing, entry.extends)
  own_methods = set(entry.members)
  return dataclasses.replace(
    entry,
    members={**base.members, **entry.members},
    extra_params=[p for p in base.extra_params if p.method not in own_methods] + entry.extra_params,
    optimizer=entry.optimizer or base.optimizer,
  )


LISTING = parse_listing(GOLDEN.read_text())


# --- Looking at the package -------------------------------------------------------


def resolve(path):
  """The object at a dotted path (modules imported as needed)."""
  parts = path.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for part in parts[i:]:
      obj = getattr(obj, part)
    return obj
  raise ImportError(path)


def _is_ours(cls):
  return cls.__module__.split(".")[0] == _OURS


def _public_member(name):
  return not name.startswith("_") or name in ("__init__", "__call__")


def check_signature(where, func, expected, extras=()):
  """Problems of `func`'s signature against `expected` plus keyword-only `extras`."""
  try:
    actual = list(inspect.signature(func).parameters.values())
  except (TypeError, ValueError) as e:
    return [f"{where}: no signature ({e})"]
  problems = []
  plain = inspect.signature(func).replace(return_annotation=inspect.Signature.empty)
  plain = plain.replace(
    parameters=[p.replace(annotation=p.empty) for p in plain.parameters.values()]
  )
  shown = f"{where}{plain}"
  for have, want in zip(actual, expected):
    if have.name != want.name or have.kind != want.kind:
      problems.append(
        f"{shown}: parameter {have.name} ({have.kind.description}) where TF 2.4 has {want.name} ({want.kind.description})"
      )
    elif not _same_default(have.default, want.default):
      problems.append(f"{shown}: {have.name} defaults to {have.default!r}, not {want.default!r}")
  if len(actual) < len(expected):
    missing = [p.name for p in expected[len(actual) :]]
    problems.append(f"{shown}: missing parameters {missing}")
  by_name = {e.param.name: e for e in extras}
  for have in actual[len(expected) :]:
    extra = by_name.get(have.name)
    if extra is None:
      problems.append(f"{shown}: undocumented parameter {have.name}")
    elif have.kind != inspect.Parameter.KEYWORD_ONLY:
      problems.append(f"{shown}: extra parameter {have.name} must be keyword-only")
    elif not _same_default(have.default, extra.param.default):
      problems.append(
        f"{shown}: {have.name} defaults to {have.default!r}, not {extra.param.default!r}"
      )
  present = {p.name for p in actual}
  for extra in extras:
    if not extra.planned and extra.param.name not in present:
      problems.append(f"{shown}: missing extra parameter {extra.param.name}")
  return problems


def _same_default(have, want):
  if want is _ANY_DEFAULT:
    return have is not inspect.Parameter.empty
  if have is inspect.Parameter.empty or want is inspect.Parameter.empty:
    return have is want
  return type(have) is type(want) and have == want


def _raw_member(cls, name):
  member = inspect.getattr_static(cls, name)
  if isinstance(member, (classmethod, staticmethod)):
    return member.__func__
  return member


def check_member(cls, entry, member, extra_params):
  where = f"{entry.path}.{member.name}"
  if member.kind == "framework":
    return []  # Checked on a wrapper of TF 2.4's own optimizer family.
  try:
    static = inspect.getattr_static(cls, member.name)
  except AttributeError:
    return [f"{where}: missing"]
  if member.kind == "property":
    return [] if isinstance(static, property) else [f"{where}: not a property"]
  if member.kind == "constant":
    value = getattr(cls, member.name)
    return [] if value == member.value else [f"{where}: {value!r}, not {member.value!r}"]
  if member.kind == "classmethod" and not isinstance(static, classmethod):
    return [f"{where}: not a classmethod"]
  if member.kind == "method" and not callable(static):
    return [f"{where}: not a method"]
  if entry.keras3 and member.keras3_differs:
    return []
  extras = [p for p in extra_params if p.method == member.name]
  return check_signature(where, _raw_member(cls, member.name), member.params, extras)


def check_class(listing, path, cls=None, framework=()):
  """Problems of the class at `path` against the listing.

  Args:
    listing: A parsed `Listing`.
    path: The class's path in the listing.
    cls: A class made from it (a family's concrete class); default: itself.
    framework: More names that belong to the framework, not to us (the inner
      optimizer's attributes, which a wrapper mirrors).

  Returns:
    A list of problems.
  """
  entry = merged(listing, path)
  public = resolve(path)
  cls = public if cls is None else cls
  problems = []
  if entry.keras3 and cls is not resolve(entry.keras3):
    problems.append(f"{path}: not Keras 3's {entry.keras3}")
  if entry.extends and not issubclass(cls, resolve(entry.extends)):
    problems.append(f"{path}: does not subclass {entry.extends}")
  for member in entry.members.values():
    problems += check_member(cls, entry, member, entry.extra_params)
  if not entry.keras3:
    problems += [
      f"{path}: undocumented extra {name}" for name in undocumented(cls, entry, framework)
    ]
  return problems


def undocumented(cls, entry, framework=()):
  """Public names tf_lossscale defines on `cls` that neither the listing nor a framework has."""
  framework = set(framework)
  for klass in cls.__mro__:
    if not _is_ours(klass):
      framework.update(dir(klass))
  own = {
    name for klass in cls.__mro__ if _is_ours(klass) for name in vars(klass) if _public_member(name)
  }
  listed = set(entry.members) | {p.method for p in entry.extra_params}
  return sorted(own - listed - framework)


def check_function(listing, path):
  entry = listing.functions[path]
  func = resolve(path)
  problems = []
  if entry.keras3 and func is not resolve(entry.keras3):
    problems.append(f"{path}: not Keras 3's {entry.keras3}")
  return problems + check_signature(path, func, entry.params)


def check_namespace(listing, path):
  namespace = listing.namespaces[path]
  module = importlib.import_module(path)
  problems = []
  names = {
    name
    for name, value in vars(module).items()
    if not name.startswith("_") and not isinstance(value, type(__future__.annotations))
  }
  if hasattr(module, "__path__"):
    names |= {m.name for m in pkgutil.iter_modules(module.__path__) if not m.name.startswith("_")}
  expected = {name for name, e in namespace.entries.items() if e.target != "omitted"}
  problems += [f"{path}.{name}: undocumented extra" for name in sorted(names - expected)]
  for name, entry in sorted(namespace.entries.items()):
    where = f"{path}.{name}"
    present = name in names
    if entry.target == "omitted":
      if present:
        problems.append(f"{where}: listed as omitted, but present")
      continue
    if not present:
      problems.append(f"{where}: missing")
      continue
    value = getattr(module, name, None) or importlib.import_module(where)
    if entry.target == "module":
      if not (isinstance(value, types.ModuleType) and value.__name__ == where):
        problems.append(f"{where}: not the module {where}")
    elif value is not resolve(entry.target):
      problems.append(f"{where}: not the same object as {entry.target}")
  exported = set(getattr(module, "__all__", ()))
  if exported != expected:
    problems.append(f"{path}.__all__: {sorted(exported ^ expected)} differ from the listing")
  return problems


def listing_problems(listing):
  """Problems of the listing itself: syntax, and paths no entry describes."""
  problems = list(listing.errors)
  described = set(listing.classes) | set(listing.functions)
  for namespace in listing.namespaces.values():
    for entry in namespace.entries.values():
      if entry.target not in ("module", "omitted") and entry.target not in described:
        problems.append(f"{namespace.path}.{entry.name}: {entry.target} is described nowhere")
  for entry in listing.classes.values():
    if entry.extends and entry.extends not in listing.classes:
      problems.append(f"{entry.path}: extends {entry.extends}, which is described nowhere")
  return problems


def wrappers():
  """A Keras `LossScaleOptimizer` (both classes) around every inner-optimizer family."""
  from tf_lossscale.keras import mixed_precision

  inners = {"keras3": keras.optimizers.SGD}
  try:
    import tf_keras
  except ImportError:
    pass
  else:
    inners["tf_keras_legacy"] = tf_keras.optimizers.legacy.SGD
    inners["tf_keras"] = tf_keras.optimizers.SGD
  made = {}
  for family, make in inners.items():
    made[("non-experimental", family)] = mixed_precision.LossScaleOptimizer(make())
    made[("experimental", family)] = mixed_precision.experimental.LossScaleOptimizer(
      make(), "dynamic"
    )
  return made


# --- Tests ------------------------------------------------------------------------


def test_listing_is_well_formed():
  assert listing_problems(LISTING) == []


@pytest.mark.parametrize("path", sorted(LISTING.namespaces))
def test_namespace_matches_tf24(path):
  assert check_namespace(LISTING, path) == []


@pytest.mark.parametrize("path", sorted(LISTING.classes))
def test_class_matches_tf24(path):
  assert check_class(LISTING, path) == []


@pytest.mark.parametrize("path", sorted(LISTING.functions))
def test_function_matches_tf24(path):
  assert check_function(LISTING, path) == []


def test_optimizer_classes_of_every_family_have_no_undocumented_extras():
  paths = {
    "non-experimental": "tf_lossscale.keras.mixed_precision.LossScaleOptimizer",
    "experimental": "tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer",
  }
  problems = []
  for (which, family), optimizer in wrappers().items():
    made = check_class(LISTING, paths[which], type(optimizer), dir(optimizer.inner_optimizer))
    problems += [f"[{family}] {p}" for p in made]
  assert problems == []


def test_framework_members_exist_on_a_tf_keras_optimizer_v2_wrapper():
  tf_keras = pytest.importorskip("tf_keras")
  from tf_lossscale.keras import mixed_precision

  wrapper = mixed_precision.LossScaleOptimizer(tf_keras.optimizers.legacy.SGD())
  entry = merged(LISTING, "tf_lossscale.keras.mixed_precision.LossScaleOptimizer")
  framework = [m.name for m in entry.members.values() if m.kind == "framework"]
  assert framework, "the listing names OptimizerV2's members"
  assert [name for name in framework if not hasattr(type(wrapper), name)] == []


# --- The checks catch what they should ---------------------------------------------


def _listing_with(old, new):
  text = GOLDEN.read_text()
  assert old in text
  return parse_listing(text.replace(old, new, 1))


def test_a_changed_default_is_caught():
  listing = _listing_with("increment_period=2000,", "increment_period=1000,")
  assert check_class(listing, "tf_lossscale.loss_scale.DynamicLossScale") == [
    "tf_lossscale.loss_scale.DynamicLossScale.__init__(self, initial_loss_scale=32768, "
    "increment_period=2000, multiplier=2.0): increment_period defaults to 2000, not 1000"
  ]


def test_an_int_default_is_not_a_float_default():
  listing = _listing_with("initial_loss_scale=32768,", "initial_loss_scale=32768.0,")
  assert len(check_class(listing, "tf_lossscale.loss_scale.DynamicLossScale")) == 1


def test_a_keyword_only_change_is_caught():
  listing = _listing_with(
    "__init__(self, opt, loss_scale)\n", "__init__(self, opt, *, loss_scale)\n"
  )
  problems = check_class(
    listing, "tf_lossscale.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer"
  )
  assert len(problems) == 1 and "keyword-only" in problems[0]


def test_an_unlisted_member_is_an_undocumented_extra():
  listing = _listing_with("  method comparable_config(self)", "  # comparable_config unlisted")
  assert check_class(listing, "tf_lossscale.keras.mixed_precision.LossScaleOptimizer") == [
    "tf_lossscale.keras.mixed_precision.LossScaleOptimizer: undocumented extra comparable_config"
  ]


def test_an_unlisted_name_and_a_missing_name_are_caught():
  listing = _listing_with("  get_layer_policy: ", "  get_policy_of_layer: ")
  problems = check_namespace(listing, "tf_lossscale.keras.mixed_precision.experimental")
  assert "tf_lossscale.keras.mixed_precision.experimental.get_layer_policy: undocumented extra" in (
    problems
  )
  assert "tf_lossscale.keras.mixed_precision.experimental.get_policy_of_layer: missing" in problems


def test_an_alias_must_be_the_same_object():
  listing = _listing_with(
    "  global_policy: tf_lossscale.keras.mixed_precision.global_policy\n  set_policy",
    "  global_policy: tf_lossscale.keras.mixed_precision.experimental.set_policy\n  set_policy",
  )
  problems = check_namespace(listing, "tf_lossscale.keras.mixed_precision.experimental")
  assert problems == [
    "tf_lossscale.keras.mixed_precision.experimental.global_policy: not the same object as "
    "tf_lossscale.keras.mixed_precision.experimental.set_policy"
  ]


def test_planned_parameters_are_checked_once_present():
  def init(self, initial_loss_scale=32768, increment_period=2000, multiplier=2.0, *, hysteresis=2):
    del self, initial_loss_scale, increment_period, multiplier, hysteresis

  entry = merged(LISTING, "tf_lossscale.loss_scale.DynamicLossScale")
  expected = entry.members["__init__"].params
  assert check_signature("init", init, expected, entry.extra_params) == [
    "init(self, initial_loss_scale=32768, increment_period=2000, multiplier=2.0, *, "
    "hysteresis=2): hysteresis defaults to 2, not 1"
  ]
  assert check_signature("init", init, expected, []) == [
    "init(self, initial_loss_scale=32768, increment_period=2000, multiplier=2.0, *, "
    "hysteresis=2): undocumented parameter hysteresis"
  ]


def test_an_extra_without_a_reason_is_refused():
  listing = _listing_with(
    "  method scale_loss(self, loss) -- Keras 3's", "  method scale_loss(self, loss) #"
  )
  assert any("needs a reason" in p for p in listing_problems(listing))
