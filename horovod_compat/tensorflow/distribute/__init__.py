"""tf.distribute on horovod_compat: ``HorovodStrategy`` and dataset helpers.

    import horovod_compat.tensorflow as hvd
    strategy = hvd.distribute.HorovodStrategy()   # was tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = ...; model.compile(...)
    model.fit(dataset)

See docs/strategy.md.
"""

from horovod_compat.tensorflow.distribute.cross_device_ops import HorovodCrossDeviceOps
from horovod_compat.tensorflow.distribute.datasets import shard_and_rebatch_dataset
from horovod_compat.tensorflow.distribute.strategy import HorovodExtended, HorovodStrategy

__all__ = ["HorovodStrategy", "HorovodExtended", "HorovodCrossDeviceOps",
           "shard_and_rebatch_dataset"]
