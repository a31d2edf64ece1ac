"""``SyncBatchNormalization`` (API.md 1.19) on Keras 3's ``BatchNormalization``.

In training mode the batch mean and variance are those of the union of every rank's batch:
each rank sums, per channel, its element count, ``x`` and ``x**2`` (weighted by the mask when
there is one), one Sum-allreduce over the global process set adds them up, and
``mean = S1/N``, ``variance = S2/N - mean**2``. Ranks may hold batches of different sizes
(Horovod 0.28.1 averaged per-rank moments, which assumes equal sizes). Gradients flow through
the allreduce's registered gradient, so they are those of batch normalization over the global
batch. Inference uses the moving statistics, as ``BatchNormalization`` does.
"""

from typing import Any, Tuple

import keras
import tensorflow as tf

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.reductions import allreduce


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
        axes = self._reduction_axes
        x = tf.convert_to_tensor(inputs)
        if mask is None:
            channels = tf.shape(x)[self.axis]
            count = tf.cast(tf.size(x) // channels, x.dtype) * tf.ones([channels], x.dtype)
            weighted = x
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
            count = tf.reduce_sum(weights, axis=axes)
            weighted = x * weights
        local = tf.stack([count,
                          tf.reduce_sum(weighted, axis=axes),
                          tf.reduce_sum(weighted * x, axis=axes)])
        total = allreduce(local, op=mpi_ops.Sum)
        # An empty global batch (all masked) gives zero statistics rather than NaN.
        n = tf.maximum(total[0], tf.ones_like(total[0]))
        mean = total[1] / n
        variance = tf.maximum(total[2] / n - tf.square(mean), tf.zeros_like(mean))
        return mean, variance
