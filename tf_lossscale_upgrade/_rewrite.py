"""Rewrites one Python source: TensorFlow's loss-scaling names become tf_lossscale's.

How a name is found: scope analysis gives every import binding (`tf`,
`mixed_precision`, `LossScaleOptimizer`, ...) and every reference to it (see
`_bindings`; libcst's ScopeProvider where that cannot tell), and a
reference's attribute chain is resolved from the binding's import
(`tf.keras.mixed_precision.LossScaleOptimizer` with `import tensorflow as tf` is
`tensorflow.keras.mixed_precision.LossScaleOptimizer`). A name is rewritten only
when every binding that can reach it resolves to a name in `_names.NAMES`.

How it is rewritten, keeping the file's import style:
- an import of a known name or of a loss-scaling module is rewritten in place
  (`from tensorflow.keras.mixed_precision import experimental as mp` becomes
  `from tf_lossscale.keras.mixed_precision import experimental as mp`) when every
  use of it is ours, so the code using it is untouched;
- otherwise each use is spelled out (`tf_lossscale.keras.mixed_precision.
  LossScaleOptimizer`) and `import tf_lossscale` is added after the file's
  TensorFlow import (beside it where TensorFlow is imported lazily or
  optionally: `_Planner.import_places`).
"""

import dataclasses
import re

import libcst as cst
from libcst import helpers, metadata

from tf_lossscale_upgrade import _bindings, _names, _prefilter

REWRITE = "rewrite"
NOT_REWRITTEN = "not rewritten"
CHECK = "check"


@dataclasses.dataclass(frozen=True)
class Finding:
  """One line of the report.

  Attributes:
    line: 1-based line in the source.
    column: 1-based column.
    kind: `'rewrite'` (done), `'not rewritten'` (recognised, left for a
      person) or `'check'` (rewritten, but something near it needs a
      person's look).
    old: The dotted name as written; for an import, the fully qualified
      name it binds (`tensorflow.keras.mixed_precision.LossScaleOptimizer`).
    new: What it became (`'rewrite'` only), or `'(import removed: unused now)'`.
    reason: Why it was not rewritten, or what to check.
  """

  line: int
  column: int
  kind: str
  old: str
  new: str = ""
  reason: str = ""

  def describe(self):
    """The report text after `path:line:column: `."""
    if self.kind == REWRITE:
      return f"{self.old} -> {self.new}"
    return f"{self.kind}: {self.old}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Result:
  """What `upgrade_source` did.

  Attributes:
    code: The rewritten code.
    findings: A tuple of `Finding`, in source order.
  """

  code: str
  findings: tuple


# Keras 3 code (TF >= 2.16) that already uses Keras 3's own LossScaleOptimizer:
# its training-loop protocol is `scale_loss`, TF 2.4's was get_scaled_loss/get_unscaled_gradients,
# and its scale `dynamic_scale`, which TF 2.4's optimizer (and tf_lossscale's)
# does not have. (Not its `step_counter`: a name users give their own counters.)
_KERAS3_STATE = ("dynamic_scale",)
_PROTOCOL_WORDS = re.compile(
  r"\.\s*(scale_loss|dynamic_scale|get_scaled_loss|get_unscaled_gradients)\b"
)
_KERAS_LSO = frozenset(
  f"{root}.keras.mixed_precision.LossScaleOptimizer"
  for root in ("tensorflow", "tensorflow.compat.v1", "tensorflow.compat.v2")
)

_OURS = "tf_lossscale"

# False: always libcst's ScopeProvider (the tests compare both ways).
_FAST_BINDINGS = True
# Either kind of import binding and module scope: `_bindings`' or ScopeProvider's.
_IMPORT_ASSIGNMENT = (metadata.ImportAssignment, _bindings.ImportAssignment)
_GLOBAL_SCOPE = (metadata.GlobalScope, _bindings.GlobalScope)


def upgrade_source(code):
  """Rewrites TF 2.x-era loss-scaling names in one Python module's text.

  Args:
    code: The module's source code.

  Returns:
    A `Result`: the new code (`code` itself when nothing changes) and the
    findings, in source order: one per rewrite, per use left for a person,
    and per rewritten use that a person should check.

  Raises:
    libcst.ParserSyntaxError: If `code` is not valid Python (text without
      `tensorflow`, or naming none of the loss-scaling words, is returned
      unparsed).
  """
  if not _prefilter.worth_parsing(code):
    return Result(code, ())
  return upgrade_parsed(code)


def upgrade_parsed(code):
  """`upgrade_source` without the pre-filter (for callers that ran it already)."""
  module = cst.parse_module(code)
  plan = _Planner(module, _protocol(code, module))
  plan.run()
  if not plan.changes():
    return Result(code, tuple(plan.findings))
  new_code = plan.wrapper.module.visit(_Applier(plan)).code
  # libcst (1.9, checked) drops the last line end of a file whose line ends are "\r".
  new_code += "\r" * (_trailing_returns(code) - _trailing_returns(new_code))
  return Result(new_code, tuple(plan.findings))


def _trailing_returns(text):
  return len(text) - len(text.rstrip("\r"))


def lines(text):
  """`text`'s lines with their ends, split at "\n" alone, as libcst numbers them and
  `patch` reads a diff (`str.splitlines` also splits at form feeds, U+2028, ...)."""
  return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def _protocol(code, module):
  """Which loss-scaling protocol `module`'s code uses (see `_ProtocolFinder`);
  a flag, a string or a comment of the name does not count. A text search
  spares most files the walk."""
  finder = _ProtocolFinder()
  if _PROTOCOL_WORDS.search(code) or "train_step" in code:
    module.visit(finder)
  return finder


class _ProtocolFinder(cst.CSTVisitor):
  """`keras3`: what shows Keras 3's API, or None: a call `<expr>.scale_loss(...)`
  (Keras 3's protocol), or `<expr>.dynamic_scale` of another object than
  `self` (Keras 3's scale); `tf24`: the code names `get_scaled_loss`
  or `get_unscaled_gradients` as an attribute (TF 2.4's protocol); `compiles`:
  it calls `<expr>.compile(...)`; `unscaled_train_step`: the first method
  `train_step` that calls `<expr>.apply_gradients(...)` and neither `scale_loss`
  nor `get_scaled_loss`, or None."""

  def __init__(self):
    super().__init__()
    self.keras3 = self.unscaled_train_step = None
    self.tf24 = self.compiles = False
    self._scopes = []  # the classes and functions the visit is in

  def visit_ClassDef(self, node):
    self._scopes.append(node)

  def leave_ClassDef(self, original_node):
    self._scopes.pop()

  def visit_FunctionDef(self, node):
    method = bool(self._scopes) and isinstance(self._scopes[-1], cst.ClassDef)
    self._scopes.append(node)
    if not method or node.name.value != "train_step" or self.unscaled_train_step:
      return
    called = _CalledMethods()
    node.body.visit(called)
    if "apply_gradients" in called.names and not called.names & _SCALING:
      self.unscaled_train_step = node

  def leave_FunctionDef(self, original_node):
    self._scopes.pop()

  def visit_Call(self, node):
    if isinstance(node.func, cst.Attribute):
      called = node.func.attr.value
      if called == "scale_loss":
        self.keras3 = self.keras3 or "`scale_loss` protocol"
      self.compiles = self.compiles or called == "compile"

  def visit_Attribute(self, node):
    name = node.attr.value
    if name in ("get_scaled_loss", "get_unscaled_gradients"):
      self.tf24 = True
    elif name in _KERAS3_STATE and not (
      isinstance(node.value, cst.Name) and node.value.value == "self"
    ):
      self.keras3 = self.keras3 or f"`{name}` attribute"


