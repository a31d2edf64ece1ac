"""What the distributed Keras optimizers share, for Keras 3 (``_keras/__init__.py``) and for
``tf_keras`` (``_keras/keras2.py``): Horovod's attributes, the gradient allreduce with local
variables, and the record of gradients ``compute_gradients`` already reduced."""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from horovod_compat.tensorflow.allreduce_grads import _make_allreduce_grads_fn, _reduce_with_local
from horovod_compat.tensorflow.util import _VariableRef


class CallableList(list):
    """A list that also answers ``opt.variables()`` (Keras 2 spelling)."""

    def __call__(self) -> "CallableList":
        return self


class AggregationHelper:
    """Local gradient aggregation of a Keras distributed optimizer with
    ``backward_passes_per_step > 1`` (what Horovod exposes as ``opt._agg_helper``).

    Each pass adds its gradients to per-variable sums; the pass that completes
    ``backward_passes_per_step`` passes allreduces the sums (divided by the pass count with
    ``average_aggregated_gradients``), applies them and clears them. The other passes only
    advance the optimizer's ``iterations``, so step counters and schedules see every pass.
    ``counter`` is the number of passes since the last update (``steps % passes``).
    """

    def __init__(self, backward_passes_per_step: int, average_aggregated_gradients: bool,
                 sparse_as_dense: bool) -> None:
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self.sparse_as_dense = sparse_as_dense
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="agg_counter")
        self._sums: Dict[int, Tuple[Any, tf.Variable]] = {}  # id(var) -> (var, its sum)

    def _dense(self, grad: Any) -> Any:
        if isinstance(grad, tf.IndexedSlices):
            if not self.sparse_as_dense:
                raise ValueError("IndexedSlices are not supported when "
                                 "`backward_passes_per_step` > 1 and `sparse_as_dense` is "
                                 "False; pass sparse_as_dense=True to DistributedOptimizer.")
            return tf.convert_to_tensor(grad)
        return tf.convert_to_tensor(grad)

    def _sum_of(self, var: Any) -> tf.Variable:
        entry = self._sums.get(id(var))
        if entry is None:
            dtype = tf.as_dtype(var.dtype).base_dtype
            with tf.init_scope():
                entry = (var, tf.Variable(tf.zeros(tuple(var.shape), dtype=dtype),
                                          trainable=False, name="hvd_aggregated_grad"))
            self._sums[id(var)] = entry
        return entry[1]

    def step(self, grads: Sequence[Any], variables: Sequence[Any],
             apply_fn: Callable[[List[Any], List[Any]], Any], iterations: Any) -> tf.Tensor:
        """One backward pass: accumulates ``grads``; on the last pass of a step calls
        ``apply_fn(summed_grads, variables)`` (which allreduces and applies, advancing
        ``iterations``), otherwise advances ``iterations``. Returns whether it applied."""
        present = [k for k, g in enumerate(grads) if g is not None]
        dense = {k: self._dense(grads[k]) for k in present}
        sums = [self._sum_of(variables[k]) for k in present]
        updates = [acc.assign_add(tf.cast(dense[k], acc.dtype))
                   for acc, k in zip(sums, present)]
        with tf.control_dependencies(updates):
            count = self.counter.assign_add(1)
        present_vars = [variables[k] for k in present]
        passes = self.backward_passes_per_step

        def apply_step() -> tf.Tensor:
            summed = [tf.identity(acc) for acc in sums]
            if self.average_aggregated_gradients:
                summed = [g / tf.cast(passes, g.dtype) for g in summed]
            applied = apply_fn(summed, present_vars)
            deps = [t for t in [applied] + summed if isinstance(t, (tf.Tensor, tf.Operation))]
            with tf.control_dependencies(deps):
                resets = [acc.assign(tf.zeros_like(acc)) for acc in sums]
                resets.append(self.counter.assign(0))
            with tf.control_dependencies(resets):
                return tf.constant(True)

        def skip_step() -> tf.Tensor:
            advanced = iterations.assign_add(1)
            deps = [advanced] if isinstance(advanced, (tf.Tensor, tf.Operation)) else []
            with tf.control_dependencies(deps):
                return tf.constant(False)

        return tf.cond(tf.equal(count, passes), apply_step, skip_step)


class OptimizerState:
    """Horovod state of one optimizer instance: a plain container, so what it holds is not
    tracked by Keras/TF checkpointing."""

    def __init__(self) -> None:
        self.agg_helper: Optional[AggregationHelper] = None  # backward_passes_per_step > 1
        self.local_vars: set = set()
        # What compute_gradients last returned, already allreduced: applying those must not
        # reduce them a second time (compute_gradients + apply_gradients reduces once).
        self.pre_reduced: List[Any] = []


def state_of(opt: Any) -> OptimizerState:
    holder = opt.__dict__.get("_hvd_state")
    if holder is None:
        holder = OptimizerState()
        object.__setattr__(opt, "_hvd_state", holder)
    return holder


class HorovodOptimizerMixin:
    """Methods of every distributed optimizer subclass; ``_hvd_settings`` is set per class."""

    _HAS_AGGREGATE_GRAD = True
    _hvd_settings: dict = {}

    @property
    def process_set(self) -> Any:
        return self._hvd_settings["process_set"]

    @property
    def scale_local_gradients(self) -> bool:
        return self._hvd_settings["scale_local_gradients"]

    @property
    def _agg_helper(self) -> Optional[AggregationHelper]:
        """The local gradient aggregation (``backward_passes_per_step > 1``), else None."""
        s = self._hvd_settings
        passes = s.get("backward_passes_per_step", 1)
        if passes <= 1:
            return None
        state = state_of(self)
        if state.agg_helper is None:
            state.agg_helper = AggregationHelper(passes, s["average_aggregated_gradients"],
                                                 s["sparse_as_dense"])
        return state.agg_helper

    @property
    def _local_vars(self) -> set:
        return state_of(self).local_vars

    def register_local_var(self, var: Any) -> None:
        """Gradients of ``var`` are not allreduced (only scaled by 1/size if configured)."""
        state_of(self).local_vars.add(_VariableRef(var))

    @property
    def _allreduce_grads(self) -> Any:
        s = self._hvd_settings
        return _make_allreduce_grads_fn(s["name"], s["device_dense"], s["device_sparse"],
                                        s["compression"], s["sparse_as_dense"], s["op"],
                                        s["gradient_predivide_factor"], s["groups"],
                                        s["process_set"])

    def _allreduce(self, grads: Sequence[Any], vars: Sequence[Any]) -> List[Any]:
        s = self._hvd_settings
        state = state_of(self)
        if s["process_set"].size() <= 1 and not state.local_vars:
            return list(grads)
        return _reduce_with_local(self._allreduce_grads, grads, vars, state.local_vars,
                                  s["process_set"], s["scale_local_gradients"])

    def _hvd_reduce_and_record(self, grads: Sequence[Any], vars: Sequence[Any]) -> List[Any]:
        """Allreduces for compute_gradients, remembering the result for apply_gradients."""
        reduced = self._allreduce(grads, vars)
        state_of(self).pre_reduced = [g for g in reduced if g is not None]
        return reduced

    def _hvd_take_pre_reduced(self, grads: Sequence[Any]) -> bool:
        """True when every gradient is one our ``compute_gradients`` already allreduced."""
        state = state_of(self)
        pre, state.pre_reduced = state.pre_reduced, []
        present = [g for g in grads if g is not None]
        return bool(pre) and bool(present) and all(any(g is p for p in pre) for g in present)
