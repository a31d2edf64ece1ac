"""tf.data service jobs (``horovod.tensorflow.data.compute_service``): the configuration a compute
job writes and training jobs read, the context through which a training rank finds its
dispatcher, and what every compute worker runs.

TensorFlow's own ``tf.data.experimental.service`` servers do the data work; our compute service
(``horovod_compat.runner.common.service.compute_service``) only tells them about each other.
"""

import binascii
import dataclasses
import json
import os
import sys
import threading
import time
import _thread
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

from horovod_compat.runner.common.service.compute_service import (
    HEARTBEAT_SECONDS, ComputeClient, ComputeServiceError)

DISPATCHER_SIDES = ("compute", "training")
#: After a lost compute worker is reported to a training rank whose main thread does not come
#: back from TensorFlow (a tf.data read waiting for that worker), the process exits this many
#: seconds later with status 1.
LOST_EXIT_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class TfDataServiceConfig:
    """What a training job needs to reach a compute job: the number of dispatchers, the workers
    each has, where the dispatchers run ('compute' or 'training'), the compute service's
    addresses ({interface: [(host, port)]}) and key, and the timeout (seconds) for waits."""
    dispatchers: int
    workers_per_dispatcher: int
    dispatcher_side: str
    addresses: Mapping[str, Sequence[Tuple[str, int]]]
    key: bytes
    timeout: int = 60

    def __post_init__(self) -> None:
        if self.dispatcher_side not in DISPATCHER_SIDES:
            raise ValueError(f"dispatcher_side must be one of {DISPATCHER_SIDES}, got "
                             f"{self.dispatcher_side!r}")

    def compute_client(self, verbose: int = 1) -> ComputeClient:
        return ComputeClient(self.addresses, self.key, verbose=verbose)

    def to_dict(self) -> Dict[str, Any]:
        return {"dispatchers": self.dispatchers,
                "workers_per_dispatcher": self.workers_per_dispatcher,
                "dispatcher_side": self.dispatcher_side,
                "addresses": {nic: [list(a) for a in addrs]
                              for nic, addrs in self.addresses.items()},
                "key": binascii.hexlify(self.key).decode(),
                "timeout": self.timeout}

    @staticmethod
    def from_dict(config: Mapping[str, Any]) -> "TfDataServiceConfig":
        return TfDataServiceConfig(
            dispatchers=int(config["dispatchers"]),
            workers_per_dispatcher=int(config["workers_per_dispatcher"]),
            dispatcher_side=config["dispatcher_side"],
            addresses={nic: [(str(a[0]), int(a[1])) for a in addrs]
                       for nic, addrs in config["addresses"].items()},
            key=binascii.unhexlify(config["key"]),
            timeout=int(config.get("timeout", 60)))

    def write(self, filename: str) -> None:
        """Writes the JSON file (owner-readable only: it holds the key), atomically, so a reader
        never sees half of it."""
        partial = f"{filename}.{os.getpid()}.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f)
        os.replace(partial, filename)

    @staticmethod
    def read(filename: str, wait_for_file_creation: bool = False) -> "TfDataServiceConfig":
        """Reads the file; with ``wait_for_file_creation`` first waits for it to appear (the
        training job started before the compute job)."""
        while wait_for_file_creation and not os.path.exists(filename):
            time.sleep(0.2)
        with open(filename) as f:
            return TfDataServiceConfig.from_dict(json.load(f))


class _LossWatch:
    """While a training rank uses the data service: polls the compute service, and when it
    reports a lost compute worker, or cannot be reached before it announced its shutdown, says
    so, interrupts the main thread and, if that stays inside TensorFlow, exits the process."""

    def __init__(self, client: ComputeClient, rank: int) -> None:
        self._client = client
        self._rank = rank
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hvdc-data-service-watch",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        unreachable = 0
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                status = self._client.status()
            except ComputeServiceError as error:
                unreachable += 1
                if unreachable < 3:
                    continue
                why = f"{error}"
            else:
                unreachable = 0
                if status.get("shutdown"):
                    return
                if not status.get("lost"):
                    continue
                why = status["lost"][0]
            if self._stop.is_set():
                return
            self._fail(why)
            return

    def _fail(self, why: str) -> None:
        sys.stderr.write(f"horovod_compat.tensorflow.data: training rank {self._rank}: the "
                         f"tf.data service failed: {why}; ending this rank (exit in "
                         f"{LOST_EXIT_SECONDS:.0f} s unless it stops first)\n")
        sys.stderr.flush()
        _thread.interrupt_main()
        if not self._stop.wait(LOST_EXIT_SECONDS):
            os._exit(1)


def _stop_server(server: Any) -> None:
    # stop() is public in recent TensorFlow; older releases have only the wrapped server's.
    stop = getattr(server, "stop", None) or server._server.stop
    stop()


