"""The public reducing collectives: allreduce, grouped_allreduce, reducescatter and
grouped_reducescatter, with compression and IndexedSlices (sparse) support."""

import contextlib
from typing import Any, ContextManager, List, Optional, Sequence

import tensorflow as tf

from horovod_compat.common.process_sets import ProcessSet, global_process_set
from horovod_compat.tensorflow.compression import Compression
from horovod_compat.tensorflow.mpi_ops import (Adasum, Average, Sum, _allreduce,
                                               _grouped_allreduce, _grouped_reducescatter,
                                               _process_set_id, _reducescatter, _set_size,
                                               allgather, grouped_allgather,
                                               handle_average_backwards_compatibility)

_SPARSE_ADASUM_MESSAGE = ("The Adasum reduction does not currently support sparse tensors. As a "
                          "workaround please pass sparse_as_dense=True to DistributedOptimizer")
_ADASUM_MESSAGE = ("Adasum is not supported by horovod_compat yet; use op=hvd.Average or "
                   "op=hvd.Sum.")


def _device(name: str) -> ContextManager[Any]:
    """``tf.device(name)``; for the default "" (which changes nothing) no scope at all: entering
    one costs a few microseconds on every eager call."""
    return tf.device(name) if name else contextlib.nullcontext()


def _check_sparse(op: int, prescale_factor: float, postscale_factor: float) -> None:
    if op == Adasum:
        raise NotImplementedError(_SPARSE_ADASUM_MESSAGE)
    if op not in (Average, Sum):
        raise NotImplementedError("Only Sum and Average are supported with IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with IndexedSlices")


def _sparse_result(values: Any, indices: Any, like: tf.IndexedSlices, op: int,
                   process_set: ProcessSet) -> tf.IndexedSlices:
    if op == Average:
        values = tf.math.divide(values, _set_size(process_set, values.dtype))
    return tf.IndexedSlices(values, indices, dense_shape=like.dense_shape)


def allreduce(tensor: Any, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression: type = Compression.none,
              op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> Any:
    """Reduces ``tensor`` over the ranks of ``process_set`` (default: average over all ranks).

    ``tensor`` may be a tf.Tensor, a variable or tf.IndexedSlices (gathered, not summed: only
    Sum/Average and no scaling). ``prescale_factor`` multiplies the input, ``postscale_factor``
    the result.
    """
    op = handle_average_backwards_compatibility(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse(op, prescale_factor, postscale_factor)
        _process_set_id(process_set)
        with _device(device_sparse):
            values = allgather(tensor.values, name=None if name is None else name + "_values",
                               ignore_name_scope=ignore_name_scope, process_set=process_set)
            indices = allgather(tensor.indices,
                                name=None if name is None else name + "_indices",
                                ignore_name_scope=ignore_name_scope, process_set=process_set)
            return _sparse_result(values, indices, tensor, op, process_set)
    if op == Adasum:
        raise NotImplementedError(_ADASUM_MESSAGE)
    with _device(device_dense):
        compressed, ctx = compression.compress(tensor)
        reduced = _allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor,
                             ignore_name_scope=ignore_name_scope, process_set=process_set)
        return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: type = Compression.none, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False, name: Optional[str] = None) -> Any:
    """allreduce of a list of tensors as one negotiated group; the result keeps input order.

    Dense tensors of one call must share a dtype. An empty list is returned unchanged.
    """
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    if op == Adasum:
        raise NotImplementedError(_ADASUM_MESSAGE)
    results: List[Any] = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse(op, prescale_factor, postscale_factor)
        with _device(device_sparse):
            values = grouped_allgather([tensors[i].values for i in sparse],
                                       name=None if name is None else name + "_values",
                                       ignore_name_scope=ignore_name_scope,
                                       process_set=process_set)
            indices = grouped_allgather([tensors[i].indices for i in sparse],
                                        name=None if name is None else name + "_indices",
                                        ignore_name_scope=ignore_name_scope,
                                        process_set=process_set)
            for i, v, ix in zip(sparse, values, indices):
                results[i] = _sparse_result(v, ix, tensors[i], op, process_set)
    if dense:
        with _device(device_dense):
            compressed = [compression.compress(tensors[i]) for i in dense]
            reduced = _grouped_allreduce([c[0] for c in compressed], name=name, op=op,
                                         prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor,
                                         ignore_name_scope=ignore_name_scope,
                                         process_set=process_set)
            for i, r, (_, ctx) in zip(dense, reduced, compressed):
                results[i] = compression.decompress(r, ctx)
    return results


def reducescatter(tensor: Any, device_dense: str = "", compression: type = Compression.none,
                  op: int = Average, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """Reduces ``tensor`` over the set; rank r keeps its block of dimension 0.

    With n rows and s ranks, ranks r < n % s get n // s + 1 rows, the others n // s. Only
    Average and Sum are supported.
    """
    if op == Adasum:
        raise NotImplementedError(_ADASUM_MESSAGE)
    with _device(device_dense):
        compressed, ctx = compression.compress(tensor)
        reduced = _reducescatter(compressed, name=name, op=op,
                                 ignore_name_scope=ignore_name_scope, process_set=process_set,
                                 prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor)
        return compression.decompress(reduced, ctx)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """reducescatter of a list of tensors (one dtype) as one negotiated group."""
    if not tensors:
        return tensors
    if op == Adasum:
        raise NotImplementedError(_ADASUM_MESSAGE)
    with _device(device_dense):
        compressed = [compression.compress(t) for t in tensors]
        reduced = _grouped_reducescatter([c[0] for c in compressed], op=op,
                                         process_set=process_set,
                                         prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor)
        return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