class _CalledMethods(cst.CSTVisitor):
  """`names`: the `m` of every `<expr>.m(...)` call."""

  def __init__(self):
    super().__init__()
    self.names = set()

  def visit_Call(self, node):
    if isinstance(node.func, cst.Attribute):
      self.names.add(node.func.attr.value)


_SCALING = frozenset(("scale_loss", "get_scaled_loss"))


def _dotted(node):
  return helpers.get_full_name_for_node(node)


def _dotted_expr(name):
  """`a.b.c` as a libcst expression."""
  first, *rest = name.split(".")
  expr = cst.Name(first)
  for part in rest:
    expr = cst.Attribute(value=expr, attr=cst.Name(part))
  return expr


@dataclasses.dataclass
class _Binding:
  """A name bound by an import (`tf`, `mixed_precision`, `tensorflow.compat.v1`),
  or by an assignment the planner follows (`tf1 = tf.compat.v1`)."""

  assignment: object  # `_bindings.ImportAssignment` or libcst's (Import)Assignment
  target: str  # what the name denotes, e.g. "tensorflow.keras.mixed_precision"
  alias: cst.ImportAlias | None  # None for an assignment
  statement: cst.CSTNode  # the Import, ImportFrom or Assign
  dotted: bool  # `import a.b.c` without `as`: uses spell the whole path


@dataclasses.dataclass
class _Use:
  """A reference through a binding, resolved as far as the known names go."""

  access: object  # `_bindings.Access` or libcst's `metadata.Access`
  node: cst.CSTNode  # the expression naming `name`
  name: str  # fully qualified TF name or module
  kind: str  # "name" (in NAMES), "module" (a module used as a value), "unknown"


