"""Import bindings and their references, in one pass over the tree.

libcst's `ScopeProvider` models every Python scope and binding; it is about
two thirds of the tool's time on a file that needs analysing. The tool only
asks about names bound by imports, and in the code nearly all projects write
(imports at module level, their names never rebound, only read) the answer
needs no scope model: every read of such a name after its imports refers to
them. `analyse` recognises that case and answers it in the pass that records
the tree's structure; in any other case (also a TensorFlow name read as the
value of an assignment that may bind a module, `tf1 = tf.compat.v1`, which the
planner follows) it answers None and the caller uses `ScopeProvider`. The objects it returns answer the questions the planner asks
exactly as `ScopeProvider`'s would (tests/test_upgrade.py compares them).
"""

import dataclasses
import re

import libcst as cst

from tf_lossscale_upgrade import _names

# Where a read of an import-bound name may be: `tf.x` (the value of an
# attribute), `f(...)`, an argument, the value of an assignment. Anything else
# (a parameter, an assignment target, `global`, a keyword name, a pattern, ...)
# sends the file to ScopeProvider.
_READS = (
  (cst.Attribute, "value"),
  (cst.Call, "func"),
  (cst.Arg, "value"),
  (cst.Assign, "value"),
)

_OURS = "tf_lossscale"
# The last part of every module on the way to a name the tool knows.
_MODULE_PARTS = frozenset(module.rsplit(".", 1)[-1] for module in _names.MODULES)
_WATCHED_ROOTS = ("tensorflow", _OURS)

# Statements an import may sit in and still bind at module level.
_MODULE_LEVEL = (
  cst.Module,
  cst.SimpleStatementLine,
  cst.SimpleStatementSuite,  # `if x: import tensorflow as tf`
  cst.IndentedBlock,
  cst.If,
  cst.Else,
  cst.Try,
  cst.ExceptHandler,
  cst.Finally,
)


@dataclasses.dataclass(eq=False)
class ImportAssignment:
  """A name bound by an import (the attributes the planner reads of libcst's)."""

  name: str  # `tf`, or `a`, `a.b`, `a.b.c` for `import a.b.c`
  node: cst.CSTNode  # the Import or ImportFrom statement
  scope: "GlobalScope"
  references: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class Access:
  """A read of an import-bound name: the name, or the dotted chain an import spells."""

  node: cst.CSTNode
  referents: tuple


@dataclasses.dataclass(eq=False)
class GlobalScope:
  assignments: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Analysis:
  """What one pass over a module found.

  Attributes:
    parents: {node: parent}.
    order: {node: rank in source order}.
    scope: The module's `GlobalScope` with the import bindings of the names
      TensorFlow's or tf_lossscale's imports bind, or None when
      the file is not the simple case and `ScopeProvider` must answer.
  """

  parents: dict
  order: dict
  scope: GlobalScope | None


class _Recorder(cst.CSTVisitor):
  def __init__(self):
    super().__init__()
    self.parents = {}
    self.order = {}
    self.names = []  # Name nodes outside import statements
    self.imports = []
    self.strings = []
    self._stack = []
    self._in_import = 0

  def on_visit(self, node):
    if self._stack:
      self.parents[node] = self._stack[-1]
    self.order[node] = len(self.order)
    self._stack.append(node)
    if isinstance(node, cst.Name):
      if not self._in_import:
        self.names.append(node)
    elif isinstance(node, (cst.Import, cst.ImportFrom)):
      self.imports.append(node)
      self._in_import += 1
    elif isinstance(node, cst.SimpleString):
      self.strings.append(node)
    return True

  def on_leave(self, original_node):
    self._stack.pop()
    if isinstance(original_node, (cst.Import, cst.ImportFrom)):
      self._in_import -= 1


def analyse(module):
  """Records `module`'s structure and, in the simple case, its import bindings."""
  recorder = _Recorder()
  module.visit(recorder)
  analysis = Analysis(recorder.parents, recorder.order, None)
  analysis.scope = _bindings(recorder)
  return analysis


