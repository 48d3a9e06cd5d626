"""Jupyter notebooks: their code cells as one Python module, and back.

The cells are analysed together (an import in one cell serves the others), so
they are joined with a marker comment between them. IPython syntax that is not
Python (`%magic`, `!shell`, `x?`, a cell magic's line) is masked as a comment
first and restored after; the body of a cell magic that runs Python (`%%time`,
`%%capture`, ...) is read as Python. Another cell magic's cell (`%%bash`,
`%%writefile`), or a cell that still does not parse, is left out, and reported
where it names a loss-scaling word.
"""

import json
import re

import libcst as cst

from tf_lossscale_upgrade import _prefilter, _rewrite

_BOUNDARY = "# tf-lossscale-upgrade: cell {}"
_MASK = "# tf-lossscale-upgrade: ipython {}"
# `%magic`, `!shell` (not a line continuing with `!=`), `obj?`, `?obj`, `obj??`.
_IPYTHON_LINE = re.compile(r"^\s*(%|!(?!=)|\?{1,2}[\w.]+\s*$|[\w.]+(\(\))?\s*\?{1,2}\s*$)")
_PYTHON_CELL_MAGICS = frozenset(("time", "timeit", "capture", "prun", "debug"))
_LEFT_OUT = (
  "a cell the tool cannot read as Python (a cell magic, or IPython syntax it does not know) "
  "that names a loss-scaling word: migrate its uses by hand"
)


def is_notebook(text):
  """Whether `text` is a Jupyter notebook's JSON (or claims to be one: `nbformat`)."""
  if not text.lstrip().startswith("{"):
    return False
  try:
    data = json.loads(text)
  except ValueError:
    return False
  return isinstance(data, dict) and ("nbformat" in data or isinstance(data.get("cells"), list))


class Notebook:
  """A parsed notebook whose code cells can be rewritten.

  Args:
    text: The notebook's JSON text.

  Raises:
    ValueError: If `text` is not JSON, or not a notebook of nbformat 4 (a list
      of cells, each an object whose source is text or a list of lines).
  """

  def __init__(self, text):
    self.text = text
    self.data = json.loads(text)
    _check_cells(self.data)
    self.code_cells = [
      index for index, cell in enumerate(self.data["cells"]) if cell.get("cell_type") == "code"
    ]

  def cell_source(self, index):
    source = self.data["cells"][index].get("source", "")
    return source if isinstance(source, str) else "".join(source)

  def worth_parsing(self):
    """False when the code cells have nothing to rewrite or report (see `_prefilter`)."""
    # A cell's last line has no newline of its own: a comment there would swallow
    # the next cell's first line.
    return _prefilter.worth_parsing("\n".join(self.cell_source(index) for index in self.code_cells))

  def upgrade(self):
    """Rewrites the code cells.

    Returns:
      `({cell index: new source}, findings)`: the cells that changed, and the
      findings with `line` counted within their cell, in `(cell, finding)` pairs.
    """
    if not self.worth_parsing():
      return {}, []
    masked_cells, masks, left_out = {}, {}, []
    for index in self.code_cells:
      source = self.cell_source(index)
      masked, cell_masks = _mask(source, first=len(masks))
      python = _cell_magic(source) in _PYTHON_CELL_MAGICS | {None}
      if python and _parses(masked):
        masked_cells[index] = masked
        masks.update(cell_masks)
      elif python and _parses(source):  # Python that looked like IPython (`% x` continued)
        masked_cells[index] = source
      elif _prefilter.names_a_word(source):
        line, first = next(
          (n, t.strip()) for n, t in enumerate(_rewrite.lines(source), 1) if t.strip()
        )
        finding = _rewrite.Finding(line, 1, _rewrite.NOT_REWRITTEN, first, "", _LEFT_OUT)
        left_out.append((index, finding))
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
    findings = sorted(findings + left_out, key=lambda pair: (pair[0], pair[1].line, pair[1].column))
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
        cell["source"] = source.splitlines(keepends=True)  # as nbformat splits them
    return _dump_like(data, self.text)


def _check_cells(data):
  if isinstance(data, dict) and "worksheets" in data and "cells" not in data:
    raise ValueError(
      f"a notebook of nbformat {data.get('nbformat')} (worksheets): the tool reads "
      "nbformat 4; open and save it in Jupyter to convert it"
    )
  cells = data.get("cells") if isinstance(data, dict) else None
  if not isinstance(cells, list) or not all(isinstance(cell, dict) for cell in cells):
    raise ValueError("not a Jupyter notebook: no list of cells")
  for index, cell in enumerate(cells):
    source = cell.get("source", "")
    if not (
      isinstance(source, str)
      or (isinstance(source, list) and all(isinstance(line, str) for line in source))
    ):
      raise ValueError(f"cell {index + 1}: its source is neither text nor a list of lines")


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
  lines = _rewrite.lines(source)
  out = []
  for line in lines:
    if _IPYTHON_LINE.search(line.rstrip("\r\n")):
      body = line.rstrip("\r\n")
      indent = body[: len(body) - len(body.lstrip())]
      comment = _MASK.format(first + len(masks))
      masks[comment] = body
      out.append(indent + comment + line[len(body) :])
    else:
      out.append(line)
  return "".join(out), masks


def _cell_magic(source):
  """The name of `source`'s cell magic (`time` for `%%time -n 1`), or None."""
  first = source.lstrip().split("\n", 1)[0].strip()
  return first[2:].split(" ", 1)[0] if first.startswith("%%") else None


def _unmask(code, masks):
  if not masks:
    return code
  lines = _rewrite.lines(code)
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
  for line in _rewrite.lines(code):
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
  """`data` as JSON in the layout of `original` (indent, key order, escaping, line ends)."""
  if original.count("\r\n") == original.count("\n") > 0:  # Windows line ends
    return _dump_like(data, original.replace("\r\n", "\n")).replace("\n", "\r\n")
  stripped = original.lstrip()
  lines = original.split("\n")
  second = lines[1] if len(lines) > 1 else ""
  indent = len(second) - len(second.lstrip(" ")) if second.strip() else None
  trailing = original[len(original.rstrip()) :]
  for ensure_ascii in (False, True):
    for sort_keys in (True, False):
      options = {"indent": indent, "ensure_ascii": ensure_ascii, "sort_keys": sort_keys}
      if json.dumps(json.loads(stripped), **options) + trailing == original:
        return json.dumps(data, **options) + trailing
  # An unusual layout: nbformat's own (what Jupyter writes).
  return json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