class _Planner:
  """Decides every rewrite of one module; `_Applier` then performs them."""

  def __init__(self, module, protocol):
    self.wrapper = metadata.MetadataWrapper(module, unsafe_skip_copy=True)
    analysis = _bindings.analyse(module)
    self.parents, self._order = analysis.parents, analysis.order
    if _FAST_BINDINGS and analysis.scope is not None:
      self.scopes = [analysis.scope]
    else:
      scopes = self.wrapper.resolve(metadata.ScopeProvider).values()
      self.scopes = list({scope for scope in scopes if scope is not None})
    self._positions = None  # computed when first needed: most files report nothing
    self._tf24 = protocol.tf24
    # What shows that the file is Keras 3 code (see `_ProtocolFinder`), or None.
    self.keras3 = None if protocol.tf24 else protocol.keras3
    self.tf24_compile = protocol.tf24 and protocol.compiles  # TF 2.4's protocol and `compile`
    self.unscaled_train_step = protocol.unscaled_train_step  # a method that scales no loss
    self.findings = []
    self.expressions = {}  # node -> the dotted name it becomes
    self.aliases = {}  # ImportAlias -> new fully qualified name it imports
    self.dropped_aliases = set()  # ImportAlias nodes to delete
    self.prefix = _OURS  # how the file names tf_lossscale
    self.has_import = False  # the file imports tf_lossscale already
    self._bindings = {}  # ImportAssignment -> _Binding or None
    self._planned = set()  # Access objects whose use was decided on
    self._spelled_out = set()  # Access objects whose use became tf_lossscale.<name>
    self._spelled_through = {}  # spelled-out node -> the import statements its name may come from
    self._private_imports = []  # (binding, uses) of TF's private or gone modules
    self._kept_imports = set()  # import aliases reported as not rewritten: left as written
    self._root_imports = {}  # alias -> binding of `import a.b.gone` to become `import a`

  def changes(self):
    return bool(self.expressions or self.aliases or self.dropped_aliases)

  @property
  def needs_import(self):
    """Whether `import tf_lossscale` must be added."""
    return bool(self.expressions) and not self.has_import

  @property
  def import_places(self):
    """`{statement: "before" or "after"}`: where `import tf_lossscale` goes.

    Where every spelled-out name comes through one TensorFlow import made in
    a function, or at module level under an `if` or in a `try` that goes on
    without TensorFlow (an optional dependency), next to each such import, so
    tf_lossscale is imported when and where TensorFlow is. Else after the
    file's TensorFlow imports, unless a spelled-out name is used earlier.
    """
    local = {}
    for node, statements in self._spelled_through.items():
      place = _local_place(statements[0], self.parents) if len(statements) == 1 else None
      if place is None:
        break
      use_line = node
      while use_line is not None and not isinstance(use_line, cst.SimpleStatementLine):
        use_line = self.parents.get(use_line)
      local[place] = "before" if use_line is place or local.get(place) == "before" else "after"
    else:
      return local
    body = list(self.wrapper.module.body)
    anchor = _import_anchor(body, self.dropped_aliases)
    first_use = min(body.index(self._top_level(node)) for node in self.expressions)
    if first_use <= anchor:
      return {body[first_use]: "before"}
    if anchor < 0:
      return {body[0]: "before"}
    return {body[anchor]: "after"}

  def _top_level(self, node):
    while not isinstance(self.parents[node], cst.Module):
      node = self.parents[node]
    return node

  # Analysis ---------------------------------------------------------------

  def run(self):
    bindings = []
    for scope in self.scopes:
      for assignment in scope.assignments:
        binding = self._binding(assignment)
        if binding is not None:
          bindings.append(binding)
    self._find_prefix()
    bindings.sort(key=lambda b: self._order[b.alias])
    if self.keras3 is None and not self._tf24 and self._constructs_keras3(bindings):
      self.keras3 = _KERAS3_CONSTRUCTOR
    for binding in bindings:
      self._plan_binding(binding)
    for binding, uses in self._private_imports:
      self._plan_private_import(binding, uses)
    self._plan_root_imports()
    self._plan_star_imports()
    self.findings.sort(key=lambda f: (f.line, f.column))

  def _binding(self, assignment):
    if assignment in self._bindings:
      return self._bindings[assignment]
    binding = None
    if isinstance(assignment, _IMPORT_ASSIGNMENT):
      binding = self._import_binding(assignment)
    self._bindings[assignment] = binding
    return binding

  def _import_binding(self, assignment):
    statement = assignment.node
    if isinstance(statement, cst.Import):
      for alias in statement.names:
        full = _dotted(alias.name)
        if alias.asname is not None:
          if alias.asname.name.value == assignment.name:
            return self._relevant(_Binding(assignment, full, alias, statement, dotted=False))
        elif full == assignment.name or full.startswith(assignment.name + "."):
          # `import a.b.c` binds `a`, `a.b` and `a.b.c` for the uses spelled so.
          return self._relevant(_Binding(assignment, assignment.name, alias, statement, True))
      return None
    if statement.relative or isinstance(statement.names, cst.ImportStar):
      return None
    module = _dotted(statement.module)
    for alias in statement.names:
      bound = alias.evaluated_alias or alias.evaluated_name
      if bound == assignment.name:
        target = f"{module}.{alias.evaluated_name}"
        return self._relevant(_Binding(assignment, target, alias, statement, dotted=False))
    return None

  def _relevant(self, binding):
    target = binding.target
    if target in _names.NAMES or target in _names.MODULES:
      return binding
    parent = target.rsplit(".", 1)[0]
    if parent not in _names.CLAIMED:
      return None
    if not binding.dotted:
      # e.g. `from tensorflow.python.keras.mixed_precision import autocast_variable`
      self._report(binding.alias, NOT_REWRITTEN, target, reason=_no_equivalent(target))
    elif target == _dotted(binding.alias.name) and binding.assignment.references:
      # `import tensorflow.python.keras.mixed_precision.autocast_variable`, used as
      # such: its shorter bindings (`tensorflow.python.keras...`) are left as they are.
      self._report(binding.alias, NOT_REWRITTEN, target, reason=_no_equivalent(target))
      self._kept_imports.add(binding.alias)
    elif target == _dotted(binding.alias.name) and _names.is_gone(target):
      return binding  # unused, and its import would fail: planned as a gone module's
    return None

  def _find_prefix(self):
    """Finds how the file names tf_lossscale: its module-level `import tf_lossscale [as x]`."""
    imported = [
      assignment.name
      for scope in self.scopes
      if isinstance(scope, _GLOBAL_SCOPE)
      for assignment in scope.assignments
      if _ours_alias(assignment) is not None
    ]
    if imported:
      self.has_import = True
      self.prefix = _OURS if _OURS in imported else sorted(imported)[0]

  def _prefix_taken(self, access):
    """Whether the name the file gives tf_lossscale is bound to something else
    where `access` is, or at module level (where `import tf_lossscale` may go)."""
    if isinstance(access, metadata.Access):
      bound = [*access.scope[self.prefix], *access.scope.globals[self.prefix]]
    else:  # `_bindings`' one pass: the file binds the name by module-level imports only
      bound = [a for a in self.scopes[0].assignments if a.name == self.prefix]
    return any(_ours_alias(assignment) is None for assignment in bound)

  def _constructs_keras3(self, bindings):
    """Whether the file calls Keras 3's LossScaleOptimizer by TF 2.4's path with a
    number second: Keras 3's `initial_scale`, where TF 2.4 took `dynamic`, a bool."""
    for binding in bindings:
      if not any(
        name == binding.target or name.startswith(binding.target + ".") for name in _KERAS_LSO
      ):
        continue
      for use in self._uses(binding):
        call = self.parents.get(use.node)
        if (
          use.name in _KERAS_LSO
          and isinstance(call, cst.Call)
          and call.func is use.node
          and _is_number(_argument(call, 1, "dynamic"))
        ):
          return True
    return False

  def _uses(self, binding):
    uses = []
    for access in binding.assignment.references:
      node = access.node
      if not isinstance(node, (cst.Name, cst.Attribute)):
        continue  # a string annotation
      uses.append(self._resolve(access, node, binding.target))
    uses.sort(key=lambda use: self._order[use.node])
    return uses

  def _resolve(self, access, node, name):
    """Follows `node`'s attribute chain from `name` as far as the known names go."""
    while name not in _names.NAMES:
      parent = self.parents.get(node)
      if not (isinstance(parent, cst.Attribute) and parent.value is node):
        return _Use(access, node, name, "module" if name in _names.MODULES else "unknown")
      child = f"{name}.{parent.attr.value}"
      if child not in _names.NAMES and child not in _names.MODULES:
        return _Use(access, parent, child, "unknown")
      node, name = parent, child
    return _Use(access, node, name, "name")

  # Decisions --------------------------------------------------------------

  def _plan_binding(self, binding):
    if binding.target in _names.NAMES:
      self._plan_name_import(binding)
      return
    uses = self._uses(binding)
    ours = _names.COUNTERPARTS.get(binding.target)
    if ours is not None and not binding.dotted and self._whole_module(binding, uses, ours):
      self._rewrite_alias(binding, ours)
      self._check(uses)
      self._planned.update(use.access for use in uses)
      return
    for use in uses:
      # A name bound by two imports (`import tensorflow`, `import tensorflow.x.y`)
      # has its uses listed under both.
      if use.access in self._planned:
        continue
      self._planned.add(use.access)
      if self._plan_use(binding, use):
        self._spelled_out.add(use.access)
    if _names.is_private_or_gone(binding.target):
      self._private_imports.append((binding, uses))

  def _plan_name_import(self, binding):
    """`from tensorflow.keras.mixed_precision import LossScaleOptimizer [as X]`."""
    target = _names.NAMES[binding.target]
    if target.alive:
      self._check(self._uses(binding), alive=True)
      return
    if binding.target in _KERAS_LSO and self.keras3:
      self._report(binding.alias, NOT_REWRITTEN, binding.target, reason=_keras3_reason(self.keras3))
      return
    self._rewrite_alias(binding, target.name)
    self._check(self._uses(binding))

  def _whole_module(self, binding, uses, ours):
    """Whether the import of `binding` can simply import `ours` instead."""
    needed = _names.is_gone(binding.target)
    for use in uses:
      relative = use.name[len(binding.target) :]
      if use.kind == "name":
        target = _names.NAMES[use.name]
        if target.name != ours + relative:
          return False
        if use.name in _KERAS_LSO and self.keras3:
          return False
        needed = needed or not target.alive
      elif use.kind == "module":
        if use.name not in _names.COMPLETE or _names.COUNTERPARTS[use.name] != ours + relative:
          return False
        needed = True
      else:
        return False
    return needed

  def _plan_use(self, binding, use):
    """Spells out one use as `tf_lossscale.<name>`; returns whether it did."""
    if use.kind == "unknown":
      module = use.name.rsplit(".", 1)[0]
      if module in _names.CLAIMED:
        reason = self._known_through_another_binding(binding, use) or _no_equivalent(use.name)
        self._report(use.node, NOT_REWRITTEN, _dotted(use.node), reason=reason)
      return False
    if use.kind == "module":
      if use.name in _names.COMPLETE:
        return self._spell_out(binding, use, _names.COUNTERPARTS[use.name])
      if self._follow_module_alias(use):
        return False
      if _names.COUNTERPARTS.get(use.name) or use.name in _names.CLAIMED:
        self._report(
          use.node,
          NOT_REWRITTEN,
          _dotted(use.node),
          reason="a loss-scaling module used as a value: the names later taken from it "
          "cannot be followed; migrate them by hand",
        )
      return False
    target = _names.NAMES[use.name]
    if target.alive:
      self._check([use], alive=True)
      return False
    if use.name in _KERAS_LSO and self.keras3:
      self._report(use.node, NOT_REWRITTEN, _dotted(use.node), reason=_keras3_reason(self.keras3))
      return False
    done = self._spell_out(binding, use, target.name)
    if done:
      self._check([use])
    return done

  def _follow_module_alias(self, use):
    """Plans the uses of a module-level name bound once to the module `use`
    names (`tf1 = tf.compat.v1`), as an import's; returns whether it did (not
    for a name this file never reads: other modules may)."""
    statement = self.parents.get(use.node)
    if not (
      isinstance(statement, cst.Assign)
      and statement.value is use.node
      and len(statement.targets) == 1
      and isinstance(statement.targets[0].target, cst.Name)
    ):
      return False
    name = statement.targets[0].target
    for scope in self.scopes:
      if isinstance(scope, metadata.GlobalScope) and name.value in scope:
        assignments = list(scope.assignments[name.value])
        if len(assignments) == 1 and assignments[0].node is name and assignments[0].references:
          break
    else:
      return False
    binding = _Binding(assignments[0], use.name, None, statement, dotted=False)
    for alias_use in self._uses(binding):
      if alias_use.access not in self._planned:
        self._planned.add(alias_use.access)
        if self._plan_use(binding, alias_use):
          self._spelled_out.add(alias_use.access)
    return True

  def _spell_out(self, binding, use, new_name):
    old = _dotted(use.node)
    reason = self._unsafe_use(binding, use, new_name)
    if reason:
      self._report(use.node, NOT_REWRITTEN, old, reason=reason)
      return False
    self.expressions[use.node] = self.prefix + new_name[len(_OURS) :]
    self._spelled_through[use.node] = list(
      {
        id(r.node): r.node for r in use.access.referents if isinstance(r, _IMPORT_ASSIGNMENT)
      }.values()
    )
    self._report(use.node, REWRITE, old, new=new_name)
    return True

  def _known_through_another_binding(self, binding, use):
    """Why a use unknown through `binding` may not be what it seems: another
    binding of its name (`try:` / `except ImportError:` imports) reaches a
    known name with it. None otherwise."""
    relative = use.name[len(binding.target) :]
    for other in use.access.referents:
      other_binding = None if other is binding.assignment else self._binding(other)
      if other_binding is not None and other_binding.target + relative in _names.NAMES:
        line = self._position(other.node)[0]
        return f"`{other.name}` is also bound on line {line}: cannot tell which one this is"
    return None

  def _unsafe_use(self, binding, use, new_name):
    """Why spelling out `use` would be wrong, or None."""
    if self._prefix_taken(use.access):
      return f"the name {self.prefix} is bound to something else here or at module level"
    relative = use.name[len(binding.target) :]
    for other in use.access.referents:
      if other is binding.assignment:
        continue
      other_binding = self._binding(other)
      other_target = None
      if other_binding is not None:
        other_name = other_binding.target + relative
        known = _names.NAMES.get(other_name)
        if known is not None:
          other_target = known.name
        elif other_name in _names.COUNTERPARTS:
          other_target = _names.COUNTERPARTS[other_name]
      if other_target is None or not _names.same_object(other_target, new_name):
        line = self._position(other.node)[0]
        return (
          f"`{other.name}` is also bound on line {line} to something else: "
          "cannot tell which one this is"
        )
    parent = self.parents.get(use.node)
    if _is_store_target(use.node, parent):
      return "assigned to or deleted: patching TensorFlow's module cannot be migrated"
    return None

  def _check(self, uses, alive=False):
    """Reports the rewritten `uses` (`alive`: left alone, today's TensorFlow
    has them) that still need a person's look."""
    for use in uses:
      overrides = None if alive else self._private_overrides(use)
      reasons = (
        overrides,
        self._compile_ignores_loss_scale(use),
        self._type_test(use),
        self._policy_none(use),
      )
      for reason in reasons:
        if reason:
          self._report(use.node, CHECK, _dotted(use.node), reason=reason)

  def _private_overrides(self, use):
    """Why a subclass of TF's class that overrides TF's private methods, or uses
    through `self` or `super()` private attributes it does not set itself, needs a look."""
    arg = self.parents.get(use.node)
    class_def = self.parents.get(arg)
    if not (isinstance(arg, cst.Arg) and isinstance(class_def, cst.ClassDef)):
      return None
    if arg not in class_def.bases:
      return None
    overrides = [
      statement.name.value
      for statement in class_def.body.body
      if isinstance(statement, cst.FunctionDef) and _is_private(statement.name.value)
    ]
    private = _PrivateNames()
    class_def.body.visit(private)
    target = _names.NAMES.get(use.name)
    kept = _names.KEPT_PRIVATE.get(target.name.rsplit(".", 1)[-1], ()) if target else ()
    used = [
      name
      for name in dict.fromkeys(private.used)
      if name not in private.own and name not in overrides and name not in kept
    ]
    if not overrides and not used:
      return None
    done = [f"overrides {', '.join(overrides)}"] if overrides else []
    done += [f"uses {', '.join(used)}"] if used else []
    what = "attributes" if used else "methods"
    return (
      f"class {class_def.name.value} {' and '.join(done)}: TensorFlow's private {what}, "
      "which tf_lossscale's class does not have; port them by hand"
    )

  def _compile_ignores_loss_scale(self, use):
    """Why a use that sets a policy needs a look for what Keras 3's `compile` does with it.

    Any use of the experimental `set_policy` but a call given a policy that
    has no loss scale (`_without_loss_scale`), and a call of the experimental
    `Policy` given a loss scale: TF 2.4's `compile` used the scale, Keras 3's
    ignores it. And `set_global_policy` that may set `'mixed_float16'` in a
    file that uses TF 2.4's protocol with `compile`, or has a `train_step`
    that never scales its loss: Keras 3's `compile` wraps the optimizer in
    its own LossScaleOptimizer.
    """
    target = _names.NAMES.get(use.name)
    if target is None:
      return None
    call = self.parents.get(use.node)
    called = isinstance(call, cst.Call) and call.func is use.node
    if target.name == _SET_POLICY:
      policy = _argument(call, 0, "policy") if called else None
      return None if _without_loss_scale(policy) else _COMPILE_REASON
    if target.name == _EXPERIMENTAL_POLICY and called and _given_loss_scale(call):
      return _COMPILE_REASON
    if target.name == _SET_GLOBAL_POLICY and (self.tf24_compile or self.unscaled_train_step):
      policy = _argument(call, 0, "policy") if called else None
      if _not_mixed_float16(policy):
        return None
      if self.tf24_compile:
        return _COMPILE_WRAPS_REASON
      line, _ = self._position(self.unscaled_train_step)
      return _UNSCALED_TRAIN_STEP_REASON.format(line=line)
    return None

  def _policy_none(self, use):
    """Why `set_global_policy(None)` needs a look: Keras 3's refuses None."""
    target = _names.NAMES.get(use.name)
    call = self.parents.get(use.node)
    if target is None or target.name != _SET_GLOBAL_POLICY:
      return None
    if not (isinstance(call, cst.Call) and call.func is use.node):
      return None
    policy = _argument(call, 0, "policy")
    return _POLICY_NONE_REASON if _is_none(policy) else None

  def _type_test(self, use):
    """Why a type test of the Keras `LossScaleOptimizer` needs a look:
    `isinstance(x, A)` or `issubclass` (`A` in a tuple or a `|` union too),
    `type(x) is A` (or `==`, `is not`, `!=`, `in`, and `x.__class__`) and
    `case A(...)`, and `B = A` (or `B = (A, C)`) where the file type-tests a `B`."""
    target = _names.NAMES.get(use.name)
    if target is None or target.name not in _OUR_KERAS_LSO:
      return None
    if self._in_type_test(use.node):
      return _TYPE_TEST_REASON
    classes = self._classes(use.node)
    assign = self.parents.get(classes)
    if isinstance(assign, cst.Assign) and assign.value is classes:
      aliases = [target.target for target in assign.targets]
    elif isinstance(assign, cst.AnnAssign) and assign.value is classes:
      aliases = [assign.target]
    else:
      return None
    names = {alias.value for alias in aliases if isinstance(alias, cst.Name)}
    tested = any(
      isinstance(node, cst.Name)
      and node.value in names
      and node not in aliases
      and self._in_type_test(node)
      for node in self.parents
    )
    return _TYPE_TEST_REASON if tested else None

  def _classes(self, node):
    """The expression of classes that the class `node` is part of: `(A, B)`,
    `[A, B]`, `{A, B}` or `A | B` around it, else `node`."""
    while True:
      parent = self.parents.get(node)
      container = self.parents.get(parent)
      if isinstance(parent, cst.Element) and isinstance(container, (cst.Tuple, cst.List, cst.Set)):
        node = container
      elif isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.BitOr):
        node = parent
      else:
        return node

  def _in_type_test(self, node):
    """Whether the class expression `node` is what a type test tests against."""
    node = self._classes(node)
    parent = self.parents.get(node)
    if isinstance(parent, cst.MatchClass):
      return parent.cls is node
    if isinstance(parent, (cst.Comparison, cst.ComparisonTarget)):
      return _compares_a_type(parent, self.parents)
    call = self.parents.get(parent)
    return (
      isinstance(parent, cst.Arg)
      and isinstance(call, cst.Call)
      and isinstance(call.func, cst.Name)
      and call.func.value in ("isinstance", "issubclass")
      and len(call.args) == 2
      and call.args[1] is parent
    )

  def _rewrite_alias(self, binding, new_name):
    self.aliases[binding.alias] = new_name
    old = binding.target
    self._report(binding.alias, REWRITE, old, new=new_name)

  def _plan_private_import(self, binding, uses):
    """Deletes an import of TF's private (or gone) module once nothing needs it."""
    if binding.alias in self.aliases or binding.alias in self.dropped_aliases:
      return
    if binding.alias in self._kept_imports:
      return
    left = [use for use in uses if use.access not in self._spelled_out]
    # An import nothing used is only removed when it would fail (a module gone from TF).
    worth = len(left) < len(uses) or _names.is_gone(binding.target)
    if worth and not left and (not binding.dotted or self._only_user(binding)):
      self.dropped_aliases.add(binding.alias)
      self._report(binding.alias, REWRITE, binding.target, new="(import removed: unused now)")
    elif not left and binding.dotted and _names.is_gone(binding.target):
      # `import a.b.gone` whose `a` other uses read: `import a` (the rest are attributes),
      # decided once every alias is (see `_plan_root_imports`).
      self._root_imports.setdefault(binding.alias, binding)
    elif _names.is_gone(binding.target):
      self._report(
        binding.alias,
        NOT_REWRITTEN,
        binding.target,
        reason="today's TensorFlow has no such module, and the uses reported here keep it",
      )

  def _plan_root_imports(self):
    """`import a.b.gone` becomes `import a`, or goes where another alias of its
    statement binds `a` (`import a.gone.x, a.gone.y` is `import a`, not `import a, a`)."""
    for alias, binding in self._root_imports.items():
      root = binding.target.split(".")[0]
      for other in self.parents[alias].names:
        if other is alias or other.asname is not None or other in self.dropped_aliases:
          continue
        name = self.aliases.get(other) or _dotted(other.name)
        if (name + ".").startswith(root + "."):
          self.dropped_aliases.add(alias)
          self._report(alias, REWRITE, binding.target, new="(import removed: unused now)")
          break
      else:
        self._rewrite_alias(binding, root)

  def _only_user(self, binding):
    """Whether `import a.b.c` (of `binding`) can go: nothing else needs `a`, `a.b`."""
    full = _dotted(binding.alias.name)
    # `import a.b.c` also binds `a` and `a.b`, which another import may bind too.
    for assignment in binding.assignment.scope.assignments:
      if not (
        isinstance(assignment, _IMPORT_ASSIGNMENT)
        and assignment.node is binding.statement
        and (full + ".").startswith(assignment.name + ".")
      ):
        continue
      for access in assignment.references:
        if access in self._spelled_out:
          continue
        if not any(
          isinstance(other, _IMPORT_ASSIGNMENT) and other.node is not binding.statement
          for other in access.referents
        ):
          return False
    return True

  def _plan_star_imports(self):
    for node in self.parents:
      if not (
        isinstance(node, cst.ImportFrom)
        and isinstance(node.names, cst.ImportStar)
        and not node.relative
      ):
        continue
      module = _dotted(node.module)
      if module in _names.COMPLETE:
        self.aliases[node] = _names.COUNTERPARTS[module]
        self._report(node, REWRITE, module, new=_names.COUNTERPARTS[module])
      elif module in _names.MODULES and (module in _names.COUNTERPARTS or module in _names.CLAIMED):
        self._report(
          node,
          NOT_REWRITTEN,
          module,
          reason="a star import of a module tf_lossscale mirrors only in part; "
          "import the names you use",
        )

  # Helpers ---------------------------------------------------------------

  def _position(self, node):
    if self._positions is None:
      self._positions = self.wrapper.resolve(metadata.PositionProvider)
    start = self._positions[node].start
    return start.line, start.column + 1

  def _report(self, node, kind, old, new="", reason=""):
    line, column = self._position(node)
    self.findings.append(Finding(line, column, kind, old, new, reason))


