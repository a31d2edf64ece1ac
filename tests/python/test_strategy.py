"""HorovodStrategy (horovod_compat.tensorflow.distribute) with Keras 3 and custom loops.

Run as one process and under ``mpirun -np 2/3``. Expected values are computed in the test: the
reference is the same model trained by plain Keras / TensorFlow, without a strategy, on the
global batches in input order (every rank computes it locally).

With ``HVDC_TEST_STRATEGY=mwms`` the same tests run against
``tf.distribute.MultiWorkerMirroredStrategy`` (strategy_under_test.py): tests of what only
HorovodStrategy offers are skipped, tests where MWMS gives another answer are expected failures;
each reason says what MWMS does.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd
from horovod_compat.tensorflow.distribute import HorovodStrategy, shard_and_rebatch_dataset
from strategy_under_test import (UNDER_MWMS, create_strategy, horovod_only,
                                 keras3_compiled_model_fails_under_mwms, mwms_differs)

FEATURES = 3
GLOBAL_BATCH = 12  # divisible by 1, 2 and 3 ranks
ROWS = 4 * GLOBAL_BATCH


@pytest.fixture(scope="module")
def strategy():
    return create_strategy()


def global_data(rows=ROWS, seed=7):
    rng = np.random.RandomState(seed)
    x = rng.randn(rows, FEATURES).astype(np.float32)
    y = np.stack([x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3,
                  x[:, 0] * x[:, 1]], axis=1).astype(np.float32)
    return x, y


def initial_weights(seed=11):
    rng = np.random.RandomState(seed)
    return [rng.randn(FEATURES, 4).astype(np.float32), rng.randn(4).astype(np.float32),
            rng.randn(4, 2).astype(np.float32), rng.randn(2).astype(np.float32)]


def build_model(weights=None):
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(2)])
    if weights is not None:
        model.set_weights(weights)
    return model


def flat(values):
    return np.concatenate([np.ravel(np.asarray(v, dtype=np.float64)) for v in values])


def assert_identical_on_all_ranks(values):
    mine = flat(values)
    gathered = hvd.allgather(tf.constant(mine[None, :])).numpy()
    for r in range(hvd.size()):
        np.testing.assert_array_equal(gathered[r], mine, err_msg=f"rank {r} differs")


# -- basics ---------------------------------------------------------------------------------------

def test_replicas_workers_and_chief(strategy):
    assert isinstance(strategy, tf.distribute.Strategy)
    assert strategy.num_replicas_in_sync == hvd.size()
    assert strategy.extended._in_multi_worker_mode() == (hvd.size() > 1)
    assert strategy.extended.should_checkpoint == (hvd.rank() == 0)
    assert strategy.extended.should_save_summary == (hvd.rank() == 0)
    assert len(strategy.extended.worker_devices) == 1
    assert hvd.distribute.HorovodStrategy is HorovodStrategy


def test_reachable_through_the_horovod_alias():
    from horovod_compat import alias
    alias.install()
    try:
        import horovod.tensorflow as hvd_alias
        import horovod.tensorflow.distribute as distribute_alias
        assert hvd_alias.distribute.HorovodStrategy is HorovodStrategy
        assert distribute_alias.shard_and_rebatch_dataset is shard_and_rebatch_dataset
    finally:
        alias.uninstall()


def test_variables_start_from_rank0_values(strategy):
    rank = hvd.rank()
    with strategy.scope():
        f = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * rank)
        i = tf.Variable(tf.constant([rank + 5, -rank], tf.int64))
        b = tf.Variable(tf.constant([rank % 2 == 0, rank % 2 == 1]))
    np.testing.assert_array_equal(f.numpy(), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(i.numpy(), [5, 0])
    np.testing.assert_array_equal(b.numpy(), [True, False])


@mwms_differs("MWMS broadcasts initial values with CollectiveBcastRecv, which takes bool, "
              "float16/32/64, int32 and int64 only: creating a uint32 variable in scope raises "
              "InvalidArgumentError", raises=tf.errors.InvalidArgumentError)
def test_uint32_variable_starts_from_rank0_value(strategy):
    with strategy.scope():
        u = tf.Variable(tf.constant([2**31 + hvd.rank(), 7], tf.uint32))
    np.testing.assert_array_equal(u.numpy(), np.array([2**31, 7], np.uint32))


def test_keras_model_weights_start_from_rank0(strategy):
    keras.utils.set_random_seed(100 + hvd.rank())  # different initialisers on every rank
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    assert_identical_on_all_ranks(model.get_weights())


# -- reductions -----------------------------------------------------------------------------------

def rows_of(replica_id):
    """Replica r holds r + 1 rows of [r, 10 r + j] (uneven lengths across replicas)."""
    n = replica_id + 1
    return np.stack([np.full(n, replica_id, np.float32),
                     10.0 * replica_id + np.arange(n, dtype=np.float32)], axis=1)


def per_replica_rows(strategy):
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(rows_of(ctx.replica_id_in_sync_group)))


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
@pytest.mark.parametrize("axis", [None, 0])
def test_strategy_reduce_sum_mean_axis(strategy, op, axis):
    size = hvd.size()
    values = per_replica_rows(strategy)
    if axis is None:
        # axis=None reduces across replicas only: needs equal shapes, so reduce row 0.
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(rows_of(ctx.replica_id_in_sync_group)[0]))
        stacked = np.stack([rows_of(r)[0] for r in range(size)])
        expected = stacked.sum(0) if op == "SUM" else stacked.mean(0)
    else:
        all_rows = np.concatenate([rows_of(r) for r in range(size)])
        expected = all_rows.sum(0) if op == "SUM" else all_rows.mean(0)
    result = strategy.reduce(op, values, axis=axis)
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-6)


@mwms_differs("MWMS's strategy.reduce takes one PerReplica value, not a nested structure of them "
              "(which tf.distribute.Strategy.reduce documents): ValueError 'Attempt to convert a "
              "value ({'a': PerReplica:...}) ... to a Tensor'", raises=ValueError)
def test_strategy_reduce_nested_structure(strategy):
    size = hvd.size()
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: {"a": tf.constant(float(ctx.replica_id_in_sync_group + 1)),
                     "b": (tf.constant([ctx.replica_id_in_sync_group], tf.int64),)})
    result = strategy.reduce("SUM", value, axis=None)
    assert result["a"].numpy() == pytest.approx(size * (size + 1) / 2)
    assert result["b"][0].numpy().tolist() == [size * (size - 1) // 2]


def test_strategy_gather_in_rank_order(strategy):
    size = hvd.size()
    gathered = strategy.gather(per_replica_rows(strategy), axis=0)
    np.testing.assert_array_equal(gathered.numpy(),
                                  np.concatenate([rows_of(r) for r in range(size)]))
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.fill([2, 3], float(ctx.replica_id_in_sync_group)))
    gathered = strategy.gather(values, axis=1)
    expected = np.concatenate([np.full([2, 3], float(r)) for r in range(size)], axis=1)
    np.testing.assert_array_equal(gathered.numpy(), expected)


def test_replica_context_collectives_in_tf_function(strategy):
    size = hvd.size()

    @tf.function
    def step():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            rid = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
            total = ctx.all_reduce("SUM", tf.stack([rid, 1.0]))
            mean = ctx.all_reduce("MEAN", rid)
            gathered = ctx.all_gather(tf.reshape(rid, [1]), axis=0)
            merged = ctx.merge_call(
                lambda strat, v: strat.reduce("SUM", v, axis=None), args=(rid * 2,))
            return total, mean, gathered, merged

        return strategy.run(replica_fn)

    total, mean, gathered, merged = step()
    ranks = np.arange(size, dtype=np.float32)
    np.testing.assert_allclose(total.numpy(), [ranks.sum(), size])
    assert mean.numpy() == pytest.approx(ranks.mean())
    np.testing.assert_array_equal(gathered.numpy(), ranks)
    assert merged.numpy() == pytest.approx(2 * ranks.sum())


# -- Keras 3 fit / evaluate / predict -------------------------------------------------------------

def reference_fit(optimizer_fn, x, y, epochs):
    model = build_model(initial_weights())
    model.compile(optimizer=optimizer_fn(), loss="mse")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model


@pytest.mark.parametrize("optimizer_fn", [
    lambda: keras.optimizers.SGD(0.05, momentum=0.5),
    lambda: keras.optimizers.Adam(0.01),
], ids=["sgd", "adam"])
@keras3_compiled_model_fails_under_mwms()
def test_fit_matches_single_process_on_global_batch(strategy, optimizer_fn):
    x, y = global_data()
    with strategy.scope():
        model = build_model(initial_weights())
        model.compile(optimizer=optimizer_fn(), loss="mse")
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0)
    assert_identical_on_all_ranks(model.get_weights())
    reference = reference_fit(optimizer_fn, x, y, epochs=3)
    np.testing.assert_allclose(flat(model.get_weights()), flat(reference.get_weights()),
                               rtol=1e-4, atol=1e-5)
    # Epoch-end logs are read from the metric variables, reduced over all ranks.
    expected_loss = reference.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    assert model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0) == pytest.approx(
        expected_loss, rel=1e-4)


@keras3_compiled_model_fails_under_mwms()
def test_fit_with_steps_per_execution(strategy):
    x, y = global_data()
    optimizer_fn = lambda: keras.optimizers.SGD(0.05)  # noqa: E731
    with strategy.scope():
        model = build_model(initial_weights())
        model.compile(optimizer=optimizer_fn(), loss="mse", steps_per_execution=2)
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    assert_identical_on_all_ranks(model.get_weights())
    reference = reference_fit(optimizer_fn, x, y, epochs=2)
    np.testing.assert_allclose(flat(model.get_weights()), flat(reference.get_weights()),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows,batch", [(ROWS, GLOBAL_BATCH), (13, 4), (7, 5)])
@keras3_compiled_model_fails_under_mwms()
def test_evaluate_and_predict_equal_single_process(strategy, rows, batch):
    x, y = global_data(rows=rows, seed=3)
    with strategy.scope():
        model = build_model(initial_weights(seed=5))
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    reference = build_model(initial_weights(seed=5))
    reference.compile(optimizer="sgd", loss="mse", metrics=["mae"])

    predicted = model.predict(x, batch_size=batch, verbose=0)
    assert predicted.shape == (rows, 2)
    np.testing.assert_allclose(predicted, reference.predict(x, batch_size=batch, verbose=0),
                               rtol=1e-5, atol=1e-6)
    assert_identical_on_all_ranks([predicted])

    results = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    expected = reference.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    assert results.keys() == expected.keys()
    for key in expected:
        assert results[key] == pytest.approx(expected[key], rel=1e-5), key


def test_predict_dataset_in_input_order(strategy):
    rows = 23
    x = np.arange(rows * FEATURES, dtype=np.float32).reshape(rows, FEATURES)
    with strategy.scope():
        identity = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Identity()])
    dataset = tf.data.Dataset.from_tensor_slices(x).batch(6)
    np.testing.assert_array_equal(identity.predict(dataset, verbose=0), x)


def embedding_model(weights=None):
    model = keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(10, 3),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    if weights is not None:
        model.set_weights(weights)
    return model


@pytest.mark.parametrize("sparse_as_dense", [
    False, pytest.param(True, marks=horovod_only("MWMS has no sparse_as_dense option"))])
@keras3_compiled_model_fails_under_mwms()
def test_sparse_gradients(sparse_as_dense):
    strategy = create_strategy() if UNDER_MWMS else HorovodStrategy(
        sparse_as_dense=sparse_as_dense)
    rng = np.random.RandomState(9)
    x = rng.randint(0, 10, size=(ROWS, 2)).astype(np.int32)
    y = rng.randn(ROWS, 1).astype(np.float32)
    weights = [rng.randn(10, 3).astype(np.float32), rng.randn(6, 1).astype(np.float32),
               np.zeros(1, np.float32)]
    with strategy.scope():
        model = embedding_model(weights)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    assert_identical_on_all_ranks(model.get_weights())
    reference = embedding_model(weights)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(flat(model.get_weights()), flat(reference.get_weights()),
                               rtol=1e-4, atol=1e-5)


@horovod_only("checks HorovodCrossDeviceOps.all_reduce_list, which MWMS's cross-device ops lack")
def test_sparse_gradients_are_allgathered_not_densified(strategy):
    local = tf.IndexedSlices(values=tf.fill([1, 2], float(hvd.rank() + 1)),
                             indices=tf.constant([hvd.rank() % 3], tf.int64),
                             dense_shape=tf.constant([3, 2], tf.int64))
    ops = strategy.extended._cross_device_ops
    (summed,) = ops.all_reduce_list("SUM", [local])
    assert isinstance(summed, tf.IndexedSlices)
    assert summed.values.shape[0] == hvd.size()
    expected = np.zeros([3, 2])
    for r in range(hvd.size()):
        expected[r % 3] += r + 1
    np.testing.assert_allclose(tf.convert_to_tensor(summed).numpy(), expected)


# -- custom training loop -------------------------------------------------------------------------

def test_custom_loop_with_distribute_datasets_from_function(strategy):
    x, y = global_data()
    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id,
                         ctx.num_replicas_in_sync))
        per_replica = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(per_replica)

    dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
    assert contexts == [(hvd.size(), hvd.rank(), hvd.size())]
    with strategy.scope():
        model = build_model(initial_weights())
        optimizer = keras.optimizers.SGD(0.05)

    @tf.function
    def train_step(inputs):
        def step_fn(batch):
            bx, by = batch
            with tf.GradientTape() as tape:
                per_example = tf.reduce_sum(tf.square(model(bx, training=True) - by), axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(step_fn, args=(inputs,)), axis=None)

    losses = [float(train_step(batch)) for batch in dist_dataset]
    assert_identical_on_all_ranks(model.get_weights())

    reference = build_model(initial_weights())
    ref_optimizer = keras.optimizers.SGD(0.05)
    ref_losses = []
    for start in range(0, ROWS, GLOBAL_BATCH):
        bx, by = x[start:start + GLOBAL_BATCH], y[start:start + GLOBAL_BATCH]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(reference(bx) - by)) / GLOBAL_BATCH
        grads = tape.gradient(loss, reference.trainable_variables)
        ref_optimizer.apply_gradients(zip(grads, reference.trainable_variables))
        ref_losses.append(float(loss))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    np.testing.assert_allclose(flat(model.get_weights()), flat(reference.get_weights()),
                               rtol=1e-4, atol=1e-5)


def test_experimental_distribute_dataset_covers_each_global_batch(strategy):
    rows = 5 * GLOBAL_BATCH
    dataset = tf.data.Dataset.range(rows).batch(GLOBAL_BATCH)
    seen = []
    for batch in strategy.experimental_distribute_dataset(dataset):
        seen.append(strategy.gather(batch, axis=0).numpy())
    np.testing.assert_array_equal(np.concatenate(seen), np.arange(rows))


# -- dataset helper -------------------------------------------------------------------------------

@horovod_only("shard_and_rebatch_dataset is horovod_compat's helper, not part of MWMS")
def test_shard_and_rebatch_dataset():
    size, rank = hvd.size(), hvd.rank()
    global_batch = 2 * size
    sharded, per_rank = shard_and_rebatch_dataset(tf.data.Dataset.range(10 * size),
                                                  global_batch)
    assert per_rank == 2
    mine = list(sharded.batch(per_rank).as_numpy_iterator())
    assert len(mine) == 5
    everything = hvd.allgather(tf.constant(np.concatenate(mine)[None, :])).numpy()
    np.testing.assert_array_equal(np.sort(everything.ravel()), np.arange(10 * size))
    np.testing.assert_array_equal(np.concatenate(mine), np.arange(rank, 10 * size, size))
    for bad in (0, -size, 2.0 * size, True):
        with pytest.raises(ValueError, match="positive multiple"):
            shard_and_rebatch_dataset(tf.data.Dataset.range(4), bad)
    if size > 1:
        with pytest.raises(ValueError, match=f"multiple of the number of ranks \\({size}\\)"):
            shard_and_rebatch_dataset(tf.data.Dataset.range(4), size + 1)
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        shard_and_rebatch_dataset(list(range(4)), size)


# -- clear errors ---------------------------------------------------------------------------------

def simple_resolver(cluster, task_type, task_id, **kwargs):
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id, **kwargs)


def addresses(n):
    return [f"localhost:{20000 + i}" for i in range(n)]


@horovod_only("MWMS is made once per process and starts its own server from the cluster; "
              "there is no launcher's rank and size for it to agree with")
def test_cluster_resolver_that_agrees_is_accepted():
    size, rank = hvd.size(), hvd.rank()
    if size == 1:
        resolver = simple_resolver({"worker": addresses(1)}, "worker", 0)
    else:  # chief first, then workers by index
        resolver = simple_resolver({"chief": addresses(1), "worker": addresses(size - 1)},
                                   "chief" if rank == 0 else "worker", max(rank - 1, 0))
    strategy = HorovodStrategy(cluster_resolver=resolver)
    assert strategy.cluster_resolver is resolver
    assert strategy.num_replicas_in_sync == size


@horovod_only("MWMS takes its rank and size from the cluster; there is no launcher to disagree")
def test_cluster_resolver_that_disagrees_names_both():
    size, rank = hvd.size(), hvd.rank()
    resolver = simple_resolver({"worker": addresses(size + 1)}, "worker", rank)
    with pytest.raises(ValueError, match=f"rank {rank} of {size + 1}.*rank {rank} of {size}"):
        HorovodStrategy(cluster_resolver=resolver)


@horovod_only("MWMS takes its rank and size from TF_CONFIG; there is no launcher to disagree")
def test_tf_config_that_disagrees_is_refused(monkeypatch):
    size, rank = hvd.size(), hvd.rank()
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": addresses(size + 2)}, "task": {"type": "worker", "index": rank}}))
    with pytest.raises(ValueError, match=f"TF_CONFIG says this process is rank {rank} of "
                                         f"{size + 2}"):
        HorovodStrategy()


@horovod_only("the error is HorovodStrategy's; MWMS is made once per process, so a second one "
              "with a ps cluster cannot be tried here")
def test_parameter_servers_are_refused():
    resolver = simple_resolver({"worker": addresses(hvd.size()), "ps": addresses(1)},
                               "worker", hvd.rank())
    with pytest.raises(ValueError, match="Parameter servers"):
        HorovodStrategy(cluster_resolver=resolver)


@horovod_only("MWMS runs one replica per local GPU; one device per process is our rule")
def test_more_than_one_device_per_process_is_refused(monkeypatch):
    resolver = simple_resolver({"worker": addresses(hvd.size())}, "worker", hvd.rank(),
                               num_accelerators={"GPU": 2})
    with pytest.raises(ValueError, match="one replica \\(one device\\) per process"):
        HorovodStrategy(cluster_resolver=resolver)

    fake_gpus = [tf.config.LogicalDevice(f"/device:GPU:{i}", "GPU") for i in range(2)]
    real = tf.config.list_logical_devices
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: fake_gpus if kind == "GPU" else real(kind))
    with pytest.raises(ValueError, match="sees 2 GPUs"):
        HorovodStrategy()


@horovod_only("error messages of HorovodStrategy's constructor")
def test_bad_arguments():
    with pytest.raises(ValueError, match="CommunicationOptions"):
        HorovodStrategy(communication_options="ring")
    with pytest.raises(ValueError, match="ClusterResolver"):
        HorovodStrategy(cluster_resolver={"worker": addresses(1)})


@horovod_only("MWMS lets Keras compile the train step with XLA (jit_compile stays True); "
              "turning it off with a warning is HorovodStrategy's, whose collectives have no XLA "
              "lowering")
def test_xla_is_turned_off_with_a_warning(strategy):
    with strategy.scope():
        model = build_model(initial_weights())
    with pytest.warns(UserWarning, match="cannot be compiled by XLA"):
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert model.jit_compile is False
    plain = build_model(initial_weights())
    plain.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert plain.jit_compile is True


@keras3_compiled_model_fails_under_mwms()
def test_checkpoint_saved_on_rank0_restored_on_all(strategy, tmp_path):
    x, y = global_data()
    directory = hvd.broadcast_object(str(tmp_path), root_rank=0)  # rank 0's folder, one host
    path = os.path.join(directory, "strategy-ckpt")

    def fresh_model():
        with strategy.scope():
            model = build_model(initial_weights(seed=21))
            model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse",
                          metrics=["mae"])
        return model

    trained = fresh_model()
    trained.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    # Reading mirrored variables needs no collective: rank 0 writes alone.
    if hvd.rank() == 0:
        tf.train.Checkpoint(model=trained, optimizer=trained.optimizer).write(path)
        trained.save(path + ".keras")
    hvd.barrier()

    restored = fresh_model()
    with strategy.scope():
        restored.optimizer.build(restored.trainable_variables)
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).read(path).expect_partial()
    np.testing.assert_array_equal(flat(restored.get_weights()), flat(trained.get_weights()))
    assert int(restored.optimizer.iterations.numpy()) == ROWS // GLOBAL_BATCH
    np.testing.assert_array_equal(flat(v.numpy() for v in restored.optimizer.variables),
                                  flat(v.numpy() for v in trained.optimizer.variables))
    with strategy.scope():
        loaded = keras.models.load_model(path + ".keras")
    np.testing.assert_array_equal(flat(loaded.get_weights()), flat(trained.get_weights()))
    # Training on from the restored state continues identically on every rank.
    restored.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    trained.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_array_equal(flat(restored.get_weights()), flat(trained.get_weights()))
    assert_identical_on_all_ranks(restored.get_weights())


@keras3_compiled_model_fails_under_mwms()
def test_model_checkpoint_callback_on_rank0(strategy, tmp_path):
    """Keras' ModelCheckpoint on rank 0 only (Horovod's rule; it reads mirrored weights, no
    collective), beside a callback on every rank: each epoch's file holds that epoch's weights."""
    x, y = global_data()
    directory = hvd.broadcast_object(str(tmp_path), root_rank=0)  # rank 0's folder, one host
    pattern = os.path.join(directory, "epoch{epoch:02d}.weights.h5")
    with strategy.scope():
        model = build_model(initial_weights())
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(flat(self.model.get_weights()))

    callbacks = [Record()]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(pattern, save_weights_only=True))
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=callbacks)
    hvd.barrier()
    assert sorted(os.listdir(directory)) == ["epoch01.weights.h5", "epoch02.weights.h5"]
    for epoch in (1, 2):
        loaded = build_model()
        loaded.load_weights(pattern.format(epoch=epoch))
        np.testing.assert_array_equal(flat(loaded.get_weights()), seen[epoch - 1])
    assert_identical_on_all_ranks(model.get_weights())


@keras3_compiled_model_fails_under_mwms()
def test_mixed_precision_fit_matches_single_process(strategy):
    x, y = global_data()

    def mixed_model():
        model = keras.Sequential([
            keras.Input((FEATURES,)),
            keras.layers.Dense(4, activation="tanh", dtype="mixed_float16"),
            keras.layers.Dense(2, dtype="mixed_float16"),
            keras.layers.Activation("linear", dtype="float32")])
        model.set_weights(initial_weights())
        # A small loss scale that never overflows: with the default (2**15) the number of
        # skipped steps depends on the per-replica loss magnitude, so it would differ from
        # the single-process run by design, not by error.
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.05), initial_scale=16.0), loss="mse")
        return model

    with strategy.scope():
        model = mixed_model()
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    assert model.layers[0].compute_dtype == "float16"
    assert_identical_on_all_ranks(model.get_weights())
    reference = mixed_model()
    reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(flat(model.get_weights()), flat(reference.get_weights()),
                               rtol=2e-2, atol=2e-3)


@keras3_compiled_model_fails_under_mwms()
def test_loss_scale_skips_a_step_on_every_rank_when_one_rank_overflows(strategy):
    x, y = global_data()
    # The last row of the first global batch belongs to the last rank: only its gradients
    # overflow float16 in step 1 (1e5 error x loss scale 16).
    y = y.copy()
    y[GLOBAL_BATCH - 1] = 1e5

    def mixed_model():
        model = keras.Sequential([
            keras.Input((FEATURES,)),
            keras.layers.Dense(4, activation="tanh", dtype="mixed_float16"),
            keras.layers.Dense(2, dtype="mixed_float16"),
            keras.layers.Activation("linear", dtype="float32")])
        model.set_weights(initial_weights())
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.05), initial_scale=16.0), loss="mse")
        return model

    with strategy.scope():
        model = mixed_model()
    model.fit(x[:GLOBAL_BATCH], y[:GLOBAL_BATCH], batch_size=GLOBAL_BATCH, epochs=1,
              shuffle=False, verbose=0)
    # Skipped everywhere: weights untouched, the loss scale halved, ranks identical.
    np.testing.assert_array_equal(flat(model.get_weights()), flat(initial_weights()))
    assert float(model.optimizer.dynamic_scale.numpy()) == 8.0
    assert_identical_on_all_ranks(model.get_weights())
    model.fit(x[GLOBAL_BATCH:], y[GLOBAL_BATCH:], batch_size=GLOBAL_BATCH, epochs=1,
              shuffle=False, verbose=0)
    assert_identical_on_all_ranks(model.get_weights())


# -- reading metrics and per-replica (SyncOnRead) variables outside strategy.run ------------------

def sync_on_read_variable(aggregation):
    return tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=aggregation)


def test_metric_and_per_replica_variable_read_on_every_rank_give_job_wide_values(strategy):
    size = hvd.size()
    with strategy.scope():
        metric = keras.metrics.Mean()
        total = sync_on_read_variable(tf.VariableAggregation.SUM)
        mean = sync_on_read_variable(tf.VariableAggregation.MEAN)
        first = sync_on_read_variable(tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def update():
        # Replica r (= rank r) adds r + 1 to each, and r + 1 and 10 (r + 1) to the metric.
        value = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1,
                        tf.float32)
        metric.update_state(tf.stack([value, 10.0 * value]))
        for v in (total, mean, first):
            v.assign_add(value)

    strategy.run(update)
    shares = np.arange(1, size + 1, dtype=np.float64)
    assert float(metric.result()) == pytest.approx(np.concatenate([shares, 10 * shares]).mean())
    assert float(total.read_value()) == pytest.approx(shares.sum())
    assert float(mean.read_value()) == pytest.approx(shares.mean())
    # ONLY_FIRST_REPLICA: the local value, read without a collective (under MWMS too).
    assert float(first.read_value()) == pytest.approx(hvd.rank() + 1)
    assert float(total.values[0].read_value()) == pytest.approx(hvd.rank() + 1)


def strategy_with_read_deadline(seconds):
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=seconds)
    return HorovodStrategy(communication_options=options)


def release_pending_read(error, variables):
    """The ranks that did not read make the read rank 0 left pending (named in its error), so
    every rank's runtime is clean again; returns the value they read."""
    name = None
    if hvd.rank() == 0:
        name = next(v.name for v in variables if f"'{v.name}'" in str(error))
    name = hvd.broadcast_object(name, root_rank=0)
    value = None
    if hvd.rank() != 0:
        value = float(next(v for v in variables if v.name == name).read_value())
    hvd.barrier()
    return name, value


