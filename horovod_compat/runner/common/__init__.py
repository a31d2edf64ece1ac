"""Helpers shared by the launcher and by Horovod-era code that imports them
(``horovod.runner.common``). Light to import: nothing here imports TensorFlow."""
