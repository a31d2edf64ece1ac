"""Cross-device reductions of HorovodStrategy, run by the horovod_compat runtime.

Each process holds one replica, so every reduction is a reduction across processes: dense tensors
go through one grouped allreduce per dtype (fused and negotiated as a unit by the runtime),
IndexedSlices through allgather of their values and indices (unless ``sparse_as_dense``), gathers
through allgather.
"""

from typing import Any, Dict, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute import device_util, distribute_utils, reduce_util
from tensorflow.python.distribute import values as value_lib

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.compression import Compression
from horovod_compat.tensorflow.reductions import grouped_allreduce

# Dtypes the runtime's broadcast/allgather carry; others travel bit-cast to a same-size integer.
_BROADCAST_DTYPES = {tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
                     tf.float32, tf.float64, tf.bool, tf.bfloat16}
_BITCAST_BY_SIZE = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}


def _horovod_op(reduce_op: reduce_util.ReduceOp) -> int:
    if isinstance(reduce_op, tf.VariableAggregation):
        reduce_op = reduce_util.ReduceOp.from_variable_aggregation(reduce_op)
    elif isinstance(reduce_op, str):
        reduce_op = reduce_util.ReduceOp(reduce_op.upper())
    return mpi_ops.Average if reduce_op == reduce_util.ReduceOp.MEAN else mpi_ops.Sum


def _local_value(value: Any) -> Any:
    """The one local component of a per-replica value (or the value itself)."""
    if isinstance(value, value_lib.DistributedValues):
        components = value.values
        if len(components) != 1:
            raise ValueError(f"HorovodStrategy holds one replica per process; got a value with "
                             f"{len(components)} components.")
        value = components[0]
    if isinstance(value, tf.IndexedSlices):
        return value
    return tf.convert_to_tensor(value)


def broadcast_from_rank0(tensor: tf.Tensor, name: str = None) -> tf.Tensor:
    """rank 0's value of ``tensor``; dtypes the runtime does not carry are sent bit-cast."""
    if mpi_ops.size() == 1:
        return tensor
    dtype = tensor.dtype
    if dtype in _BROADCAST_DTYPES:
        return mpi_ops.broadcast(tensor, root_rank=0, name=name)
    carrier = _BITCAST_BY_SIZE.get(dtype.size) if dtype.is_numpy_compatible else None
    if carrier is None or dtype == tf.string:
        raise TypeError(f"HorovodStrategy cannot broadcast initial values of dtype {dtype.name}")
    sent = mpi_ops.broadcast(tf.bitcast(tensor, carrier), root_rank=0, name=name)
    return tf.bitcast(sent, dtype)


class HorovodCrossDeviceOps(cross_device_ops_lib.CrossDeviceOps):
    """tf.distribute cross-device ops whose "devices" are the processes of a Horovod job."""

    def __init__(self, device: str, sparse_as_dense: bool = False,
                 compression: type = Compression.none) -> None:
        super().__init__()
        self._device = device_util.canonicalize(device)
        self._sparse_as_dense = sparse_as_dense
        self._compression = compression

    @property
    def _num_between_graph_workers(self) -> int:
        # Reporting the job size keeps CrossDeviceOps from taking its one-device shortcut
        # (which returns the local value unreduced) whenever more than one process runs.
        return mpi_ops.size()

    # -- reductions -------------------------------------------------------------------------

    def all_reduce_list(self, reduce_op: Any, tensors: Sequence[Any]) -> List[Any]:
        """Reduces local tensors across processes; one grouped call per dtype, input order kept."""
        op = _horovod_op(reduce_op)
        results: List[Any] = [None] * len(tensors)
        groups: Dict[Tuple[str, ...], List[int]] = {}
        tensors = list(tensors)
        for i, t in enumerate(tensors):
            if isinstance(t, tf.IndexedSlices):
                if self._sparse_as_dense:
                    tensors[i] = t = tf.convert_to_tensor(t)
                    key = ("dense", t.dtype.name)
                else:
                    key = ("sparse", t.values.dtype.name, t.indices.dtype.name)
            else:
                key = ("dense", t.dtype.name)
            groups.setdefault(key, []).append(i)
        with tf.device(self._device):
            for key, members in groups.items():
                group = [tensors[i] for i in members]
                if key[0] == "dense":
                    reduced = grouped_allreduce(group, op=op, compression=self._compression)
                else:
                    reduced = grouped_allreduce(group, op=op)
                for i, r in zip(members, reduced):
                    results[i] = r
        return results

    def _to_destinations(self, result: Any, destinations: Any) -> Any:
        devices = cross_device_ops_lib.get_devices_from(destinations, self._canonicalize_devices)
        copies = []
        for d in devices:
            if d == self._device or isinstance(result, tf.IndexedSlices):
                copies.append(result)
            else:
                with tf.device(d):
                    copies.append(tf.identity(result))
        return distribute_utils.regroup(tuple(copies), wrap_class=value_lib.Mirrored)

    def reduce_implementation(self, reduce_op: Any, per_replica_value: Any, destinations: Any,
                              options: Any) -> Any:
        del options
        reduced = self.all_reduce_list(reduce_op, [_local_value(per_replica_value)])[0]
        return self._to_destinations(reduced, destinations)

    def batch_reduce_implementation(self, reduce_op: Any, value_destination_pairs: Any,
                                    options: Any) -> List[Any]:
        del options
        reduced = self.all_reduce_list(reduce_op,
                                       [_local_value(v) for v, _ in value_destination_pairs])
        return [self._to_destinations(r, d) for r, (_, d) in zip(reduced, value_destination_pairs)]

    def _all_reduce(self, reduce_op: Any, value: Any, replica_id: int, options: Any) -> Any:
        """Replica-context all-reduce of a nested structure (used when merge_call is off)."""
        del replica_id, options
        flat = tf.nest.flatten(value, expand_composites=False)
        reduced = self.all_reduce_list(reduce_op, [_local_value(v) for v in flat])
        return tf.nest.pack_sequence_as(value, reduced)

    # -- gather -------------------------------------------------------------------------------

    def gather_local(self, tensor: Any, axis: int) -> tf.Tensor:
        """Concatenates every process's ``tensor`` along ``axis``, in rank order."""
        tensor = tf.convert_to_tensor(tensor)
        rank = tensor.shape.rank
        if rank == 0:
            raise ValueError("gather needs tensors of rank >= 1 (got a scalar)")
        if rank is not None:
            axis = axis % rank
        with tf.device(self._device):
            if axis == 0:
                return mpi_ops.allgather(tensor)
            perm = [axis] + [i for i in range(rank) if i != axis]
            inverse = [perm.index(i) for i in range(rank)]
            gathered = mpi_ops.allgather(tf.transpose(tensor, perm))
            return tf.transpose(gathered, inverse)

    def _gather_implementation(self, per_replica_value: Any, destinations: Any, axis: int,
                               options: Any) -> Any:
        del options
        local = _local_value(per_replica_value)
        if isinstance(local, tf.IndexedSlices):
            raise NotImplementedError("gather does not support IndexedSlices")
        return self._to_destinations(self.gather_local(local, axis), destinations)

    def __deepcopy__(self, memo: Any) -> "HorovodCrossDeviceOps":
        return HorovodCrossDeviceOps(self._device, self._sparse_as_dense, self._compression)
