"""Launcher-side services (``horovod.runner.common.service``)."""
