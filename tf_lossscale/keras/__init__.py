"""Mirrors `tf.keras`."""

from tf_lossscale.keras import mixed_precision

__all__ = ["mixed_precision"]
