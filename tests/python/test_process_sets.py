"""Collectives over process sets added and removed at run time."""

import numpy as np
import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd
from conftest import rank_tensor, run_in_mode


@pytest.fixture
def even_set():
    if hvd.size() < 2:
        pytest.skip("needs at least two ranks")
    ps = hvd.add_process_set([r for r in range(hvd.size()) if r % 2 == 0])
    yield ps
    assert hvd.remove_process_set(ps)


def test_process_set_collectives(mode, even_set):
    members = even_set.ranks
    rank = hvd.rank()
    assert even_set.size() == len(members)
    assert even_set.included() == (rank in members)
    if rank not in members:
        with pytest.raises(tf.errors.InvalidArgumentError):
            run_in_mode(mode, lambda: hvd.allreduce(tf.constant([1.0]), process_set=even_set))
        return
    assert even_set.rank() == members.index(rank)
    mine = rank_tensor((3, 2), tf.float32, rank)

    def fn():
        x = tf.constant(mine)
        return (hvd.allreduce(x, op=hvd.Sum, process_set=even_set),
                hvd.allgather(x, process_set=even_set),
                hvd.broadcast(x, members[-1], process_set=even_set),
                hvd.reducescatter(x, op=hvd.Sum, process_set=even_set))
    summed, gathered, bcast, scattered = run_in_mode(mode, fn)
    inputs = [rank_tensor((3, 2), tf.float32, r) for r in members]
    np.testing.assert_allclose(summed, np.sum(inputs, axis=0))
    np.testing.assert_allclose(gathered, np.concatenate(inputs))
    np.testing.assert_allclose(bcast, inputs[-1])
    counts = [3 // len(members) + (1 if i < 3 % len(members) else 0) for i in range(len(members))]
    start = sum(counts[:members.index(rank)])
    np.testing.assert_allclose(scattered, np.sum(inputs, axis=0)[start:start + counts[members.index(rank)]])


def test_process_set_validation(even_set):
    with pytest.raises(ValueError):
        hvd.add_process_set(list(range(hvd.size())))  # duplicate of the global set
    with pytest.raises(ValueError):
        hvd.add_process_set(even_set.ranks)  # duplicate
    assert not hvd.remove_process_set(hvd.global_process_set)
    assert not hvd.remove_process_set(hvd.ProcessSet([0]))


def test_removed_set_is_invalidated():
    if hvd.size() < 2:
        pytest.skip("needs at least two ranks")
    ps = hvd.add_process_set([0])
    assert ps.process_set_id is not None and ps.process_set_id != 0
    assert hvd.remove_process_set(ps)
    assert ps.process_set_id is None
