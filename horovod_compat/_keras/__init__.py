"""Backend-independent parts of the Keras frontends (docs/keras.md).

Keras 3 is handled here; tf_keras (Keras 2.x, ``TF_USE_LEGACY_KERAS=1``) optimizers are
recognised by their class and handled by ``keras2``.

Keras 3's ``model.fit`` never calls ``minimize``/``get_gradients``/``_compute_gradients``: its train
step records a tape and calls ``optimizer.apply_gradients``, which calls ``optimizer.apply``. The
distributed optimizer therefore reduces gradients inside ``apply`` before delegating to the wrapped
optimizer class.
"""

import sys
import warnings
from typing import Any, List, Optional, Sequence

import tensorflow as tf

from horovod_compat.common.process_sets import global_process_set
from horovod_compat.tensorflow.allreduce_grads import _validate_grouping
from horovod_compat.tensorflow.compression import Compression
from horovod_compat.tensorflow.mpi_ops import Average, Sum
from horovod_compat._keras import keras2
from horovod_compat._keras.optimizer_base import CallableList, HorovodOptimizerMixin


class _DistributedMixin(HorovodOptimizerMixin):
    """Methods copied into the dynamically created optimizer subclass."""

    @property
    def variables(self) -> CallableList:
        return CallableList(super().variables)

    # -- Keras 3 hooks ------------------------------------------------------------------------
    def apply(self, grads: Sequence[Any], trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if trainable_variables is None:
            trainable_variables = list(self._trainable_variables)
        else:
            trainable_variables = list(trainable_variables)
            if not self.built:
                with tf.init_scope():
                    self.build(trainable_variables)
                self.built = True
        helper = self._agg_helper
        if helper is None:
            if not self._hvd_take_pre_reduced(grads):
                grads = self._allreduce(grads, trainable_variables)
            return super().apply(grads, trainable_variables)
        reduce = not self._hvd_take_pre_reduced(grads)

        def allreduce_and_apply(summed: List[Any], variables: List[Any]) -> Any:
            if reduce:
                summed = self._allreduce(summed, variables)
            # `super()` without arguments does not work inside a nested function.
            super(_DistributedMixin, self).apply(summed, variables)
            return None

        helper.step(grads, trainable_variables, allreduce_and_apply, self._iterations)
        return self._iterations

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        # Keras 2 callers pass experimental_aggregate_gradients=...; Keras 3 has no such argument.
        kwargs.pop("experimental_aggregate_gradients", None)
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return self._iterations
        grads, variables = zip(*grads_and_vars)
        self.apply(list(grads), list(variables))
        return self._iterations

    # -- helpers kept for custom loops ----------------------------------------------------------
    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> List[Any]:
        if tape is None:
            if not callable(loss):
                raise ValueError("`tape` is required when a `Tensor` loss is passed.")
            with tf.GradientTape() as tape:
                loss_value = loss()
        else:
            loss_value = loss() if callable(loss) else loss
        if callable(var_list):
            var_list = var_list()
        var_list = list(var_list)
        grads = tape.gradient(loss_value, var_list, grad_loss)
        return list(zip(self._hvd_reduce_and_record(grads, var_list), var_list))

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> List[Any]:
        return self._compute_gradients(loss, var_list, None, tape)

    def get_gradients(self, loss: Any, params: Any) -> List[Any]:
        raise NotImplementedError("get_gradients is a Keras 2 graph-mode API; use model.fit or "
                                  "compute_gradients with a tf.GradientTape.")


def _settings(base: type, name: Optional[str] = None, device_dense: str = "",
              device_sparse: str = "", compression: type = Compression.none,
              sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
              op: int = Average, backward_passes_per_step: int = 1,
              average_aggregated_gradients: bool = False, groups: Any = None,
              process_set: Any = global_process_set,
              scale_local_gradients: bool = True) -> dict:
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    return dict(name=name or "Distributed" + base.__name__, device_dense=device_dense,
                device_sparse=device_sparse, compression=compression,
                sparse_as_dense=sparse_as_dense,
                gradient_predivide_factor=gradient_predivide_factor, op=op,
                backward_passes_per_step=int(backward_passes_per_step),
                average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                process_set=process_set, scale_local_gradients=scale_local_gradients)


_jit_guard_installed = False


def _install_jit_guard() -> None:
    """Keras 3 turns XLA on by itself (``jit_compile="auto"``) on a machine with a GPU, and our
    collectives have no XLA lowering: ``fit`` would fail inside the XLA compiler. Keras asks
    ``model_supports_jit`` both when resolving "auto" and when ``jit_compile=True`` is set, and
    falls back to no XLA when it says no; answer no, with a warning, for a model whose optimizer
    is distributed."""
    global _jit_guard_installed
    if _jit_guard_installed:
        return
    _jit_guard_installed = True
    try:
        from keras.src.trainers import trainer as trainer_module
    except ImportError:  # another Keras 3 layout: nothing to guard
        return
    supports_jit = getattr(trainer_module, "model_supports_jit", None)
    if supports_jit is None:
        return

    def model_supports_jit(model: Any) -> bool:
        if getattr(getattr(model, "optimizer", None), "_hvd_settings", None):
            warnings.warn("horovod_compat: the distributed optimizer's collectives cannot be "
                          "compiled by XLA; this model trains with jit_compile=False.",
                          stacklevel=3)
            return False
        return supports_jit(model)

    trainer_module.model_supports_jit = model_supports_jit


def _distributed_class(base: type, settings: dict) -> type:
    """A subclass of the Keras 3 optimizer class ``base`` with the same ``__name__`` whose
    ``apply`` allreduces gradients as ``settings`` say."""
    if getattr(base, "_hvd_settings", None):
        raise ValueError("The optimizer is already a Horovod DistributedOptimizer.")
    if not hasattr(base, "apply"):
        raise ValueError(f"{base.__name__} is not a Keras 3 or tf_keras optimizer.")
    # The mixin comes first in the MRO, so its zero-argument super() calls reach ``base``.
    return type(base.__name__, (_DistributedMixin, base), {
        "_hvd_settings": settings, "__module__": base.__module__,
        "__qualname__": base.__qualname__})


def create_distributed_optimizer(optimizer: Any, name: Optional[str] = None,
                                 device_dense: str = "", device_sparse: str = "",
                                 compression: type = Compression.none,
                                 sparse_as_dense: bool = False,
                                 gradient_predivide_factor: float = 1.0, op: int = Average,
                                 backward_passes_per_step: int = 1,
                                 average_aggregated_gradients: bool = False,
                                 groups: Any = None, process_set: Any = global_process_set,
                                 scale_local_gradients: bool = True) -> Any:
    """A fresh optimizer of a subclass of ``type(optimizer)`` (same ``__name__``) that allreduces
    gradients in ``apply``; built from ``optimizer.get_config()``."""
    base = type(optimizer)
    settings = _settings(base, name=name, device_dense=device_dense,
                         device_sparse=device_sparse, compression=compression,
                         sparse_as_dense=sparse_as_dense,
                         gradient_predivide_factor=gradient_predivide_factor, op=op,
                         backward_passes_per_step=backward_passes_per_step,
                         average_aggregated_gradients=average_aggregated_gradients,
                         groups=groups, process_set=process_set,
                         scale_local_gradients=scale_local_gradients)
    if keras2.is_tf_keras_object(optimizer):
        cls = keras2.distributed_class(base, settings)
    else:
        cls = _distributed_class(base, settings)
        _install_jit_guard()
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


# Keras optimizers that wrap another optimizer: their config holds the inner one, so they are
# not replaced by load_model (the inner optimizer is, when it is deserialized).
_WRAPPER_OPTIMIZERS = ("LossScaleOptimizer", "MultiOptimizer")


def _builtin_optimizer_classes() -> List[type]:
    import keras
    classes = []
    for attr in dir(keras.optimizers):
        cls = getattr(keras.optimizers, attr)
        if (isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)
                and cls is not keras.optimizers.Optimizer
                and cls.__name__ not in _WRAPPER_OPTIMIZERS):
            classes.append(cls)
    return classes