_KERAS3_CONSTRUCTOR = "constructor (a number, its `initial_scale`, as second argument)"


def _keras3_reason(sign):
  return (
    f"this file uses Keras 3's {sign}, so this is Keras 3's own LossScaleOptimizer, "
    "which today's TensorFlow has"
  )


_SET_POLICY = "tf_lossscale.keras.mixed_precision.experimental.set_policy"
_EXPERIMENTAL_POLICY = "tf_lossscale.keras.mixed_precision.experimental.Policy"
_SET_GLOBAL_POLICY = "tf_lossscale.keras.mixed_precision.set_global_policy"
_COMPILE_WRAPS_REASON = (
  "under 'mixed_float16' Keras 3's `Model.compile` wraps a plain optimizer in Keras 3's own "
  "LossScaleOptimizer (no `get_scaled_loss`/`get_unscaled_gradients`, Keras 3's checkpoint "
  "layout), where TF 2.4's wrapped it in tf.keras.mixed_precision.LossScaleOptimizer, and this "
  "file uses TF 2.4's protocol: where it expects TF 2.4's optimizer from `compile` (an "
  "`isinstance(self.optimizer, LossScaleOptimizer)` in a `train_step`), pass "
  "`LossScaleOptimizer(optimizer)` from tf_lossscale.keras.mixed_precision to `compile`"
)
_POLICY_NONE_REASON = (
  "Keras 3's `set_global_policy` raises a ValueError for None, which TF 2.4's took to reset "
  "the global policy to its default, a policy named `tf.keras.backend.floatx()`: pass that"
)
# TF 2.4's `compile` wrapped in this class under 'mixed_float16' (in the experimental
# one only for an experimental policy's fixed loss scale: `set_policy`'s check).
_OUR_KERAS_LSO = frozenset(("tf_lossscale.keras.mixed_precision.LossScaleOptimizer",))
_TYPE_TEST_REASON = (
  "under 'mixed_float16' Keras 3's `Model.compile` wraps a plain optimizer in Keras 3's own "
  "LossScaleOptimizer, not in this class (TF 2.4's wrapped it in this one): for an optimizer "
  "from such a `compile` this test is now False, and a loss it guards goes unscaled while "
  "Keras 3's wrapper still divides the gradients by its scale; pass "
  "`LossScaleOptimizer(optimizer)` from tf_lossscale.keras.mixed_precision to `compile`"
)
_UNSCALED_TRAIN_STEP_REASON = (
  "under 'mixed_float16' Keras 3's `Model.compile` wraps a plain optimizer in Keras 3's own "
  "LossScaleOptimizer, whose `apply_gradients` divides the gradients by its scale, and the "
  "`train_step` of line {line} applies gradients of a loss it never scales (TF 2.4's wrapper "
  "applied them as given): its steps would shrink by the scale (32768 at first). Unless the "
  "optimizer its model is compiled with is tf_lossscale's `LossScaleOptimizer(optimizer)` "
  "(which applies such gradients as TF 2.4's did), pass one to `compile`, or scale the loss "
  "with `self.optimizer.scale_loss(loss)`"
)
_COMPILE_REASON = (
  "Keras 3's `Model.compile` does not wrap the optimizer with the policy's loss scale "
  "(under 'mixed_float16' it adds Keras 3's own LossScaleOptimizer instead): pass "
  "`wrap_optimizer_for_policy(optimizer, model)` from "
  "tf_lossscale.keras.mixed_precision.experimental to `compile`"
)