@pytest.mark.parametrize("what", ["per_replica_variable", "metric"])
@mwms_differs("a read on one worker waits forever in MWMS's collective (checked at np=2: still "
              "waiting after 40 s; with CommunicationOptions(timeout_seconds=5) it raises "
              "DeadlineExceededError 'Collective has timed out during execution')", run=False)
def test_read_on_rank0_only_fails_clearly_instead_of_hanging(what):
    if hvd.size() == 1:
        pytest.skip("needs ranks that do not read")
    strategy = strategy_with_read_deadline(3)
    with strategy.scope():
        metric = keras.metrics.Mean()
        variable = sync_on_read_variable(tf.VariableAggregation.SUM)
    strategy.run(lambda: (metric.update_state(float(hvd.rank() + 1)),
                          variable.assign_add(float(hvd.rank() + 1))))
    hvd.barrier()
    error = None
    if hvd.rank() == 0:  # the others never make this read
        with pytest.raises(tf.errors.DeadlineExceededError,
                           match="every rank must make this read") as raised:
            metric.result() if what == "metric" else variable.read_value()
        error = raised.value
        assert f"sum over all {hvd.size()} ranks" in str(error)
        assert "waited 3 s" in str(error)
    hvd.barrier()
    variables = [v.value for v in metric.variables] if what == "metric" else [variable]
    name, value = release_pending_read(error, variables)
    if hvd.rank() != 0 and what == "per_replica_variable":
        assert value == pytest.approx(hvd.size() * (hvd.size() + 1) / 2)
    assert name  # rank 0's error named the variable it was reading


@horovod_only("the read deadline is HorovodStrategy's (MWMS waits forever unless "
              "timeout_seconds is set)")
def test_read_deadline_comes_from_options_else_the_stall_check_time(monkeypatch):
    from horovod_compat.tensorflow.distribute.sync_on_read import read_deadline
    options = tf.distribute.experimental.CommunicationOptions
    assert read_deadline(options(timeout_seconds=7)) == 7.0
    monkeypatch.delenv("HOROVOD_STALL_CHECK_TIME_SECONDS", raising=False)
    monkeypatch.delenv("HOROVOD_STALL_CHECK_DISABLE", raising=False)
    assert read_deadline(options()) == 60.0
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "25")
    assert read_deadline(options()) == 25.0
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "1")
    assert read_deadline(options()) is None
    assert read_deadline(options(timeout_seconds=7)) == 7.0
