"""Horovod's ``horovod.runner.common.util.config_parser``: launcher flags as HOROVOD_* variables."""

import argparse
from typing import Dict, MutableMapping

LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"]


def set_env_from_args(env: MutableMapping[str, str], args: argparse.Namespace) -> Dict[str, str]:
    """Writes the HOROVOD_* settings the flags in ``args`` ask for (fusion threshold, cycle
    time, timeline, log level...) into ``env`` and returns them."""
    from horovod_compat.runner.launch import runtime_env
    settings = runtime_env(args)
    env.update(settings)
    return settings
