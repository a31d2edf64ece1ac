"""DistributedOptimizer: wraps an optimizer so that gradients are averaged across ranks."""

from typing import Any, List, Optional

import tensorflow as tf

from horovod_compat.common.process_sets import ProcessSet, global_process_set
from horovod_compat.tensorflow.allreduce_grads import (_make_allreduce_grads_fn,
                                                       _reduce_with_local, _validate_grouping)
from horovod_compat.tensorflow.compression import Compression
from horovod_compat.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
from horovod_compat.tensorflow.mpi_ops import Adasum, Average, rank, rocm_built
from horovod_compat.tensorflow.util import _executing_eagerly, _VariableRef

_LegacyOptimizer = getattr(getattr(tf.compat.v1, "train", None), "Optimizer", None)

_ADASUM_MESSAGE = ("Adasum is not supported by horovod_compat yet: use op=hvd.Average "
                   "(the default) or op=hvd.Sum.")

if _LegacyOptimizer is not None:

    class _DistributedOptimizer(_LegacyOptimizer):
        """A tf.compat.v1.train.Optimizer whose compute_gradients() allreduces the gradients."""

        def __init__(self, optimizer: Any, name: Optional[str] = None, use_locking: bool = False,
                     device_dense: str = "", device_sparse: str = "",
                     compression: type = Compression.none, sparse_as_dense: bool = False,
                     op: int = Average, gradient_predivide_factor: float = 1.0,
                     backward_passes_per_step: int = 1,
                     average_aggregated_gradients: bool = False, groups: Any = None,
                     process_set: ProcessSet = global_process_set,
                     scale_local_gradients: bool = True) -> None:
            if name is None:
                name = f"Distributed{type(optimizer).__name__}"
            super().__init__(name=name, use_locking=use_locking)
            self._optimizer = optimizer
            self._allreduce_grads = _make_allreduce_grads_fn(
                name, device_dense, device_sparse, compression, sparse_as_dense, op,
                gradient_predivide_factor, groups, process_set=process_set)
            self._local_vars: set = set()
            self.process_set = process_set
            self.scale_local_gradients = scale_local_gradients
            self._agg_helper = None
            if backward_passes_per_step > 1:
                if _executing_eagerly():
                    raise ValueError("backward_passes_per_step > 1 is not yet supported for "
                                     "_LegacyOptimizer with eager mode.")
                self._agg_helper = LocalGradientAggregationHelper(
                    backward_passes_per_step=backward_passes_per_step,
                    allreduce_func=self._allreduce_grads, sparse_as_dense=sparse_as_dense,
                    average_aggregated_gradients=average_aggregated_gradients, rank=rank(),
                    optimizer_type=LocalGradientAggregationHelper._OPTIMIZER_TYPE_LEGACY,
                    process_set=process_set, scale_local_gradients=scale_local_gradients)

        def register_local_var(self, var: Any) -> None:
            """Keeps ``var``'s gradient local (not allreduced)."""
            if self._agg_helper is not None:
                self._agg_helper.register_local_var(var)
            self._local_vars.add(_VariableRef(var))

        def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Any]:
            """The wrapped optimizer's gradients, allreduced across ranks."""
            gradients = self._optimizer.compute_gradients(*args, **kwargs)
            if not gradients:
                return gradients
            grads, vars = zip(*gradients)
            if self._agg_helper is not None:
                reduced = self._agg_helper.compute_gradients(grads, vars)
            else:
                reduced = _reduce_with_local(self._allreduce_grads, grads, vars, self._local_vars,
                                             self.process_set, self.scale_local_gradients)
            return list(zip(reduced, vars))

        def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
            """Delegates to the wrapped optimizer (only on the allreduce pass when aggregating)."""
            if self._agg_helper is not None:
                # The helper reads grads_and_vars too: a one-shot iterator (zip) must survive.
                if args:
                    args = (list(args[0]),) + tuple(args[1:])
                elif "grads_and_vars" in kwargs:
                    kwargs["grads_and_vars"] = list(kwargs["grads_and_vars"])
                return self._agg_helper.apply_gradients(
                    lambda: self._optimizer.apply_gradients(*args, **kwargs), self._optimizer,
                    *args, **kwargs)
            return self._optimizer.apply_gradients(*args, **kwargs)

        def get_slot(self, *args: Any, **kwargs: Any) -> Any:
            return self._optimizer.get_slot(*args, **kwargs)

        def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
            return self._optimizer.get_slot_names(*args, **kwargs)

        def variables(self, *args: Any, **kwargs: Any) -> Any:
            return self._optimizer.variables(*args, **kwargs)

    class _DistributedAdasumOptimizer(_LegacyOptimizer):
        """Adasum is not implemented yet: constructing this optimizer raises."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError(_ADASUM_MESSAGE)


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: type = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wraps ``optimizer`` so that gradients are averaged over all ranks before being applied.

    A tf.compat.v1.train optimizer gives a legacy optimizer whose compute_gradients() (and so
    minimize()) allreduces; a Keras optimizer is handed to
    horovod_compat.tensorflow.keras.DistributedOptimizer (which ignores op, groups and
    use_locking, as Horovod does).
    """
    groups = _validate_grouping(op, gradient_predivide_factor, num_groups, groups,
                                rocm=rocm_built())
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")

    if _LegacyOptimizer is not None and isinstance(optimizer, _LegacyOptimizer):
        if op == Adasum:
            raise NotImplementedError(_ADASUM_MESSAGE)
        return _DistributedOptimizer(
            optimizer=optimizer, name=name, use_locking=use_locking, device_dense=device_dense,
            device_sparse=device_sparse, compression=compression,
            sparse_as_dense=sparse_as_dense, op=op,
            gradient_predivide_factor=gradient_predivide_factor,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)

    if op == Adasum:
        raise ValueError("op == Adasum is not supported yet with Keras")
    from horovod_compat.tensorflow import keras as hvd_k
    return hvd_k.DistributedOptimizer(
        optimizer=optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
        scale_local_gradients=scale_local_gradients)
