"""Mirrors `tf.compat`."""

from tf_lossscale.compat import v1

__all__ = ["v1"]