class _PrivateNames(cst.CSTVisitor):
  """In a class body: `own`, the private names it assigns, to `self` or not;
  `used`, the private attributes of `self` or `super()` it reads (dunder and
  name-mangled `__x` names aside)."""

  def __init__(self):
    super().__init__()
    self.own, self.used = set(), []

  def visit_AssignTarget(self, node):
    self._assigned(node.target)

  def visit_AnnAssign(self, node):
    self._assigned(node.target)

  def _assigned(self, target):
    if isinstance(target, (cst.Tuple, cst.List)):
      for element in target.elements:
        self._assigned(element.value)
    elif isinstance(target, cst.Name) and _is_private(target.value):
      self.own.add(target.value)
    elif isinstance(target, cst.Attribute) and _is_self(target.value):
      self.own.add(target.attr.value)

  def visit_Attribute(self, node):
    if _is_private(node.attr.value) and _is_self(node.value):
      self.used.append(node.attr.value)


def _is_private(name):
  return name.startswith("_") and not name.startswith("__")


def _is_self(node):
  """Whether `node` is `self` or `super()`."""
  if isinstance(node, cst.Call):
    return isinstance(node.func, cst.Name) and node.func.value == "super" and not node.args
  return isinstance(node, cst.Name) and node.value == "self"


def _argument(call, position, keyword):
  """The value of `call`'s argument at `position` or named `keyword`, or None."""
  positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
  if len(positional) > position:
    return positional[position].value
  named = [
    arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == keyword
  ]
  return named[0] if named else None


