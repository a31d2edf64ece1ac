"""Python objects as base64 text, so they can travel in environment variables and command lines."""

import base64
from typing import Any, Union


def _pickler() -> Any:
    try:
        import cloudpickle  # functions defined in __main__ or in closures travel by value
        return cloudpickle
    except ImportError:
        import pickle
        return pickle


def dumps_base64(obj: Any, to_ascii: bool = True) -> Union[str, bytes]:
    """Pickles ``obj`` and base64-encodes it; a ``str`` when ``to_ascii``, else ``bytes``."""
    encoded = base64.b64encode(_pickler().dumps(obj))
    return encoded.decode("ascii") if to_ascii else encoded


def loads_base64(encoded: Union[str, bytes]) -> Any:
    """The object that ``dumps_base64`` encoded."""
    if isinstance(encoded, str):
        encoded = encoded.encode("ascii")
    return _pickler().loads(base64.b64decode(encoded))