def load_model(filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None,
               compression: type = Compression.none, legacy_opts: bool = False) -> Any:
    """``keras.models.load_model`` with every optimizer deserialized as its distributed
    subclass, so a restored model keeps training with allreduced gradients.

    Keras 3 deserializes built-in optimizers under their lower-cased class name (``"sgd"``) and
    custom ones under their class name; both spellings map to the distributed class.
    ``custom_optimizers`` (classes) are wrapped too; ``custom_objects`` are passed through and
    take precedence."""
    if _load_with_tf_keras(filepath):
        return _load_model_tf_keras(filepath, custom_optimizers, custom_objects, compression,
                                    legacy_opts)
    import keras
    if legacy_opts:
        raise ValueError("legacy_opts=True: keras.optimizers.legacy does not exist in Keras 3; "
                         "save and load models with Keras 3 optimizers (or use tf_keras, "
                         "TF_USE_LEGACY_KERAS=1).")
    objects: dict = {}
    for cls in _builtin_optimizer_classes():
        wrapped = _distributed_class(cls, _settings(cls, compression=compression))
        objects[cls.__name__.lower()] = wrapped
        objects[cls.__name__] = wrapped
    for cls in custom_optimizers or []:
        objects[cls.__name__] = _distributed_class(cls, _settings(cls, compression=compression))
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    if str(filepath).endswith((".h5", ".hdf5")):
        _restore_h5_optimizer_state(model, filepath)
    return model


