"""Jupyter notebooks: their code cells as one Python module, and back.

The cells are analysed together (an import in one cell serves the others), so
they are joined with a marker comment between them. IPython syntax that is not
Python (`%magic`, `!shell`, `x?`) is masked as a comment first and restored
after; a cell that still does not parse (a `%%bash` cell, say) is left out.
"""

import json
import re

import libcst as cst

from tf_lossscale_upgrade import _prefilter, _rewrite

_BOUNDARY = "# tf-lossscale-upgrade: cell {}"
_MASK = "# tf-lossscale-upgrade: ipython {}"
_IPYTHON_LINE = re.compile(r"^\s*[%!]|\?\s*$")


def is_notebook(text):
  """Whether `text` is a Jupyter notebook's JSON."""
  if not text.lstrip().startswith("{"):
    return False
  try:
    data = json.loads(text)
  except ValueError:
    return False
  return isinstance(data, dict) and isinstance(data.get("cells"), list)


class Notebook:
  """A parsed notebook whose code cells can be rewritten.

  Args:
    text: The notebook's JSON text.
  """

  def __init__(self, text):
    self.text = text
    self.data = json.loads(text)
    self.code_cells = [
      index for index, cell in enumerate(self.data["cells"]) if cell.get("cell_type") == "code"
    ]

  def cell_source(self, index):
    source = self.data["cells"][index].get("source", "")
    return source if isinstance(source, str) else "".join(source)

  def worth_parsing(self):
    """False when the code cells have nothing to rewrite or report (see `_prefilter`)."""
    return _prefilter.worth_parsing("".join(self.cell_source(index) for index in self.code_cells))

  def upgrade(self):
    """Rewrites the code cells.

    Returns:
      `({cell index: new source}, findings)`: the cells that changed, and the
      findings with `line` counted within their cell, in `(cell, finding)` pairs.
    """
    if not self.worth_parsing():
      return {}, []
    masked_cells, masks = {}, {}
    for index in self.code_cells:
      masked, cell_masks = _mask(self.cell_source(index), first=len(masks))
      if _parses(masked):
        masked_cells[index] = masked
        masks.update(cell_masks)
    cells = list(masked_cells)
    joined, starts = [], []
    line = 1
    for index, masked in masked_cells.items():
      joined.append(_BOUNDARY.format(index) + "\n")
      starts.append(line + 1)
      line += 1 + masked.count("\n") + (not masked.endswith("\n"))
      joined.append(masked if masked.endswith("\n") else masked + "\n")
    result = _rewrite.upgrade_source("".join(joined))
    findings = []
    for finding in result.findings:
      position = max(i for i, start in enumerate(starts) if start <= finding.line)
      findings.append((cells[position], _shift(finding, finding.line - starts[position] + 1)))
    changed = {}
    for index, new in _split(result.code, cells).items():
      new = _unmask(new, masks)
      old = self.cell_source(index)
      if not old.endswith("\n"):
        new = new[:-1] if new.endswith("\n") else new
      if new != old:
        changed[index] = new
    return changed, findings

  def dumps(self, changed):
    """The notebook's JSON with `changed` cell sources, formatted as it was."""
    data = json.loads(self.text)
    for index, source in changed.items():
      cell = data["cells"][index]
      if isinstance(cell.get("source"), str):
        cell["source"] = source
      else:
        cell["source"] = source.splitlines(keepends=True)
    return _dump_like(data, self.text)


def _parses(code):
  try:
    cst.parse_module(code)
  except cst.ParserSyntaxError:
    return False
  return True


def _mask(source, first):
  """Replaces IPython-only lines by comments numbered from `first`.

  Returns:
    The code and {comment: the line it replaces}.
  """
  masks = {}
  lines = source.splitlines(keepends=True)
  cell_magic = bool(lines) and lines[0].lstrip().startswith("%%")
  out = []
  for line in lines:
    if cell_magic or _IPYTHON_LINE.search(line.rstrip("\r\n")):
      body = line.rstrip("\r\n")
      indent = body[: len(body) - len(body.lstrip())]
      comment = _MASK.format(first + len(masks))
      masks[comment] = body
      out.append(indent + comment + line[len(body) :])
    else:
      out.append(line)
  return "".join(out), masks


def _unmask(code, masks):
  if not masks:
    return code
  lines = code.splitlines(keepends=True)
  out = []
  for line in lines:
    body = line.rstrip("\r\n")
    key = body.strip()
    out.append(masks[key] + line[len(body) :] if key in masks else line)
  return "".join(out)


def _split(code, cells):
  """{cell index: source} from the joined code."""
  sources, current = {}, None
  markers = {_BOUNDARY.format(index): index for index in cells}
  for line in code.splitlines(keepends=True):
    index = markers.get(line.rstrip("\r\n"))
    if index is not None:
      current = index
      sources[current] = []
    else:
      sources[current].append(line)
  return {index: "".join(lines) for index, lines in sources.items()}


def _shift(finding, line):
  return _rewrite.Finding(
    line, finding.column, finding.kind, finding.old, finding.new, finding.reason
  )


def _dump_like(data, original):
  """`data` as JSON in the layout of `original` (indent, key order, escaping)."""
  stripped = original.lstrip()
  second = original.splitlines()[1] if original.count("\n") else ""
  indent = len(second) - len(second.lstrip(" ")) if second.strip() else None
  trailing = original[len(original.rstrip()) :]
  for ensure_ascii in (False, True):
    for sort_keys in (True, False):
      options = {"indent": indent, "ensure_ascii": ensure_ascii, "sort_keys": sort_keys}
      if json.dumps(json.loads(stripped), **options) + trailing == original:
        return json.dumps(data, **options) + trailing
  # An unusual layout: nbformat's own (what Jupyter writes).
  return json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
