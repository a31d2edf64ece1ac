"""Keras callbacks of ``horovod.keras`` (API.md 2.6): with Keras 3 both Horovod namespaces share
one Keras, so these are the classes of ``horovod_compat.tensorflow.keras.callbacks``."""

from horovod_compat.tensorflow.keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
