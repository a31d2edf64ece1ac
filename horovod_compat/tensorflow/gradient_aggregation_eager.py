"""Local gradient aggregation in eager mode / tf.function (backward_passes_per_step > 1)."""

from typing import Any, Callable, List, Sequence

import tensorflow as tf

from horovod_compat.common.process_sets import ProcessSet, global_process_set
from horovod_compat.tensorflow.allreduce_grads import _reduce_with_local
from horovod_compat.tensorflow.util import _VariableRef


class LocalGradientAggregationHelperEager:
    """Sums gradients over ``backward_passes_per_step`` passes, then allreduces the sums.

    ``counter`` counts passes since the last allreduce (``steps % backward_passes_per_step``).
    """

    def __init__(self, backward_passes_per_step: int, allreduce_func: Callable,
                 sparse_as_dense: bool, average_aggregated_gradients: bool,
                 process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True) -> None:
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = backward_passes_per_step
        self.allreduce_grads = allreduce_func
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.counter = tf.Variable(0, trainable=False, dtype=tf.int32, name="agg_counter")
        self.locally_aggregated_grads: List[Any] = []
        self._local_vars: set = set()

    def register_local_var(self, var: Any) -> None:
        """Excludes ``var`` from the allreduce."""
        self._local_vars.add(_VariableRef(var))

    def _densify(self, grads: Sequence[Any]) -> List[Any]:
        out = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError("IndexedSlices are not supported when "
                                     "`backward_passes_per_step` > 1 and "
                                     "`sparse_as_dense` is False.")
                g = tf.convert_to_tensor(g)
            out.append(g)
        return out

    def _init_aggregation_vars(self, grads: Sequence[Any]) -> None:
        if self.locally_aggregated_grads:
            return
        self.locally_aggregated_grads = [
            None if g is None else tf.Variable(tf.zeros_like(g), trainable=False,
                                               name=f"aggregated_grad_{i}")
            for i, g in enumerate(grads)]

    def compute_gradients(self, grads: Sequence[Any], vars: Sequence[Any]) -> List[Any]:
        """Adds ``grads`` to the sums; on every backward_passes_per_step-th pass returns the
        allreduced sums (and clears them), otherwise the running sums."""
        grads = self._densify(grads)
        self._init_aggregation_vars(grads)
        for acc, g in zip(self.locally_aggregated_grads, grads):
            if acc is not None and g is not None:
                acc.assign_add(g)
        self.counter.assign_add(1)

        def reduce_and_clear() -> List[Any]:
            sums = [None if acc is None else acc.read_value()
                    for acc in self.locally_aggregated_grads]
            reduced = _reduce_with_local(self.allreduce_grads, sums, list(vars), self._local_vars,
                                         self.process_set, self.scale_local_gradients)
            if self.average_aggregated_gradients:
                reduced = [None if r is None else r / self.backward_passes_per_step
                           for r in reduced]
            with tf.control_dependencies([r for r in reduced if r is not None]):
                clears = [acc.assign(tf.zeros_like(acc)) for acc in self.locally_aggregated_grads
                          if acc is not None]
            with tf.control_dependencies(clears):
                return [None if r is None else tf.identity(r) for r in reduced]

        def keep_summing() -> List[Any]:
            return [None if acc is None else acc.read_value()
                    for acc in self.locally_aggregated_grads]

        if tf.executing_eagerly():
            if int(self.counter.numpy()) == self.backward_passes_per_step:
                return reduce_and_clear()
            return keep_summing()
        present = [i for i, a in enumerate(self.locally_aggregated_grads) if a is not None]

        def pick(fn: Callable) -> Callable:
            return lambda: [fn()[i] for i in present]

        values = tf.cond(tf.equal(self.counter, self.backward_passes_per_step),
                         pick(reduce_and_clear), pick(keep_summing))
        result: List[Any] = [None] * len(grads)
        for i, v in zip(present, values):
            result[i] = v
        return result

    def apply_gradients(self, apply_grads_closure: Callable, optimizer: Any, *args: Any,
                        **kwargs: Any) -> Any:
        """Applies on the allreduce pass (resetting the counter); otherwise only advances the
        optimizer's iteration count."""
        def apply() -> Any:
            self.counter.assign(0)
            apply_grads_closure()
            return tf.constant(True)

        def skip() -> Any:
            iterations = getattr(optimizer, "iterations", None)
            if iterations is not None:
                iterations.assign_add(1)
            return tf.constant(False)

        if tf.executing_eagerly():
            if int(self.counter.numpy()) == self.backward_passes_per_step:
                return apply()
            return skip()
        return tf.cond(tf.equal(self.counter, self.backward_passes_per_step), apply, skip)
