"""Reading a SyncOnRead variable outside ``strategy.run``: a collective with a deadline.

TensorFlow reads a SyncOnRead variable (a Keras metric's state, a variable created with
``synchronization=ON_READ``) in cross-replica context -- ``metric.result()`` after a loop, a log
line, a checkpoint -- by reducing it over all replicas; MWMS does that with a collective across
workers, and so do we: the value is the job-wide SUM or MEAN, so every rank must make the same
read. A rank that reads alone would wait forever for ranks that never come.

Eagerly, HorovodStrategy waits for the others at most the read deadline --
``communication_options.timeout_seconds`` when set (MWMS's knob for its collectives), else the
runtime's ``HOROVOD_STALL_CHECK_TIME_SECONDS`` (60 s) -- and then raises
``tf.errors.DeadlineExceededError`` naming the variable and the rule. No rank can tell sooner
whether the others are late or never coming. The read's collective carries the variable's name,
so inside ``tf.function`` (no deadline) the runtime's stall warning names it.
``ONLY_FIRST_REPLICA`` variables are read locally by TensorFlow without any collective.
"""

import os
import re
import threading
from typing import Any, Dict, Optional

import tensorflow as tf

from horovod_compat.tensorflow import mpi_ops
from horovod_compat.tensorflow.reductions import grouped_allreduce

_DEFAULT_STALL_CHECK_SECONDS = 60.0


def read_deadline(communication_options: Any) -> Optional[float]:
    """Seconds an eager read waits for the other ranks; None: no deadline."""
    timeout = getattr(communication_options, "timeout_seconds", None)
    if timeout:
        return float(timeout)
    if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "0").strip() not in ("", "0"):
        return None
    try:
        seconds = float(os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", ""))
    except ValueError:
        seconds = _DEFAULT_STALL_CHECK_SECONDS
    return seconds if seconds > 0 else _DEFAULT_STALL_CHECK_SECONDS


def _collective_name(variable: Any) -> str:
    return "HorovodStrategyRead_" + re.sub("[^a-zA-Z0-9_]", "_", variable.name)


def _message(variable: Any, op: int, deadline: float) -> str:
    op_name = "mean" if op == mpi_ops.Average else "sum"
    return (
        f"HorovodStrategy: reading the SyncOnRead variable '{variable.name}' (a Keras metric's "
        f"state or a per-replica variable) outside strategy.run returns its {op_name} over all "
        f"{mpi_ops.size()} ranks, so every rank must make this read, in the same order; this "
        f"rank waited {deadline:g} s and the others did not join. Read it on every rank and "
        f"print on one (value = metric.result(), then `if hvd.rank() == 0: print(value)`), or "
        f"read this rank's own share with variable.values[0]. The deadline is "
        f"communication_options.timeout_seconds, else HOROVOD_STALL_CHECK_TIME_SECONDS. The "
        f"read stays pending on this rank until every other rank makes it: end the job.")


def reduce_sync_on_read(variable: Any, op: int, device: str,
                        deadline: Optional[float]) -> tf.Tensor:
    """The job-wide reduction of ``variable``'s local value (no compression: a read is exact)."""
    local = tf.convert_to_tensor(variable.values[0])
    name = _collective_name(variable)

    def reduce() -> tf.Tensor:
        with tf.device(device):
            return grouped_allreduce([local], op=op, name=name)[0]

    if mpi_ops.size() == 1 or deadline is None or not tf.executing_eagerly():
        return reduce()
    # The eager op blocks its thread until every rank has joined: wait for it from here.
    box: Dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = reduce()
        except BaseException as e:  # pylint: disable=broad-except  # re-raised below
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"hvdc-read-{name}", daemon=True).start()
    if not done.wait(deadline):
        raise tf.errors.DeadlineExceededError(None, None, _message(variable, op, deadline))
    if "error" in box:
        raise box["error"]
    return box["value"]
