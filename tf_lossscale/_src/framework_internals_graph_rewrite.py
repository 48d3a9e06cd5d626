"""TensorFlow's process-wide mixed-precision flags, shared with TF's own API and tf_keras.

TensorFlow keeps three flags in the private module
`tensorflow.python.training.experimental.mixed_precision_global_state`:

- "the graph rewrite is enabled": `tf.compat.v1.Session` reads it when it is
  created and then switches the `auto_mixed_precision` grappler rewrite on in
  the `ConfigProto` it was given (unless that proto switches it off). TF's
  `enable_mixed_precision_graph_rewrite` and tf_keras's `set_global_policy`
  read it too.
- "a Keras mixed-precision policy is in use": set by tf_keras's
  `set_global_policy`; TF's `enable_mixed_precision_graph_rewrite` refuses to
  run while it is set.
- "a Session without the rewrite was created": set by `tf.compat.v1.Session`.

Sharing them makes our graph rewrite and our experimental `set_policy` refuse
each other, and TF's and tf_keras's, exactly as TF 2.4's functions did. Each
accessor below falls back to public behaviour when the private module is
gone (TF has had it and these functions since 2.4; checked on 2.21): the getters answer
from public state or False, the setters do what the public API can.
"""

import tensorflow as tf

try:
  from tensorflow.python.training.experimental import (
    mixed_precision_global_state as _global_state,
  )
except ImportError:  # pragma: no cover - TF without the module
  _global_state = None


def set_graph_rewrite_flag(enabled):
  """Sets TF's "graph rewrite enabled" flag, which `tf.compat.v1.Session` reads.

  Relies on `mixed_precision_global_state.set_mixed_precision_graph_rewrite_enabled`.
  Without it, Sessions created without a `config` still get the rewrite
  (their default config carries the optimizer options set with
  `tf.config.optimizer.set_experimental_options`), but a Session given its
  own `ConfigProto` needs
  `config.graph_options.rewrite_options.auto_mixed_precision = 1` (ON).

  Args:
    enabled: Bool, the new value.

  Returns:
    True if the flag was set, False if this TensorFlow lacks it.
  """
  if _global_state is None:
    return False
  _global_state.set_mixed_precision_graph_rewrite_enabled(enabled)
  return True


def graph_rewrite_flag():
  """Whether TF's or our `enable_mixed_precision_graph_rewrite` is in effect.

  Relies on `mixed_precision_global_state.is_mixed_precision_graph_rewrite_enabled`
  (also exported as `tf.__internal__.train.is_mixed_precision_graph_rewrite_enabled`
  for tf_keras). Without it: whether the public optimizer option
  `auto_mixed_precision` is on.

  Returns:
    Bool.
  """
  if _global_state is None:
    options = tf.config.optimizer.get_experimental_options()
    return bool(options.get("auto_mixed_precision", False))
  return bool(_global_state.is_mixed_precision_graph_rewrite_enabled())


def non_mixed_precision_session_created():
  """Whether a `tf.compat.v1.Session` without the rewrite exists (TF's record of it).

  Relies on `mixed_precision_global_state.non_mixed_precision_session_created`.
  Without it: False (the warning that depends on it is not logged).

  Returns:
    Bool.
  """
  if _global_state is None:
    return False
  return bool(_global_state.non_mixed_precision_session_created())


def using_mixed_precision_policy():
  """Whether tf_keras's (or TF's own) Keras set a mixed global policy.

  Relies on `mixed_precision_global_state.is_using_mixed_precision_policy`.
  Without it: False (Keras 3's and our own policies are checked directly by
  the callers).

  Returns:
    Bool.
  """
  if _global_state is None:
    return False
  return bool(_global_state.is_using_mixed_precision_policy())


def set_using_mixed_precision_policy(is_mixed):
  """Records in TF's flag whether our global policy is a mixed one.

  Relies on `mixed_precision_global_state.set_using_mixed_precision_policy`
  (also exported as `tf.__internal__.train.set_using_mixed_precision_policy`,
  which tf_keras's `set_global_policy` calls). Without it: nothing is
  recorded, and TF's own graph rewrite no longer refuses to run beside our
  policy (ours still does: it reads the Keras 3 global policy itself).

  Args:
    is_mixed: Bool.
  """
  if _global_state is not None:
    _global_state.set_using_mixed_precision_policy(is_mixed)