def _dispatch_server() -> Any:
    import tensorflow as tf
    return tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=0))


@contextmanager
def tf_data_service(compute_config: TfDataServiceConfig, rank: int) -> Iterator[str]:
    """Yields the address of the tf.data dispatcher through which training rank ``rank``
    distributes its dataset (``tf.data.experimental.service.distribute(service=...)``), once
    that dispatcher and all its workers have registered. With ``dispatcher_side='training'``
    the dispatchers run here: on every rank (one dispatcher per rank), or on rank 0 only (one
    dispatcher for all). While inside, a lost compute worker ends this rank with an error
    instead of letting it wait for data forever."""
    config = compute_config
    client = config.compute_client(verbose=2)
    server = None
    if config.dispatcher_side == "training" and (config.dispatchers > 1 or rank == 0):
        server = _dispatch_server()
        client.register_dispatcher(rank if config.dispatchers > 1 else 0, server.target)
    dispatcher_id = rank if config.dispatchers > 1 else 0
    watch = None
    try:
        address = client.wait_for_dispatcher_registration(dispatcher_id, config.timeout)
        client.wait_for_dispatcher_worker_registration(dispatcher_id, config.timeout)
        watch = _LossWatch(client, rank)
        yield address
    finally:
        if watch is not None:
            watch.stop()
        if server is not None:
            _stop_server(server)


def send_to_data_service(dataset: Any, compute_config: TfDataServiceConfig, rank: int,
                         size: Optional[int] = None, reuse_dataset: bool = False,
                         round_robin: bool = False) -> Any:
    """``dataset`` distributed through the compute job's dispatcher for ``rank`` (dispatchers
    on the compute side only). ``reuse_dataset``: ranks read one shared job, first come first
    served (``round_robin``: in turn, ``size`` consumers)."""
    import tensorflow as tf
    if compute_config.dispatcher_side == "training":
        raise RuntimeError("send_to_data_service needs dispatchers on the compute side; with "
                           "dispatcher_side='training' use the tf_data_service context")
    client = compute_config.compute_client(verbose=2)
    dispatcher_id = rank if compute_config.dispatchers > 1 else 0
    address = client.wait_for_dispatcher_registration(dispatcher_id, compute_config.timeout)
    client.wait_for_dispatcher_worker_registration(dispatcher_id, compute_config.timeout)
    # The dataset outlives this call: watch for lost workers for the rest of the process.
    _LossWatch(client, rank)
    shared = reuse_dataset and round_robin
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode="distributed_epoch", service=address,
        job_name="job" if reuse_dataset else None,
        consumer_index=rank if shared else None,
        num_consumers=size if shared else None))


def _install_dataset_method() -> None:
    """Horovod adds ``send_to_data_service`` to ``tf.data.Dataset``; so do we, on import."""
    import tensorflow as tf
    if not hasattr(tf.data.Dataset, "send_to_data_service"):
        tf.data.Dataset.send_to_data_service = send_to_data_service


def compute_worker_fn(compute_config: TfDataServiceConfig, timeout: Optional[int] = None) -> None:
    """What every rank of a compute job runs: the dispatcher of its group (compute side, first
    rank of each group of ``workers_per_dispatcher``), a tf.data worker for that dispatcher, and
    heartbeats to the compute service until it shuts down."""
    import tensorflow as tf
    import horovod_compat.tensorflow as hvd
    hvd.init()
    index = hvd.rank()
    config = compute_config
    dispatcher_index = index // config.workers_per_dispatcher
    client = config.compute_client(verbose=2)
    servers = []
    try:
        if config.dispatcher_side == "compute" and index % config.workers_per_dispatcher == 0:
            dispatcher = _dispatch_server()
            servers.append(dispatcher)
            client.register_dispatcher(dispatcher_index, dispatcher.target)
        address = client.wait_for_dispatcher_registration(dispatcher_index, config.timeout)
        worker_config = tf.data.experimental.service.WorkerConfig(
            dispatcher_address=address.split("://", 1)[-1], port=0,
            # What the dispatcher hands to readers: this host as the compute service sees it
            # (TensorFlow puts the bound port in place of %port%).
            worker_address=f"{client.local_address()}:%port%",
            heartbeat_interval_ms=1000,
            dispatcher_timeout_ms=int(timeout * 1000) if timeout else None)
        worker = tf.data.experimental.service.WorkerServer(worker_config)
        servers.append(worker)
        client.register_worker_for_dispatcher(dispatcher_index, index)
        while True:
            try:
                if client.heartbeat(index) or client.wait_for_shutdown(HEARTBEAT_SECONDS):
                    break
            except ComputeServiceError:
                break  # the service is gone: its rank ended the job (or died, and so do we)
    finally:
        for server in reversed(servers):
            _stop_server(server)
