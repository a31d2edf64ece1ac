"""The Keras frontends on ``tf_keras`` (Keras 2.x, ``TF_USE_LEGACY_KERAS=1``).

``tf_keras``'s ``Model.train_step`` calls ``optimizer.minimize(loss, variables, tape=tape)``, which
computes the gradients (``compute_gradients`` for ``tf_keras.optimizers.Optimizer``,
``_compute_gradients`` for ``tf_keras.optimizers.legacy.Optimizer``) and hands them to
``apply_gradients``. The distributed optimizer reduces in ``apply_gradients`` (so custom loops that
call ``apply_gradients`` directly reduce too, as on Keras 3), and ``minimize`` feeds it the raw
gradients. ``compute_gradients``/``_compute_gradients``/``get_gradients`` called directly return
allreduced gradients (Horovod's Keras 2 contract); ``apply_gradients`` recognises those tensors and
does not reduce them a second time.
"""

import importlib
from typing import Any, List, Optional, Sequence

import tensorflow as tf

from horovod_compat._keras.optimizer_base import CallableList, HorovodOptimizerMixin


def _tf_keras() -> Any:
    return importlib.import_module("tf_keras")


def is_tf_keras_object(obj: Any) -> bool:
    """True when ``obj`` (an instance or a class) comes from the ``tf_keras`` package."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(c.__module__.split(".")[0] == "tf_keras" for c in cls.__mro__)


def tf_keras_active() -> bool:
    """True when ``tf.keras`` is ``tf_keras`` in this process (``TF_USE_LEGACY_KERAS=1`` set before
    TensorFlow was imported, with ``tf_keras`` installed)."""
    try:
        return getattr(tf.keras, "__name__", "").startswith("tf_keras")
    except Exception:  # pragma: no cover - broken Keras installs
        return False


def is_legacy_optimizer(optimizer_or_class: Any) -> bool:
    """True for ``tf_keras.optimizers.legacy.Optimizer`` (OptimizerV2) instances/classes."""
    cls = optimizer_or_class if isinstance(optimizer_or_class, type) else type(optimizer_or_class)
    return issubclass(cls, _tf_keras().optimizers.legacy.Optimizer)


def _dense(grad: Any) -> Any:
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


class _Keras2DistributedMixin(HorovodOptimizerMixin):
    """Methods shared by the distributed subclasses of both tf_keras optimizer families."""

    @property
    def variables(self) -> CallableList:
        # A property on tf_keras.optimizers.Optimizer, a method on the legacy OptimizerV2.
        value = super().variables
        return CallableList(value() if callable(value) else value)

    def _hvd_reduced(self, grads_and_vars: Sequence[Any]) -> List[Any]:
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        return list(zip(self._hvd_reduce_and_record(grads, variables), variables))

    # -- the update ------------------------------------------------------------------------------
    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        reduce = not self._hvd_take_pre_reduced(grads)
        passes = self._hvd_settings["backward_passes_per_step"]
        if passes <= 1:
            if reduce:
                grads = self._allreduce(grads, variables)
            return super().apply_gradients(list(zip(grads, variables)), *args, **kwargs)
        return self._hvd_apply_aggregated(grads, variables, passes, reduce, args, kwargs)

    def _hvd_prepare(self, variables: List[Any]) -> None:
        """Creates the optimizer's own variables outside the conditional update."""
        raise NotImplementedError

    def _hvd_apply_aggregated(self, grads: List[Any], variables: List[Any], passes: int,
                              reduce: bool, args: tuple, kwargs: dict) -> Any:
        present = [k for k, g in enumerate(grads) if g is not None]
        if not present:
            return super().apply_gradients(list(zip(grads, variables)), *args, **kwargs)
        self._hvd_prepare([variables[k] for k in present])
        helper = self._agg_helper

        def allreduce_and_apply(summed: List[Any], present_vars: List[Any]) -> Any:
            if reduce:
                summed = self._allreduce(summed, present_vars)
            # Zero-argument super() does not work inside a nested function.
            super(_Keras2DistributedMixin, self).apply_gradients(
                list(zip(summed, present_vars)), *args, **kwargs)
            return None

        helper.step(grads, variables, allreduce_and_apply, self.iterations)
        return self.iterations

    # -- gradient computation ----------------------------------------------------------------
    def get_gradients(self, loss: Any, params: Any) -> List[Any]:
        base = getattr(super(), "get_gradients", None)
        if base is None:
            raise NotImplementedError("get_gradients is a legacy (OptimizerV2) graph-mode API; "
                                      "use model.fit or compute_gradients with a tape.")
        grads = base(loss, params)
        return self._allreduce(grads, list(params))


