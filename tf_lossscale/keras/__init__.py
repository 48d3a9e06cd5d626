"""Mirrors `tf.keras`."""

from tf_lossscale.keras import callbacks, mixed_precision

__all__ = ["callbacks", "mixed_precision"]
