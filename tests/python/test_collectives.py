"""Every collective in eager mode, inside tf.function and in a tf.compat.v1 graph, checked
against values computed in numpy from every rank's (deterministic) input."""

import numpy as np
import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd
from conftest import rank_tensor, run_in_mode

ALLREDUCE_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.float32, tf.float64,
                    tf.bfloat16]
GATHER_DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
                 tf.float32, tf.float64, tf.bool, tf.bfloat16]
SHAPES = [(0,), (1,), (17,), (5, 3), (2, 3, 4)]


def all_inputs(shape, dtype, offset=0):
    return [rank_tensor(shape, dtype, r, offset) for r in range(hvd.size())]


def as_float(x):
    return np.asarray(x).astype(np.float64)


@pytest.mark.parametrize("dtype", ALLREDUCE_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_allreduce_sum(mode, dtype, shape):
    mine = rank_tensor(shape, dtype, hvd.rank())
    out = run_in_mode(mode, lambda: hvd.allreduce(tf.constant(mine, dtype=dtype), op=hvd.Sum))
    expected = np.sum([as_float(x) for x in all_inputs(shape, dtype)], axis=0)
    assert out.shape == tuple(shape)
    np.testing.assert_allclose(as_float(out), expected.reshape(shape))


@pytest.mark.parametrize("op", ["Average", "Min", "Max", "Product"])
@pytest.mark.parametrize("dtype", [tf.int32, tf.float32, tf.float64, tf.float16],
                         ids=lambda d: d.name)
def test_allreduce_ops(mode, op, dtype):
    if op == "Average" and dtype == tf.int32:
        pytest.skip("integer average truncates")
    shape = (4, 3)
    mine = rank_tensor(shape, dtype, hvd.rank(), offset=1)
    out = run_in_mode(mode, lambda: hvd.allreduce(tf.constant(mine, dtype=dtype),
                                                  op=getattr(hvd, op)))
    stacked = np.stack([as_float(x) for x in all_inputs(shape, dtype, offset=1)])
    expected = {"Average": np.mean, "Min": np.min, "Max": np.max,
                "Product": np.prod}[op](stacked, axis=0)
    rtol = 1e-2 if dtype == tf.float16 else 1e-6
    np.testing.assert_allclose(as_float(out), expected, rtol=rtol)


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64, tf.int32],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_allreduce_scale_factors(mode, dtype, op):
    shape = (6,)
    mine = rank_tensor(shape, dtype, hvd.rank())
    out = run_in_mode(mode, lambda: hvd.allreduce(tf.constant(mine, dtype=dtype),
                                                  op=getattr(hvd, op), prescale_factor=2.0,
                                                  postscale_factor=0.5 if op == "Sum" else 3.0))
    total = np.sum([as_float(x) * 2.0 for x in all_inputs(shape, dtype)], axis=0)
    expected = total * 0.5 if op == "Sum" else total * 3.0 / hvd.size()
    if dtype.is_integer:
        expected = np.trunc(expected)
    np.testing.assert_allclose(as_float(out), expected, rtol=1e-2 if dtype == tf.float16 else 1e-6)


def test_allreduce_variable_and_compression(mode):
    if mode == "function":
        pytest.skip("the variable is created by the test body")

    def fn():
        var = tf.Variable(tf.constant(rank_tensor((3,), tf.float32, hvd.rank())))
        return hvd.allreduce(var, op=hvd.Sum, compression=hvd.Compression.fp16)
    out = run_in_mode(mode, fn)
    expected = np.sum(all_inputs((3,), tf.float32), axis=0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected)


def test_allreduce_sparse(mode):
    def fn():
        values = tf.constant(rank_tensor((2, 3), tf.float32, hvd.rank()))
        indices = tf.constant([hvd.rank(), hvd.rank() + 1], dtype=tf.int64)
        sparse = tf.IndexedSlices(values, indices, dense_shape=tf.constant([10, 3], tf.int64))
        out = hvd.allreduce(sparse, op=hvd.Average)
        return out.values, out.indices
    values, indices = run_in_mode(mode, fn)
    expected = np.concatenate(all_inputs((2, 3), tf.float32)) / hvd.size()
    np.testing.assert_allclose(values, expected, rtol=1e-6)
    assert indices.tolist() == [i for r in range(hvd.size()) for i in (r, r + 1)]


def test_grouped_allreduce(mode):
    shapes = [(3,), (2, 2), (0,), (5,)]
    mine = [rank_tensor(s, tf.float32, hvd.rank(), i) for i, s in enumerate(shapes)]
    out = run_in_mode(mode, lambda: hvd.grouped_allreduce([tf.constant(m) for m in mine],
                                                          op=hvd.Sum))
    for i, s in enumerate(shapes):
        expected = np.sum(all_inputs(s, tf.float32, i), axis=0)
        np.testing.assert_allclose(out[i], expected.reshape(s))


