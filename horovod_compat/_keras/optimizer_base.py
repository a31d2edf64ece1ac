"""What the distributed Keras optimizers share, for Keras 3 (``_keras/__init__.py``) and for
``tf_keras`` (``_keras/keras2.py``): Horovod's attributes, the gradient allreduce with local
variables, and the record of gradients ``compute_gradients`` already reduced."""

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from horovod_compat.tensorflow.allreduce_grads import _make_allreduce_grads_fn, _reduce_with_local
from horovod_compat.tensorflow.util import _VariableRef


class CallableList(list):
    """A list that also answers ``opt.variables()`` (Keras 2 spelling)."""

    def __call__(self) -> "CallableList":
        return self


class OptimizerState:
    """Horovod state of one optimizer instance: a plain container, so what it holds is not
    tracked by Keras/TF checkpointing."""

    def __init__(self) -> None:
        self.accumulators: Any = None  # backward_passes_per_step > 1: the gradient sums
        self.counter: Optional[tf.Variable] = None
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
