"""HorovodStrategy: a tf.distribute.Strategy with one replica per process, on our runtime.

The extended object reuses TensorFlow's multi-worker (collective all-reduce) machinery for what
it does well -- input distribution with per-worker sharding, the worker/chief bookkeeping Keras
reads, replica contexts, merge_call -- but is built with an empty cluster spec (so no gRPC server
starts) and takes the worker count, index and chief flag from the runtime. Every cross-process
reduction, gather and initial-value broadcast goes through horovod_compat's collectives.
"""

import contextlib
import threading
import weakref
from typing import Any, Iterator, Optional, Tuple

import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy as collective_lib
from tensorflow.python.distribute import collective_util, cross_device_utils, device_util
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import distribute_lib, mirrored_strategy, multi_worker_util
from tensorflow.python.distribute import numpy_dataset
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.distribute.cluster_resolver import cluster_resolver as resolver_lib
from tensorflow.python.distribute.cluster_resolver import tfconfig_cluster_resolver
from tensorflow.python.trackable import base as trackable_base

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.compression import Compression
from horovod_compat.tensorflow.distribute import keras_support, sync_on_read
from horovod_compat.tensorflow.distribute.cross_device_ops import (HorovodCrossDeviceOps,
                                                                   _horovod_op,
                                                                   broadcast_from_rank0)

_SUPPORTED_JOBS = ("chief", "worker")


def _rank_and_size_from_cluster(resolver: resolver_lib.ClusterResolver
                                ) -> Optional[Tuple[int, int]]:
    """(rank, size) the cluster spec implies: chief first, then workers by index (MWMS order).

    None when the resolver has no cluster spec (nothing to agree with)."""
    spec = resolver.cluster_spec()
    jobs = spec.as_dict()
    if not jobs:
        return None
    others = sorted(job for job in jobs if job not in _SUPPORTED_JOBS)
    if others:
        raise ValueError(
            f"HorovodStrategy runs chief and worker tasks only; the cluster also has "
            f"{others} tasks. Parameter servers (parameter-server style variables) and "
            f"evaluator tasks are not supported: start only the chief/worker tasks, or use "
            f"tf.distribute.experimental.ParameterServerStrategy for that layout.")
    spec = multi_worker_util.normalize_cluster_spec(spec)
    ordered = [(job, index) for job in _SUPPORTED_JOBS if job in spec.jobs
               for index in sorted(spec.task_indices(job))]
    task = (resolver.task_type, resolver.task_id)
    if task not in ordered:
        raise ValueError(f"HorovodStrategy: this task ({task[0]}, {task[1]}) is not in the "
                         f"cluster spec {jobs}")
    return ordered.index(task), len(ordered)


def _check_cluster_agrees(resolver: resolver_lib.ClusterResolver, source: str) -> None:
    expected = _rank_and_size_from_cluster(resolver)
    if expected is None:
        return
    rank, size = mpi_ops.rank(), mpi_ops.size()
    if expected != (rank, size):
        raise ValueError(
            f"HorovodStrategy: {source} says this process is rank {expected[0]} of "
            f"{expected[1]} (chief first, then workers by index), but the horovod_compat "
            f"runtime says rank {rank} of {size}. Launch every chief/worker task of that "
            f"cluster (and nothing else), or drop the cluster description.")


def _local_device(resolver: Optional[resolver_lib.ClusterResolver]) -> str:
    """The one device of this process's replica (GPU:0 when a GPU is visible, else CPU:0)."""
    if resolver is not None and not isinstance(resolver,
                                               tfconfig_cluster_resolver.TFConfigClusterResolver):
        try:
            accelerators = resolver.num_accelerators()
        except Exception:  # a resolver that cannot count: rely on the visible devices
            accelerators = {}
        if accelerators and max(accelerators.values()) > 1:
            raise ValueError(
                f"HorovodStrategy runs one replica (one device) per process; the cluster "
                f"resolver reports {accelerators} per task. Start one process per device.")
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        raise ValueError(
            f"HorovodStrategy runs one replica (one device) per process, but this process sees "
            f"{len(gpus)} GPUs. Start one process per GPU and make only its own GPU visible "
            f"before creating the strategy, e.g. tf.config.set_visible_devices("
            f"tf.config.list_physical_devices('GPU')[hvd.local_rank()], 'GPU').")
    return "/device:GPU:0" if gpus else "/device:CPU:0"


