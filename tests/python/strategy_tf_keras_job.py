"""HorovodStrategy with tf_keras (TF_USE_LEGACY_KERAS=1), as one job.

Run by tests/python/test_strategy_tf_keras.py under ``horovodrun -np 2`` and as one plain
process (TensorFlow picks tf_keras at import time, so this cannot run inside the pytest process).
Every rank runs the same checks in the same order and prints ``CHECK <name> ok`` after each.

    TF_USE_LEGACY_KERAS=1 python tests/python/strategy_tf_keras_job.py

With HVDC_TEST_STRATEGY=mwms the checks run against tf.distribute.MultiWorkerMirroredStrategy
(strategy_under_test.py builds its TF_CONFIG from the launcher's ranks).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.tensorflow as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strategy_under_test  # noqa: E402

K = tf.keras
FEATURES = 3
GLOBAL_BATCH = 8


def check(name):
    print(f"CHECK {name} ok rank={hvd.rank()} size={hvd.size()}", flush=True)


def data(rows, seed=5):
    rng = np.random.RandomState(seed)
    x = rng.randn(rows, FEATURES).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
    return x, y


def weights(seed=3):
    rng = np.random.RandomState(seed)
    return [rng.randn(FEATURES, 4).astype(np.float32), rng.randn(4).astype(np.float32),
            rng.randn(4, 1).astype(np.float32), rng.randn(1).astype(np.float32)]


def model(initial=None):
    m = K.Sequential([K.Input((FEATURES,)), K.layers.Dense(4, activation="tanh"),
                      K.layers.Dense(1)])
    if initial is not None:
        m.set_weights(initial)
    return m


def flat(values):
    return np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in values])


def assert_identical_on_all_ranks(values):
    mine = flat(values)
    gathered = hvd.allgather(tf.constant(mine[None, :])).numpy()
    for r in range(hvd.size()):
        np.testing.assert_array_equal(gathered[r], mine)


def main():
    assert K.__name__.startswith("tf_keras"), K.__name__
    strategy = strategy_under_test.create_strategy()  # MWMS: before any TensorFlow op
    hvd.init()
    assert strategy.num_replicas_in_sync == hvd.size()
    check("environment")

    tf.random.set_seed(100 + hvd.rank())
    with strategy.scope():
        fresh = model()
    assert_identical_on_all_ranks(fresh.get_weights())
    check("initial_weights_from_rank0")

    x, y = data(4 * GLOBAL_BATCH * hvd.size())
    batch = GLOBAL_BATCH * hvd.size()
    with strategy.scope():
        m = model(weights())
        m.compile(optimizer=K.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    m.fit(x, y, batch_size=batch, epochs=3, shuffle=False, verbose=0)
    assert_identical_on_all_ranks(m.get_weights())
    ref = model(weights())
    ref.compile(optimizer=K.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    ref.fit(x, y, batch_size=batch, epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(flat(m.get_weights()), flat(ref.get_weights()),
                               rtol=1e-4, atol=1e-5)
    check("fit_matches_reference")

    loss = m.evaluate(x, y, batch_size=batch, verbose=0)
    expected = ref.evaluate(x, y, batch_size=batch, verbose=0)
    assert abs(loss - expected) <= 1e-4 * abs(expected), (loss, expected)
    check("evaluate_matches_reference")

    for rows, pbatch in ((13, 4), (len(x), batch)):
        px = x[:rows]
        predicted = m.predict(px, batch_size=pbatch, verbose=0)
        assert predicted.shape == (rows, 1), predicted.shape
        np.testing.assert_allclose(predicted, ref.predict(px, batch_size=pbatch, verbose=0),
                                   rtol=1e-5, atol=1e-6)
        assert_identical_on_all_ranks([predicted])
    check("predict_whole_result_in_input_order")

    print(f"ALL CHECKS PASSED rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
