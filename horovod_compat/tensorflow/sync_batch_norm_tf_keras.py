"""``SyncBatchNormalization`` on tf_keras (Keras 2.x), used when ``tf.keras`` is tf_keras.

It overrides tf_keras' ``_calculate_mean_and_var`` hook with ``global_moments``; the layer is
never fused (the fused kernel computes its own moments).
"""

from typing import Any, Sequence, Tuple

import tf_keras

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.sync_moments import global_moments


class SyncBatchNormalization(tf_keras.layers.BatchNormalization):
    """Batch normalization whose training-mode statistics are computed over all ranks."""

    def __init__(self, fused: Any = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        super().__init__(fused=False, **kwargs)

    def _calculate_mean_and_var(self, inputs: Any, reduction_axes: Sequence[int],
                                keep_dims: bool, mask: Any = None) -> Tuple[Any, Any]:
        if mpi_ops.size() == 1:
            return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=mask)
        return global_moments(inputs, reduction_axes, keepdims=keep_dims, mask=mask)
