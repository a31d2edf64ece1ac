"""What an elastic job was asked for, checked once (``horovodrun`` flags or ``horovod.run``
keywords)."""

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

# Bounds of --blacklist-cooldown-range, as Horovod's: at least 1 s, at most an hour.
COOLDOWN_LOWER_BOUND_SECONDS = 1
COOLDOWN_UPPER_BOUND_SECONDS = 60 * 60


@dataclass
class ElasticSettings:
    """num_proc: slots that must be available before the first workers start; min_num_proc:
    the fewest ranks a round may have; max_num_proc: the most (None: every discovered slot);
    elastic_timeout: seconds a round waits (None: HOROVOD_ELASTIC_TIMEOUT, else the driver's
    ELASTIC_TIMEOUT_SECS); reset_limit: rounds after the first before the job is stopped;
    cooldown_range: (low, high) seconds a failed host stays blacklisted (None: for good)."""
    discovery: Any
    num_proc: int
    min_num_proc: int
    max_num_proc: Optional[int] = None
    elastic_timeout: Optional[float] = None
    reset_limit: Optional[int] = None
    cooldown_range: Optional[Tuple[int, int]] = None
    nics: Optional[str] = None
    verbose: bool = False
    output_filename: Optional[str] = None
    # launch.py's parsed arguments (ssh flags, --gloo-timeout-seconds...) for the workers' commands.
    args: Any = None
    runtime_env: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.min_num_proc < 1:
            raise ValueError(f"--min-np must be at least 1, got {self.min_num_proc}")
        if self.num_proc < self.min_num_proc:
            raise ValueError(f"-np {self.num_proc} is less than --min-np {self.min_num_proc}")
        if self.max_num_proc is not None and self.max_num_proc < self.num_proc:
            raise ValueError(f"--max-np {self.max_num_proc} is less than -np {self.num_proc}")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ValueError(f"--reset-limit must not be negative, got {self.reset_limit}")
        if self.elastic_timeout is not None and self.elastic_timeout <= 0:
            raise ValueError(f"--elastic-timeout must be positive, got {self.elastic_timeout}")
        if self.cooldown_range is not None:
            low, high = self.cooldown_range
            if low < COOLDOWN_LOWER_BOUND_SECONDS or high > COOLDOWN_UPPER_BOUND_SECONDS \
                    or low > high:
                raise ValueError(f"--blacklist-cooldown-range {low} {high}: need "
                                 f"{COOLDOWN_LOWER_BOUND_SECONDS} <= low <= high <= "
                                 f"{COOLDOWN_UPPER_BOUND_SECONDS} seconds")


def elastic_timeout(settings: ElasticSettings, default: float) -> float:
    """The seconds a round waits: --elastic-timeout, else HOROVOD_ELASTIC_TIMEOUT, else
    ``default``."""
    if settings.elastic_timeout is not None:
        return float(settings.elastic_timeout)
    text = os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "").strip()
    if text:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"HOROVOD_ELASTIC_TIMEOUT={text!r} is not a number") from None
        if value > 0:
            return value
    return float(default)
