"""``SyncBatchNormalization`` (docs/keras.md): batch normalization whose training-mode statistics
are those of the union of every rank's batch (``sync_moments.global_moments``). Inference uses
the moving statistics, with no collective.

On Keras 3 it is the class below, on ``keras.layers.BatchNormalization``; when ``tf.keras`` is
tf_keras (``TF_USE_LEGACY_KERAS=1``) it is ``sync_batch_norm_tf_keras``'s, on
``tf_keras.layers.BatchNormalization`` -- as Horovod's derives from ``tf.keras``'s layer.
"""

from typing import Any, Tuple

import keras
import tensorflow as tf

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.sync_moments import global_moments


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization whose training-mode statistics are computed over all ranks."""

    def __init__(self, fused: Any = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, mask: Any) -> Tuple[Any, Any]:
        # Keras 3 hook: called from call() in training mode with float32 (or wider) inputs.
        if mpi_ops.size() == 1:
            return super()._moments(inputs, mask)
        return global_moments(inputs, self._reduction_axes, mask=mask)


if getattr(tf.keras, "__name__", "").startswith("tf_keras"):
    from horovod_compat.tensorflow.sync_batch_norm_tf_keras import (  # noqa: F811,E402
        SyncBatchNormalization)
