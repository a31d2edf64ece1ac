"""TensorFlow collective ops: loading the op library, the op wrappers and their gradients."""

import os
import re
from typing import Any, List, Optional, Sequence, Tuple, Union

import tensorflow as tf
from tensorflow.python.framework import ops

from horovod_compat.common.basics import HorovodBasics as _HorovodBasics
from horovod_compat.common import process_sets as _ps
from horovod_compat.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                                global_process_set, remove_process_set,
                                                _temp_process_set_object)
from horovod_compat.common.util import (check_extension, check_installed_version,
                                        get_average_backwards_compatibility_fun, get_ext_suffix,
                                        num_rank_is_power_2)
from horovod_compat.tensorflow import peer_lost as _peer_lost
from horovod_compat.tensorflow.util import _executing_eagerly

check_extension("horovod_compat.tensorflow", "HOROVOD_WITH_TENSORFLOW", __file__, "mpi_lib")


def _load_library(name: str) -> Any:
    """Loads the op library, turning a TensorFlow version change into a clear error."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + get_ext_suffix())
    try:
        library = tf.load_op_library(path)
    except Exception as e:  # noqa: BLE001 - any load failure is reported the same way
        check_installed_version("tensorflow", tf.__version__, e)
        raise
    check_installed_version("tensorflow", tf.__version__)
    return library


MPI_LIB = _load_library("mpi_lib")
_peer_lost.install()  # a lost peer raises HorovodInternalError (peer_lost.py)

# The collective ops are stateful (so grappler never constant-folds or merges them); tell
# tf.function's automatic control dependencies that their order does not matter, as TF does for
# its own collectives, so that they run concurrently and the runtime can fuse them.
_COLLECTIVE_OP_TYPES = frozenset((
    "HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather", "HorovodGroupedAllgather",
    "HorovodBroadcast", "HorovodAlltoall", "HorovodReducescatter", "HorovodGroupedReducescatter"))


def _register_order_insensitive_ops() -> None:
    from tensorflow.python.framework import auto_control_deps
    current = getattr(auto_control_deps, "ASYNC_STATEFUL_OPS", None)
    if current is not None and not _COLLECTIVE_OP_TYPES <= current:
        auto_control_deps.ASYNC_STATEFUL_OPS = frozenset(current) | _COLLECTIVE_OP_TYPES


_register_order_insensitive_ops()

_basics = _HorovodBasics()
_ps._setup(_basics)

init = _basics.init
shutdown = _basics.shutdown
is_initialized = _basics.is_initialized
start_timeline = _basics.start_timeline
stop_timeline = _basics.stop_timeline
size = _basics.size
local_size = _basics.local_size
cross_size = _basics.cross_size
rank = _basics.rank
local_rank = _basics.local_rank
cross_rank = _basics.cross_rank
is_homogeneous = _basics.is_homogeneous
mpi_threads_supported = _basics.mpi_threads_supported
mpi_enabled = _basics.mpi_enabled
mpi_built = _basics.mpi_built
gloo_enabled = _basics.gloo_enabled
gloo_built = _basics.gloo_built
nccl_built = _basics.nccl_built
ddl_built = _basics.ddl_built
ccl_built = _basics.ccl_built
cuda_built = _basics.cuda_built
rocm_built = _basics.rocm_built
sycl_built = _basics.sycl_built

Average = _basics.Average
Sum = _basics.Sum
Adasum = _basics.Adasum
Min = _basics.Min
Max = _basics.Max
Product = _basics.Product

handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_basics)
check_num_rank_power_of_2 = num_rank_is_power_2

_ADASUM_MESSAGE = ("Adasum is not supported by horovod_compat yet; use op=hvd.Average or "
                   "op=hvd.Sum.")


def _check_has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def _normalize_name(name: str) -> str:
    """Replaces every character outside [A-Za-z0-9_] with '_' (TF op names are restricted)."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _auto_name(prefix: str, tensor: Any) -> Optional[str]:
    """Graph mode: <prefix>_<normalized input name>. Eager: None (TF's default node name)."""
    if _executing_eagerly():
        return None
    return f"{prefix}_{_normalize_name(tensor.name)}"