class HorovodExtended(collective_lib.CollectiveAllReduceExtended):
    """The strategy's implementation: one local device, workers = the runtime's ranks."""

    # No gRPC peers to watch: a dead rank is the runtime's business.
    _enable_check_health = False

    def __init__(self, container_strategy: "HorovodStrategy",
                 cluster_resolver: resolver_lib.ClusterResolver,
                 communication_options: collective_util.Options, device: str,
                 sparse_as_dense: bool, compression: type) -> None:
        # CollectiveAllReduceExtended.__init__ would read TF_CONFIG and start a server;
        # this sets up the same state for a one-device worker of a Horovod job instead.
        distribute_lib.StrategyExtendedV1.__init__(self, container_strategy)
        self._cluster_resolver = cluster_resolver
        self._communication_options = communication_options
        self._collective_key_base = 0
        self._num_workers = mpi_ops.size()
        self._id_in_cluster = mpi_ops.rank()
        self._is_chief = self._id_in_cluster == 0
        self._worker_device = device_util.canonicalize("/device:CPU:0")
        self._host_input_device = numpy_dataset.SingleDevice(self._worker_device)
        self._collective_keys = cross_device_utils.CollectiveKeys(group_key_start=1)
        self._device = device
        self._cross_device_ops = HorovodCrossDeviceOps(device, sparse_as_dense=sparse_as_dense,
                                                       compression=compression)
        self._host_cross_device_ops = self._cross_device_ops
        mirrored_strategy.MirroredExtended._initialize_single_worker(self, (device,))
        self._cluster_spec = None
        # Keras' checkpoint helpers read these (non-chief workers write to temporary dirs).
        self._task_type = "worker"
        self._task_id = self._id_in_cluster
        self._local_or_standalone_client_mode = True
        self._num_devices_per_worker = 1
        self._local_device_type = "GPU" if "GPU" in device.upper() else "CPU"
        self._rpc_layer = None
        self._cfer_fn_cache = weakref.WeakKeyDictionary()
        self.experimental_enable_get_next_as_optional = True
        self._local_reductions = threading.local()

    def _get_variable_creator_initial_value(self, replica_id: int, device: str,
                                            primary_var: Any, **kwargs: Any) -> Any:
        if replica_id != 0:  # never: one replica per process
            raise ValueError("HorovodStrategy has one replica per process")

        def initial_value_fn() -> tf.Tensor:
            with tf.device(device):
                initial_value = kwargs["initial_value"]
                if callable(initial_value):
                    initial_value = initial_value()
                if isinstance(initial_value, trackable_base.CheckpointInitialValue):
                    initial_value = initial_value.wrapped_value
                initial_value = tf.convert_to_tensor(initial_value, dtype=kwargs.get("dtype"))
                # Every rank starts from rank 0's value: variables created in scope must be
                # created on every rank, in the same order.
                return broadcast_from_rank0(initial_value)

        return initial_value_fn

    @contextlib.contextmanager
    def local_reductions(self) -> Iterator[None]:
        """Within this block (this thread only), reductions return the local value unreduced.

        For Keras 3's model build, which reduces a data batch only to learn its structure."""
        self._local_reductions.active = True
        try:
            yield
        finally:
            self._local_reductions.active = False

    def _reduce_to(self, reduce_op: Any, value: Any, destinations: Any, options: Any) -> Any:
        if getattr(self._local_reductions, "active", False):
            return tf.nest.map_structure(
                lambda v: v.values[0] if isinstance(v, values_lib.DistributedValues) else v,
                value)
        if isinstance(value, values_lib.DistributedVariable) and \
                distribute_utils.is_sync_on_read(value):
            # A SyncOnRead variable read outside strategy.run (metric.result()): every rank
            # must read it; eagerly, a rank left alone fails after the read deadline.
            reduced = sync_on_read.reduce_sync_on_read(
                value, _horovod_op(reduce_op), self._device,
                sync_on_read.read_deadline(self._communication_options))
            return self._cross_device_ops._to_destinations(  # pylint: disable=protected-access
                reduced, destinations)
        # The collective extended class reduces one value; strategy.reduce may pass a nested
        # structure (Keras reduces a whole (x, y) batch), so map over it.
        reduce_one = super()._reduce_to
        return tf.nest.map_structure(
            lambda v: reduce_one(reduce_op, v, destinations, options), value)

    def _configure(self, session_config: Any = None, cluster_spec: Any = None,
                   task_type: Any = None, task_id: Any = None) -> None:
        if cluster_spec:
            raise ValueError("HorovodStrategy takes its cluster from the runtime; "
                             "configure(cluster_spec=...) is not supported")
        if session_config:
            session_config.CopyFrom(self._update_config_proto(session_config))

    def _update_config_proto(self, config_proto: Any) -> Any:
        return mirrored_strategy.MirroredExtended._update_config_proto(self, config_proto)

    def __deepcopy__(self, memo: Any) -> Any:
        raise ValueError("HorovodStrategy cannot be deep-copied")


