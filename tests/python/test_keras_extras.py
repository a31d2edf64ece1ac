"""Keras 3 extras: load_model, BestModelCheckpoint, SyncBatchNormalization."""

import os

import numpy as np
import pytest
import tensorflow as tf
import keras

import horovod_compat.keras as hk
import horovod_compat.tensorflow as hvd
import horovod_compat.tensorflow.keras as hvdk
from keras_helpers import (
    FEATURES,
    assert_same_on_all_ranks,
    dense_model,
    global_data,
    initial_weights,
    mse_gradient,
)

ROWS = 8
LR = 0.05
MOMENTUM = 0.5


def _shared_dir(tmp_path):
    """A directory every rank can see (rank 0's tmp_path; all ranks run on this host)."""
    return hvd.broadcast_object(str(tmp_path), root_rank=0, name="keras_extras_shared_dir")


class CustomSGD(keras.optimizers.SGD):
    """An optimizer outside keras.optimizers, for load_model(custom_optimizers=...)."""


# -- load_model -------------------------------------------------------------------------------

@pytest.mark.parametrize("frontend,ext", [("hvdk", "keras"), ("hk", "h5"), ("hvdk", "custom")])
def test_load_model_continues_distributed(tmp_path, frontend, ext):
    module = hvdk if frontend == "hvdk" else hk
    x, y = _data_rows(ROWS)
    mine = slice(hvd.rank() * ROWS, (hvd.rank() + 1) * ROWS)
    base_cls = CustomSGD if ext == "custom" else keras.optimizers.SGD
    model = dense_model(initial_weights(5))
    opt = module.DistributedOptimizer(base_cls(learning_rate=LR, momentum=MOMENTUM))
    # An object loss: Keras 3 cannot deserialize the string "mse" from an HDF5 training config.
    model.compile(optimizer=opt, loss=keras.losses.MeanSquaredError())
    model.fit(x[mine], y[mine], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / f"model-{hvd.rank()}.{'h5' if ext == 'h5' else 'keras'}")
    model.save(path)

    if ext == "custom":
        loaded = module.load_model(path, custom_optimizers=[CustomSGD],
                                   compression=hvd.Compression.fp16)
    else:
        loaded = module.load_model(path)
    restored = loaded.optimizer
    assert isinstance(restored, base_cls)
    assert type(restored).__name__ == base_cls.__name__
    assert type(restored) is not base_cls and type(restored)._hvd_settings  # distributed
    expected_compression = hvd.Compression.fp16 if ext == "custom" else hvd.Compression.none
    assert type(restored)._hvd_settings["compression"] is expected_compression
    config = restored.get_config()
    assert config["learning_rate"] == pytest.approx(LR)
    assert config["momentum"] == pytest.approx(MOMENTUM)
    assert int(restored.iterations.numpy()) == 1
    for got, want in zip(restored.variables, opt.variables):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    loaded.fit(x[mine], y[mine], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
    w, b = loaded.get_weights()
    assert_same_on_all_ranks([w, b])
    # Two SGD-with-momentum steps on the global batch: m = mu*m - lr*g; w = w + m.
    ref_w, ref_b = initial_weights(5)
    mom_w, mom_b = np.zeros_like(ref_w), np.zeros_like(ref_b)
    for _ in range(2):
        gw, gb = mse_gradient(ref_w, ref_b, x, y)
        mom_w, mom_b = MOMENTUM * mom_w - LR * gw, MOMENTUM * mom_b - LR * gb
        ref_w, ref_b = ref_w + mom_w, ref_b + mom_b
    # With fp16 compression (custom case) the second step's gradients are rounded to fp16.
    tol = 1e-2 if ext == "custom" and hvd.size() > 1 else 1e-5
    np.testing.assert_allclose(w, ref_w, rtol=tol, atol=tol)
    np.testing.assert_allclose(b, ref_b, rtol=tol, atol=tol)


def test_load_model_rejects_legacy_opts(tmp_path):
    with pytest.raises(ValueError, match="legacy"):
        hvdk.load_model(str(tmp_path / "missing.keras"), legacy_opts=True)


# -- BestModelCheckpoint ----------------------------------------------------------------------

VAL_LOSSES = [3.0, 1.0, 2.0, 1.5]   # the best epoch is epoch 1 (0-based)


class _FakeValLoss(keras.callbacks.Callback):
    """Sets val_loss per epoch and records the weights the checkpoint sees."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        logs["val_loss"] = VAL_LOSSES[epoch]
        self.weights.append([np.array(w) for w in self.model.get_weights()])


def _data_rows(rows_per_rank):
    return global_data(rows_per_rank, seed=1234, bias=0.5)


@pytest.mark.parametrize("frontend,suffix", [("hvdk", ".weights.h5"), ("hk", ".keras")])
def test_best_model_checkpoint(tmp_path, frontend, suffix):
    directory = _shared_dir(tmp_path)
    x, y = _data_rows(ROWS)
    mine = slice(hvd.rank() * ROWS, (hvd.rank() + 1) * ROWS)
    model = dense_model(initial_weights(6))
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=LR)),
                  loss="mse")
    if frontend == "hvdk":
        checkpoint = hvdk.callbacks.BestModelCheckpoint(monitor="val_loss",
                                                        save_weights_only=True)
    else:
        checkpoint = hk.callbacks.BestModelCheckpoint(monitor="val_loss")
    assert checkpoint.save_best_only and checkpoint.filepath is None
    # As in Horovod, the path is assigned after construction; each rank names its own file.
    checkpoint.filepath = os.path.join(directory, f"best-{hvd.rank()}-{frontend}{suffix}")
    record = _FakeValLoss()
    model.fit(x[mine], y[mine], batch_size=ROWS, epochs=len(VAL_LOSSES), shuffle=False,
              verbose=0, callbacks=[record, checkpoint])
    assert checkpoint.best == pytest.approx(min(VAL_LOSSES))
    hvd.barrier()

    written = sorted(n for n in os.listdir(directory) if n.startswith("best-"))
    assert written == [f"best-0-{frontend}{suffix}"]
    best_path = os.path.join(directory, written[0])
    if suffix == ".keras":
        saved = keras.models.load_model(best_path).get_weights()
    else:
        restored = dense_model(initial_weights(0))
        restored.load_weights(best_path)
        saved = restored.get_weights()
    best_epoch = int(np.argmin(VAL_LOSSES))
    for got, want in zip(saved, record.weights[best_epoch]):
        np.testing.assert_array_equal(got, want)
    assert not np.allclose(record.weights[best_epoch][0], record.weights[-1][0])
    hvd.barrier()   # no rank removes the directory while another still reads it


def test_best_model_checkpoint_checks_filepath():
    model = dense_model(initial_weights(0))
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((2, FEATURES), np.float32), np.zeros((2, 1), np.float32)
    with pytest.raises(ValueError, match="filepath"):
        model.fit(x, y, verbose=0, callbacks=[hvdk.callbacks.BestModelCheckpoint()])
    wrong = hvdk.callbacks.BestModelCheckpoint(save_weights_only=True, filepath="w.keras")
    with pytest.raises(ValueError, match="weights.h5"):
        model.fit(x, y, verbose=0, callbacks=[wrong])


# -- SyncBatchNormalization -------------------------------------------------------------------

def _rank_batches(rows, seed):
    """Every rank's batch (rank q holds 2 + q rows: sizes differ on purpose)."""
    rng = np.random.RandomState(seed)
    return [(rng.randn(2 + q, 3, rows).astype(np.float32) * (q + 1) + q) for q in range(hvd.size())]


def _train_step(layer, x, upstream, compiled, mask=None):
    mask = None if mask is None else tf.constant(mask)

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True, mask=mask)
            loss = tf.reduce_sum(y * upstream)
        return (y,) + tuple(tape.gradient(loss, [x, layer.gamma, layer.beta]))

    if compiled:
        step = tf.function(step)
    y, gx, g_gamma, g_beta = step(tf.constant(x))
    return dict(y=y.numpy(), gx=gx.numpy(), g_gamma=g_gamma.numpy(), g_beta=g_beta.numpy(),
                moving_mean=np.asarray(layer.moving_mean),
                moving_variance=np.asarray(layer.moving_variance))