def _auto_group_name(prefix: str, tensors: Sequence[Any]) -> Optional[str]:
    if _executing_eagerly():
        return None
    return f"{prefix}_{_normalize_name(tensors[0].name)}_{_normalize_name(tensors[-1].name)}"


def _process_set_id(process_set: ProcessSet) -> int:
    """The set's id, checked now: unknown ids and use before init raise ValueError."""
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered; register it with "
                         "hvd.init(process_sets=[...]) or hvd.add_process_set().")
    process_set.size()
    return process_set.process_set_id


def _set_size(process_set: ProcessSet, dtype: tf.DType) -> Any:
    """The set size for divisions made in Python (read at run time in elastic mode)."""
    if os.environ.get("HOROVOD_ELASTIC", "0") == "1":
        return tf.cast(size_op(process_set_id=process_set.process_set_id), dtype)
    return tf.cast(process_set.size(), dtype)


def _dtype_of(tensor: Any) -> tf.DType:
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:
        dtype = tf.convert_to_tensor(tensor).dtype
    return tf.as_dtype(dtype)


def _per_dtype(call: Any, tensors: Sequence[Any], name: Optional[str]) -> List[Any]:
    """``call(part, part_name)`` once per dtype among ``tensors`` (a grouped op takes a single
    dtype), results back in input order. One dtype: one call with ``name`` unchanged; several:
    ``name`` gets the dtype as suffix, and unnamed parts are auto-named from their own tensors."""
    tensors = list(tensors)
    dtypes = [_dtype_of(t) for t in tensors]
    distinct = list(dict.fromkeys(dtypes))
    if len(distinct) <= 1:
        return call(tensors, name)
    results: List[Any] = [None] * len(tensors)
    for dtype in distinct:
        positions = [i for i, d in enumerate(dtypes) if d == dtype]
        part_name = None if name is None else f"{name}_{dtype.name}"
        for i, result in zip(positions, call([tensors[i] for i in positions], part_name)):
            results[i] = result
    return results


# -- collectives --------------------------------------------------------------------------------

