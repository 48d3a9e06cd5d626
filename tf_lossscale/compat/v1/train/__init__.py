"""Mirrors `tf.compat.v1.train` (its loss-scaling part)."""

from tf_lossscale.compat.v1.train import experimental

__all__ = ["experimental"]
