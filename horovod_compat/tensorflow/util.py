"""Small TensorFlow helpers shared by the frontend modules."""

from typing import Any, Callable, Iterable, List

import tensorflow as tf

from horovod_compat.common.util import _cache  # noqa: F401  (re-exported, as in Horovod)


def _executing_eagerly() -> bool:
    """True in eager mode; False while building a graph or tracing a tf.function."""
    return tf.executing_eagerly()


def _make_subgraph(f: Callable) -> Callable:
    """Wraps ``f`` in tf.function so that its collectives get graph names and run together."""
    return tf.function(f)


class _VariableRef:
    """A hashable handle on a variable, compared by identity.

    Keras 3 variables have no ``ref()`` and are unhashable (elementwise ``__eq__``), so identity is
    the only key that works for both Keras and TensorFlow variables.
    """

    __slots__ = ("_var",)

    def __init__(self, var: Any) -> None:
        self._var = var

    def deref(self) -> Any:
        return self._var

    def __hash__(self) -> int:
        return id(self._var)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _VariableRef) and other._var is self._var

    def __repr__(self) -> str:
        return f"_VariableRef({getattr(self._var, 'name', self._var)!r})"


def vars_to_refs(vars: Iterable[Any]) -> List[_VariableRef]:
    """Hashable references to ``vars`` (see _VariableRef)."""
    return [_VariableRef(v) for v in vars]


def refs_to_vars(refs: Iterable[_VariableRef]) -> List[Any]:
    """Inverse of vars_to_refs."""
    return [r.deref() for r in refs]
