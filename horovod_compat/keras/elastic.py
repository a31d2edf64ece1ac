"""Elastic state and callbacks of ``horovod.keras.elastic``: with Keras 3 both Horovod Keras
namespaces share one Keras, so these are ``horovod_compat.tensorflow.keras.elastic``'s."""

from horovod_compat.tensorflow.keras.elastic import (  # noqa: F401
    CommitStateCallback, KerasState, ObjectState, TensorFlowKerasState, TensorFlowState,
    UpdateBatchStateCallback, UpdateEpochStateCallback, run)