def _bindings(recorder):
  parents, order = recorder.parents, recorder.order
  imported = []  # (statement, the names one of its aliases binds)
  watched = {_OURS}  # the planner also asks whether this name is free
  from_tensorflow = set()  # the names TensorFlow's imports bind
  for statement in recorder.imports:
    if isinstance(statement.names, cst.ImportStar):
      continue
    module = "" if isinstance(statement, cst.Import) else _dotted_or_empty(statement.module)
    for alias in statement.names:
      full = _dotted(alias.name)
      if alias.asname is not None:
        names = [alias.asname.name.value]
      else:
        parts = full.split(".")
        # libcst's order: the whole dotted name first, then its prefixes.
        names = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
      imported.append((statement, names))
      # Only names TensorFlow's or tf_lossscale's imports bind matter to the planner
      # (a relative import binds none of them).
      source = f"{module}.{full}" if module else full
      if not getattr(statement, "relative", ()) and source.split(".")[0] in _WATCHED_ROOTS:
        watched.update(name.split(".", 1)[0] for name in names)
        if source.split(".")[0] == "tensorflow":
          from_tensorflow.update(name.split(".", 1)[0] for name in names)
  scope = GlobalScope()
  by_name = {}
  last_import = {}  # a watched name -> rank of its last import
  for statement, names in imported:
    first = names[0].split(".", 1)[0]
    if first not in watched:
      continue
    if not _at_module_level(statement, parents):
      return None
    for name in names:
      assignment = ImportAssignment(name, statement, scope)
      scope.assignments.append(assignment)
      by_name.setdefault(name, []).append(assignment)
    last_import[first] = max(last_import.get(first, -1), order[statement])
  if _mentioned_in_strings(recorder, watched):
    return None
  for name in recorder.names:
    if name.value not in watched:
      continue
    parent = parents[name]
    if (isinstance(parent, cst.Attribute) and parent.attr is name) or (
      isinstance(parent, cst.Arg) and parent.keyword is name
    ):
      continue  # `x.tf`, `f(tf=...)`: neither a read nor a binding of `tf`
    if not any(
      isinstance(parent, kind) and getattr(parent, field) is name for kind, field in _READS
    ):
      return None
    if order[name] < last_import.get(name.value, -1):
      return None  # read before (or between) its imports: order matters, ask ScopeProvider
    if name.value in from_tensorflow and _may_bind_a_module(name, parents):
      return None  # `tf1 = tf.compat.v1`: the planner follows such a name with ScopeProvider's
    node, dotted = _accessed(name, parents, by_name)
    referents = tuple(by_name.get(dotted, ()))
    access = Access(node, referents)
    for assignment in referents:
      assignment.references.append(access)
  return scope


def _may_bind_a_module(name, parents):
  """Whether `name` starts the value of an assignment that may bind a
  TensorFlow module (`tf1 = tf.compat.v1`; not `dtype = tf.float32`)."""
  top = name
  while isinstance(parents.get(top), cst.Attribute) and parents[top].value is top:
    top = parents[top]
  if not isinstance(parents.get(top), cst.Assign):
    return False
  return top is name or top.attr.value in _MODULE_PARTS


def _dotted_or_empty(node):
  return "" if node is None else _dotted(node)


def _at_module_level(node, parents):
  node = parents.get(node)
  while node is not None:
    if not isinstance(node, _MODULE_LEVEL):
      return False
    node = parents.get(node)
  return True


def _mentioned_in_strings(recorder, names):
  """Whether a string that may be a type annotation mentions one of `names`.

  ScopeProvider reads names in annotations written as strings; a string
  statement (a docstring) is never one.
  """
  pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(names))) + r")\b")
  for string in recorder.strings:
    holder = recorder.parents.get(string)
    while isinstance(holder, cst.ConcatenatedString):
      holder = recorder.parents.get(holder)
    if isinstance(holder, cst.Expr):
      continue
    if pattern.search(string.value):
      return True
  return False


def _accessed(name, parents, by_name):
  """`(node, dotted name)` an access to `name` resolves to, as ScopeProvider resolves it.

  The longest dotted prefix of the attribute chain that an import binds
  (`tensorflow.compat.v1` for `import tensorflow.compat.v1`), else the name.
  """
  chain = [name]
  node = name
  while True:
    parent = parents.get(node)
    if not isinstance(parent, cst.Attribute) or parent.value is not node:
      break
    chain.append(parent)
    node = parent
  # ScopeProvider resolves from the outermost attribute below the nearest call;
  # one above a subscript or another expression gives no dotted names.
  above = parents.get(node)
  while above is not None and not isinstance(above, cst.Call):
    if isinstance(above, cst.Attribute):
      return name, name.value
    above = parents.get(above)
  dotted = [name.value]
  for attribute in chain[1:]:
    dotted.append(f"{dotted[-1]}.{attribute.attr.value}")
  for node, text in zip(reversed(chain), reversed(dotted)):
    if text in by_name:
      return node, text
  return name, name.value


def _dotted(node):
  if isinstance(node, cst.Name):
    return node.value
  return f"{_dotted(node.value)}.{node.attr.value}"
