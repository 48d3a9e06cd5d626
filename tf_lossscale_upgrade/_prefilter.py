"""Which files can be skipped: those where the tool has nothing to rewrite or report.

Most files of a codebase have nothing to migrate, and parsing one with libcst
and analysing it costs tens of milliseconds. Two cheap tests, each answering
False only when the full analysis would change nothing and report nothing:

1. A text search. A name resolves only through an import of `tensorflow`, so
   that word is in the file; and every module or name on the way to something
   the tool rewrites or reports (`_names.NAMES`, `COUNTERPARTS`, `CLAIMED`) has
   a part spelling one of the words of `_WORDS` (a test checks the tables). A
   file reaches a name only by spelling each of its parts, in an import or an
   attribute chain: an alias renames the bound name, never the parts.
2. Python's own parser (`ast`, in C). The planner acts only through import
   bindings and star imports, and on a use only when the attribute chain from a
   binding leads to a known name or to a loss-scaling module used whole. This
   follows every chain from every import-bound name, ignoring scopes: that finds
   a superset of the uses ScopeProvider finds (scopes only take uses away), so
   when it finds nothing the planner finds nothing. A file Python cannot parse
   goes on to libcst, which reports the error or handles the syntax.
"""

import ast
import re
import warnings

from tf_lossscale_upgrade import _names

# `experimental`: `train.experimental` (reported when used whole) and TensorFlow's
# private `tensorflow.python.training.experimental`.
_WORDS = re.compile(r"mixed_precision|LossScale|loss_scale|experimental")


def names_a_word(code):
  """Whether `code` spells a word every name the tool knows has a part of."""
  return _WORDS.search(code) is not None


def worth_parsing(code):
  """False when the tool has nothing to rewrite or report in `code` (see above)."""
  if "tensorflow" not in code or _WORDS.search(code) is None:
    return False
  try:
    with warnings.catch_warnings():  # `"\d"` and the like: not the user's concern here
      warnings.simplefilter("ignore", SyntaxWarning)
      warnings.simplefilter("ignore", DeprecationWarning)
      tree = ast.parse(code)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return True
  return _reaches_a_known_name(tree)


def _reaches_a_known_name(tree):
  modules = {}  # bound name -> the TensorFlow modules it may denote
  names = []
  attributes = []
  aliases = []  # `name = a.b.c`: a module may be bound by assignment too
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      names.append(node)
    elif isinstance(node, ast.Attribute):
      attributes.append(node)
    elif isinstance(node, ast.Assign) and len(node.targets) == 1:
      if isinstance(node.targets[0], ast.Name):
        aliases.append((node.targets[0].id, _chain(node.value) or _chain_of_name(node.value)))
    elif isinstance(node, ast.Import | ast.ImportFrom):
      for bound, target in _bindings(node):
        if target == "*":
          if bound in _names.MODULES:  # `bound` is the module of a star import
            return True
        elif _binding_matters(target):
          return True
        elif target in _names.MODULES:
          modules.setdefault(bound, set()).add(target)
  if not modules:
    return False
  for _ in range(len(aliases)):  # aliases of aliases, in any order
    before = sum(map(len, modules.values()))
    for bound, parts in aliases:
      for length in range(1, len(parts) + 1):
        for target in list(modules.get(".".join(parts[:length]), ())):
          path = ".".join([target, *parts[length:]])
          if path in _names.MODULES:
            modules.setdefault(bound, set()).add(path)
    if sum(map(len, modules.values())) == before:
      break
  for name in names:
    if any(_chain_matters(target, []) for target in modules.get(name.id, ())):
      return True
  for attribute in attributes:
    parts = _chain(attribute)
    for length in range(1, len(parts)):
      for target in modules.get(".".join(parts[:length]), ()):
        if _chain_matters(target, parts[length:]):
          return True
  return False


def _bindings(node):
  """`(bound name, what it denotes)` pairs of an import; `(module, "*")` for a star."""
  if isinstance(node, ast.Import):
    for alias in node.names:
      if alias.asname:
        yield alias.asname, alias.name
      else:
        parts = alias.name.split(".")
        for length in range(1, len(parts) + 1):
          dotted = ".".join(parts[:length])
          yield dotted, dotted
  elif not node.level and node.module:
    for alias in node.names:
      if alias.name == "*":
        yield node.module, "*"
      else:
        yield alias.asname or alias.name, f"{node.module}.{alias.name}"


def _binding_matters(target):
  """Whether importing `target` is itself rewritten or reported."""
  return (
    target in _names.NAMES
    or target.rsplit(".", 1)[0] in _names.CLAIMED
    or (target in _names.MODULES and _names.is_private_or_gone(target))
  )


def _chain_matters(target, rest):
  """Whether `target` followed by the attributes `rest` is rewritten or reported."""
  name = target
  for attribute in rest:
    if name in _names.NAMES:
      return True
    child = f"{name}.{attribute}"
    if child not in _names.NAMES and child not in _names.MODULES:
      return name in _names.CLAIMED
    name = child
  if name in _names.NAMES:
    return True
  # A module used whole (as a value).
  return name in _names.COUNTERPARTS or name in _names.CLAIMED


def _chain_of_name(node):
  return [node.id] if isinstance(node, ast.Name) else []


def _chain(attribute):
  """`["tf", "keras", "mixed_precision"]` for `tf.keras.mixed_precision`; [] if not dotted."""
  parts = []
  node = attribute
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return []
  parts.append(node.id)
  return parts[::-1]