def _load_with_tf_keras(filepath: Any) -> bool:
    """tf_keras loads the file when it was saved by Keras 2 (tf_keras), or, when the file does
    not say (SavedModel directories), when ``tf.keras`` is tf_keras in this process."""
    major = keras2.saved_keras_major(filepath)
    if major is not None:
        if major >= 3:
            return False
        try:
            keras2._tf_keras()
        except ImportError:
            return False
        return True
    return keras2.tf_keras_active()


def _load_model_tf_keras(filepath: Any, custom_optimizers: Any, custom_objects: Any,
                         compression: type, legacy_opts: bool) -> Any:
    objects: dict = {}
    for cls in keras2.builtin_optimizer_classes(legacy_opts):
        wrapped = keras2.distributed_class(cls, _settings(cls, compression=compression))
        objects[cls.__name__.lower()] = wrapped
        objects[cls.__name__] = wrapped
    for cls in custom_optimizers or []:
        objects[cls.__name__] = keras2.distributed_class(
            cls, _settings(cls, compression=compression))
    objects.update(custom_objects or {})
    return keras2.load_model(filepath, objects)


def _restore_h5_optimizer_state(model: Any, filepath: Any) -> None:
    """Keras 3's HDF5 loader builds the optimizer for ``model._trainable_variables``, which is
    empty for Sequential and functional models: the optimizer then rejects the model's
    variables on the first step and the saved slots are dropped (plain Keras, no Horovod,
    fails the same way). Rebuild it for the model's trainable variables and restore the saved
    optimizer weights."""
    import h5py
    import numpy as np
    optimizer = getattr(model, "optimizer", None)
    if (optimizer is None or not getattr(optimizer, "built", False)
            or list(optimizer._trainable_variables) or not model.trainable_variables):
        return
    optimizer.built = False
    optimizer.build(model.trainable_variables)
    with h5py.File(filepath, "r") as f:
        if "optimizer_weights" not in f:
            return
        group = f["optimizer_weights"]
        names = [n.decode("utf8") if isinstance(n, bytes) else n
                 for n in group.attrs.get("weight_names", [])]
        values = [np.asarray(group[n]) for n in names]
    if len(values) == len(optimizer.variables):
        optimizer.set_weights(values)


def layer_classes() -> tuple:
    """Keras 3's ``Layer``, plus tf_keras's when tf_keras is in use."""
    import keras
    if keras2.tf_keras_active() or "tf_keras" in sys.modules:
        return (keras.layers.Layer, keras2._tf_keras().layers.Layer)
    return (keras.layers.Layer,)


def check_op(op: int, gradient_predivide_factor: float, num_groups: int, groups: Any) -> Any:
    if op not in (Average, Sum):
        raise ValueError("op currently only supports Average and Sum")
    return _validate_grouping(Average, gradient_predivide_factor if op == Average else 1.0,
                              num_groups, groups)


def _value_helper(collective: Any, value: Any, name: Optional[str], *args: Any,
                  **kwargs: Any) -> Any:
    if not tf.executing_eagerly():
        raise RuntimeError("Keras value helpers need eager execution (Keras 3 has no session).")
    return collective(tf.constant(value, name=name), *args, name=name, **kwargs)
