"""tf.data service support (``horovod.tensorflow.data``): a compute job of its own feeds the
training job's datasets through TensorFlow's ``tf.data.experimental.service``."""

from horovod_compat.tensorflow.data.compute_service import (  # noqa: F401
    TfDataServiceConfig, compute_worker_fn, send_to_data_service, tf_data_service,
    _install_dataset_method)

_install_dataset_method()
