"""Dataset helpers for data-parallel input, with or without a tf.distribute strategy."""

from typing import Tuple

import tensorflow as tf

from horovod_compat.tensorflow import mpi_ops


def shard_and_rebatch_dataset(dataset: tf.data.Dataset,
                              global_batch_size: int) -> Tuple[tf.data.Dataset, int]:
    """This rank's share of ``dataset`` and the per-rank batch size for ``global_batch_size``.

    ``dataset`` holds unbatched elements; rank r keeps elements r, r + size, r + 2*size, ...
    Batch the result with the returned size, so that one step over all ranks covers
    ``global_batch_size`` elements:

        ds, per_rank = shard_and_rebatch_dataset(ds, 256)
        ds = ds.batch(per_rank)

    Raises ValueError unless ``global_batch_size`` is a positive multiple of ``hvd.size()``.
    Calls ``hvd.init()`` if needed.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"shard_and_rebatch_dataset expects a tf.data.Dataset, got "
                        f"{type(dataset).__name__}")
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    size, rank = mpi_ops.size(), mpi_ops.rank()
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) \
            or global_batch_size <= 0 or global_batch_size % size:
        raise ValueError(f"global_batch_size must be a positive multiple of the number of "
                         f"ranks ({size}); got {global_batch_size!r}")
    return dataset.shard(size, rank), global_batch_size // size
