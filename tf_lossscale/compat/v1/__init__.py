"""Mirrors `tf.compat.v1`."""

from tf_lossscale.compat.v1 import mixed_precision, train

__all__ = ["mixed_precision", "train"]