@pytest.mark.parametrize("dtype", GATHER_DTYPES, ids=lambda d: d.name)
def test_allgather_uneven(mode, dtype):
    def rows(r):
        return r + 1
    mine = rank_tensor((rows(hvd.rank()), 2, 3), dtype, hvd.rank())
    out = run_in_mode(mode, lambda: hvd.allgather(tf.constant(mine, dtype=dtype)))
    expected = np.concatenate([rank_tensor((rows(r), 2, 3), dtype, r)
                               for r in range(hvd.size())])
    np.testing.assert_array_equal(as_float(out), as_float(expected))


def test_allgather_empty_rank(mode):
    rows = 0 if hvd.rank() == 0 else 2
    mine = rank_tensor((rows, 4), tf.int32, hvd.rank())
    out = run_in_mode(mode, lambda: hvd.allgather(tf.constant(mine, dtype=tf.int32)))
    expected = np.concatenate([rank_tensor((0 if r == 0 else 2, 4), tf.int32, r)
                               for r in range(hvd.size())])
    np.testing.assert_array_equal(out, expected)


def test_grouped_allgather(mode):
    mine = [rank_tensor((hvd.rank() + 1, 2), tf.float32, hvd.rank(), i) for i in range(3)]
    out = run_in_mode(mode, lambda: hvd.grouped_allgather([tf.constant(m) for m in mine]))
    for i in range(3):
        expected = np.concatenate([rank_tensor((r + 1, 2), tf.float32, r, i)
                                   for r in range(hvd.size())])
        np.testing.assert_array_equal(out[i], expected)


@pytest.mark.parametrize("dtype", GATHER_DTYPES, ids=lambda d: d.name)
def test_broadcast_every_root(mode, dtype):
    shape = (3, 2)
    for root in range(hvd.size()):
        mine = rank_tensor(shape, dtype, hvd.rank())
        out = run_in_mode(mode, lambda: hvd.broadcast(tf.constant(mine, dtype=dtype), root))
        np.testing.assert_array_equal(as_float(out), as_float(rank_tensor(shape, dtype, root)))


def test_broadcast_inplace_resource_and_ref(mode):
    if mode == "function":
        pytest.skip("variables are created outside tf.function in this test")

    def fn():
        a = tf.Variable(rank_tensor((3,), tf.float32, hvd.rank()))
        b = tf.Variable(rank_tensor((2, 2), tf.int64, hvd.rank()))
        return hvd.broadcast_([a, b], 0)
    a, b = run_in_mode(mode, fn)
    np.testing.assert_array_equal(a, rank_tensor((3,), tf.float32, 0))
    np.testing.assert_array_equal(b, rank_tensor((2, 2), tf.int64, 0))


def test_broadcast_inplace_ref_variables():
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(rank_tensor((4,), tf.float32, hvd.rank()), use_resource=False)
        out = hvd.broadcast_([v], 0)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(out)
            np.testing.assert_array_equal(session.run(v), rank_tensor((4,), tf.float32, 0))


def test_broadcast_variables_keras_and_tf(mode):
    if mode == "function":
        pytest.skip("broadcast_variables is called outside tf.function")
    import keras
    if mode == "graph":
        with tf.Graph().as_default():
            v = tf.compat.v1.get_variable("v", initializer=rank_tensor((3,), tf.float32,
                                                                        hvd.rank()))
            op = hvd.broadcast_variables([v], 0)
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(op)
                np.testing.assert_array_equal(session.run(v), rank_tensor((3,), tf.float32, 0))
        return
    layer = keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(hvd.rank()))
    layer.build((None, 3))
    v = tf.Variable(rank_tensor((3,), tf.float32, hvd.rank()))
    hvd.broadcast_variables(layer.variables + [v], 0)
    assert np.all(layer.kernel.numpy() == 0.0)
    np.testing.assert_array_equal(v.numpy(), rank_tensor((3,), tf.float32, 0))
    layer.kernel.assign(tf.fill(layer.kernel.shape, float(hvd.rank())))
    hvd.broadcast_variables(layer.variables, root_rank=hvd.size() - 1, inplace=True)
    assert np.all(layer.kernel.numpy() == hvd.size() - 1)


@pytest.mark.parametrize("dtype", [tf.int32, tf.float32, tf.bool, tf.float64],
                         ids=lambda d: d.name)
