"""Keras 3 DistributedOptimizer with backward_passes_per_step > 1 (docs/compat.md): weights equal a
single-process run fed the same accumulated global-batch gradients, ``iterations`` advances on
every pass, ``opt._agg_helper.counter`` is ``steps % backward_passes_per_step``, and embedding
(IndexedSlices) gradients work with ``sparse_as_dense=True``. tf_keras: tests/python/tf_keras_job.py."""

import numpy as np
import pytest
import tensorflow as tf
import keras

import horovod_compat.tensorflow as hvd
import horovod_compat.tensorflow.keras as hvdk
from keras_helpers import assert_same_on_all_ranks

LR = 0.05
ROWS = 4  # per rank and pass
VOCAB, DIM = 10, 3


def _dense_model(seed):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    rng = np.random.RandomState(seed)
    model.set_weights([rng.randn(3, 2).astype(np.float32), rng.randn(2).astype(np.float32)])
    return model


def _embedding_model(seed):
    model = keras.Sequential([keras.Input((2,), dtype="int32"),
                              keras.layers.Embedding(VOCAB, DIM),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    rng = np.random.RandomState(seed)
    model.set_weights([w.astype(np.float32) for w in
                       (rng.randn(VOCAB, DIM), rng.randn(2 * DIM, 1), rng.randn(1))])
    return model


def _data(kind, passes_total):
    """Global data: for pass j, rank r's batch is rows [(j * size + r) * ROWS, ... + ROWS)."""
    n = passes_total * hvd.size() * ROWS
    rng = np.random.RandomState(7)
    if kind == "dense":
        x = rng.randn(n, 3).astype(np.float32)
        y = np.stack([x.sum(axis=1), x[:, 0] - x[:, 2]], axis=1).astype(np.float32)
    else:
        x = rng.randint(0, VOCAB, size=(n, 2)).astype(np.int32)
        y = (x[:, :1] * 0.1 - 0.3).astype(np.float32)
    return x, y


def _rows(j, r):
    start = (j * hvd.size() + r) * ROWS
    return np.arange(start, start + ROWS)


def _my_rows(passes_total):
    return np.concatenate([_rows(j, hvd.rank()) for j in range(passes_total)])


def _reference(kind, seed, x, y, passes, passes_total, average):
    """One process: the same plain SGD applied to the sum (or mean) over each step's passes of
    the global-batch gradient (densified), applied every ``passes`` passes."""
    model = _dense_model(seed) if kind == "dense" else _embedding_model(seed)
    opt = keras.optimizers.SGD(LR)
    loss_fn = keras.losses.MeanSquaredError()
    total = None
    for j in range(passes_total):
        rows = np.concatenate([_rows(j, r) for r in range(hvd.size())])
        with tf.GradientTape() as tape:
            loss = loss_fn(y[rows], model(x[rows]))
        grads = [tf.convert_to_tensor(g)
                 for g in tape.gradient(loss, model.trainable_variables)]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
        if (j + 1) % passes == 0:
            if average:
                total = [g / passes for g in total]
            opt.apply_gradients(zip(total, model.trainable_variables))
            total = None
    return model.get_weights()


@pytest.mark.parametrize("run_eagerly", [False, True])
@pytest.mark.parametrize("average", [False, True])
@pytest.mark.parametrize("kind", ["dense", "embedding"])
def test_fit_with_backward_passes(kind, average, run_eagerly):
    passes, passes_total = 3, 7  # two updates, one pass left pending
    x, y = _data(kind, passes_total)
    model = _dense_model(3) if kind == "dense" else _embedding_model(3)
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=passes,
                                    average_aggregated_gradients=average,
                                    sparse_as_dense=(kind == "embedding"))
    assert opt._agg_helper is not None and opt._agg_helper.backward_passes_per_step == passes
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    mine = _my_rows(passes_total)
    model.fit(x[mine], y[mine], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
    got = model.get_weights()
    assert_same_on_all_ranks(got)
    want = _reference(kind, 3, x, y, passes, passes_total, average)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert int(opt.iterations.numpy()) == passes_total
    assert int(opt._agg_helper.counter.numpy()) == passes_total % passes


@pytest.mark.parametrize("use_function", [False, True])
def test_custom_loop_counter_and_iterations(use_function):
    passes = 2
    model = _dense_model(5)
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=passes)
    x, y = _data("dense", 5)

    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    if use_function:
        train_step = tf.function(train_step)
    counters = []
    for step in range(5):
        rows = _rows(step, hvd.rank())
        train_step(tf.constant(x[rows]), tf.constant(y[rows]))
        counters.append(int(opt._agg_helper.counter.numpy()))
        assert int(opt.iterations.numpy()) == step + 1
    assert counters == [(s + 1) % passes for s in range(5)]


def test_indexed_slices_need_sparse_as_dense():
    model = _embedding_model(1)
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2)
    x, y = _data("embedding", 1)
    rows = _rows(0, hvd.rank())
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x[rows]) - y[rows]) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices)
    with pytest.raises(ValueError, match="sparse_as_dense"):
        opt.apply_gradients(zip(grads, model.trainable_variables))


def test_no_helper_without_aggregation():
    assert hvdk.DistributedOptimizer(keras.optimizers.SGD(LR))._agg_helper is None
    with pytest.raises(ValueError):
        hvdk.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=0)
