"""Gradients of the collectives, checked against their closed forms."""

import numpy as np
import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd
from conftest import rank_tensor


def _grad(fn, x_value, mode):
    """d(sum(fn(x)))/dx by GradientTape (eager or tf.function) or tf.gradients (graph)."""
    if mode == "graph":
        with tf.Graph().as_default():
            x = tf.constant(x_value)
            y = fn(x)
            g = tf.gradients(tf.reduce_sum(y), x)[0]
            with tf.compat.v1.Session() as session:
                return session.run(g)

    def compute():
        x = tf.constant(x_value)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(fn(x))
        return tape.gradient(loss, x)
    if mode == "function":
        compute = tf.function(compute)
    return compute().numpy()


@pytest.mark.parametrize("op,expected", [("Sum", "size"), ("Average", "one")])
def test_allreduce_grad(mode, op, expected):
    g = _grad(lambda x: hvd.allreduce(x, op=getattr(hvd, op)), np.ones((3, 2), np.float32), mode)
    value = hvd.size() if expected == "size" else 1.0
    np.testing.assert_allclose(g, np.full((3, 2), value))


def test_grouped_allreduce_grad(mode):
    g = _grad(lambda x: hvd.grouped_allreduce([x, x * 2.0], op=hvd.Sum)[1],
              np.ones((4,), np.float32), mode)
    np.testing.assert_allclose(g, np.full((4,), 2.0 * hvd.size()))


def test_allgather_grad(mode):
    rows = hvd.rank() + 1
    # y = allgather(x) * w, with w = global position + 1: dy/dx is this rank's slice of the
    # averaged w (w is equal on every rank, so the average is w itself).
    def fn(x):
        gathered = hvd.allgather(x)
        weights = tf.reshape(tf.range(1, tf.shape(gathered)[0] + 1, dtype=tf.float32), [-1, 1])
        return gathered * weights
    g = _grad(fn, np.ones((rows, 2), np.float32), mode)
    start = sum(r + 1 for r in range(hvd.rank()))
    expected = np.repeat(np.arange(start + 1, start + rows + 1, dtype=np.float32)[:, None], 2, 1)
    np.testing.assert_allclose(g, expected)


def test_broadcast_grad(mode):
    root = 0
    g = _grad(lambda x: hvd.broadcast(x, root), np.ones((3,), np.float32), mode)
    expected = np.ones(3) if hvd.rank() == root else np.zeros(3)
    np.testing.assert_allclose(g, expected)


def test_reducescatter_grad(mode):
    size = hvd.size()
    g = _grad(lambda x: hvd.reducescatter(x, op=hvd.Sum), np.ones((2 * size, 2), np.float32),
              mode)
    np.testing.assert_allclose(g, np.full((2 * size, 2), float(size)))


def test_alltoall_grad(mode):
    size = hvd.size()
    splits = [1] * size
    g = _grad(lambda x: hvd.alltoall(x, splits=splits)[0] * 3.0,
              rank_tensor((size, 2), tf.float32, hvd.rank()), mode)
    np.testing.assert_allclose(g, np.full((size, 2), 3.0))


def test_numeric_gradient_allreduce_product_like():
    """A non-linear function of the allreduced value, against a finite difference."""
    x0 = rank_tensor((3,), tf.float64, hvd.rank()).astype(np.float64) + 1.0

    def f(x):
        return tf.reduce_sum(tf.square(hvd.allreduce(x, op=hvd.Average)))

    x = tf.constant(x0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = f(x)
    analytic = tape.gradient(y, x).numpy()
    # Every rank perturbs the same coordinate at once. The loss is the same on every rank and
    # Horovod's gradient of an averaging allreduce is size x the partial derivative, which is
    # exactly the derivative along that joint perturbation.
    eps = 1e-6
    numeric = np.zeros(3)
    for i in range(3):
        d = np.zeros(3)
        d[i] = eps
        numeric[i] = (f(tf.constant(x0 + d)).numpy() - f(tf.constant(x0 - d)).numpy()) / (2 * eps)
    np.testing.assert_allclose(numeric, analytic, rtol=1e-5)