def test_alltoall_with_splits(mode, dtype):
    size, rank = hvd.size(), hvd.rank()
    # Rank r sends (r + d + 1) rows to rank d.
    splits = [rank + d + 1 for d in range(size)]
    mine = rank_tensor((sum(splits), 2), dtype, rank)

    def fn():
        return hvd.alltoall(tf.constant(mine, dtype=dtype), splits=splits)
    out, received = run_in_mode(mode, fn)
    expected = []
    for src in range(size):
        src_splits = [src + d + 1 for d in range(size)]
        start = sum(src_splits[:rank])
        expected.append(rank_tensor((sum(src_splits), 2), dtype, src)[start:start + src_splits[rank]])
    np.testing.assert_array_equal(as_float(out), as_float(np.concatenate(expected)))
    assert received.tolist() == [src + rank + 1 for src in range(size)]


def test_alltoall_even(mode):
    size, rank = hvd.size(), hvd.rank()
    mine = rank_tensor((2 * size, 3), tf.float32, rank)
    out = run_in_mode(mode, lambda: hvd.alltoall(tf.constant(mine)))
    expected = np.concatenate([rank_tensor((2 * size, 3), tf.float32, src)[2 * rank:2 * rank + 2]
                               for src in range(size)])
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.float16, tf.float32, tf.float64,
                                   tf.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("rows", [1, 7, 12])
def test_reducescatter(mode, dtype, rows):
    size, rank = hvd.size(), hvd.rank()
    shape = (rows, 3)
    mine = rank_tensor(shape, dtype, rank)
    out = run_in_mode(mode, lambda: hvd.reducescatter(tf.constant(mine, dtype=dtype),
                                                      op=hvd.Sum))
    total = np.sum([as_float(x) for x in all_inputs(shape, dtype)], axis=0)
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    np.testing.assert_allclose(as_float(out), total[start:start + counts[rank]])


def test_reducescatter_average_and_grouped(mode):
    size, rank = hvd.size(), hvd.rank()
    shapes = [(2 * size, 2), (size + 1,)]
    mine = [rank_tensor(s, tf.float32, rank, i) for i, s in enumerate(shapes)]
    out = run_in_mode(mode, lambda: hvd.grouped_reducescatter([tf.constant(m) for m in mine]))
    for i, s in enumerate(shapes):
        total = np.mean(all_inputs(s, tf.float32, i), axis=0)
        counts = [s[0] // size + (1 if r < s[0] % size else 0) for r in range(size)]
        start = sum(counts[:rank])
        np.testing.assert_allclose(out[i], total[start:start + counts[rank]], rtol=1e-6)


def test_reducescatter_scalar_rejected():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError,
                        tf.errors.FailedPreconditionError)):
        hvd.reducescatter(tf.constant(1.0))


def test_many_collectives_one_session_run_different_orders():
    """Dozens of collectives in one session.run, created in a rank-dependent order."""
    size, rank = hvd.size(), hvd.rank()
    n = 40
    order = list(range(n))
    np.random.RandomState(rank).shuffle(order)
    with tf.Graph().as_default():
        outs = {}
        for i in order:
            x = tf.constant(rank_tensor((i + 1,), tf.float32, rank, i))
            if i % 4 == 0:
                outs[i] = hvd.allreduce(x, op=hvd.Sum, name=f"ar_{i}")
            elif i % 4 == 1:
                outs[i] = hvd.allgather(x, name=f"ag_{i}")
            elif i % 4 == 2:
                outs[i] = hvd.broadcast(x, i % size, name=f"bc_{i}")
            else:
                outs[i] = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, name=f"gar_{i}")[1]
        with tf.compat.v1.Session() as session:
            for _ in range(2):
                results = session.run(outs)
    for i in range(n):
        inputs = all_inputs((i + 1,), tf.float32, i)
        if i % 4 == 0:
            expected = np.sum(inputs, axis=0)
        elif i % 4 == 1:
            expected = np.concatenate(inputs)
        elif i % 4 == 2:
            expected = inputs[i % size]
        else:
            expected = np.sum(inputs, axis=0) * 2
        np.testing.assert_allclose(results[i], expected)


def test_eager_collectives_inside_one_function_run_concurrently():
    """Many independent collectives in one tf.function (they are order-insensitive)."""
    @tf.function
    def fn():
        return [hvd.allreduce(tf.fill([i + 1], float(hvd.rank())), op=hvd.Sum)
                for i in range(20)]
    for i, out in enumerate(fn()):
        np.testing.assert_allclose(out.numpy(), np.full(i + 1, sum(range(hvd.size()))))


def test_join():
    """Ranks > 0 allreduce once more than rank 0, which joins first: it contributes zeros."""
    size, rank = hvd.size(), hvd.rank()
    if rank != 0:
        out = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum, name="after_join")
        np.testing.assert_allclose(out.numpy(), np.array([1.0, 2.0]) * (size - 1))
    last = hvd.join()
    assert 0 <= int(last) < size
    hvd.allreduce(tf.constant([0.0]), name="global_barrier_after_join")
