"""Elastic state objects (docs/compat.md) outside an elastic job: commit/restore/sync,
attributes for the extra keyword values, reset callbacks, host-update checks, and the Keras
elastic callbacks in fit (Keras 3 here; tf_keras in tf_keras_job.py)."""

import sys

import numpy as np
import pytest
import tensorflow as tf
import keras

import horovod_compat.keras as hk
import horovod_compat.tensorflow as hvd
import horovod_compat.tensorflow.keras as hvdk
from horovod_compat import alias
from horovod_compat.common import elastic as common_elastic
from horovod_compat.common.exceptions import HostsUpdatedInterrupt


def _values(rank):
    """Per-rank extra state: different on every rank."""
    return {"epoch": 10 * rank + 1, "batch": rank + 2, "history": [rank, rank * rank],
            "name": f"rank-{rank}"}


def _rows(rank, shape, offset=0.0):
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.float32).reshape(shape) * (rank + 1) + offset + rank)


def test_object_state_attributes_commit_restore():
    start = _values(hvd.rank())
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, **start)
    for key, value in start.items():
        assert getattr(state, key) == value
    state.epoch += 5
    state.restore()  # nothing committed yet: back to the constructor's values
    assert state.epoch == start["epoch"]
    state.epoch, state.history = 99, ["x"]
    state.commit()
    state.epoch, state.history = -1, []
    state.restore()
    assert (state.epoch, state.history) == (99, ["x"])


def test_object_state_sync_gives_rank_zeros_committed_values():
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, **_values(hvd.rank()))
    state.batch = 100 + hvd.rank()
    state.commit()
    state.batch = -5  # uncommitted: sync sends the committed snapshot
    state.sync()
    expected = dict(_values(0), batch=100)
    for key, value in expected.items():
        assert getattr(state, key) == value
    state.restore()
    assert state.batch == 100


def test_reset_callbacks_and_host_updates():
    calls = []
    broadcasts = []

    def bcast(obj):
        broadcasts.append(obj)
        return obj

    state = common_elastic.ObjectState(bcast, hvd.rank, epoch=0)
    state.register_reset_callbacks([lambda: calls.append("a")])
    state.register_reset_callbacks([lambda: calls.append("b"), lambda: calls.append("c")])
    state.on_reset()
    assert calls == ["a", "b", "c"]
    # Outside an elastic job no update arrives, and checking costs no collective.
    state.check_host_updates()
    state.commit()
    assert broadcasts == []
    state.on_hosts_updated(5.0, common_elastic.HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt) as added:
        state.check_host_updates()
    assert added.value.skip_sync is False  # new workers need the state
    state.check_host_updates()  # already seen
    state.on_hosts_updated(4.0, common_elastic.HostUpdateResult.removed)  # older: ignored
    state.check_host_updates()
    state.on_hosts_updated(6.0, common_elastic.HostUpdateResult.removed)
    state.on_hosts_updated(7.0, common_elastic.HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt) as mixed:
        state.commit()
    assert mixed.value.skip_sync is False
    state.on_hosts_updated(7.5, common_elastic.HostUpdateResult.removed)
    with pytest.raises(HostsUpdatedInterrupt) as removed:
        state.check_host_updates()
    assert removed.value.skip_sync is True  # only removed: the survivors agree already
    state.on_hosts_updated(8.0, common_elastic.HostUpdateResult.added)
    state.on_reset()  # a reset forgets pending updates
    state.check_host_updates()
    assert broadcasts == []


def test_base_state_requires_save_restore_sync():
    state = common_elastic.State(hvd.broadcast_object, hvd.rank)
    for method in (state.save, state.restore, state.sync):
        with pytest.raises(NotImplementedError):
            method()


