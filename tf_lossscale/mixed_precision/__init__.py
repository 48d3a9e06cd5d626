"""Mirrors `tf.mixed_precision`."""

from tf_lossscale.mixed_precision import experimental

__all__ = ["experimental"]
