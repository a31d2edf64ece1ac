"""Launcher utilities (``horovod.runner.util``): threads."""
