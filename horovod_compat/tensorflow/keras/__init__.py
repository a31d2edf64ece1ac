"""``horovod.tensorflow.keras`` on Keras 3 and on tf_keras (``TF_USE_LEGACY_KERAS=1``)
(docs/keras.md)."""

from typing import Any, Optional

import keras
import tensorflow as tf
from keras import backend as K  # noqa: F401

from horovod_compat.tensorflow import (Average, Compression, ProcessSet,  # noqa: F401
                                       Sum, add_process_set, ccl_built, cross_rank,
                                       cross_size, cuda_built, ddl_built,
                                       global_process_set, gloo_built, gloo_enabled, init,
                                       is_initialized, local_rank, local_size, mpi_built,
                                       mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                       remove_process_set, rocm_built, shutdown, size,
                                       start_timeline, stop_timeline, sycl_built)
from horovod_compat import tensorflow as _hvd
from horovod_compat import _keras
from horovod_compat.tensorflow.keras import callbacks, elastic  # noqa: F401
from horovod_compat.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, device_dense: str = "",
                         device_sparse: str = "", compression: type = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: int = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wraps a Keras optimizer so that gradients are averaged across ranks before each update."""
    if gradient_predivide_factor != 1.0 and rocm_built():
        raise ValueError("gradient_predivide_factor not supported yet with ROCm")
    groups = _keras.check_op(op, gradient_predivide_factor, num_groups, groups)
    return _keras.create_distributed_optimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)


def broadcast_global_variables(root_rank: int) -> Any:
    return _hvd.broadcast_global_variables(root_rank)


def allreduce(value: Any, name: Optional[str] = None, average: Optional[bool] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: Optional[int] = None, compression: type = Compression.none) -> Any:
    return _keras._value_helper(_hvd.allreduce, value, name, average=average,
                                prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, op=op,
                                compression=compression)


def allgather(value: Any, name: Optional[str] = None) -> Any:
    return _keras._value_helper(_hvd.allgather, value, name)


def broadcast(value: Any, root_rank: int, name: Optional[str] = None) -> Any:
    return _keras._value_helper(_hvd.broadcast, value, name, root_rank)


def reducescatter(value: Any, name: Optional[str] = None, op: int = Average) -> Any:
    return _keras._value_helper(_hvd.reducescatter, value, name, op=op)


def load_model(filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None,
               compression: type = Compression.none, legacy_opts: bool = False) -> Any:
    """Loads a ``.keras`` or ``.h5`` model; its optimizer comes back as a DistributedOptimizer
    (gradients compressed with ``compression``). ``custom_optimizers``: optimizer classes
    outside ``keras.optimizers`` to wrap as well. Files saved by tf_keras load with tf_keras
    (``legacy_opts=True`` then wraps ``tf_keras.optimizers.legacy`` optimizers); for Keras 3
    files ``legacy_opts=True`` is rejected: Keras 3 has no legacy optimizers."""
    return _keras.load_model(filepath, custom_optimizers, custom_objects, compression,
                             legacy_opts)
