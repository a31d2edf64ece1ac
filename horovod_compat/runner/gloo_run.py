"""Running an elastic job over the TCP transport (``horovod.runner.gloo_run``'s elastic half):
the rendezvous service with the driver's endpoints, the workers' environment, signals."""

import argparse
import secrets
import signal
import threading
from typing import Dict, List, Optional, Sequence

from horovod_compat.runner import gloo_launch
from horovod_compat.runner.common.util.hosts import SlotInfo
from horovod_compat.runner.elastic import driver as elastic_driver
from horovod_compat.runner.elastic.settings import ElasticSettings
from horovod_compat.runner.elastic.workers import WorkerLauncher
from horovod_compat.runner.rendezvous import RendezvousServer

ANY_ADDRESS = "0.0.0.0"


def _get_min_start_hosts(settings: ElasticSettings) -> int:
    """How many hosts must be discovered before the first workers start. Horovod waits for two
    without --network-interface, to probe which interfaces the hosts share; this launcher needs
    no probe (the workers get an address that routes to it), so one. Tests patch it, as
    Horovod's do."""
    return 1


class RendezvousAddresses:
    """Where the service listens, and the address each worker is told to reach it at.

    With --network-interface: that interface's address, for everyone. Else, a job that may see
    other machines (a discovery script, or a remote host in -H) listens on every interface and
    tells a remote worker the local address that routes to its host, and a local worker the
    address that routes to the first remote host of the job (so the address the worker's
    transport advertises is reachable from there), or 127.0.0.1 while every host is local."""

    def __init__(self, nics: Optional[str], hosts: Sequence[str], discovery_script: bool,
                 is_local=gloo_launch.is_local_host) -> None:
        self._is_local = is_local
        self._fixed: Optional[str] = None
        if nics:
            for name in nics.split(","):
                address = gloo_launch.interface_address(name.strip())
                if address:
                    self._fixed = address
                    break
            else:
                raise ValueError(f"--network-interface {nics}: no such interface with an IPv4 "
                                 f"address on this machine")
            self.bind = self._fixed
        elif discovery_script or not all(is_local(h) for h in hosts):
            self.bind = ANY_ADDRESS
        else:
            self.bind = self._fixed = "127.0.0.1"

    def for_worker(self, host: str, job_hosts: Sequence[str]) -> str:
        if self._fixed is not None:
            return self._fixed
        if not self._is_local(host):
            return gloo_launch.route_source_address(host)
        remote = [h for h in job_hosts if not self._is_local(h)]
        return gloo_launch.route_source_address(remote[0]) if remote else "127.0.0.1"


def worker_variables(info: SlotInfo, address: str, port: int, args: argparse.Namespace,
                     settings: ElasticSettings, timeout: float) -> Dict[str, str]:
    """An elastic worker's variables (docs/elastic.md): Horovod's Gloo variables for its
    planned place (it must not trust the rank ones: it asks the driver at every init), its
    identity (HOROVOD_HOSTNAME, HOROVOD_LOCAL_RANK), HOROVOD_ELASTIC=1 and the round timeout."""
    env = gloo_launch.rank_env(info, (address, port), args)
    env["HOROVOD_ELASTIC"] = "1"
    env["HOROVOD_ELASTIC_TIMEOUT"] = f"{timeout:g}"
    return env


def gloo_run_elastic(settings: ElasticSettings, command: List[str],
                     forwarded: Sequence[str], never: Sequence[str],
                     discovery_script: bool,
                     first_hosts: Sequence[str]) -> elastic_driver.JobResult:
    """Runs an elastic job to its end and returns how it ended."""
    args = settings.args
    addresses = RendezvousAddresses(settings.nics, first_hosts, discovery_script)
    secret = secrets.token_hex(32)
    launcher = WorkerLauncher(command, settings.runtime_env, forwarded, never, secret, args,
                              settings.output_filename, settings.verbose)
    holder: Dict[str, elastic_driver.ElasticDriver] = {}
    server = RendezvousServer(secret, elastic=_Endpoints(holder))
    _, port = server.start(addresses.bind, 0)
    try:
        def env_for(info: SlotInfo, hosts: List[str]) -> Dict[str, str]:
            return worker_variables(info, addresses.for_worker(info.hostname, hosts), port,
                                    args, settings, driver.timeout)

        driver = elastic_driver.ElasticDriver(settings, launcher, env_for,
                                              server.store.drop_scope)
        holder["driver"] = driver
        if settings.verbose:
            print(f"horovodrun: rendezvous service on {addresses.bind}:{port}", flush=True)

        def forward(signum: int, _frame: object) -> None:
            driver.forward(signum)

        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = ({s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
                    if in_main_thread else {})
        try:
            return driver.run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        server.stop()


class _Endpoints:
    """The driver's endpoints for the rendezvous service, answering 404 until it exists."""

    def __init__(self, holder: Dict[str, elastic_driver.ElasticDriver]) -> None:
        self._holder = holder

    def ready(self, identity: str, last_round: int) -> None:
        if "driver" in self._holder:
            self._holder["driver"].ready(identity, last_round)

    def assignment(self, identity: str) -> Optional[bytes]:
        driver = self._holder.get("driver")
        return None if driver is None else driver.assignment(identity)

    def hosts_event(self) -> bytes:
        driver = self._holder.get("driver")
        return b"0 0" if driver is None else driver.hosts_event()
