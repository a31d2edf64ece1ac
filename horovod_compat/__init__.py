"""horovod_compat: a Horovod-compatible distributed-training runtime.

Use ``import horovod_compat.tensorflow as hvd`` where Horovod scripts say
``import horovod.tensorflow as hvd``; the API is Horovod 0.28.1's.
"""

__version__ = "0.1.0"

from horovod_compat.runner import run  # noqa: E402,F401  (horovod.run)