def _is_number(node):
  """Whether `node` is a number as written: `1024`, `2.0**15`, `-1`."""
  if isinstance(node, cst.UnaryOperation):
    return _is_number(node.expression)
  if isinstance(node, cst.BinaryOperation):
    return _is_number(node.left) and _is_number(node.right)
  return isinstance(node, (cst.Integer, cst.Float))


def _given_loss_scale(policy_call):
  """Whether an experimental `Policy(...)` call passes a loss scale, or may:
  arguments unpacked (`*args`, `**kwargs`) may hold one."""
  return _argument(policy_call, 1, "loss_scale") is not None or any(
    arg.star for arg in policy_call.args
  )


def _without_loss_scale(policy):
  """Whether a `set_policy` argument is a policy without a loss scale, as
  written: None, a name other than 'mixed_float16', or a `Policy(name)` call
  of such a name and no loss scale."""
  if isinstance(policy, cst.Name):
    return _is_none(policy)
  if isinstance(policy, cst.Call):
    func = policy.func
    called = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
    if called != "Policy" or _given_loss_scale(policy):
      return False
    policy = _argument(policy, 0, "name")
  return isinstance(policy, cst.SimpleString) and policy.evaluated_value != "mixed_float16"


def _is_none(node):
  return isinstance(node, cst.Name) and node.value == "None"


def _not_mixed_float16(policy):
  """Whether a `set_global_policy` argument is, as written, a policy other than
  'mixed_float16': None, another name, or a `Policy(name)` of another name."""
  if isinstance(policy, cst.Call):
    policy = _argument(policy, 0, "name")
  if isinstance(policy, cst.Name):
    return _is_none(policy)
  return isinstance(policy, cst.SimpleString) and policy.evaluated_value != "mixed_float16"


def _no_equivalent(name):
  return f"tf_lossscale has no equivalent of {name}; port this use by hand"


