"""Keras callbacks beyond TF 2.4 (`tf.keras.callbacks` had none for loss scaling)."""

from tf_lossscale._src.keras_callbacks import LossScaleMinimumWarning, LossScaleMonitor

__all__ = ["LossScaleMinimumWarning", "LossScaleMonitor"]