class _NewOptimizerMixin(_Keras2DistributedMixin):
    """For ``tf_keras.optimizers.Optimizer`` (the TF 2.11+ optimizer)."""

    def _hvd_prepare(self, variables: List[Any]) -> None:
        with tf.init_scope():
            self.build(variables)
        if hasattr(self, "_current_learning_rate"):
            self._compute_current_learning_rate()

    def minimize(self, loss: Any, var_list: Any, tape: Any = None) -> None:
        # The base minimize would call our (reducing) compute_gradients; reduce once, in apply.
        grads_and_vars = super().compute_gradients(loss, var_list, tape)
        self.apply_gradients(grads_and_vars)

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> List[Any]:
        return self._hvd_reduced(super().compute_gradients(loss, var_list, tape))

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> List[Any]:
        if grad_loss is not None:
            if tape is None:
                raise ValueError("`tape` is required when `grad_loss` is passed.")
            if callable(var_list):
                var_list = var_list()
            var_list = list(var_list)
            grads = tape.gradient(loss() if callable(loss) else loss, var_list, grad_loss)
            return self._hvd_reduced(list(zip(grads, var_list)))
        return self.compute_gradients(loss, var_list, tape)


class _LegacyOptimizerMixin(_Keras2DistributedMixin):
    """For ``tf_keras.optimizers.legacy.Optimizer`` (OptimizerV2)."""

    def _hvd_prepare(self, variables: List[Any]) -> None:
        with tf.init_scope():
            _ = self.iterations
            self._create_all_weights(variables)

    def minimize(self, loss: Any, var_list: Any, grad_loss: Any = None, name: Any = None,
                 tape: Any = None) -> Any:
        grads_and_vars = super()._compute_gradients(loss, var_list=var_list,
                                                    grad_loss=grad_loss, tape=tape)
        return self.apply_gradients(grads_and_vars, name=name)

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> List[Any]:
        return self._hvd_reduced(super()._compute_gradients(loss, var_list=var_list,
                                                            grad_loss=grad_loss, tape=tape))

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> List[Any]:
        return self._compute_gradients(loss, var_list, None, tape)

    def _aggregate_gradients(self, grads_and_vars: Any) -> Any:
        # Cross-replica (tf.distribute) aggregation only; Horovod's reduction is in apply_gradients.
        return super()._aggregate_gradients(grads_and_vars)


def distributed_class(base: type, settings: dict) -> type:
    """A subclass of the tf_keras optimizer class ``base`` with the same ``__name__``."""
    if getattr(base, "_hvd_settings", None):
        raise ValueError("The optimizer is already a Horovod DistributedOptimizer.")
    mixin = _LegacyOptimizerMixin if is_legacy_optimizer(base) else _NewOptimizerMixin
    return type(base.__name__, (mixin, base), {
        "_hvd_settings": settings, "__module__": base.__module__,
        "__qualname__": base.__qualname__})


# tf_keras optimizers that wrap another optimizer (not replaced by load_model).
_WRAPPER_OPTIMIZERS = ("LossScaleOptimizer", "LossScaleOptimizerV3", "MultiOptimizer")


def builtin_optimizer_classes(legacy: bool) -> List[type]:
    tfk = _tf_keras()
    module = tfk.optimizers.legacy if legacy else tfk.optimizers
    root = module.Optimizer
    classes = []
    for attr in dir(module):
        cls = getattr(module, attr)
        if (isinstance(cls, type) and issubclass(cls, root) and cls is not root
                and cls.__name__ not in _WRAPPER_OPTIMIZERS
                and (legacy or not is_legacy_optimizer(cls))):
            classes.append(cls)
    return classes


def load_model(filepath: Any, objects: dict) -> Any:
    return _tf_keras().models.load_model(filepath, custom_objects=objects)


def saved_keras_major(filepath: Any) -> Optional[int]:
    """The Keras major version recorded in a saved ``.keras``/``.h5`` file (None if unknown)."""
    import json
    import os
    import zipfile
    path = os.fspath(filepath)
    version = None
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                if "metadata.json" in archive.namelist():
                    version = json.loads(archive.read("metadata.json")).get("keras_version")
        elif os.path.isfile(path):
            import h5py
            with h5py.File(path, "r") as f:
                version = f.attrs.get("keras_version")
        if isinstance(version, bytes):
            version = version.decode("utf8")
        return int(str(version).split(".")[0]) if version else None
    except Exception:
        return None