def _ours_alias(assignment):
  """The alias of `import tf_lossscale [as x]` behind `assignment`, or None."""
  if not (isinstance(assignment, _IMPORT_ASSIGNMENT) and isinstance(assignment.node, cst.Import)):
    return None
  for alias in assignment.node.names:
    full = _dotted(alias.name)
    bound = alias.evaluated_alias
    if bound == assignment.name and full == _OURS:
      return alias
    if bound is None and assignment.name == _OURS and full.split(".")[0] == _OURS:
      return alias
  return None


def _compares_a_type(node, parents):
  """Whether `node` (a comparison or one of its targets) is `type(x) is A`:
  identity, equality or membership (`in (A, B)`) of `type(x)` or `x.__class__`
  and the classes."""
  comparison = node if isinstance(node, cst.Comparison) else parents.get(node)
  if not isinstance(comparison, cst.Comparison):
    return False
  operands = [comparison.left, *(target.comparator for target in comparison.comparisons)]
  operators = (cst.Is, cst.IsNot, cst.Equal, cst.NotEqual, cst.In, cst.NotIn)
  return all(isinstance(t.operator, operators) for t in comparison.comparisons) and any(
    (isinstance(o, cst.Call) and isinstance(o.func, cst.Name) and o.func.value == "type")
    or (isinstance(o, cst.Attribute) and o.attr.value == "__class__")
    for o in operands
  )


def _is_store_target(node, parent):
  """Whether `node` is assigned to or deleted (`tf.x.Y = ...`, `del tf.x.Y`)."""
  if isinstance(parent, cst.AssignTarget) and parent.target is node:
    return True
  if isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node:
    return True
  if isinstance(parent, cst.Del) and parent.target is node:
    return True
  return False


class _Applier(cst.CSTTransformer):
  """Performs a `_Planner`'s decisions on the module it analysed."""

  def __init__(self, plan):
    super().__init__()
    self.plan = plan
    self._removed = []  # statement lines left empty: deleted by their block
    self._import_places = plan.import_places if plan.needs_import else {}
    # Only the way down to a change is visited: the rest of the tree stays as it is.
    self._on_the_way = set()
    for node in [*plan.expressions, *plan.aliases, *plan.dropped_aliases, *self._import_places]:
      while node is not None and node not in self._on_the_way:
        self._on_the_way.add(node)
        node = plan.parents.get(node)

  def on_visit(self, node):
    return node in self._on_the_way and super().on_visit(node)

  def leave_Name(self, original_node, updated_node):
    return self._replace(original_node, updated_node)

  def leave_Attribute(self, original_node, updated_node):
    return self._replace(original_node, updated_node)

  def _replace(self, original_node, updated_node):
    new = self.plan.expressions.get(original_node)
    if new is None:
      return updated_node
    return _respelled(updated_node, new)

  def leave_Import(self, original_node, updated_node):
    names = []
    for original, updated in zip(original_node.names, updated_node.names):
      new = self.plan.aliases.get(original)
      if original not in self.plan.dropped_aliases:
        names.append(updated if new is None else updated.with_changes(name=_dotted_expr(new)))
    if not names:  # the statement line drops the whole statement
      return updated_node
    return updated_node.with_changes(names=_with_commas(names))

  def _statements(self, original_node, updated_node):
    """The statements of a line or a suite rewritten, each with whether it is
    an import split off the one before it (dropped imports left out)."""
    for original, updated in zip(original_node.body, updated_node.body, strict=True):
      if isinstance(original, cst.ImportFrom):
        first, *others = self._import_from(original, updated)
        if first is not None:
          yield first, False
        yield from ((statement, True) for statement in others)
      elif not (
        isinstance(original, cst.Import)
        and all(alias in self.plan.dropped_aliases for alias in original.names)
      ):
        yield updated, False

  def leave_SimpleStatementLine(self, original_node, updated_node):
    # An import split in several gets a line for each new one, straight after
    # it: what follows it on the line (`from m import a as x, b; x(...)`)
    # goes on a line of its own after them, still after every name it binds.
    lines = [([], False)]  # (statements, whether they are a new import)
    for statement, new in self._statements(original_node, updated_node):
      if new or lines[-1][1]:
        lines.append(([], new))
      lines[-1][0].append(statement)
    lines = [line for line in lines if line[0]]
    if not lines:
      self._removed.append(updated_node)
      return updated_node
    # The line's comment stays with the statements that were written there last.
    commented = max(i for i, (_, new) in enumerate(lines) if not new)
    out = []
    for index, (body, _) in enumerate(lines):
      line = cst.SimpleStatementLine(body=_with_semicolons(body))
      if index == 0:
        line = line.with_changes(leading_lines=updated_node.leading_lines)
      if index == commented:
        line = line.with_changes(trailing_whitespace=updated_node.trailing_whitespace)
      out.append(line)
    return cst.FlattenSentinel(out) if len(out) > 1 else out[0]

  def leave_SimpleStatementSuite(self, original_node, updated_node):
    # A suite on its header's line (`try: from m import a, b`) keeps the
    # imports an import is split into on that line, joined by semicolons.
    body = [statement for statement, _ in self._statements(original_node, updated_node)]
    return updated_node.with_changes(body=_with_semicolons(body or [cst.Pass()]))

  def _import_from(self, original, updated):
    """`updated` rewritten: one statement or more (or a None first: deleted)."""
    if isinstance(original.names, cst.ImportStar):
      new = self.plan.aliases.get(original)
      return [updated if new is None else updated.with_changes(module=_dotted_expr(new))]
    closing = updated.names[-1].comma if updated.lpar else None
    kept, groups = [], {}
    for original_alias, alias in zip(original.names, updated.names):
      if original_alias in self.plan.dropped_aliases:
        continue
      new = self.plan.aliases.get(original_alias)
      if new is None:
        kept.append(alias)
        continue
      module, leaf = new.rsplit(".", 1)
      bound = original_alias.evaluated_alias or original_alias.evaluated_name
      alias = alias.with_changes(name=cst.Name(leaf))
      if alias.asname is None and leaf != bound:
        alias = alias.with_changes(asname=cst.AsName(name=cst.Name(bound)))
      groups.setdefault(module, []).append(alias)
    statements = []
    if kept:
      statements.append(updated.with_changes(names=_with_commas(kept, closing)))
    for module, aliases in groups.items():
      if not statements:  # the statement itself, keeping its layout
        statements.append(
          updated.with_changes(module=_dotted_expr(module), names=_with_commas(aliases, closing))
        )
      elif any(_comment_after(alias) for alias in aliases):  # a new one in its layout
        statements.append(
          updated.with_changes(
            module=_dotted_expr(module),
            names=_with_commas(aliases, closing),
            lpar=updated.lpar.with_changes(
              whitespace_after=_without_comment(updated.lpar.whitespace_after)
            ),
            rpar=updated.rpar.with_changes(
              whitespace_before=_without_comment(updated.rpar.whitespace_before)
            ),
          )
        )
      else:  # a new statement on one line
        aliases = [alias.with_changes(comma=cst.MaybeSentinel.DEFAULT) for alias in aliases]
        statements.append(cst.ImportFrom(module=_dotted_expr(module), names=_with_commas(aliases)))
    return statements or [None]

  def leave_IndentedBlock(self, original_node, updated_node):
    body, carried = self._drop_removed(updated_node.body)
    if not body:
      body = [cst.SimpleStatementLine(body=[cst.Pass()])]
    return updated_node.with_changes(body=body, footer=[*carried, *updated_node.footer])

  def leave_Module(self, original_node, updated_node):
    body, carried = self._drop_removed(updated_node.body)
    return updated_node.with_changes(body=body, footer=[*carried, *updated_node.footer])

  def on_leave(self, original_node, updated_node):
    result = super().on_leave(original_node, updated_node)
    where = self._import_places.get(original_node)
    if where is None:
      return result
    nodes = list(result.nodes) if isinstance(result, cst.FlattenSentinel) else [result]
    line = cst.SimpleStatementLine(body=[cst.Import(names=[cst.ImportAlias(name=cst.Name(_OURS))])])
    if where == "after":
      return cst.FlattenSentinel([*nodes, line])
    # Before the statement, under its comments (a file's header, a notebook's cell mark).
    first = nodes[0]
    line = line.with_changes(leading_lines=first.leading_lines)
    return cst.FlattenSentinel([line, first.with_changes(leading_lines=[]), *nodes[1:]])

  def _drop_removed(self, body):
    """Removes emptied statement lines; their comment lines go to the next statement.

    Returns:
      The new body and the comment lines left over at its end.
    """
    new, carried = [], []
    for statement in body:
      if any(statement is removed for removed in self._removed):
        carried += [line for line in statement.leading_lines if line.comment is not None]
        continue
      if carried:
        statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
        carried = []
      new.append(statement)
    return new, carried


