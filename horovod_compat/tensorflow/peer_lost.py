"""A lost peer reaches TensorFlow code as ``HorovodInternalError``.

When a peer rank dies, hangs or is cut off, the core fails every pending and later collective with
its PEER_LOST status. The op kernels turn it into TensorFlow's ``UnknownError`` (the class Horovod
raises) carrying the payload ``PEER_LOST_PAYLOAD``. TensorFlow builds the Python exception from a
status in two places (see ``install``), whatever ran the op: an eager call, a ``tf.function``
(``model.fit``'s train function included) or a tensor read. We wrap them so that a status with
that payload becomes ``HorovodPeerLostError``, a subclass of both
``tf.errors.UnknownError`` and ``HorovodInternalError``: ``except HorovodInternalError`` catches it
(what Horovod's elastic mode catches), and code written for Horovod's ``UnknownError`` still does.
Graph-mode sessions (TF1 ``Session.run``) raise through another path and still get the plain
``UnknownError``.
"""

from typing import Any

import tensorflow as tf

from horovod_compat.common.exceptions import HorovodInternalError

# Set by python/tensorflow/kernel_common.cc (kPeerLostPayload) on HVDC_PEER_LOST errors.
PEER_LOST_PAYLOAD = "horovod_compat.PeerLost"


class HorovodPeerLostError(tf.errors.UnknownError, HorovodInternalError):
    """A collective failed because a peer rank was lost; the message names the rank and host."""


def _has_peer_lost_payload(error: Any) -> bool:
    payloads = getattr(error, "experimental_payloads", None) or {}
    return any(key in (PEER_LOST_PAYLOAD, PEER_LOST_PAYLOAD.encode()) for key in payloads)


def to_internal_error(error: Any) -> Any:
    """``error`` as a ``HorovodPeerLostError`` when it carries the lost-peer payload, else as is."""
    if isinstance(error, tf.errors.UnknownError) and not isinstance(error, HorovodInternalError) \
            and _has_peer_lost_payload(error):
        converted = HorovodPeerLostError(error.node_def, error.op, error.message,
                                         error.experimental_payloads)
        converted.__traceback__ = error.__traceback__
        return converted
    return error


def _converting(execute_fn: Any) -> Any:
    """``execute_fn`` (an op or function executor) raising converted errors."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return execute_fn(*args, **kwargs)
        except tf.errors.UnknownError as e:
            converted = to_internal_error(e)
            if converted is e:
                raise
            raise converted.with_traceback(e.__traceback__) from None

    wrapper._hvdc_peer_lost = True  # type: ignore[attr-defined]
    wrapper.__wrapped__ = execute_fn  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Makes TensorFlow raise ``HorovodPeerLostError`` for lost-peer statuses (idempotent).

    Two places build the exception: ``core._status_to_exception`` (eager ops, tensor reads), and
    the C++ of ``TFE_Py_Execute`` itself, which raises the class registered for the code -- the
    path of ``tf.function`` calls (``context.call_function`` -> ``execute.execute``). The first is
    wrapped, and the executors of the second are wrapped to convert what they raise.
    """
    from tensorflow.python.eager import core, execute

    original = core._status_to_exception  # pylint: disable=protected-access
    if not getattr(original, "_hvdc_peer_lost", False):
        def _status_to_exception(status: Any) -> Any:
            return to_internal_error(original(status))

        _status_to_exception._hvdc_peer_lost = True  # type: ignore[attr-defined]
        core._status_to_exception = _status_to_exception  # pylint: disable=protected-access
    for name in ("quick_execute", "execute", "execute_with_cancellation"):
        fn = getattr(execute, name, None)
        if fn is not None and not getattr(fn, "_hvdc_peer_lost", False):
            setattr(execute, name, _converting(fn))
