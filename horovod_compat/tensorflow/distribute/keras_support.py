"""What Keras needs from HorovodStrategy beyond the tf.distribute API.

Keras (3 and tf_keras) gathers ``predict`` outputs across workers only for
MultiWorkerMirroredStrategy; for any other strategy it concatenates this process's replicas,
which under one replica per process would be this rank's slice only. The hook below makes
``predict`` return every rank's rows, in input order, on every rank.

Keras 3 also builds a model from its first batch by MEAN-reducing that batch across replicas:
an allreduce of a whole data batch, which fails when the ranks' shares differ in size (an
uneven last or only batch). Under HorovodStrategy that reduction returns the local batch (only
its structure and shapes are used).

Keras 3 turns XLA on by itself on a machine with a GPU (``jit_compile="auto"``), and the
runtime's collectives have no XLA lowering: a model built under HorovodStrategy answers "no" to
``model_supports_jit``, with a warning, so Keras trains it without XLA. None of the hooks
changes anything for other strategies.

Keras 3's LossScaleOptimizer decides whether to apply a step from this replica's gradients
before they are reduced, assuming replicas agree; across processes they need not (one rank's
batch may overflow), and a rank that skips the step would leave the others waiting in the
gradient allreduce. Under HorovodStrategy the finite flag is reduced (logical AND) over all
ranks, so every rank applies or skips the same steps.
"""

import sys
import warnings
from typing import Any, Callable

import tensorflow as tf

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.distribute.cross_device_ops import _local_value

_KERAS3_TRAINER = "keras.src.backend.tensorflow.trainer"
_KERAS3_TRAINERS = "keras.src.trainers.trainer"
_KERAS3_LOSS_SCALE = "keras.src.optimizers.loss_scale_optimizer"
# Modules whose module-level ``reduce_per_replica`` Keras' predict step calls.
_TRAINER_MODULES = ("keras.src.backend.tensorflow.trainer", "tf_keras.src.engine.training")


def _is_horovod_strategy(strategy: Any) -> bool:
    # A class attribute of HorovodStrategy: strategy.py imports this module, not the reverse.
    return getattr(type(strategy), "_horovod_compat_strategy", False) is True


def _gather_rows(value: Any, strategy: Any) -> Any:
    """Every rank's rows of one predict output, in rank order (= input order per step)."""
    if isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
        raise NotImplementedError("HorovodStrategy: predict outputs that are sparse or ragged "
                                  "tensors cannot be gathered across ranks")
    local = _local_value(value)
    if local.shape.rank == 0:
        local = tf.expand_dims(local, 0)
    return strategy.extended._cross_device_ops.gather_local(local, 0)  # pylint: disable=W0212


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "_hvdc_wrapped", False):
        return original

    def reduce_per_replica(values: Any, strategy: Any, reduction: str, *args: Any,
                           **kwargs: Any) -> Any:
        if reduction == "concat" and _is_horovod_strategy(strategy):
            return tf.nest.map_structure(lambda v: _gather_rows(v, strategy), values)
        return original(values, strategy, reduction, *args, **kwargs)

    reduce_per_replica._hvdc_wrapped = True  # type: ignore[attr-defined]
    reduce_per_replica.__wrapped__ = original  # type: ignore[attr-defined]
    return reduce_per_replica


def _wrap_symbolic_build(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "_hvdc_wrapped", False):
        return original

    def _maybe_symbolic_build(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = getattr(self, "_distribute_strategy", None)
        if not _is_horovod_strategy(strategy):
            return original(self, *args, **kwargs)
        with strategy.extended.local_reductions():
            return original(self, *args, **kwargs)

    _maybe_symbolic_build._hvdc_wrapped = True  # type: ignore[attr-defined]
    _maybe_symbolic_build.__wrapped__ = original  # type: ignore[attr-defined]
    return _maybe_symbolic_build


def _wrap_supports_jit(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "_hvdc_strategy_wrapped", False):
        return original

    def model_supports_jit(model: Any) -> bool:
        if _is_horovod_strategy(getattr(model, "_distribute_strategy", None)):
            warnings.warn("horovod_compat: HorovodStrategy's collectives cannot be compiled by "
                          "XLA; this model runs with jit_compile=False.", stacklevel=3)
            return False
        return original(model)

    model_supports_jit._hvdc_strategy_wrapped = True  # type: ignore[attr-defined]
    model_supports_jit.__wrapped__ = original  # type: ignore[attr-defined]
    return model_supports_jit


def _wrap_check_finite(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "_hvdc_wrapped", False):
        return original

    def check_finite(self: Any, grads: Any) -> Any:
        finite = original(self, grads)
        if _is_horovod_strategy(tf.distribute.get_strategy()) and mpi_ops.size() > 1:
            everywhere = mpi_ops._allreduce(tf.cast(finite, tf.int32), op=mpi_ops.Min)
            finite = tf.greater(everywhere, 0)
        return finite

    check_finite._hvdc_wrapped = True  # type: ignore[attr-defined]
    check_finite.__wrapped__ = original  # type: ignore[attr-defined]
    return check_finite


def install() -> None:
    """Wraps the hooks of each Keras trainer module already imported (idempotent)."""
    for name in _TRAINER_MODULES:
        module = sys.modules.get(name)
        original = getattr(module, "reduce_per_replica", None) if module is not None else None
        if original is not None:
            module.reduce_per_replica = _wrap(original)
    trainer_class = getattr(sys.modules.get(_KERAS3_TRAINER), "TensorFlowTrainer", None)
    build = getattr(trainer_class, "_maybe_symbolic_build", None)
    if build is not None:
        trainer_class._maybe_symbolic_build = _wrap_symbolic_build(build)
    trainers = sys.modules.get(_KERAS3_TRAINERS)
    supports_jit = getattr(trainers, "model_supports_jit", None)
    if supports_jit is not None:
        trainers.model_supports_jit = _wrap_supports_jit(supports_jit)
    loss_scale = getattr(sys.modules.get(_KERAS3_LOSS_SCALE), "LossScaleOptimizer", None)
    if loss_scale is not None and hasattr(loss_scale, "check_finite"):
        loss_scale.check_finite = _wrap_check_finite(loss_scale.check_finite)