def test_tensorflow_state_eager():
    r = hvd.rank()
    w = tf.Variable(_rows(r, (2, 3)))
    b = tf.Variable(_rows(r, (3,), offset=0.5), dtype=tf.float32)
    state = hvd.elastic.TensorFlowState([w, b], epoch=r)
    assert state.variables == [w, b] and state.epoch == r
    w.assign_add(tf.ones_like(w))
    state.restore()
    np.testing.assert_array_equal(w.numpy(), _rows(r, (2, 3)))
    b.assign(tf.zeros_like(b))
    state.epoch = 7 + r
    state.commit()
    b.assign(tf.ones_like(b))
    state.restore()
    np.testing.assert_array_equal(b.numpy(), np.zeros(3, np.float32))
    state.sync()
    np.testing.assert_array_equal(w.numpy(), _rows(0, (2, 3)))
    np.testing.assert_array_equal(b.numpy(), np.zeros(3, np.float32))
    assert state.epoch == 7
    w.assign(tf.zeros_like(w))
    state.restore()  # sync re-saved rank 0's values
    np.testing.assert_array_equal(w.numpy(), _rows(0, (2, 3)))


def test_tensorflow_state_graph_mode():
    r = hvd.rank()
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("elastic_v", initializer=_rows(r, (4,)))
        bump = v.assign_add(tf.ones_like(v))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            state = hvd.elastic.TensorFlowState(session=session, step=r)
            assert state.variables == [v]
            session.run(bump)
            state.restore()
            np.testing.assert_array_equal(session.run(v), _rows(r, (4,)))
            session.run(bump)
            state.commit()
            state.sync()
            np.testing.assert_array_equal(session.run(v), _rows(0, (4,)) + 1)
            assert state.step == 0


def _dense_model(rank):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    kernel, bias = model.get_weights()
    model.set_weights([_rows(rank, kernel.shape), _rows(rank, bias.shape, offset=0.25)])
    return model


