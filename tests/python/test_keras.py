"""Keras 3 frontend: DistributedOptimizer under model.fit, and the callbacks."""

import numpy as np
import pytest
import tensorflow as tf
import keras

import horovod_compat.keras as hk
import horovod_compat.tensorflow as hvd
import horovod_compat.tensorflow.keras as hvdk
from keras_helpers import (
    assert_same_on_all_ranks,
    dense_model,
    global_data,
    initial_weights,
    mse_gradient,
)

ROWS = 8
LR = 0.1


def _data_rows(rows_per_rank):
    return global_data(rows_per_rank, seed=4321, bias=-0.25)


@pytest.mark.parametrize("run_eagerly", [False, True])
@pytest.mark.parametrize("frontend", ["hvdk", "hk"])
def test_fit_matches_single_process_on_global_batch(run_eagerly, frontend):
    module = hvdk if frontend == "hvdk" else hk
    epochs = 4
    x, y = _data_rows(ROWS)
    shard = slice(hvd.rank() * ROWS, (hvd.rank() + 1) * ROWS)
    model = dense_model(initial_weights(0))
    opt = module.DistributedOptimizer(keras.optimizers.SGD(learning_rate=LR))
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    model.fit(x[shard], y[shard], batch_size=ROWS, epochs=epochs, shuffle=False, verbose=0)
    w, b = model.get_weights()
    assert_same_on_all_ranks([w, b])

    ref_w, ref_b = initial_weights(0)
    for _ in range(epochs):
        gw, gb = mse_gradient(ref_w, ref_b, x, y)
        ref_w, ref_b = ref_w - LR * gw, ref_b - LR * gb
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-5)
    assert int(opt.iterations.numpy()) == epochs


@pytest.mark.parametrize("run_eagerly", [False, True])
@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_per_step(run_eagerly, average):
    passes, epochs = 2, 3
    x, y = _data_rows(ROWS * passes)
    per_rank = ROWS * passes
    mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)
    model = dense_model(initial_weights(1))
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=LR),
                                    backward_passes_per_step=passes,
                                    average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    model.fit(x[mine], y[mine], batch_size=ROWS, epochs=epochs, shuffle=False, verbose=0)
    w, b = model.get_weights()
    assert_same_on_all_ranks([w, b])

    ref_w, ref_b = initial_weights(1)
    for _ in range(epochs):
        total_w, total_b = 0.0, 0.0
        for j in range(passes):
            rows = np.concatenate([np.arange(r * per_rank + j * ROWS, r * per_rank + (j + 1) * ROWS)
                                   for r in range(hvd.size())])
            gw, gb = mse_gradient(ref_w, ref_b, x[rows], y[rows])
            total_w, total_b = total_w + gw, total_b + gb
        if average:
            total_w, total_b = total_w / passes, total_b / passes
        ref_w, ref_b = ref_w - LR * total_w, ref_b - LR * total_b
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-5)
    # iterations advances on every pass (as in Horovod), not only on the applying ones.
    assert int(opt.iterations.numpy()) == epochs * passes
    assert int(opt._agg_helper.counter.numpy()) == 0


def test_optimizer_class_config_and_variables():
    base = keras.optimizers.Adam(learning_rate=0.01, beta_1=0.8)
    opt = hvdk.DistributedOptimizer(base)
    assert type(opt).__name__ == "Adam"
    assert isinstance(opt, keras.optimizers.Adam)
    assert opt is not base
    config = opt.get_config()
    assert config["beta_1"] == pytest.approx(0.8)
    again = type(opt).from_config(config)
    assert type(again) is type(opt)
    assert again.get_config() == config
    assert isinstance(opt.variables, list)
    assert opt.variables() == opt.variables or len(opt.variables()) == len(opt.variables)
    with pytest.raises(ValueError):
        hvdk.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Adasum)
    with pytest.raises(ValueError):
        hvdk.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max)


def test_compute_gradients_allreduces():
    var = keras.Variable(np.ones(3, np.float32))
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0))
    scale = float(hvd.rank() + 1)
    grads_and_vars = opt.compute_gradients(lambda: tf.reduce_sum(var * scale), [var])
    expected = np.mean(np.arange(1, hvd.size() + 1))
    np.testing.assert_allclose(grads_and_vars[0][0].numpy(), np.full(3, expected))


def test_compute_then_apply_gradients_reduces_once():
    # With op=Sum a second reduction would multiply the update by size.
    var = keras.Variable(np.zeros(3, np.float32))
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), op=hvd.Sum)
    scale = float(hvd.rank() + 1)
    grads_and_vars = opt.compute_gradients(lambda: tf.reduce_sum(var * scale), [var])
    opt.apply_gradients(grads_and_vars)
    total = float(np.sum(np.arange(1, hvd.size() + 1)))
    np.testing.assert_allclose(var.numpy(), np.full(3, -total))
    # Gradients that did not come from compute_gradients are reduced as usual.
    opt.apply_gradients([(tf.fill([3], scale), var)])
    np.testing.assert_allclose(var.numpy(), np.full(3, -2 * total))


