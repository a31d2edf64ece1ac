"""The tf_keras (TF_USE_LEGACY_KERAS=1) path of the Keras frontends, as one job.

Run by tests/python/test_tf_keras.py, under `horovodrun -np 2` and as a single plain process,
with TF_USE_LEGACY_KERAS=1 set before TensorFlow is imported (the Keras choice is made then, so
it cannot run inside the pytest process, which already has Keras 3). Every rank runs the same
checks in the same order and prints `CHECK <name> ok` after each one; a failed assertion ends
the rank with a traceback and the job with a non-zero exit code.

    TF_USE_LEGACY_KERAS=1 python tests/python/tf_keras_job.py OUTDIR
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.keras as hk  # noqa: E402
import horovod_compat.tensorflow as hvd  # noqa: E402
import horovod_compat.tensorflow.keras as hvdk  # noqa: E402

K = tf.keras
FEATURES = 4
ROWS = 8
LR = 0.1
MOMENTUM = 0.5


def check(name):
    print(f"CHECK {name} ok rank={hvd.rank()} size={hvd.size()}", flush=True)


def global_data(rows_per_rank, seed=4321):
    rng = np.random.RandomState(seed)
    x = rng.randn(rows_per_rank * hvd.size(), FEATURES).astype(np.float32)
    y = (x @ np.arange(1, FEATURES + 1, dtype=np.float32) - 0.25).reshape(-1, 1)
    return x, y


def shard(rows_per_rank, rank=None):
    rank = hvd.rank() if rank is None else rank
    return slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)


def initial_weights(seed):
    rng = np.random.RandomState(seed)
    return [rng.randn(FEATURES, 1).astype(np.float32), rng.randn(1).astype(np.float32)]


def model(weights):
    m = K.Sequential([K.Input((FEATURES,)), K.layers.Dense(1)])
    m.set_weights(weights)
    return m


def sgd(flavour, lr=LR, momentum=MOMENTUM):
    cls = K.optimizers.legacy.SGD if flavour == "legacy" else K.optimizers.SGD
    return cls(learning_rate=lr, momentum=momentum)


def assert_same_on_all_ranks(values):
    flat = np.concatenate([np.ravel(np.asarray(v)) for v in values]).astype(np.float32)
    gathered = hvd.allgather(tf.constant(flat[None, :])).numpy()
    for r in range(1, hvd.size()):
        np.testing.assert_array_equal(gathered[r], gathered[0])


def reference_fit(flavour, seed, x, y, batch_size, epochs):
    """A plain tf_keras optimizer on the global batch (every rank computes it locally)."""
    m = model(initial_weights(seed))
    m.compile(optimizer=sgd(flavour), loss="mse")
    m.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return m.get_weights()


def check_environment():
    assert K.__name__.startswith("tf_keras"), K.__name__
    import tf_keras
    assert tf_keras.__version__.startswith("2."), tf_keras.__version__
    check("environment")


def check_fit_matches_reference(flavour, run_eagerly, frontend):
    module = hvdk if frontend == "hvdk" else hk
    epochs = 3
    x, y = global_data(ROWS)
    m = model(initial_weights(0))
    opt = module.DistributedOptimizer(sgd(flavour))
    assert isinstance(opt, type(sgd(flavour))) and type(opt).__name__ == "SGD"
    m.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    m.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=ROWS, epochs=epochs, shuffle=False,
          verbose=0)
    got = m.get_weights()
    assert_same_on_all_ranks(got)
    want = reference_fit(flavour, 0, x, y, ROWS * hvd.size(), epochs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert int(opt.iterations.numpy()) == epochs
    check(f"fit_matches_reference[{flavour},eager={run_eagerly},{frontend}]")


def check_backward_passes(flavour, average):
    passes, epochs = 2, 2
    per_rank = ROWS * passes
    x, y = global_data(per_rank, seed=99)
    m = model(initial_weights(1))
    opt = hvdk.DistributedOptimizer(sgd(flavour), backward_passes_per_step=passes,
                                    average_aggregated_gradients=average)
    m.compile(optimizer=opt, loss="mse")
    m.fit(x[shard(per_rank)], y[shard(per_rank)], batch_size=ROWS, epochs=epochs,
          shuffle=False, verbose=0)
    got = m.get_weights()
    assert_same_on_all_ranks(got)
    # iterations advances on every pass (as in Horovod); the helper's counter is steps % passes.
    assert int(opt.iterations.numpy()) == epochs * passes
    assert int(opt._agg_helper.counter.numpy()) == 0

    # Reference: the same plain optimizer, fed the sum (or mean) over the passes of the
    # global-batch gradient of each pass.
    ref = model(initial_weights(1))
    ref_opt = sgd(flavour)
    loss_fn = K.losses.MeanSquaredError()
    for _ in range(epochs):
        total = None
        for j in range(passes):
            rows = np.concatenate([np.arange(r * per_rank + j * ROWS, r * per_rank + (j + 1) * ROWS)
                                   for r in range(hvd.size())])
            with tf.GradientTape() as tape:
                loss = loss_fn(y[rows], ref(x[rows]))
            grads = tape.gradient(loss, ref.trainable_variables)
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        if average:
            total = [g / passes for g in total]
        ref_opt.apply_gradients(zip(total, ref.trainable_variables))
    for g, w in zip(got, ref.get_weights()):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    check(f"backward_passes[{flavour},average={average}]")


def check_backward_passes_embedding(flavour, run_eagerly, average):
    """Embedding (IndexedSlices) gradients with sparse_as_dense=True, a pass left pending at
    the end: weights as a single process fed the same accumulated global-batch gradients."""
    passes, total_passes, vocab, dim = 3, 7, 10, 3
    size = hvd.size()
    rng = np.random.RandomState(7)
    n = total_passes * size * ROWS
    x = rng.randint(0, vocab, size=(n, 2)).astype(np.int32)
    y = (x[:, :1] * 0.1 - 0.3).astype(np.float32)

    def rows(j, r):
        start = (j * size + r) * ROWS
        return np.arange(start, start + ROWS)

    def emb_model():
        m = K.Sequential([K.Input((2,), dtype="int32"), K.layers.Embedding(vocab, dim),
                          K.layers.Flatten(), K.layers.Dense(1)])
        r = np.random.RandomState(3)
        m.set_weights([w.astype(np.float32) for w in
                       (r.randn(vocab, dim), r.randn(2 * dim, 1), r.randn(1))])
        return m

    m = emb_model()
    opt = hvdk.DistributedOptimizer(sgd(flavour, momentum=0.0), backward_passes_per_step=passes,
                                    average_aggregated_gradients=average, sparse_as_dense=True)
    m.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    mine = np.concatenate([rows(j, hvd.rank()) for j in range(total_passes)])
    m.fit(x[mine], y[mine], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
    got = m.get_weights()
    assert_same_on_all_ranks(got)
    assert int(opt.iterations.numpy()) == total_passes
    assert int(opt._agg_helper.counter.numpy()) == total_passes % passes

    ref = emb_model()
    ref_opt = sgd(flavour, momentum=0.0)
    loss_fn = K.losses.MeanSquaredError()
    total = None
    for j in range(total_passes):
        batch = np.concatenate([rows(j, r) for r in range(size)])
        with tf.GradientTape() as tape:
            loss = loss_fn(y[batch], ref(x[batch]))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, ref.trainable_variables)]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
        if (j + 1) % passes == 0:
            if average:
                total = [g / passes for g in total]
            ref_opt.apply_gradients(zip(total, ref.trainable_variables))
            total = None
    for g, w in zip(got, ref.get_weights()):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

    plain = hvdk.DistributedOptimizer(sgd(flavour), backward_passes_per_step=2)
    with tf.GradientTape() as tape:
        loss = loss_fn(y[:ROWS], ref(x[:ROWS]))
    grads = tape.gradient(loss, ref.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices)
    try:
        plain.apply_gradients(zip(grads, ref.trainable_variables))
    except ValueError as e:
        assert "sparse_as_dense" in str(e), e
    else:
        raise AssertionError("IndexedSlices without sparse_as_dense must raise ValueError")
    check(f"backward_passes_embedding[{flavour},eager={run_eagerly},average={average}]")


def check_options(flavour):
    """compression, sparse_as_dense (Embedding gradients), process_set, op=Sum."""
    x = np.arange(ROWS * hvd.size()).reshape(-1, 1) % 5
    y = np.linspace(-1, 1, ROWS * hvd.size()).reshape(-1, 1).astype(np.float32)

    def emb_model():
        m = K.Sequential([K.Input((1,), dtype="int32"), K.layers.Embedding(5, 2),
                          K.layers.Flatten(), K.layers.Dense(1)])
        rng = np.random.RandomState(7)
        m.set_weights([rng.randn(*w.shape).astype(np.float32) for w in m.get_weights()])
        return m

    m = emb_model()
    opt = hvdk.DistributedOptimizer(sgd(flavour), compression=hvd.Compression.fp16,
                                    sparse_as_dense=True, process_set=hvd.global_process_set)
    m.compile(optimizer=opt, loss="mse")
    m.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=ROWS, epochs=2, shuffle=False, verbose=0)
    assert_same_on_all_ranks(m.get_weights())
    ref = emb_model()
    ref.compile(optimizer=sgd(flavour), loss="mse")
    ref.fit(x, y, batch_size=ROWS * hvd.size(), epochs=2, shuffle=False, verbose=0)
    for g, w in zip(m.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3)   # fp16 on the wire

    # op=Sum; compute_gradients reduces, and apply_gradients does not reduce those again.
    var = tf.Variable(np.zeros(3, np.float32))
    opt = hvdk.DistributedOptimizer(sgd(flavour, lr=1.0, momentum=0.0), op=hvd.Sum)
    scale = float(hvd.rank() + 1)
    gv = opt.compute_gradients(lambda: tf.reduce_sum(var * scale), [var])
    total = float(np.sum(np.arange(1, hvd.size() + 1)))
    np.testing.assert_allclose(gv[0][0].numpy(), np.full(3, total))
    opt.apply_gradients(gv)
    np.testing.assert_allclose(var.numpy(), np.full(3, -total))
    # A custom loop: tape.gradient + apply_gradients is reduced.
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(var * scale)
    opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
    np.testing.assert_allclose(var.numpy(), np.full(3, -2 * total))
    # minimize() reduces once.
    opt.minimize(lambda: tf.reduce_sum(var * scale), [var])
    np.testing.assert_allclose(var.numpy(), np.full(3, -3 * total))
    check(f"options[{flavour}]")


def check_config_and_validation(flavour):
    base = (K.optimizers.legacy.Adam if flavour == "legacy" else K.optimizers.Adam)(
        learning_rate=0.01, beta_1=0.8)
    opt = hvdk.DistributedOptimizer(base, backward_passes_per_step=2)
    assert type(opt).__name__ == "Adam" and isinstance(opt, type(base)) and opt is not base
    config = opt.get_config()
    assert abs(config["beta_1"] - 0.8) < 1e-6
    again = type(opt).from_config(config)
    assert type(again) is type(opt) and again._hvd_settings["backward_passes_per_step"] == 2
    assert again.get_config() == config
    assert isinstance(opt.variables, list) and isinstance(opt.variables(), list)
    for op in (hvd.Adasum, hvd.Max):
        try:
            hvdk.DistributedOptimizer(sgd(flavour), op=op)
        except ValueError:
            pass
        else:
            raise AssertionError(f"op={op} accepted")
    check(f"config[{flavour}]")


class RankMetric(K.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        logs["rank_metric"] = float(hvd.rank() * (epoch + 1))


class Record(K.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_logs = []
        self.batch_lrs = []
        self.batch_momenta = []

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        self.batch_lrs.append(float(K.backend.get_value(opt.lr)))
        if hasattr(opt, "_hyper") and "momentum" in opt._hyper:
            self.batch_momenta.append(float(K.backend.get_value(opt._get_hyper("momentum"))))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def check_broadcast_callback(flavour):
    m = model(initial_weights(100 + hvd.rank()))
    opt = hvdk.DistributedOptimizer(sgd(flavour, lr=0.0))
    m.compile(optimizer=opt, loss="mse")
    x, y = global_data(ROWS)
    cb = hvdk.callbacks.BroadcastGlobalVariablesCallback(0)
    assert isinstance(cb, K.callbacks.Callback)
    m.fit(x, y, batch_size=ROWS, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    for got, want in zip(m.get_weights(), initial_weights(100)):
        np.testing.assert_array_equal(got, want)
    assert_same_on_all_ranks([np.asarray(v) for v in opt.variables()])
    check(f"broadcast_callback[{flavour}]")


def check_metric_average():
    x, y = global_data(ROWS)
    m = model(initial_weights(2 + hvd.rank()))
    m.compile(optimizer=sgd("new", lr=0.0), loss="mse")
    record = Record()
    m.fit(x, y, batch_size=ROWS, epochs=2, shuffle=False, verbose=0,
          callbacks=[RankMetric(), hk.callbacks.MetricAverageCallback(), record])
    size = hvd.size()
    for epoch, logs in enumerate(record.epoch_logs):
        assert abs(logs["rank_metric"] - (epoch + 1) * (size - 1) / 2.0) < 1e-6, logs
    assert_same_on_all_ranks([logs["loss"] for logs in record.epoch_logs])
    check("metric_average")


def check_warmup(flavour):
    initial_lr, steps, warmup = 0.4, 3, 2
    x, y = global_data(ROWS * steps)
    m = model(initial_weights(3))
    opt = hvdk.DistributedOptimizer(sgd(flavour, lr=initial_lr, momentum=0.0))
    m.compile(optimizer=opt, loss="mse")
    record = Record()
    m.fit(x[:ROWS * steps], y[:ROWS * steps], batch_size=ROWS, epochs=warmup + 1,
          shuffle=False, verbose=0,
          callbacks=[hvdk.callbacks.LearningRateWarmupCallback(initial_lr, warmup_epochs=warmup),
                     record])
    size = hvd.size()
    expected = []
    for epoch in range(warmup):
        for batch in range(steps):
            e = epoch + batch / steps + 1.0 / steps
            expected.append(initial_lr / size * (e * (size - 1) / warmup + 1))
    expected += [expected[-1]] * steps
    np.testing.assert_allclose(record.batch_lrs, expected, rtol=1e-6)
    assert abs(record.epoch_logs[-1]["lr"] - initial_lr) < 1e-6
    check(f"warmup[{flavour}]")


def check_schedule_with_momentum_correction():
    steps = 2
    x, y = global_data(ROWS * steps)
    m = model(initial_weights(4))
    m.compile(optimizer=hvdk.DistributedOptimizer(sgd("legacy", lr=1.0, momentum=0.9)),
              loss="mse")
    record = Record()
    m.fit(x[:ROWS * steps], y[:ROWS * steps], batch_size=ROWS, epochs=4, shuffle=False,
          verbose=0, callbacks=[hk.callbacks.LearningRateScheduleCallback(
              0.01, multiplier=0.5, start_epoch=1, end_epoch=3), record])
    expected = [1.0] * steps + [0.01] * steps + [0.005] * steps + [0.005] * steps
    np.testing.assert_allclose(record.batch_lrs, expected, rtol=1e-6)
    # legacy optimizers read momentum at run time: scaled by new_lr / old_lr on the batch where
    # the learning rate changes, restored at its end.
    want_momenta = [0.9, 0.9, 0.9 * 0.01, 0.9, 0.9 * 0.5, 0.9, 0.9, 0.9]
    np.testing.assert_allclose(record.batch_momenta, want_momenta, rtol=1e-5)
    assert abs(float(K.backend.get_value(m.optimizer.momentum)) - 0.9) < 1e-6
    check("schedule_momentum_correction")


def check_load_model(outdir, flavour, ext):
    x, y = global_data(ROWS)
    m = model(initial_weights(5))
    m.compile(optimizer=hvdk.DistributedOptimizer(sgd(flavour)), loss="mse")
    m.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
    path = os.path.join(outdir, f"model-{flavour}-{hvd.rank()}.{ext}")
    m.save(path)
    loaded = hvdk.load_model(path, legacy_opts=(flavour == "legacy"),
                             compression=hvd.Compression.fp16)
    opt = loaded.optimizer
    assert getattr(type(opt), "_hvd_settings", None), type(opt).__mro__
    assert opt._hvd_settings["compression"] is hvd.Compression.fp16
    assert isinstance(opt, type(sgd(flavour)))
    assert int(opt.iterations.numpy()) == 1
    for g, w in zip(loaded.get_weights(), m.get_weights()):
        np.testing.assert_array_equal(g, w)
    loaded.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=ROWS, epochs=2, shuffle=False,
               verbose=0)
    assert_same_on_all_ranks(loaded.get_weights())
    assert int(opt.iterations.numpy()) == 3
    check(f"load_model[{flavour},{ext}]")


def check_best_model_checkpoint(outdir):
    x, y = global_data(ROWS)
    m = model(initial_weights(6))
    m.compile(optimizer=hvdk.DistributedOptimizer(sgd("new")), loss="mse")
    cb = hvdk.callbacks.BestModelCheckpoint(monitor="loss")
    path = os.path.join(outdir, f"best-{hvd.rank()}.h5")
    cb.filepath = path
    m.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=ROWS, epochs=2, shuffle=False, verbose=0,
          callbacks=[hvdk.callbacks.MetricAverageCallback(), cb])
    assert os.path.exists(path) == (hvd.rank() == 0), (path, os.path.exists(path))
    hk_cb = hk.callbacks.BestModelCheckpoint(monitor="loss")
    try:
        m.fit(x, y, epochs=1, verbose=0, callbacks=[hk_cb])
    except ValueError:
        pass
    else:
        raise AssertionError("BestModelCheckpoint without a filepath trained")
    check("best_model_checkpoint")


def check_partial_distributed_optimizer():
    x, y = global_data(ROWS)
    local = K.layers.Dense(1, name="local_dense")
    m = K.Sequential([K.Input((FEATURES,)), K.layers.Dense(2), local])
    opt = hk.PartialDistributedOptimizer(sgd("new"), local_layers=local)
    m.compile(optimizer=opt, loss="mse")
    m.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
    assert len(opt._local_vars) == 2
    check("partial_distributed_optimizer")


def check_value_helpers():
    size, rank = hvd.size(), hvd.rank()
    assert abs(float(hvdk.allreduce(float(rank), name="tfk_value_allreduce"))
               - (size - 1) / 2.0) < 1e-6
    assert abs(float(hk.allreduce(float(rank), name="tfk_value_allreduce_hk", average=False))
               - size * (size - 1) / 2.0) < 1e-6
    np.testing.assert_array_equal(hvdk.allgather([rank], name="tfk_value_allgather").numpy(),
                                  np.arange(size))
    assert int(hvdk.broadcast(rank + 5, 0, name="tfk_value_broadcast")) == 5
    check("value_helpers")


def check_sync_batch_norm():
    """hvd.SyncBatchNormalization is a tf_keras layer here, and in training mode matches a plain
    tf_keras BatchNormalization run on the batch gathered from every rank (rank q holds 2 + q
    rows: sizes differ on purpose), with and without a mask, eager and in a tf.function."""
    assert hvdk.SyncBatchNormalization is hvd.SyncBatchNormalization
    assert hk.SyncBatchNormalization is hvd.SyncBatchNormalization
    assert isinstance(hvd.SyncBatchNormalization(), K.layers.BatchNormalization)
    assert hvd.SyncBatchNormalization().name.startswith("sync_batch_normalization")
    for fused in (True, None):
        try:
            hvd.SyncBatchNormalization(fused=fused)
        except ValueError:
            pass
        else:
            raise AssertionError(f"fused={fused} accepted")
    size, rank = hvd.size(), hvd.rank()
    rng = np.random.RandomState(77)
    batches = [rng.randn(2 + q, 3, 4).astype(np.float32) * (q + 1) + q for q in range(size)]
    ups = [rng.randn(*b.shape).astype(np.float32) for b in batches]
    masks = []
    for q, b in enumerate(batches):
        m = np.ones(b.shape[:2], bool)
        m[0, q % 3] = False
        masks.append(m)
    own = slice(sum(2 + q for q in range(rank)), sum(2 + q for q in range(rank + 1)))

    def run(layer, x, up, mask, compiled):
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True, mask=None if mask is None else tf.constant(mask))
                loss = tf.reduce_sum(y * up)
            return (y,) + tuple(tape.gradient(loss, [x, layer.gamma, layer.beta]))
        if compiled:
            step = tf.function(step)
        return [t.numpy() for t in step(tf.constant(x))]

    for compiled, masked in ((False, False), (True, False), (False, True)):
        sync = hvd.SyncBatchNormalization(momentum=0.5, epsilon=1e-3)
        plain = K.layers.BatchNormalization(momentum=0.5, epsilon=1e-3)
        # The reference batch is the concatenation of every rank's batch (gathered, as a check
        # of what each rank holds, and compared with the local recomputation).
        global_x = hvd.allgather(tf.constant(batches[rank]), name=f"tfk_sbn_x_{compiled}_{masked}")
        np.testing.assert_array_equal(global_x.numpy(), np.concatenate(batches))
        global_up = np.concatenate(ups)
        global_mask = np.concatenate(masks) if masked else None
        mine_mask = masks[rank] if masked else None
        for _ in range(2):  # the moving statistics compound
            y, gx, g_gamma, g_beta = run(sync, batches[rank], ups[rank], mine_mask, compiled)
            ry, rgx, rg_gamma, rg_beta = run(plain, global_x.numpy(), global_up, global_mask,
                                             compiled)
        np.testing.assert_allclose(y, ry[own], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(gx, rgx[own], rtol=1e-3, atol=1e-4)
        for got, want, what in ((g_gamma, rg_gamma, "gamma"), (g_beta, rg_beta, "beta")):
            total = hvd.allreduce(tf.constant(got), op=hvd.Sum,
                                  name=f"tfk_sbn_g_{what}_{compiled}_{masked}").numpy()
            np.testing.assert_allclose(total, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(sync.moving_mean.numpy(), plain.moving_mean.numpy(),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sync.moving_variance.numpy(), plain.moving_variance.numpy(),
                                   rtol=1e-4, atol=1e-5)
    check("sync_batch_norm")


def _optimizer_values(opt):
    variables = opt.variables
    return [np.array(v.numpy()) for v in (variables() if callable(variables) else variables)]


def check_elastic_state(flavour):
    """KerasState on tf_keras: restore rolls back, sync gives rank 0's model and optimizer; the
    elastic callbacks keep the state current during fit."""
    r = hvd.rank()
    x, y = global_data(ROWS, seed=7)
    m = model(initial_weights(10 + r))
    opt = sgd(flavour)
    m.compile(optimizer=opt, loss="mse")
    m.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
    state = hvdk.elastic.KerasState(m, epoch=r, batch=0)
    assert state.optimizer is opt
    committed, committed_opt = m.get_weights(), _optimizer_values(opt)
    m.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
    state.restore()
    for got, want in zip(m.get_weights() + _optimizer_values(opt), committed + committed_opt):
        np.testing.assert_array_equal(got, want)
    ref = model(initial_weights(10))
    ref_opt = sgd(flavour)
    ref.compile(optimizer=ref_opt, loss="mse")
    ref.fit(x[shard(ROWS, 0)], y[shard(ROWS, 0)], batch_size=ROWS, epochs=1, shuffle=False,
            verbose=0)
    state.epoch = 50 + r
    state.commit()
    state.sync()
    for got, want in zip(m.get_weights() + _optimizer_values(opt),
                         ref.get_weights() + _optimizer_values(ref_opt)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert state.epoch == 50

    class Counting(hvdk.elastic.ObjectState):
        commits = 0

        def save(self):
            Counting.commits += 1
            super().save()

    counting = Counting(hvd.broadcast_object, hvd.rank, epoch=r, batch=0)
    steps, epochs, per_commit = ROWS // 2, 2, 3
    m.fit(x[shard(ROWS)], y[shard(ROWS)], batch_size=2, epochs=epochs, shuffle=False, verbose=0,
          callbacks=[hvdk.elastic.CommitStateCallback(counting, per_commit),
                     hvdk.elastic.UpdateBatchStateCallback(counting),
                     hvdk.elastic.UpdateEpochStateCallback(counting)])
    # Due every per_commit batches (counted across epochs) and at each epoch's end; one due at
    # an epoch's last batch is replaced by the epoch's (docs/elastic.md).
    expected_commits = sum(1 for n in range(1, steps * epochs + 1)
                           if n % per_commit == 0 and n % steps != 0) + epochs
    assert Counting.commits == expected_commits, Counting.commits
    assert (counting.epoch, counting.batch) == (r + epochs, 0)
    check(f"elastic_state[{flavour}]")


def main():
    outdir = sys.argv[1]
    hvd.init()
    check_environment()
    check_value_helpers()
    check_fit_matches_reference("new", False, "hvdk")
    check_fit_matches_reference("new", True, "hk")
    check_fit_matches_reference("legacy", False, "hk")
    check_fit_matches_reference("legacy", True, "hvdk")
    for flavour in ("new", "legacy"):
        check_backward_passes(flavour, average=(flavour == "legacy"))
        check_backward_passes_embedding(flavour, run_eagerly=False, average=True)
        check_backward_passes_embedding(flavour, run_eagerly=True, average=False)
        check_options(flavour)
        check_config_and_validation(flavour)
        check_broadcast_callback(flavour)
        check_warmup(flavour)
        check_elastic_state(flavour)
    check_metric_average()
    check_schedule_with_momentum_correction()
    check_load_model(outdir, "new", "h5")
    check_load_model(outdir, "new", "keras")
    check_load_model(outdir, "legacy", "h5")
    check_best_model_checkpoint(outdir)
    check_partial_distributed_optimizer()
    check_sync_batch_norm()
    print(f"ALL CHECKS PASSED rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
