"""Gradient allreduce shared by DistributedOptimizer and DistributedGradientTape."""

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from horovod_compat.common.process_sets import ProcessSet, global_process_set
from horovod_compat.common.util import split_list
from horovod_compat.tensorflow.mpi_ops import (Average, _basics, process_set_included_op,
                                               size_op)
from horovod_compat.tensorflow.reductions import allreduce, grouped_allreduce
from horovod_compat.tensorflow.util import (_cache, _executing_eagerly, _make_subgraph,
                                            _VariableRef, refs_to_vars, vars_to_refs)

def _elastic() -> bool:
    return os.environ.get("HOROVOD_ELASTIC", "0") == "1"

def _static_participation(process_set: ProcessSet) -> Optional[bool]:
    """Whether this rank reduces over ``process_set``, when that cannot change at run time.

    None in elastic mode, where membership and size are read at run time (as in Horovod).
    """
    if _elastic():
        return None
    process_set_id = process_set.process_set_id
    return (_basics._process_set_included(process_set_id) == 1 and
            _basics._process_set_size(process_set_id) > 1)

def _runtime_participation(process_set: ProcessSet) -> tf.Tensor:
    process_set_id = process_set.process_set_id
    return tf.logical_and(tf.equal(process_set_included_op(process_set_id), 1),
                          size_op(process_set_id) > 1)

def _allreduce_cond(tensor: Any, *args: Any, process_set: ProcessSet = global_process_set,
                    **kwargs: Any) -> Any:
    """allreduce, skipped (input returned) when this rank is not in the set or it has one rank."""
    def allreduce_fn() -> Any:
        return allreduce(tensor, *args, process_set=process_set, **kwargs)

    participation = _static_participation(process_set)
    if participation is not None:
        return allreduce_fn() if participation else tensor
    return tf.cond(_runtime_participation(process_set), allreduce_fn, lambda: tensor)

def _grouped_allreduce_cond(tensors: List[Any], *args: Any,
                            process_set: ProcessSet = global_process_set, **kwargs: Any) -> Any:
    """grouped_allreduce with the same skip rule as _allreduce_cond."""
    def allreduce_fn() -> Any:
        return grouped_allreduce(tensors, *args, process_set=process_set, **kwargs)

    participation = _static_participation(process_set)
    if participation is not None:
        return allreduce_fn() if participation else tensors
    return tf.cond(_runtime_participation(process_set), allreduce_fn, lambda: tensors)

def _var_key(var: Any) -> Any:
    return getattr(var, "path", None) or getattr(var, "name", None)

