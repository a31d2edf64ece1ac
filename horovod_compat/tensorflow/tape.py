"""DistributedGradientTape: a tf.GradientTape whose gradient() averages across ranks."""

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from horovod_compat.common.process_sets import ProcessSet, global_process_set
from horovod_compat.tensorflow.allreduce_grads import (_make_allreduce_grads_fn,
                                                       _reduce_with_local, _split_local,
                                                       _validate_grouping)
from horovod_compat.tensorflow.compression import Compression
from horovod_compat.tensorflow.mpi_ops import Average, rocm_built
from horovod_compat.tensorflow.util import _VariableRef


class _DistributedGradientTape(tf.GradientTape):
    """The distributed methods; DistributedGradientTape() mixes them into the user's tape class."""

    def __init__(self, tape: Any, device_dense: str, device_sparse: str, compression: type,
                 sparse_as_dense: bool, op: int, gradient_predivide_factor: float, groups: Any,
                 persistent: bool = False, watch_accessed_variables: bool = True,
                 process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True) -> None:
        super(_DistributedGradientTape, self).__init__(persistent, watch_accessed_variables)
        # Take over what the user's tape recorded.
        self._tape = tape
        self._allreduce_grads = _make_allreduce_grads_fn(
            "DistributedGradientTape", device_dense, device_sparse, compression, sparse_as_dense,
            op, gradient_predivide_factor, groups, process_set)
        self._local_sources: set = set()
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients

    def register_local_source(self, source: Any) -> None:
        """Keeps ``source``'s gradient local (not allreduced; scaled by 1/size by default)."""
        self._local_sources.add(_VariableRef(source))

    def _local_gradients(self, target: Any, sources: Sequence[Any],
                         output_gradients: Any) -> List[Any]:
        return super(_DistributedGradientTape, self).gradient(target, sources, output_gradients)

    def gradient(self, target: Any, sources: Sequence[Any], output_gradients: Any = None,
                 use_generic_names: bool = False) -> List[Any]:
        """Gradients of ``target`` w.r.t. ``sources`` (a list), averaged across ranks."""
        gradients = self._local_gradients(target, sources, output_gradients)
        return _reduce_with_local(self._allreduce_grads, gradients, list(sources),
                                  self._local_sources, self.process_set,
                                  self.scale_local_gradients, use_generic_names)

    def get_local_and_global_gradients(self, target: Any, sources: Sequence[Any],
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False
                                       ) -> Tuple[List[Tuple[Any, Any]], List[Tuple[Any, Any]]]:
        """(local (var, grad) pairs, global (var, grad) pairs) for ``sources``."""
        sources = list(sources)
        gradients = self.gradient(target, sources, output_gradients, use_generic_names)
        global_idx, local_idx = _split_local(gradients, sources, self._local_sources)
        return ([(sources[i], gradients[i]) for i in local_idx],
                [(sources[i], gradients[i]) for i in global_idx])


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: type = Compression.none,
                            sparse_as_dense: bool = False, op: int = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Wraps a recorded tf.GradientTape so that gradient() averages gradients across ranks.

    Wrap the tape right after its ``with`` block; the wrapper reuses what it recorded.
    """
    groups = _validate_grouping(op, gradient_predivide_factor, num_groups, groups,
                                rocm=rocm_built())
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    return cls(gradtape._tape, device_dense, device_sparse, compression, sparse_as_dense, op,
               gradient_predivide_factor, groups, gradtape._persistent,
               getattr(gradtape, "_watch_accessed_variables", True), process_set=process_set,
               scale_local_gradients=scale_local_gradients)


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression: type = Compression.none,
                                   sparse_as_dense: bool = False, op: int = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: Optional[Any] = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """DistributedGradientTape whose ``local_layers`` (Keras layers) keep local gradients."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, list):
        local_layers = [local_layers]
    for layer in local_layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError("All local layers must be of type tf.keras.layers.Layer")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
