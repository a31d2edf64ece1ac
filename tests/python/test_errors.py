"""Cross-rank mismatches become per-op TF errors, and the runtime keeps working."""

import numpy as np
import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd
from conftest import run_in_mode

def _still_works(mode):
    out = run_in_mode(mode, lambda: hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum,
                                                  name="after_error"))
    np.testing.assert_allclose(out, np.array([1.0, 2.0]) * hvd.size())


def _size():
    return hvd.size()


def test_shape_mismatch(mode):
    if _size() < 2:
        pytest.skip("needs two ranks")
    shape = (2,) if hvd.rank() == 0 else (3,)
    with pytest.raises(tf.errors.FailedPreconditionError):
        run_in_mode(mode, lambda: hvd.allreduce(tf.zeros(shape), name="mismatch_shape"))
    _still_works(mode)


def test_dtype_mismatch(mode):
    if _size() < 2:
        pytest.skip("needs two ranks")
    dtype = tf.float32 if hvd.rank() == 0 else tf.int32
    with pytest.raises(tf.errors.FailedPreconditionError):
        run_in_mode(mode, lambda: hvd.allreduce(tf.zeros([4], dtype=dtype), name="mismatch_dtype"))
    _still_works(mode)


def test_allgather_trailing_dim_mismatch(mode):
    if _size() < 2:
        pytest.skip("needs two ranks")
    shape = (2, 3) if hvd.rank() == 0 else (2, 4)
    with pytest.raises(tf.errors.FailedPreconditionError):
        run_in_mode(mode, lambda: hvd.allgather(tf.zeros(shape), name="mismatch_gather"))
    _still_works(mode)


def test_broadcast_root_mismatch(mode):
    if _size() < 2:
        pytest.skip("needs two ranks")
    with pytest.raises(tf.errors.FailedPreconditionError):
        run_in_mode(mode, lambda: hvd.broadcast(tf.zeros([3]), hvd.rank(), name="mismatch_root"))
    _still_works(mode)


def test_alltoall_bad_splits():
    with pytest.raises(tf.errors.InvalidArgumentError):
        hvd.alltoall(tf.zeros([4, 2]), splits=[1] * (hvd.size() + 1))
    with pytest.raises(tf.errors.InvalidArgumentError):
        hvd.alltoall(tf.zeros([4, 2]), splits=[5] * hvd.size())
    with pytest.raises(tf.errors.InvalidArgumentError):
        hvd.alltoall(tf.zeros([4, 2]), splits=tf.constant([[1]] * hvd.size()))
    if hvd.size() > 1:
        with pytest.raises(tf.errors.InvalidArgumentError):
            hvd.alltoall(tf.zeros([hvd.size() + 1, 2]))
    _still_works("eager")
