"""End-to-end training: every rank ends with identical weights, equal to one process training
on the whole global batch."""

import numpy as np
import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd

FEATURES = 4
ROWS_PER_RANK = 8
STEPS = 5
LR = 0.1


def _global_batch():
    rng = np.random.RandomState(1234)
    x = rng.randn(ROWS_PER_RANK * hvd.size(), FEATURES).astype(np.float32)
    y = (x @ np.arange(1, FEATURES + 1, dtype=np.float32) + 0.5).reshape(-1, 1)
    return x, y


def _shard(a):
    return a[hvd.rank() * ROWS_PER_RANK:(hvd.rank() + 1) * ROWS_PER_RANK]


def _initial_weights(seed):
    rng = np.random.RandomState(seed)
    return (rng.randn(FEATURES, 1).astype(np.float32), rng.randn(1).astype(np.float32))


def _reference_weights():
    """Plain gradient descent on the global batch, from rank 0's initial weights."""
    x, y = _global_batch()
    w0, b0 = _initial_weights(0)
    w, b = tf.Variable(w0), tf.Variable(b0)
    for _ in range(STEPS):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(LR * gw)
        b.assign_sub(LR * gb)
    return w.numpy(), b.numpy()


def _check_identical_and_reference(w, b):
    gathered = hvd.allgather(tf.constant(np.concatenate([w.ravel(), b.ravel()])[None, :]))
    gathered = gathered.numpy()
    for r in range(1, hvd.size()):
        np.testing.assert_array_equal(gathered[r], gathered[0])
    ref_w, ref_b = _reference_weights()
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-6)


def _graph_training_result():
    x, y = _global_batch()
    w0, b0 = _initial_weights(hvd.rank())
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=w0)
        b = tf.compat.v1.get_variable("b", initializer=b0)
        loss = tf.reduce_mean(tf.square(tf.matmul(_shard(x), w) + b - _shard(y)))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR))
        train_op = opt.minimize(loss, global_step=global_step)
        hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        final = {}

        class _Capture(tf.compat.v1.train.SessionRunHook):
            def end(self, session):
                final["w"], final["b"] = session.run([w, b])

        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks + [_Capture()]) as session:
            for _ in range(STEPS):
                session.run(train_op)
    return final["w"], final["b"]


def test_monitored_session_distributed_optimizer_and_hook():
    w, b = _graph_training_result()
    _check_identical_and_reference(w, b)


def _keras_model():
    import keras
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    w0, b0 = _initial_weights(hvd.rank())
    model.layers[0].kernel.assign(w0)
    model.layers[0].bias.assign(b0)
    return model


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
def test_gradient_tape_training_keras_variables(use_function):
    import keras
    x, y = _global_batch()
    xs, ys = tf.constant(_shard(x)), tf.constant(_shard(y))
    model = _keras_model()
    hvd.broadcast_variables(model.variables, root_rank=0)
    opt = keras.optimizers.SGD(learning_rate=LR)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xs) - ys))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if use_function:
        step = tf.function(step)
    for _ in range(STEPS):
        step()
    w, b = (v.numpy() for v in model.trainable_variables)
    _check_identical_and_reference(w, b)


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
def test_gradient_tape_training_tf_variables_grouped(use_function):
    x, y = _global_batch()
    xs, ys = tf.constant(_shard(x)), tf.constant(_shard(y))
    w0, b0 = _initial_weights(hvd.rank())
    w, b = tf.Variable(w0), tf.Variable(b0)
    hvd.broadcast_variables([w, b], root_rank=0)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xs, w) + b - ys))
        tape = hvd.DistributedGradientTape(tape, groups=1)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(LR * gw)
        b.assign_sub(LR * gb)

    if use_function:
        step = tf.function(step)
    for _ in range(STEPS):
        step()
    _check_identical_and_reference(w.numpy(), b.numpy())


def test_broadcast_and_allgather_object():
    obj = {"rank": hvd.rank(), "payload": list(range(hvd.rank() + 1))}
    got = hvd.broadcast_object(obj, root_rank=hvd.size() - 1)
    assert got == {"rank": hvd.size() - 1, "payload": list(range(hvd.size()))}
    everyone = hvd.allgather_object(obj)
    assert [o["rank"] for o in everyone] == list(range(hvd.size()))