@pytest.mark.parametrize("compiled,masked", [(False, False), (True, False), (False, True)])
def test_sync_batch_norm_matches_batch_norm_on_global_batch(compiled, masked):
    channels = 4
    mine = _rank_batches(channels, seed=11)[hvd.rank()]
    # The reference batch is gathered from the ranks, not recomputed locally.
    global_x = hvd.allgather(tf.constant(mine)).numpy()
    upstream = np.random.RandomState(12 + hvd.rank()).randn(*mine.shape).astype(np.float32)
    global_up = hvd.allgather(tf.constant(upstream)).numpy()
    start = sum(2 + q for q in range(hvd.rank()))   # rows held by lower ranks
    mask = global_mask = None
    if masked:   # Keras masks (batch, steps); rank q masks out step (q % 3) of its first row
        mask = np.ones(mine.shape[:2], bool)
        mask[0, hvd.rank() % 3] = False
        global_mask = hvd.allgather(tf.constant(mask.astype(np.int32))).numpy().astype(bool)

    sync = hvd.SyncBatchNormalization(momentum=0.5, epsilon=1e-3)
    plain = keras.layers.BatchNormalization(momentum=0.5, epsilon=1e-3)
    for _ in range(2):   # two steps: the moving statistics compound
        got = _train_step(sync, mine, upstream, compiled, mask)
        want = _train_step(plain, global_x, global_up, compiled, global_mask)
    own = slice(start, start + len(mine))
    np.testing.assert_allclose(got["y"], want["y"][own], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["gx"], want["gx"][own], rtol=1e-3, atol=1e-4)
    # gamma/beta gradients are per-rank parts of the global ones (the optimizer sums them).
    for name in ("g_gamma", "g_beta"):
        total = hvd.allreduce(tf.constant(got[name]), op=hvd.Sum).numpy()
        np.testing.assert_allclose(total, want[name], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["moving_mean"], want["moving_mean"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["moving_variance"], want["moving_variance"], rtol=1e-4,
                               atol=1e-5)
    # Inference uses the moving statistics only: no collective, same as the plain layer.
    np.testing.assert_allclose(sync(tf.constant(mine), training=False).numpy(),
                               plain(tf.constant(mine), training=False).numpy(),
                               rtol=1e-4, atol=1e-4)


def test_sync_batch_norm_namespaces_and_fused():
    assert hvdk.SyncBatchNormalization is hvd.SyncBatchNormalization
    assert hk.SyncBatchNormalization is hvd.SyncBatchNormalization
    layer = hvd.SyncBatchNormalization()
    assert layer.name.startswith("sync_batch_normalization")
    assert isinstance(layer, keras.layers.BatchNormalization)
    for fused in (True, None):
        with pytest.raises(ValueError):
            hvd.SyncBatchNormalization(fused=fused)
    again = hvd.SyncBatchNormalization.from_config(layer.get_config())
    assert type(again) is hvd.SyncBatchNormalization
