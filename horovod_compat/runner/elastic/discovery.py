"""Where the hosts come from: a discovery script run about once a second, or the fixed -H list."""

import subprocess
from typing import Dict, List, Sequence, Tuple

from horovod_compat.runner.elastic import constants

# A discovery script that has not answered in this long is treated as failed.
SCRIPT_TIMEOUT_SECONDS = 60.0


def parse_host_lines(text: str, default_slots: int) -> List[Tuple[str, int]]:
    """``host[:slots]`` lines -> (host, slots) in the order printed (blank lines skipped, a host
    printed twice keeps its last count)."""
    hosts: Dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        name, sep, slots = line.rpartition(":") if ":" in line else (line, "", "")
        if not sep:
            name, count = line, default_slots
        else:
            try:
                count = int(slots)
            except ValueError:
                raise ValueError(f"line {number} of the discovery output, {line!r}: expected "
                                 f"host or host:slots") from None
        if not name or count < 0:
            raise ValueError(f"line {number} of the discovery output, {line!r}: expected "
                             f"host or host:slots")
        hosts.pop(name, None)
        hosts[name] = count
    return [(h, s) for h, s in hosts.items() if s > 0]


class HostDiscoveryScript:
    """Runs ``script`` through the shell; its standard output lists the hosts now available.
    Hosts printed without ``:slots`` get ``default_slots`` (--slots-per-host, else 1)."""

    def __init__(self, script: str, default_slots: int = 1) -> None:
        self.script = script
        self.default_slots = default_slots

    def find_available_hosts_and_slots(self) -> List[Tuple[str, int]]:
        """The hosts and their slots, in the order printed; RuntimeError when the script fails."""
        try:
            done = subprocess.run(self.script, shell=True, stdout=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, timeout=SCRIPT_TIMEOUT_SECONDS,
                                  check=False)
        except subprocess.TimeoutExpired:
            message = constants.DISCOVERY_FAILED_MESSAGE.format(script=self.script, code="none")
            raise RuntimeError(f"{message} (no answer in {SCRIPT_TIMEOUT_SECONDS:.0f} s)") from None
        if done.returncode != 0:
            raise RuntimeError(constants.DISCOVERY_FAILED_MESSAGE.format(
                script=self.script, code=done.returncode))
        try:
            return parse_host_lines(done.stdout.decode(errors="replace"), self.default_slots)
        except ValueError as error:
            raise RuntimeError(f"discovery script {self.script}: {error}") from None


class FixedHosts:
    """The -H / --hostfile hosts, always available (fault tolerance without scaling)."""

    def __init__(self, hosts: Sequence[Tuple[str, int]]) -> None:
        self.hosts = list(hosts)

    def find_available_hosts_and_slots(self) -> List[Tuple[str, int]]:
        return list(self.hosts)
