"""The table of TensorFlow names the tool rewrites, and what each becomes.

Every key is a fully qualified TensorFlow name, spelled as the module path
Python imports (`tensorflow.keras...`, `tensorflow.compat.v1...`,
`tensorflow.python...`); `tf.X` in a file resolves to `tensorflow.X` once the
file's imports are read. Values are the tf_lossscale name it becomes.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Target:
  """What a TensorFlow name becomes.

  Attributes:
    name: The fully qualified tf_lossscale name.
    alive: True when today's TensorFlow still has the TensorFlow name with the
      same meaning (the non-experimental Keras policy functions): such a name is
      left alone unless the import it is reached through is rewritten anyway.
  """

  name: str
  alive: bool = False


_LOSS_SCALES = ("LossScale", "FixedLossScale", "DynamicLossScale")
_GRAPH_REWRITE = ("enable_mixed_precision_graph_rewrite", "disable_mixed_precision_graph_rewrite")
_KERAS_POLICY = ("Policy", "global_policy", "set_global_policy")
_KERAS_EXPERIMENTAL = (
  "LossScaleOptimizer",
  "Policy",
  "global_policy",
  "set_policy",
  "get_layer_policy",
)
_V1_OPTIMIZER = ("MixedPrecisionLossScaleOptimizer",)

# Roots under which TensorFlow exposes an API version: `import tensorflow as tf`
# is TF2's API (TF1's in TF 1.x code), `tensorflow.compat.v1`/`.v2` pin one, and
# each of those has a `compat` of its own (`import tensorflow.compat.v1 as tf`
# then `tf.compat.v1.train...`).
_ROOTS_V1 = (
  "tensorflow",
  "tensorflow.compat.v1",
  "tensorflow.compat.v1.compat.v1",
  "tensorflow.compat.v2.compat.v1",
)
_ROOTS_V2 = (
  "tensorflow",
  "tensorflow.compat.v2",
  "tensorflow.compat.v1.compat.v2",
  "tensorflow.compat.v2.compat.v2",
)
_ROOTS_ANY = tuple(dict.fromkeys(_ROOTS_V1 + _ROOTS_V2))


def _table():
  """(TF module, names, tf_lossscale module, alive) rows, most specific last."""
  rows = []
  for root in _ROOTS_ANY:
    rows += [
      (f"{root}.keras.mixed_precision", ("LossScaleOptimizer",), "keras.mixed_precision", False),
      (f"{root}.keras.mixed_precision", _KERAS_POLICY, "keras.mixed_precision", True),
      (
        f"{root}.keras.mixed_precision.experimental",
        _KERAS_EXPERIMENTAL,
        "keras.mixed_precision.experimental",
        False,
      ),
    ]
  # TF 1.x code said `tf.mixed_precision...` and `tf.train.experimental...` with
  # `import tensorflow as tf`, so TF1's names are listed under both roots.
  for root in _ROOTS_V1:
    rows += [
      (
        f"{root}.mixed_precision",
        _LOSS_SCALES + _V1_OPTIMIZER + _GRAPH_REWRITE,
        "compat.v1.mixed_precision",
        False,
      ),
      (
        f"{root}.mixed_precision.experimental",
        _LOSS_SCALES,
        "compat.v1.mixed_precision.experimental",
        False,
      ),
      (
        f"{root}.train.experimental",
        _LOSS_SCALES + _V1_OPTIMIZER + _GRAPH_REWRITE,
        "compat.v1.train.experimental",
        False,
      ),
    ]
  for root in _ROOTS_V2:
    rows += [
      (f"{root}.mixed_precision.experimental", _LOSS_SCALES, "mixed_precision.experimental", False),
      (
        f"{root}.train.experimental",
        _LOSS_SCALES + _GRAPH_REWRITE,
        "compat.v1.train.experimental",
        False,
      ),
    ]
  # TensorFlow's private modules, as TF 2.1-2.4 code imported them.
  training = "tensorflow.python.training.experimental"
  keras = "tensorflow.python.keras.mixed_precision"
  rows += [
    (
      f"{training}.loss_scale",
      _LOSS_SCALES + ("get", "serialize", "deserialize"),
      "loss_scale",
      False,
    ),
    (f"{training}.loss_scale_optimizer", _V1_OPTIMIZER, "compat.v1.mixed_precision", False),
    (f"{training}.mixed_precision", _GRAPH_REWRITE, "compat.v1.mixed_precision", False),
    (f"{keras}.loss_scale", ("get", "serialize", "deserialize"), "loss_scale", False),
    (f"{keras}.loss_scale_optimizer", ("LossScaleOptimizer",), "keras.mixed_precision", False),
    (
      f"{keras}.policy",
      ("Policy", "global_policy", "set_global_policy"),
      "keras.mixed_precision",
      False,
    ),
    (f"{keras}.policy", ("set_policy",), "keras.mixed_precision.experimental", False),
    (
      f"{keras}.get_layer_policy",
      ("get_layer_policy",),
      "keras.mixed_precision.experimental",
      False,
    ),
    (
      f"{keras}.experimental.loss_scale_optimizer",
      ("LossScaleOptimizer",),
      "keras.mixed_precision.experimental",
      False,
    ),
    (
      f"{keras}.experimental.policy",
      ("Policy", "global_policy", "set_policy"),
      "keras.mixed_precision.experimental",
      False,
    ),
    (
      f"{keras}.experimental.get_layer_policy",
      ("get_layer_policy",),
      "keras.mixed_precision.experimental",
      False,
    ),
  ]
  return rows


def _renamed():
  """Private names whose tf_lossscale name differs: {TF name: tf_lossscale name}."""
  training = "tensorflow.python.training.experimental.mixed_precision"
  keras = "tensorflow.python.keras.mixed_precision"
  return {
    f"{keras}.loss_scale_optimizer.LossScaleOptimizerV1": (
      "tf_lossscale.keras.mixed_precision.experimental.LossScaleOptimizer"
    ),
    f"{keras}.policy.PolicyV1": "tf_lossscale.keras.mixed_precision.experimental.Policy",
    f"{training}.enable_mixed_precision_graph_rewrite_v1": (
      "tf_lossscale.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite"
    ),
    f"{training}.disable_mixed_precision_graph_rewrite_v1": (
      "tf_lossscale.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite"
    ),
  }


def _build_names():
  names = {}
  for tf_module, leaves, ours, alive in _table():
    for leaf in leaves:
      names[f"{tf_module}.{leaf}"] = Target(f"tf_lossscale.{ours}.{leaf}", alive)
  for tf_name, ours in _renamed().items():
    names[tf_name] = Target(ours)
  return names


#: {TensorFlow name: Target}: every name the tool knows.
NAMES = _build_names()

#: Every module on the way to a known name (`tensorflow`, `tensorflow.keras`, ...).
MODULES = frozenset(name.rsplit(".", i)[0] for name in NAMES for i in range(1, name.count(".") + 1))

_PRIVATE_ROOT = "tensorflow.python."

#: Modules TF >= 2.16 no longer has: importing them fails.
GONE = frozenset(f"{root}.keras.mixed_precision.experimental" for root in _ROOTS_ANY) | frozenset(
  f"{root}.mixed_precision{sub}" for root in _ROOTS_V2 for sub in ("", ".experimental")
)


def _is_loss_scaling_module(module):
  """Whether a module is about loss scaling only (so it may map to one of ours).

  General modules (`tensorflow`, `tensorflow.keras`, `tensorflow.train`) stay
  TensorFlow's even when a file only uses their loss-scaling names.
  """
  last = module.rsplit(".", 1)[-1]
  return (
    "mixed_precision" in module
    or "loss_scale" in module
    or "policy" in last
    or module.endswith("train.experimental")
  )


def _counterparts():
  """{TF module: tf_lossscale module} for loss-scaling modules with a twin of ours.

  A module has a twin when every known name in it keeps its leaf name and lands
  in one module of ours (`tensorflow.keras.mixed_precision.experimental` ->
  `tf_lossscale.keras.mixed_precision.experimental`).
  """
  candidates = {}
  for tf_name, target in NAMES.items():
    tf_parts, our_parts = tf_name.split("."), target.name.split(".")
    same_below = tf_parts[-1] == our_parts[-1]
    for up in range(1, min(len(tf_parts), len(our_parts))):
      tf_module, our_module = ".".join(tf_parts[:-up]), ".".join(our_parts[:-up])
      candidates.setdefault(tf_module, set()).add(our_module if same_below else None)
      same_below = same_below and tf_parts[-up - 1] == our_parts[-up - 1]
  return {
    module: ours.pop()
    for module, ours in candidates.items()
    if len(ours) == 1 and None not in ours and _is_loss_scaling_module(module)
  }


#: {TF module: tf_lossscale module}: an import of the former can become one of the latter.
COUNTERPARTS = _counterparts()

#: Modules whose every TF 2.4 name is known, so the module object itself can be
#: replaced by ours (`mp = tf.keras.mixed_precision.experimental`, star imports).
COMPLETE = frozenset(
  module
  for module in COUNTERPARTS
  if module in GONE
  or module.endswith("compat.v1.mixed_precision")
  or module.endswith("compat.v1.mixed_precision.experimental")
)

#: Modules TF code has no business reaching into any more: private ones and gone ones.
#: A name in them that is not in NAMES is reported.
CLAIMED = (
  frozenset(m for m in MODULES if m.startswith(_PRIVATE_ROOT) and "." in m[len(_PRIVATE_ROOT) :])
  | GONE
)

# Objects reachable under several names of ours (API.md: aliases, not copies);
# `global_policy` is one function, experimental or not, as in TF 2.4.
_SHARED_LEAVES = frozenset(_LOSS_SCALES + _V1_OPTIMIZER + _GRAPH_REWRITE + ("global_policy",))


#: {tf_lossscale class name: private attributes}: those of TensorFlow's class that
#: tf_lossscale's has too, with TensorFlow's meaning, so a subclass may use them
#: (a custom loss scale creates its variables with `_add_weight`).
KEPT_PRIVATE = {
  "LossScaleOptimizer": ("_optimizer",),
  "MixedPrecisionLossScaleOptimizer": ("_optimizer", "_loss_scale"),
  "LossScale": ("_add_weight", "_weights"),
  "FixedLossScale": ("_add_weight", "_weights", "_loss_scale_value"),
  "DynamicLossScale": ("_add_weight", "_weights", "_current_loss_scale", "_num_good_steps"),
}


def same_object(first, second):
  """Whether two tf_lossscale names denote one object."""
  if first == second:
    return True
  leaf = first.rsplit(".", 1)[-1]
  return leaf == second.rsplit(".", 1)[-1] and leaf in _SHARED_LEAVES


#: TensorFlow's private package of TF 2.1-2.3's Keras mixed precision, gone since TF 2.4.
_GONE_PRIVATE = "tensorflow.python.keras.mixed_precision.experimental"


def is_gone(module):
  """Whether importing `module` fails on TF >= 2.16."""
  return module in GONE or (module + ".").startswith(_GONE_PRIVATE + ".")


def is_private_or_gone(module):
  """Whether importing `module` is what a migration should remove."""
  return module.startswith(_PRIVATE_ROOT) or module in GONE


def markdown_table():
  """The table as Markdown, one row per TF module (what docs/migration.md shows).

  `tensorflow.` is spelled `tf.` for public names, and `tf.compat.v2.` rows,
  the same as `tf.` rows, and those under a compat module's own `compat`
  (`tf.compat.v1.compat.v1.`), the same again, are left out.
  """
  rows = {}
  for tf_name, target in NAMES.items():
    if tf_name.startswith("tensorflow.compat.v2.") or tf_name.count(".compat.") > 1:
      continue
    tf_module, leaf = tf_name.rsplit(".", 1)
    our_module, our_leaf = target.name.rsplit(".", 1)
    if not tf_module.startswith(_PRIVATE_ROOT):
      tf_module = "tf" + tf_module[len("tensorflow") :]
    rows.setdefault((tf_module, our_module, target.alive), []).append(
      leaf if leaf == our_leaf else f"{leaf} as {our_leaf}"
    )
  lines = ["| TensorFlow name | becomes | |", "|---|---|---|"]
  for (tf_module, our_module, alive), leaves in rows.items():
    note = "left alone unless its import is rewritten (today's TF has it)" if alive else ""
    lines.append(f"| `{tf_module}.{{{', '.join(leaves)}}}` | `{our_module}.*` | {note} |")
  return "\n".join(lines) + "\n"