def _respelled(old, new):
  """The dotted name `old` spelling `new`: the parts both end with keep their
  dots, and the comments and line breaks around them."""
  *module, leaf = new.split(".")
  if module and isinstance(old, cst.Attribute) and old.attr.value == leaf:
    return old.with_changes(value=_respelled(old.value, ".".join(module)))
  return _dotted_expr(new).with_changes(lpar=old.lpar, rpar=old.rpar)


def _with_commas(items, closing=None):
  """`items` (import aliases) separated by commas.

  Args:
    items: The aliases.
    closing: In a parenthesized import, the comma (or MaybeSentinel) that
      followed the original last alias, for the new last one; None without
      parentheses (no trailing comma then).
  """
  out = []
  for index, item in enumerate(items):
    if index < len(items) - 1:
      if isinstance(item.comma, cst.MaybeSentinel):
        item = item.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
      out.append(item)
    elif closing is None:
      out.append(item.with_changes(comma=cst.MaybeSentinel.DEFAULT))
    else:
      out.append(_last_in_parentheses(item, closing))
  return out


def _comment_after(alias):
  """Whether a comment follows `alias`'s comma (in a parenthesized import)."""
  comma = alias.comma
  return (
    isinstance(comma, cst.Comma)
    and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace)
    and comma.whitespace_after.first_line.comment is not None
  )


def _without_comment(whitespace):
  """`whitespace` inside an import's parentheses without its comment (which stays
  with the import the comment was in)."""
  if not isinstance(whitespace, cst.ParenthesizedWhitespace):
    return whitespace
  return whitespace.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])


def _last_in_parentheses(item, closing):
  """`item` as the last alias before `)`, keeping a comment after its comma."""
  own = item.comma
  if not _comment_after(item):
    return item.with_changes(comma=closing)
  last_line = cst.SimpleWhitespace("")  # `)` at the start of its line
  if isinstance(closing, cst.Comma) and isinstance(
    closing.whitespace_after, cst.ParenthesizedWhitespace
  ):
    last_line = closing.whitespace_after.last_line
  whitespace = own.whitespace_after.with_changes(last_line=last_line)
  return item.with_changes(comma=own.with_changes(whitespace_after=whitespace))


def _with_semicolons(statements):
  out = []
  for index, statement in enumerate(statements):
    last = index == len(statements) - 1
    if last:
      out.append(statement.with_changes(semicolon=cst.MaybeSentinel.DEFAULT))
    elif isinstance(statement.semicolon, cst.MaybeSentinel):
      out.append(
        statement.with_changes(semicolon=cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" ")))
      )
    else:
      out.append(statement)
  return out


def _imported_modules(statement):
  """The modules a module-level statement imports (looking into try/if blocks)."""
  if isinstance(statement, cst.SimpleStatementLine):
    for small in statement.body:
      if isinstance(small, cst.Import):
        yield from (_dotted(alias.name) for alias in small.names)
      elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        yield _dotted(small.module)
  elif isinstance(statement, (cst.Try, cst.If)):
    blocks = [statement.body]
    if isinstance(statement, cst.Try):
      blocks += [handler.body for handler in statement.handlers]
    elif statement.orelse is not None:
      blocks.append(statement.orelse.body)
    for block in blocks:
      for inner in block.body:
        yield from _imported_modules(inner)


def _local_place(statement, parents):
  """The statement line of the import `statement` when `import tf_lossscale`
  goes next to it: in a function, or at module level under an `if` or in a
  `try` body; None where it goes at module level (also for a `try` whose
  handlers import another TensorFlow)."""
  line = parents.get(statement)
  block = parents.get(line)
  if not isinstance(block, cst.IndentedBlock):
    return None  # At module level, or `def f(): import ...` on one line.
  owner = parents.get(block)
  if isinstance(owner, cst.Try) and owner.body is block:
    handled = [m for h in owner.handlers for x in h.body.body for m in _imported_modules(x)]
    if any(m.split(".")[0] == "tensorflow" for m in handled):
      return None
  return line if isinstance(owner, (cst.FunctionDef, cst.Try, cst.If, cst.Else)) else None


def _import_anchor(body, dropped):
  """The index of the statement `import tf_lossscale` goes after (-1: the top).

  Statements made only of the imports in `dropped` (aliases) do not count.
  """
  after = None
  for index, statement in enumerate(body):
    if isinstance(statement, cst.SimpleStatementLine) and all(
      isinstance(small, cst.Import) and all(alias in dropped for alias in small.names)
      for small in statement.body
    ):
      continue
    if any(m.split(".")[0] in ("tensorflow", _OURS) for m in _imported_modules(statement)):
      after = index
  if after is None:
    # After the leading docstring, `__future__` and other imports.
    after = -1
    for index, statement in enumerate(body):
      if list(_imported_modules(statement)) or (index == 0 and _is_docstring(statement)):
        after = index
      else:
        break
  return after


def _is_docstring(statement):
  return (
    isinstance(statement, cst.SimpleStatementLine)
    and isinstance(statement.body[0], cst.Expr)
    and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
  )