def _train_one_step(model, optimizer, rank):
    x = tf.constant(_rows(rank, (4, 3)) / 10.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


def _numpy_all(variables):
    return [np.array(v.numpy()) for v in variables]


@pytest.mark.parametrize("namespace", ["tensorflow", "tensorflow.keras", "keras"])
def test_keras_state_commit_restore_sync(namespace):
    elastic = {"tensorflow": hvd.elastic, "tensorflow.keras": hvdk.elastic,
               "keras": hk.elastic}[namespace]
    r = hvd.rank()
    model = _dense_model(r)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    _train_one_step(model, optimizer, r)  # builds the optimizer: momentum slots exist
    if namespace == "tensorflow":
        state = elastic.TensorFlowKerasState(model, optimizer=optimizer, epoch=r, batch=2 * r)
    else:
        model.compile(optimizer=optimizer, loss="mse")
        state = elastic.KerasState(model, epoch=r, batch=2 * r)
    assert state.optimizer is optimizer and state.model is model
    committed_model = _numpy_all(model.variables)
    committed_opt = _numpy_all(optimizer.variables)
    _train_one_step(model, optimizer, r)
    state.restore()
    for got, want in zip(_numpy_all(model.variables), committed_model):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(_numpy_all(optimizer.variables), committed_opt):
        np.testing.assert_array_equal(got, want)

    # Expected after sync: rank 0's model and optimizer after one more step from rank 0's
    # start, computed here on a private copy.
    ref_model = _dense_model(0)
    ref_opt = keras.optimizers.SGD(0.1, momentum=0.9)
    _train_one_step(ref_model, ref_opt, 0)
    _train_one_step(ref_model, ref_opt, 0)
    _train_one_step(model, optimizer, r)
    state.epoch = 100 + r
    state.commit()
    state.sync()
    for got, want in zip(_numpy_all(model.variables), _numpy_all(ref_model.variables)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    for got, want in zip(_numpy_all(optimizer.variables), _numpy_all(ref_opt.variables)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert (state.epoch, state.batch) == (100, 0)


def test_keras_state_needs_a_built_model():
    model = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="built"):
        hvdk.elastic.KerasState(model, optimizer=keras.optimizers.SGD(0.1))


class _CountingState(common_elastic.ObjectState):
    def __init__(self, **kwargs):
        super().__init__(hvd.broadcast_object, hvd.rank, **kwargs)
        self.commits = 0

    def save(self):
        self.commits += 1
        super().save()


@pytest.mark.parametrize("batches_per_commit", [1, 3])
def test_keras_elastic_callbacks_in_fit(batches_per_commit):
    steps, epochs, first_epoch = 5, 2, 3
    model = _dense_model(hvd.rank())
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    state = _CountingState(epoch=first_epoch, batch=0)
    batches_seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches_seen.append(state.batch)

    # Commits fall due every batches_per_commit batches (counted across epochs) and at each
    # epoch's end; one due at an epoch's last batch is replaced by the epoch's.
    expected_commits, counted = 0, 0
    for _ in range(epochs):
        for step in range(steps):
            counted += 1
            if counted % batches_per_commit == 0 and step != steps - 1:
                expected_commits += 1
        expected_commits += 1

    x = _rows(hvd.rank(), (steps * 2, 3)) / 10.0
    y = np.zeros((steps * 2, 2), np.float32)
    model.fit(x, y, batch_size=2, epochs=epochs, verbose=0, shuffle=False,
              callbacks=[hvdk.elastic.CommitStateCallback(state, batches_per_commit),
                         hvdk.elastic.UpdateBatchStateCallback(state),
                         hvdk.elastic.UpdateEpochStateCallback(state), Spy()])
    assert state.commits == expected_commits
    assert state.epoch == first_epoch + epochs
    assert state.batch == 0
    # state.batch counts the batches finished in the epoch.
    assert batches_seen == list(range(1, steps + 1)) * epochs
    # Resuming with fit(initial_epoch=state.epoch) keeps counting finished epochs.
    model.fit(x, y, batch_size=2, epochs=state.epoch + 1, initial_epoch=state.epoch, verbose=0,
              callbacks=[hvdk.elastic.UpdateEpochStateCallback(state)])
    assert state.epoch == first_epoch + epochs + 1


def test_update_batch_state_shortens_resumed_epoch_steps():
    state = _CountingState(batch=3)
    callback = hvdk.elastic.UpdateBatchStateCallback(state)
    callback.set_params({"steps": 10, "epochs": 2, "verbose": 0})
    callback.on_train_begin()
    callback.on_epoch_begin(0)
    assert callback.params["steps"] == 10 - 3
    callback.on_epoch_end(0)
    callback.on_epoch_begin(1)
    assert callback.params["steps"] == 10


def test_keras_elastic_callbacks_resume_inside_an_epoch():
    """A job reset after 3 of 5 batches of epoch 1 resumes with fit asked for the 2 left:
    state.batch counts on from 3, the epoch ends at 5 finished, and every commit (taken after
    all callbacks saw the batch, whatever their order) holds the position of the weights."""
    steps = 5
    model = _dense_model(hvd.rank())
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    snapshots = []

    class Recording(common_elastic.ObjectState):
        def save(self):
            snapshots.append((self.epoch, self.batch))
            super().save()

    state = Recording(hvd.broadcast_object, hvd.rank, epoch=1, batch=3)
    x = _rows(hvd.rank(), (steps * 2, 3)) / 10.0
    y = np.zeros((steps * 2, 2), np.float32)
    # Commit listed first, as in Horovod's examples: the commits still see the updates.
    callbacks = [hvdk.elastic.CommitStateCallback(state, batches_per_commit=1),
                 hvdk.elastic.UpdateBatchStateCallback(state),
                 hvdk.elastic.UpdateEpochStateCallback(state)]
    model.fit(x[6:], y[6:], batch_size=2, epochs=state.epoch + 1, initial_epoch=state.epoch,
              verbose=0, shuffle=False, callbacks=callbacks)
    assert snapshots == [(1, 4), (2, 0)]
    assert (state.epoch, state.batch) == (2, 0)


def test_elastic_modules_through_the_alias():
    alias.install()
    try:
        import horovod.common.elastic as he
        import horovod.tensorflow.elastic as hte
        import horovod.tensorflow.keras.elastic as htke
        import horovod.keras.elastic as hke
        assert he is common_elastic and hte is hvd.elastic and htke is hvdk.elastic
        assert hke.KerasState is htke.KerasState
        assert hte.ObjectState is he.ObjectState
        assert sys.modules["horovod.tensorflow.elastic"] is hvd.elastic
    finally:
        alias.uninstall()
