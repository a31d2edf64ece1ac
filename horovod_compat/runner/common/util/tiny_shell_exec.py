"""Run a short shell command and capture what it prints."""

import subprocess
from typing import Mapping, Optional, Tuple


def execute(command: str, env: Optional[Mapping[str, str]] = None) -> Tuple[str, int]:
    """Runs ``command`` through the shell and returns (stdout and stderr interleaved as text,
    exit code)."""
    result = subprocess.run(command, shell=True, env=None if env is None else dict(env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    return result.stdout.decode("utf-8", errors="replace"), result.returncode