def _index_groups(grads: Sequence[Any], vars: Optional[Sequence[Any]],
                  groups: Any) -> Tuple[Tuple[int, ...], ...]:
    """Indices of the non-None gradients, grouped as ``groups`` asks."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if isinstance(groups, list):
        if vars is None:
            raise ValueError("Gradient groups given as variables need the variables.")
        by_identity = {id(vars[i]): i for i in present}
        by_key = {_var_key(vars[i]): i for i in present}
        taken = set()
        result = []
        for group in groups:
            members = []
            for var in group:
                i = by_identity.get(id(var), by_key.get(_var_key(var)))
                if i is not None and i not in taken:
                    taken.add(i)
                    members.append(i)
            if members:
                result.append(tuple(members))
        result.extend((i,) for i in present if i not in taken)
        return tuple(result)
    return tuple(tuple(chunk) for chunk in split_list(present, groups) if chunk)

def _make_allreduce_grads_fn(name: str, device_dense: str, device_sparse: str,
                             compression: type, sparse_as_dense: bool, op: int,
                             gradient_predivide_factor: float, groups: Any,
                             process_set: ProcessSet = global_process_set) -> Callable:
    """Returns ``fn(grads, vars=None, use_generic_names=False)`` that allreduces gradients."""
    if isinstance(groups, list):
        groups = tuple(tuple(vars_to_refs(group)) for group in groups)
    return _make_cached_allreduce_grads_fn(name, device_dense, device_sparse, compression,
                                           sparse_as_dense, op, gradient_predivide_factor,
                                           groups, process_set, _executing_eagerly())

@_cache
def _make_cached_allreduce_grads_fn(name: str, device_dense: str, device_sparse: str,
                                    compression: type, sparse_as_dense: bool, op: int,
                                    gradient_predivide_factor: float, groups: Any,
                                    process_set: ProcessSet, eager: bool) -> Callable:
    if isinstance(groups, tuple):
        groups = [refs_to_vars(group) for group in groups]
    if op == Average:
        # The runtime divides by the set size; predividing moves part of it before the sum.
        prescale_factor = 1.0 / gradient_predivide_factor
        postscale_factor = gradient_predivide_factor
    else:
        prescale_factor = 1.0
        postscale_factor = 1.0
    common = dict(device_dense=device_dense, device_sparse=device_sparse,
                  compression=compression, op=op, prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set=process_set)

    def reduce_grads(grads: List[Any], index_groups: Optional[Tuple[Tuple[int, ...], ...]],
                     use_generic_names: bool) -> List[Any]:
        with tf.name_scope(name + "_Allreduce"):
            if sparse_as_dense:
                grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                         for g in grads]
            if index_groups is not None:
                reduced = list(grads)
                for group in index_groups:
                    outputs = _grouped_allreduce_cond([grads[i] for i in group], **common)
                    for i, out in zip(group, outputs):
                        reduced[i] = out
                return reduced
            return [_allreduce_cond(g, name=f"grad_{i}" if use_generic_names else None,
                                    ignore_name_scope=use_generic_names, **common)
                    if g is not None else g
                    for i, g in enumerate(grads)]

    if eager:
        reduce_grads = _make_subgraph(reduce_grads)

    def allreduce_grads(grads: Sequence[Any], vars: Optional[Sequence[Any]] = None,
                        use_generic_names: bool = False) -> List[Any]:
        grads = list(grads)
        index_groups = None
        if groups is not None:
            index_groups = _index_groups(grads, vars, groups)
        return list(reduce_grads(grads, index_groups, use_generic_names))

    return allreduce_grads

def _split_local(grads: Sequence[Any], vars: Sequence[Any], local: set) -> Tuple[list, list]:
    """Indices of global and local (registered, not reduced) variables."""
    global_idx = [i for i, v in enumerate(vars) if _VariableRef(v) not in local]
    local_idx = [i for i, v in enumerate(vars) if _VariableRef(v) in local]
    return global_idx, local_idx

def _reduce_with_local(allreduce_grads: Callable, grads: Sequence[Any], vars: Sequence[Any],
                       local: set, process_set: ProcessSet, scale_local_gradients: bool,
                       use_generic_names: bool = False) -> List[Any]:
    """Allreduces gradients of non-local variables; local ones are kept (and scaled by 1/size)."""
    grads = list(grads)
    if not local:
        return allreduce_grads(grads, vars, use_generic_names)
    global_idx, local_idx = _split_local(grads, vars, local)
    result = list(grads)
    if global_idx:
        reduced = allreduce_grads([grads[i] for i in global_idx], [vars[i] for i in global_idx],
                                  use_generic_names)
        for i, r in zip(global_idx, reduced):
            result[i] = r
    if scale_local_gradients and local_idx:
        set_size = process_set.size()
        for i in local_idx:
            g = grads[i]
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices):
                result[i] = tf.IndexedSlices(g.values / set_size, g.indices, g.dense_shape)
            else:
                result[i] = g / set_size
    return result

def _validate_grouping(op: int, gradient_predivide_factor: float, num_groups: int,
                       groups: Any, rocm: bool = False) -> Any:
    """Shared argument checks of DistributedOptimizer and DistributedGradientTape."""
    import warnings
    if gradient_predivide_factor != 1.0:
        if rocm:
            raise ValueError("gradient_predivide_factor not supported yet with ROCm")
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "tf.Variable.")
    return groups

