"""horovod_compat.tensorflow: Horovod 0.28.1's TensorFlow API.

Use it as ``import horovod_compat.tensorflow as hvd``: hvd.init(), hvd.rank(), hvd.size(),
the collectives (allreduce, allgather, broadcast, alltoall, reducescatter, their grouped forms),
DistributedOptimizer, DistributedGradientTape, BroadcastGlobalVariablesHook and the variable and
object helpers.
"""

import os  # noqa: F401  (Horovod's namespace has it)
import warnings  # noqa: F401

import tensorflow as tf  # noqa: F401

from horovod_compat import __version__  # noqa: F401
from horovod_compat.common.util import check_extension, gpu_available, split_list  # noqa: F401
from horovod_compat.tensorflow import (compression, functions, mpi_ops, util,  # noqa: F401
                                       gradient_aggregation, gradient_aggregation_eager)
from horovod_compat.tensorflow.mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ProcessSet, Sum, _allreduce, _grouped_allreduce,
    _grouped_reducescatter, _reducescatter, add_process_set, allgather, alltoall, barrier,
    broadcast, broadcast_, ccl_built, check_num_rank_power_of_2, cross_rank, cross_size,
    cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, grouped_allgather,
    handle_average_backwards_compatibility, init, is_homogeneous, is_initialized, join,
    local_rank, local_rank_op, local_size, local_size_op, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, process_set_included_op, rank, rank_op,
    remove_process_set, rocm_built, shutdown, size, size_op, start_timeline, stop_timeline,
    sycl_built)
from horovod_compat.tensorflow.reductions import (allreduce, grouped_allreduce,  # noqa: F401
                                                  grouped_reducescatter, reducescatter)
from horovod_compat.tensorflow.compression import Compression  # noqa: F401
from horovod_compat.tensorflow.functions import (allgather_object,  # noqa: F401
                                                 broadcast_global_variables, broadcast_object,
                                                 broadcast_object_fn, broadcast_variables)
from horovod_compat.tensorflow.util import (_cache, _executing_eagerly,  # noqa: F401
                                            _make_subgraph, refs_to_vars, vars_to_refs)
from horovod_compat.tensorflow.allreduce_grads import (  # noqa: F401
    _allreduce_cond, _grouped_allreduce_cond, _make_allreduce_grads_fn,
    _make_cached_allreduce_grads_fn)
from horovod_compat.tensorflow.gradient_aggregation import (  # noqa: F401
    LocalGradientAggregationHelper)
from horovod_compat.tensorflow.gradient_aggregation_eager import (  # noqa: F401
    LocalGradientAggregationHelperEager)
from horovod_compat.tensorflow.optimizer import DistributedOptimizer  # noqa: F401
from horovod_compat.tensorflow.optimizer import _LegacyOptimizer  # noqa: F401
from horovod_compat.tensorflow.tape import (DistributedGradientTape,  # noqa: F401
                                            PartialDistributedGradientTape,
                                            _DistributedGradientTape)
from horovod_compat.tensorflow.hooks import (BroadcastGlobalVariablesHook,  # noqa: F401
                                             _SessionRunHook)
from horovod_compat.tensorflow import elastic  # noqa: F401

if _LegacyOptimizer is not None:
    from horovod_compat.tensorflow.optimizer import (  # noqa: F401
        _DistributedAdasumOptimizer, _DistributedOptimizer)

_IS_TF2 = True
_global_variables = tf.compat.v1.global_variables
_get_default_graph = tf.compat.v1.get_default_graph


def _check_has_gpu() -> bool:
    return mpi_ops._check_has_gpu()


# SyncBatchNormalization lives with the Keras integration; import it when that module exists.
import importlib.util as _importlib_util  # noqa: E402

if _importlib_util.find_spec("horovod_compat.tensorflow.sync_batch_norm") is not None:
    from horovod_compat.tensorflow import sync_batch_norm  # noqa: F401
    from horovod_compat.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401

# tf.distribute on the runtime (hvd.distribute.HorovodStrategy).
from horovod_compat.tensorflow import distribute  # noqa: E402,F401