def _allreduce(tensor: Any, name: Optional[str] = None, op: int = Sum,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               ignore_name_scope: bool = False,
               process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Raw allreduce (default op Sum), without compression or sparse handling."""
    if op == Adasum:
        raise NotImplementedError(_ADASUM_MESSAGE)
    process_set_id = _process_set_id(process_set)
    if name is None:
        name = _auto_name("HorovodAllreduce", tensor)
    return MPI_LIB.horovod_allreduce(tensor, name=name, reduce_op=op,
                                     prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor,
                                     ignore_name_scope=ignore_name_scope,
                                     process_set_id=process_set_id)


def _grouped_allreduce(tensors: Sequence[Any], name: Optional[str] = None, op: int = Sum,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       ignore_name_scope: bool = False,
                       process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Raw grouped allreduce: one op per dtype, each negotiated as a unit."""
    if op == Adasum:
        raise NotImplementedError(_ADASUM_MESSAGE)
    process_set_id = _process_set_id(process_set)

    def one_dtype(part: List[Any], part_name: Optional[str]) -> List[tf.Tensor]:
        if part_name is None:
            part_name = _auto_group_name("HorovodGroupedAllreduce", part)
        return MPI_LIB.horovod_grouped_allreduce(part, name=part_name, reduce_op=op,
                                                 prescale_factor=prescale_factor,
                                                 postscale_factor=postscale_factor,
                                                 ignore_name_scope=ignore_name_scope,
                                                 process_set_id=process_set_id)

    return _per_dtype(one_dtype, tensors, name)


def allgather(tensor: Any, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenates ``tensor`` from every rank of the set along dimension 0, in rank order.

    The first dimension may differ between ranks; the others must match.
    """
    process_set_id = _process_set_id(process_set)
    if name is None:
        name = _auto_name("HorovodAllgather", tensor)
    return MPI_LIB.horovod_allgather(tensor, name=name, ignore_name_scope=ignore_name_scope,
                                     process_set_id=process_set_id)


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """allgather of each tensor, negotiated as one group per dtype (Horovod accepts a single
    dtype per call)."""
    process_set_id = _process_set_id(process_set)

    def one_dtype(part: List[Any], part_name: Optional[str]) -> List[tf.Tensor]:
        if part_name is None:
            part_name = _auto_group_name("HorovodGroupedAllgather", part)
        return MPI_LIB.horovod_grouped_allgather(part, name=part_name,
                                                 ignore_name_scope=ignore_name_scope,
                                                 process_set_id=process_set_id)

    return _per_dtype(one_dtype, tensors, name)


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Returns ``root_rank``'s value of ``tensor`` (root_rank is a global rank)."""
    process_set_id = _process_set_id(process_set)
    if name is None:
        name = _auto_name("HorovodBroadcast", tensor)
    return MPI_LIB.horovod_broadcast(tensor, name=name, root_rank=root_rank,
                                     ignore_name_scope=ignore_name_scope,
                                     process_set_id=process_set_id)


def _is_resource_variable(var: Any) -> bool:
    handle = getattr(var, "handle", None)
    return handle is not None and getattr(handle, "dtype", None) == tf.resource


def _is_ref_variable(var: Any) -> bool:
    return hasattr(var, "_ref") and not _is_resource_variable(var)


def _variable_keys(variables: Sequence[Any]) -> List[str]:
    """Per-variable key suffixes: the variable's path/name, made unique within the op."""
    keys = []
    seen = {}
    for var in variables:
        key = getattr(var, "path", None) or var.name
        key = _normalize_name(key)
        count = seen.get(key, 0)
        seen[key] = count + 1
        keys.append(key if count == 0 else f"{key}_{count}")
    return keys


def broadcast_(variables: Sequence[Any], root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> Any:
    """Overwrites ``variables`` in place with ``root_rank``'s values.

    Resource variables (TF2, Keras): returns their new values. TF1 reference variables: returns
    the updated references. Mixing both kinds raises ValueError.
    """
    variables = list(variables)
    process_set_id = _process_set_id(process_set)
    if not variables:
        return []
    if all(_is_resource_variable(v) for v in variables):
        op = MPI_LIB.horovod_broadcast_inplace_resource(
            [v.handle for v in variables], root_rank=root_rank, process_set_id=process_set_id,
            variable_names=_variable_keys(variables),
            name=name or (None if _executing_eagerly() else "HorovodBroadcastInplaceResource"))
        with tf.control_dependencies([op] if op is not None else []):
            return [v.read_value() if hasattr(v, "read_value") else tf.identity(v.value)
                    for v in variables]
    if all(_is_ref_variable(v) for v in variables):
        return MPI_LIB.horovod_broadcast_inplace(
            [v._ref() for v in variables], root_rank=root_rank, process_set_id=process_set_id,
            variable_names=_variable_keys(variables),
            name=name or (None if _executing_eagerly() else "HorovodBroadcastInplace"))
    raise ValueError("broadcast_() needs all variables to be resource variables or all to be "
                     "reference variables, not a mix.")


def alltoall(tensor: Any, splits: Any = None, name: Optional[str] = None,
             ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Union[tf.Tensor, Tuple[Any, Any]]:
    """Sends ``splits[i]`` rows of ``tensor`` to set rank i and concatenates what arrives.

    Without splits dimension 0 is divided evenly and only the output is returned; with splits
    the result is ``(output, received_splits)``.
    """
    process_set_id = _process_set_id(process_set)
    if splits is None:
        splits_tensor = tf.constant([], dtype=tf.int32)
    elif isinstance(splits, (list, tuple)):
        splits_tensor = tf.convert_to_tensor(splits, dtype=tf.int32)
    else:
        splits_tensor = tf.convert_to_tensor(splits)
    if name is None:
        name = _auto_name("HorovodAlltoall", tensor)
    output, received_splits = MPI_LIB.horovod_alltoall(tensor, splits=splits_tensor, name=name,
                                                       ignore_name_scope=ignore_name_scope,
                                                       process_set_id=process_set_id)
    if splits is None:
        return output
    return output, received_splits


def _reducescatter(tensor: Any, name: Optional[str] = None, op: int = Sum,
                   ignore_name_scope: bool = False,
                   process_set: ProcessSet = global_process_set,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Raw reducescatter (default op Sum)."""
    process_set_id = _process_set_id(process_set)
    if name is None:
        name = _auto_name("HorovodReducescatter", tensor)
    return MPI_LIB.horovod_reducescatter(tensor, name=name, reduce_op=op,
                                         ignore_name_scope=ignore_name_scope,
                                         prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor,
                                         process_set_id=process_set_id)


def _grouped_reducescatter(tensors: Sequence[Any], name: Optional[str] = None, op: int = Sum,
                           ignore_name_scope: bool = False,
                           process_set: ProcessSet = global_process_set,
                           prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0) -> List[tf.Tensor]:
    """Raw grouped reducescatter (default op Sum), one op per dtype."""
    process_set_id = _process_set_id(process_set)

    def one_dtype(part: List[Any], part_name: Optional[str]) -> List[tf.Tensor]:
        if part_name is None:
            part_name = _auto_group_name("HorovodGroupedReducescatter", part)
        return MPI_LIB.horovod_grouped_reducescatter(part, name=part_name, reduce_op=op,
                                                     ignore_name_scope=ignore_name_scope,
                                                     prescale_factor=prescale_factor,
                                                     postscale_factor=postscale_factor,
                                                     process_set_id=process_set_id)

    return _per_dtype(one_dtype, tensors, name)


def join() -> tf.Tensor:
    """Marks this rank as out of data; returns the last rank that joined (int32 scalar).

    Until every rank has joined, joined ranks contribute zeros to the others' allreduces.
    """
    return MPI_LIB.horovod_join()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Blocks until every rank of ``process_set`` has called barrier() (not in Horovod's TF API)."""
    _basics._barrier(_process_set_id(process_set), "barrier")


# -- runtime-valued ops -------------------------------------------------------------------------

def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The size of the process set, read when the op runs (int32 scalar)."""
    return MPI_LIB.horovod_size(process_set_id=process_set_id, name=name)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """1 if this rank is in the set, 0 if not, a negative error code otherwise (int32)."""
    return MPI_LIB.horovod_process_set_included(process_set_id=process_set_id, name=name)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks on this node, read when the op runs (int32 scalar)."""
    return MPI_LIB.horovod_local_size(name=name)


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's global rank, read when the op runs (int32 scalar)."""
    return MPI_LIB.horovod_rank(name=name)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its node, read when the op runs (int32 scalar)."""
    return MPI_LIB.horovod_local_rank(name=name)


# -- gradients ----------------------------------------------------------------------------------

def _register_gradient(op_type: str, fn: Any) -> None:
    # A second copy of this module (imported under another name) must not fail import.
    try:
        ops.RegisterGradient(op_type)(fn)
    except KeyError:
        pass


def _not_differentiable(op_type: str) -> None:
    try:
        ops.NotDifferentiable(op_type)
    except KeyError:
        pass


def _op_process_set(op: Any) -> ProcessSet:
    return _temp_process_set_object(op.get_attr("process_set_id"))


def _allreduce_grad(op: Any, grad: Any) -> Any:
    """Allreduce of the incoming gradient with the forward op's reduction and factors."""
    return _allreduce(grad, op=op.get_attr("reduce_op"),
                      prescale_factor=op.get_attr("prescale_factor"),
                      postscale_factor=op.get_attr("postscale_factor"),
                      ignore_name_scope=op.get_attr("ignore_name_scope"),
                      process_set=_op_process_set(op))


def _output_grads(op: Any, grads: Sequence[Any]) -> List[Any]:
    """The incoming gradients, one per output, each in that output's dtype: missing ones as
    zeros, and TensorFlow's float32 zeros for an unused output of another dtype cast (a grouped
    op takes one dtype per group)."""
    out = []
    for g, output in zip(grads, op.outputs):
        if g is None:
            g = tf.zeros_like(output)
        elif isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        if g.dtype != output.dtype:
            g = tf.cast(g, output.dtype)
        out.append(g)
    return out


def _grouped_allreduce_grad(op: Any, *grads: Any) -> List[Any]:
    grads = _output_grads(op, grads)
    return _grouped_allreduce(grads, op=op.get_attr("reduce_op"),
                              prescale_factor=op.get_attr("prescale_factor"),
                              postscale_factor=op.get_attr("postscale_factor"),
                              ignore_name_scope=op.get_attr("ignore_name_scope"),
                              process_set=_op_process_set(op))


def _gathered_slice_grad(grad: Any, forward_input: Any, ignore_name_scope: bool,
                         process_set: ProcessSet) -> Any:
    """This rank's slice of the averaged gradient of an allgather output."""
    grad = _allreduce(grad, op=Average, ignore_name_scope=ignore_name_scope,
                      process_set=process_set)
    with tf.device("/cpu:0"):
        dim0 = tf.shape(forward_input, out_type=tf.int64)[0:1]
        dims = allgather(dim0, ignore_name_scope=ignore_name_scope, process_set=process_set)
    pieces = tf.split(grad, num_or_size_splits=dims, axis=0, num=process_set.size())
    return pieces[process_set.rank()]


def _allgather_grad(op: Any, grad: Any) -> Any:
    return _gathered_slice_grad(grad, op.inputs[0], op.get_attr("ignore_name_scope"),
                                _op_process_set(op))


def _grouped_allgather_grad(op: Any, *grads: Any) -> List[Any]:
    process_set = _op_process_set(op)
    ignore_name_scope = op.get_attr("ignore_name_scope")
    return [_gathered_slice_grad(g, x, ignore_name_scope, process_set)
            for g, x in zip(_output_grads(op, grads), op.inputs)]


def _broadcast_grad(op: Any, grad: Any) -> Any:
    """Averaged gradient on the root; zeros elsewhere."""
    reduced = _allreduce(grad, op=Average, ignore_name_scope=op.get_attr("ignore_name_scope"),
                         process_set=_op_process_set(op))
    if rank() != op.get_attr("root_rank"):
        return reduced * 0
    return reduced


def _alltoall_grad(op: Any, grad_wrt_output: Any, grad_wrt_received_splits: Any) -> List[Any]:
    """Sends the gradient back along the forward exchange; splits get no gradient."""
    grad_wrt_output = _output_grads(op, [grad_wrt_output])[0]
    grad_wrt_tensor, _ = alltoall(grad_wrt_output, splits=op.outputs[1],
                                  ignore_name_scope=op.get_attr("ignore_name_scope"),
                                  process_set=_op_process_set(op))
    return [grad_wrt_tensor, None]


def _scale_for_reducescatter_grad(op: Any, grad: Any, process_set: ProcessSet) -> Any:
    if op.get_attr("reduce_op") == Sum:
        grad = grad * tf.cast(process_set.size(), grad.dtype)
    prescale = op.get_attr("prescale_factor")
    postscale = op.get_attr("postscale_factor")
    if prescale != 1.0:
        grad = grad * tf.cast(prescale, grad.dtype)
    if postscale != 1.0:
        grad = grad * tf.cast(postscale, grad.dtype)
    return grad


def _reducescatter_grad(op: Any, grad: Any) -> Any:
    process_set = _op_process_set(op)
    grad = _scale_for_reducescatter_grad(op, grad, process_set)
    return allgather(grad, ignore_name_scope=op.get_attr("ignore_name_scope"),
                     process_set=process_set)


def _grouped_reducescatter_grad(op: Any, *grads: Any) -> List[Any]:
    process_set = _op_process_set(op)
    grads = [_scale_for_reducescatter_grad(op, g, process_set)
             for g in _output_grads(op, grads)]
    return grouped_allgather(grads, ignore_name_scope=op.get_attr("ignore_name_scope"),
                             process_set=process_set)


_register_gradient("HorovodAllreduce", _allreduce_grad)
_register_gradient("HorovodGroupedAllreduce", _grouped_allreduce_grad)
_register_gradient("HorovodAllgather", _allgather_grad)
_register_gradient("HorovodGroupedAllgather", _grouped_allgather_grad)
_register_gradient("HorovodBroadcast", _broadcast_grad)
_register_gradient("HorovodAlltoall", _alltoall_grad)
_register_gradient("HorovodReducescatter", _reducescatter_grad)
_register_gradient("HorovodGroupedReducescatter", _grouped_reducescatter_grad)
for _op_type in ("HorovodSize", "HorovodProcessSetIncluded", "HorovodLocalSize", "HorovodRank",
                 "HorovodLocalRank"):
    _not_differentiable(_op_type)
