"""Batch moments over every rank's batch: what both ``SyncBatchNormalization`` layers compute.

Per channel each rank sums its element count, ``x`` and ``x**2`` (weighted by a Keras mask when
there is one); one Sum-allreduce over the global process set adds them up, and
``mean = S1/N``, ``variance = S2/N - mean**2``. Ranks may hold batches of different sizes.
Gradients flow through the allreduce's registered gradient.
"""

from typing import Any, Sequence, Tuple

import tensorflow as tf

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.reductions import allreduce


def global_moments(x: Any, axes: Sequence[int], keepdims: bool = False,
                   mask: Any = None) -> Tuple[Any, Any]:
    """Mean and variance of ``x`` over ``axes`` and over all ranks; ``mask`` (batch, steps) marks
    the entries that count, as Keras masks do."""
    axes = list(axes)
    x = tf.convert_to_tensor(x)
    s1_local = tf.reduce_sum(x, axis=axes, keepdims=keepdims)
    if mask is None:
        n = tf.reduce_prod(tf.gather(tf.shape(x), axes))
        count = tf.cast(n, x.dtype) * tf.ones_like(s1_local)
        s1, s2 = s1_local, tf.reduce_sum(tf.square(x), axis=axes, keepdims=keepdims)
    else:
        weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
        count = tf.reduce_sum(weights, axis=axes, keepdims=keepdims)
        s1 = tf.reduce_sum(x * weights, axis=axes, keepdims=keepdims)
        s2 = tf.reduce_sum(tf.square(x) * weights, axis=axes, keepdims=keepdims)
    total = allreduce(tf.stack([count, s1, s2]), op=mpi_ops.Sum)
    # An empty global batch (all masked) gives zero statistics rather than NaN.
    n = tf.maximum(total[0], tf.ones_like(total[0]))
    mean = total[1] / n
    variance = tf.maximum(total[2] / n - tf.square(mean), tf.zeros_like(mean))
    return mean, variance