class HorovodStrategy(distribute_lib.Strategy):
    """A ``tf.distribute.Strategy`` with one replica per process, reducing through horovod_compat.

    Drop-in for ``tf.distribute.MultiWorkerMirroredStrategy()`` in scripts launched with
    ``mpirun``, ``horovodrun`` or a ``TF_CONFIG`` cluster: no gRPC server, gradients summed over
    all processes by the runtime (grouped per dtype), variables created in ``scope()`` start
    from rank 0's values, ``num_replicas_in_sync == hvd.size()``.

    Args:
      cluster_resolver: optional ``tf.distribute.cluster_resolver.ClusterResolver``; when given
        (or when ``TF_CONFIG`` describes a cluster) it must agree with the runtime's rank and
        size.
      communication_options: optional ``tf.distribute.experimental.CommunicationOptions``
        (accepted for compatibility; the runtime's own settings decide how data moves).
      sparse_as_dense: reduce ``IndexedSlices`` gradients as dense tensors instead of
        allgathering their rows.
      compression: ``hvd.Compression.none`` or ``hvd.Compression.fp16`` for dense reductions.
    """

    # How keras_support recognises this strategy without importing this module (which imports it).
    _horovod_compat_strategy = True

    def __init__(self, cluster_resolver: Optional[resolver_lib.ClusterResolver] = None,
                 communication_options: Optional[collective_util.Options] = None, *,
                 sparse_as_dense: bool = False,
                 compression: type = Compression.none) -> None:
        if communication_options is None:
            communication_options = collective_util.Options()
        if not isinstance(communication_options, collective_util.Options):
            raise ValueError("communication_options must be a "
                             "tf.distribute.experimental.CommunicationOptions")
        if cluster_resolver is not None and not isinstance(cluster_resolver,
                                                           resolver_lib.ClusterResolver):
            raise ValueError("cluster_resolver must be a "
                             "tf.distribute.cluster_resolver.ClusterResolver")
        if not mpi_ops.is_initialized():
            mpi_ops.init()
        if cluster_resolver is not None:
            _check_cluster_agrees(cluster_resolver, "the cluster_resolver")
        else:
            tf_config = tfconfig_cluster_resolver.TFConfigClusterResolver()
            _check_cluster_agrees(tf_config, "TF_CONFIG")
            cluster_resolver = tf_config
        device = _local_device(cluster_resolver)
        super().__init__(HorovodExtended(self, cluster_resolver, communication_options, device,
                                         sparse_as_dense, compression))
        keras_support.install()

    @property
    def cluster_resolver(self) -> resolver_lib.ClusterResolver:
        return self.extended._cluster_resolver  # pylint: disable=protected-access

    def scope(self) -> Any:
        keras_support.install()  # Keras may have been imported after the strategy was made
        return super().scope()
