"""What the Keras test files share: a small linear-regression problem (data, a one-layer model,
its exact gradient) and a check that every rank holds the same values. Not a test module."""

import numpy as np
import tensorflow as tf
import keras

import horovod_compat.tensorflow as hvd

FEATURES = 4


def global_data(rows_per_rank, seed, bias):
    """The whole job's rows (every rank makes the same ones): y = x . (1..FEATURES) + bias."""
    rng = np.random.RandomState(seed)
    x = rng.randn(rows_per_rank * hvd.size(), FEATURES).astype(np.float32)
    y = (x @ np.arange(1, FEATURES + 1, dtype=np.float32) + bias).reshape(-1, 1)
    return x, y


def initial_weights(seed):
    rng = np.random.RandomState(seed)
    return [rng.randn(FEATURES, 1).astype(np.float32), rng.randn(1).astype(np.float32)]


def dense_model(weights):
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.set_weights(weights)
    return model


def mse_gradient(w, b, x, y):
    """The exact gradient of the mean squared error of x @ w + b against y."""
    err = x @ w + b - y
    return 2.0 * x.T @ err / len(x), 2.0 * err.mean(axis=0)


def assert_same_on_all_ranks(values):
    flat = np.concatenate([np.ravel(v) for v in values]).astype(np.float32)
    gathered = hvd.allgather(tf.constant(flat[None, :])).numpy()
    for r in range(1, hvd.size()):
        np.testing.assert_array_equal(gathered[r], gathered[0])
