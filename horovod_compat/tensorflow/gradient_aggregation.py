"""Local gradient aggregation for tf.compat.v1 graphs (backward_passes_per_step > 1)."""

from typing import Any, Callable, List, Sequence

import tensorflow as tf

from horovod_compat.common.process_sets import ProcessSet, global_process_set
from horovod_compat.tensorflow.allreduce_grads import _reduce_with_local
from horovod_compat.tensorflow.util import _VariableRef


class LocalGradientAggregationHelper:
    """Graph-mode gradient accumulation: sums ``backward_passes_per_step`` passes in local
    variables, allreduces on the last pass and applies only then."""

    _OPTIMIZER_TYPE_KERAS = "optimizer_type_keras"
    _OPTIMIZER_TYPE_LEGACY = "optimizer_type_legacy"

    def __init__(self, backward_passes_per_step: int, allreduce_func: Callable,
                 sparse_as_dense: bool, average_aggregated_gradients: bool, rank: int,
                 optimizer_type: str, process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True, name: str = "") -> None:
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = backward_passes_per_step
        self.allreduce_grads = allreduce_func
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        self.rank = rank
        self.optimizer_type = optimizer_type
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.name = name
        self.counter = None
        self.locally_aggregated_grads: List[Any] = []
        self._local_vars: set = set()

    def register_local_var(self, var: Any) -> None:
        """Excludes ``var`` from the allreduce."""
        self._local_vars.add(_VariableRef(var))

    def _make_variables(self, grads: Sequence[Any]) -> None:
        scope = f"aggregation_variables_{self.name}{self.rank}"
        collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
        with tf.compat.v1.variable_scope(scope, reuse=tf.compat.v1.AUTO_REUSE):
            self.counter = tf.compat.v1.get_variable(
                "aggregation_counter", shape=(), dtype=tf.int32, trainable=False,
                initializer=tf.compat.v1.zeros_initializer(), collections=collections)
            self.locally_aggregated_grads = [
                None if g is None else tf.compat.v1.get_variable(
                    f"aggregated_grad_{i}", shape=g.shape, dtype=g.dtype, trainable=False,
                    initializer=tf.compat.v1.zeros_initializer(), collections=collections)
                for i, g in enumerate(grads)]

    def compute_gradients(self, grads: Sequence[Any], vars: Sequence[Any]) -> List[Any]:
        """Ops adding ``grads`` to the sums; on the last pass they yield the allreduced sums."""
        dense = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError("IndexedSlices are not supported when "
                                     "`backward_passes_per_step` > 1 and "
                                     "`sparse_as_dense` is False.")
                g = tf.convert_to_tensor(g)
            dense.append(g)
        if self.counter is None:
            self._make_variables(dense)
        updates = [acc.assign_add(g) for acc, g in zip(self.locally_aggregated_grads, dense)
                   if acc is not None and g is not None]
        with tf.control_dependencies(updates):
            count = self.counter.assign_add(1)
        present = [i for i, a in enumerate(self.locally_aggregated_grads) if a is not None]

        def reduce_and_clear() -> List[Any]:
            sums = [None if acc is None else acc.read_value()
                    for acc in self.locally_aggregated_grads]
            reduced = _reduce_with_local(self.allreduce_grads, sums, list(vars), self._local_vars,
                                         self.process_set, self.scale_local_gradients)
            if self.average_aggregated_gradients:
                reduced = [None if r is None else r / self.backward_passes_per_step
                           for r in reduced]
            with tf.control_dependencies([r for r in reduced if r is not None]):
                clears = [acc.assign(tf.zeros_like(acc))
                          for acc in self.locally_aggregated_grads if acc is not None]
            with tf.control_dependencies(clears):
                return [tf.identity(reduced[i]) for i in present]

        def keep_summing() -> List[Any]:
            return [tf.identity(self.locally_aggregated_grads[i].read_value()) for i in present]

        with tf.control_dependencies([count]):
            values = tf.cond(tf.equal(count, self.backward_passes_per_step), reduce_and_clear,
                             keep_summing)
        if not isinstance(values, (list, tuple)):
            values = [values]
        result: List[Any] = [None] * len(dense)
        for i, v in zip(present, values):
            result[i] = v
        return result

    def apply_gradients(self, apply_grads_closure: Callable, optimizer: Any, *args: Any,
                        **kwargs: Any) -> Any:
        """An op applying the gradients on the last pass (and resetting the counter); on other
        passes it only increments ``global_step`` when one was given."""
        global_step = kwargs.get("global_step", args[1] if len(args) > 1 else None)

        def apply() -> Any:
            with tf.control_dependencies([apply_grads_closure()]):
                with tf.control_dependencies([self.counter.assign(0)]):
                    return tf.constant(True)

        def skip() -> Any:
            if global_step is not None:
                with tf.control_dependencies([global_step.assign_add(1)]):
                    return tf.constant(False)
            return tf.constant(False)

        # Read the counter only after this pass's gradients (and so its increment in
        # compute_gradients) exist; otherwise the read may race ahead of the increment.
        grads_and_vars = kwargs.get("grads_and_vars", args[0] if args else ())
        grads = [g for g, _ in grads_and_vars if g is not None]
        with tf.control_dependencies(grads):
            flag = tf.cond(tf.equal(self.counter.read_value(), self.backward_passes_per_step),
                           apply, skip)
        return flag.op