def test_broadcast_callback_overwrites_with_root_weights():
    root_weights = initial_weights(100)
    model = dense_model(initial_weights(100 + hvd.rank()))
    # A zero learning rate keeps the update of the first batch from moving the weights.
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.0, momentum=0.5))
    model.compile(optimizer=opt, loss="mse")
    x, y = _data_rows(ROWS)
    model.fit(x, y, batch_size=ROWS, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    for got, want in zip(model.get_weights(), root_weights):
        np.testing.assert_array_equal(got, want)
    assert_same_on_all_ranks([np.asarray(v) for v in opt.variables])


def test_broadcast_callback_rejects_bad_local_variables():
    with pytest.raises(ValueError):
        hvdk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[1.0])


class _SetRankMetric(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        logs["rank_metric"] = float(hvd.rank() * (epoch + 1))


class _Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_logs = []
        self.batch_lrs = []

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_lrs.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def test_metric_average_callback():
    x, y = _data_rows(ROWS)
    model = dense_model(initial_weights(2 + hvd.rank()))   # per-rank losses differ
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse")
    record = _Record()
    model.fit(x, y, batch_size=ROWS, epochs=2, shuffle=False, verbose=0,
              callbacks=[_SetRankMetric(), hk.callbacks.MetricAverageCallback(), record])
    size = hvd.size()
    for epoch, logs in enumerate(record.epoch_logs):
        assert logs["rank_metric"] == pytest.approx((epoch + 1) * (size - 1) / 2.0)
    assert_same_on_all_ranks([logs["loss"] for logs in record.epoch_logs])
    own_loss = float(np.mean((x @ initial_weights(2 + hvd.rank())[0]
                              + initial_weights(2 + hvd.rank())[1] - y) ** 2))
    mean_loss = hvd.allreduce(tf.constant(own_loss, tf.float32)).numpy()
    assert record.epoch_logs[0]["loss"] == pytest.approx(mean_loss, rel=1e-4)


def test_learning_rate_warmup_callback():
    initial_lr, steps, warmup = 0.4, 4, 2
    x, y = _data_rows(ROWS * steps)
    model = dense_model(initial_weights(3))
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=initial_lr))
    model.compile(optimizer=opt, loss="mse")
    record = _Record()
    model.fit(x[:ROWS * steps], y[:ROWS * steps], batch_size=ROWS, epochs=warmup + 1,
              shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.LearningRateWarmupCallback(
                  initial_lr, warmup_epochs=warmup, verbose=0), record])
    size = hvd.size()
    expected = []
    for epoch in range(warmup):
        for batch in range(steps):
            e = epoch + batch / steps + 1.0 / steps
            expected.append(initial_lr / size * (e * (size - 1) / warmup + 1))
    expected += [expected[-1]] * steps
    np.testing.assert_allclose(record.batch_lrs, expected, rtol=1e-6)
    assert expected[steps * warmup - 1] == pytest.approx(initial_lr)
    assert record.epoch_logs[-1]["lr"] == pytest.approx(initial_lr)


def test_learning_rate_schedule_callback_staircase():
    steps = 2
    x, y = _data_rows(ROWS * steps)
    model = dense_model(initial_weights(4))
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0, momentum=0.9), loss="mse")
    record = _Record()
    with pytest.warns(UserWarning, match="[Mm]omentum"):
        model.fit(x[:ROWS * steps], y[:ROWS * steps], batch_size=ROWS, epochs=4, shuffle=False,
                  verbose=0, callbacks=[hvdk.callbacks.LearningRateScheduleCallback(
                      0.01, multiplier=0.5, start_epoch=1, end_epoch=3), record])
    expected = [1.0] * steps + [0.01] * steps + [0.005] * steps + [0.005] * steps
    np.testing.assert_allclose(record.batch_lrs, expected, rtol=1e-6)


def test_value_helpers():
    size, rank = hvd.size(), hvd.rank()
    assert float(hvdk.allreduce(float(rank), name="keras_value_allreduce")) == pytest.approx(
        (size - 1) / 2.0)
    assert float(hk.allreduce(float(rank), name="keras_value_allreduce_hk", average=False)) == \
        pytest.approx(size * (size - 1) / 2.0)
    gathered = hvdk.allgather([rank], name="keras_value_allgather").numpy()
    np.testing.assert_array_equal(gathered, np.arange(size))
    assert int(hvdk.broadcast(rank + 5, 0, name="keras_value_broadcast")) == 5


def test_xla_is_turned_off_for_a_distributed_optimizer(monkeypatch):
    # Keras resolves jit_compile="auto" to XLA on a machine with a GPU; pretend to be one.
    real = tf.config.list_physical_devices
    fake_gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda *a, **k: list(real(*a, **k)) + [fake_gpu])
    plain = dense_model(initial_weights(1))
    plain.compile(optimizer=keras.optimizers.SGD(), loss="mse", jit_compile="auto")
    assert plain.jit_compile is True  # what Keras would do: the failure we must avoid
    for jit_compile in ("auto", True):
        model = dense_model(initial_weights(1))
        with pytest.warns(UserWarning, match="cannot be compiled by XLA"):
            model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD()),
                          loss="mse", jit_compile=jit_compile)
        assert model.jit_compile is False
