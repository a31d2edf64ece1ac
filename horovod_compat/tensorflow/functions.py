"""Variable and Python-object helpers built on the collectives."""

import io
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import cloudpickle
import numpy as np
import tensorflow as tf

from horovod_compat.common.process_sets import ProcessSet, global_process_set
from horovod_compat.tensorflow.mpi_ops import allgather, broadcast, broadcast_, rank
from horovod_compat.tensorflow.util import _executing_eagerly, _make_subgraph, vars_to_refs


_EAGER_BROADCAST_FNS: Dict[Tuple[Any, ...], Callable] = {}


def _eager_broadcast_fn(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet) -> Callable:
    """A cached tf.function broadcasting ``variables`` together (graph names, one launch).

    The variables are captured, not passed as arguments: Keras 3 variables passed to a
    tf.function arrive as plain tensors that cannot be assigned.
    """
    key = (tuple(vars_to_refs(variables)), root_rank, process_set.process_set_id)
    fn = _EAGER_BROADCAST_FNS.get(key)
    if fn is None:
        def broadcast_group() -> None:
            for var in variables:
                var.assign(broadcast(var, root_rank, process_set=process_set))

        fn = _make_subgraph(broadcast_group)
        _EAGER_BROADCAST_FNS[key] = fn
    return fn


def _device_of(var: Any) -> str:
    device = getattr(var, "device", None)
    if device is None:  # Keras 3 variables keep the TF variable in .value
        device = getattr(getattr(var, "value", None), "device", "")
    return device or ""


def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set,
                        inplace: bool = False) -> Any:
    """Assigns ``root_rank``'s values to ``variables`` on every rank.

    Eager: runs now and returns None. Graph mode: returns an op to run. ``inplace=True`` uses the
    in-place broadcast op (one per device) instead of assign(broadcast(...)).
    """
    variables = list(variables)
    if inplace:
        by_device = defaultdict(list)
        for var in variables:
            by_device[_device_of(var)].append(var)
        results = []
        for device, device_vars in by_device.items():
            with tf.device(device):
                results.append(broadcast_(device_vars, root_rank, process_set=process_set))
        if _executing_eagerly():
            return None
        return tf.group(*[r for result in results for r in (result or [])])
    if _executing_eagerly():
        _eager_broadcast_fn(variables, root_rank, process_set)()
        return None
    return tf.group(*[var.assign(broadcast(var, root_rank, process_set=process_set))
                      for var in variables])


def broadcast_global_variables(root_rank: int) -> Any:
    """Graph mode: an op broadcasting every global variable from ``root_rank``.

    Raises RuntimeError in eager mode (use broadcast_variables there).
    """
    if _executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _run(session: Optional[Any], tensor: Any) -> Any:
    if _executing_eagerly():
        return tensor.numpy()
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise ValueError("Graph mode needs a session: pass session= or use a default session.")
    return session.run(tensor)


def broadcast_object(obj: Any, root_rank: int = 0, session: Optional[Any] = None,
                     name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns ``root_rank``'s ``obj`` (any cloudpickle-able object) on every rank."""
    name = name or type(obj).__name__
    if rank() == root_rank:
        buf = io.BytesIO()
        cloudpickle.dump(obj, buf)
        payload = np.frombuffer(buf.getvalue(), dtype=np.uint8)
        length = np.array([len(payload)], dtype=np.int32)
    else:
        payload = None
        length = np.array([0], dtype=np.int32)

    sz = broadcast(tf.constant(length, dtype=tf.int32), root_rank, name=name + ".sz",
                   process_set=process_set)
    length = _run(session, sz)
    if payload is None:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    data = broadcast(tf.constant(payload, dtype=tf.uint8), root_rank, name=name + ".t",
                     process_set=process_set)
    data = _run(session, data)
    if rank() == root_rank:
        return obj
    return cloudpickle.loads(data.tobytes())


def broadcast_object_fn(root_rank: int = 0, session: Optional[Any] = None,
                        name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """Graph mode (TF1 style): a reusable ``fn(obj) -> root's obj`` built on placeholders."""
    name = name or "broadcast_object_fn"
    sz = tf.compat.v1.placeholder(tf.int32, [1], name="bcast_object_size")
    bcast_size = broadcast(sz, root_rank, name=name + ".sz", process_set=process_set)
    t = tf.compat.v1.placeholder(tf.uint8, [None], name="bcast_object_data")
    bcast_data = broadcast(t, root_rank, name=name + ".t", process_set=process_set)
    session = session or tf.compat.v1.get_default_session()

    def _bcast(obj: Any) -> Any:
        if rank() == root_rank:
            buf = io.BytesIO()
            cloudpickle.dump(obj, buf)
            payload = np.frombuffer(buf.getvalue(), dtype=np.uint8)
            length = [len(payload)]
        else:
            payload = None
            length = [0]
        length = session.run(bcast_size, feed_dict={sz: length})
        if payload is None:
            payload = np.zeros(int(length[0]), dtype=np.uint8)
        data = session.run(bcast_data, feed_dict={t: payload})
        if rank() == root_rank:
            return obj
        return cloudpickle.loads(data.tobytes())

    return _bcast


def allgather_object(obj: Any, session: Optional[Any] = None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Returns the list of every set rank's ``obj``, in rank order."""
    name = name or type(obj).__name__
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    payload = np.frombuffer(buf.getvalue(), dtype=np.uint8)

    sizes = allgather(tf.constant([len(payload)], dtype=tf.int32), name=name + ".sz",
                      process_set=process_set)
    sizes = _run(session, sizes)
    gathered = allgather(tf.constant(payload, dtype=tf.uint8), name=name + ".t",
                         process_set=process_set)
    gathered = _run(session, gathered)

    results = []
    offset = 0
    for n in sizes:
        results.append(cloudpickle.loads(gathered[offset:offset + n].tobytes()))
        offset += n
    return results

