"""Front-end extras without other coverage: local gradient aggregation in the TF1 optimizer,
object broadcast/allgather helpers, the Python timeline API, PartialDistributedGradientTape and
sparse gradients through the TF1 DistributedOptimizer. Expected values are computed here from
the data every rank can rebuild for every other rank."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LR = 0.5


# -- 1. backward_passes_per_step in TF1 graph mode ---------------------------------------------

def _pass_data(rank, step):
    """Per-rank, per-pass input of the aggregation test."""
    return (np.array([1.0, -2.0, 3.0], np.float32) * (rank + 1) + step * 0.25).astype(np.float32)


@pytest.mark.parametrize("average_aggregated,use_minimize",
                         [(False, True), (True, True), (False, False)],
                         ids=["sum", "average", "sum-apply-zip"])
def test_legacy_optimizer_backward_passes_per_step(average_aggregated, use_minimize):
    w0 = np.array([0.5, 1.5, -1.0], np.float32)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=w0)
        x = tf.compat.v1.placeholder(tf.float32, [3])
        loss = 0.5 * tf.reduce_sum(x * w * w)          # d loss / d w = x * w
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR),
                                       backward_passes_per_step=2,
                                       average_aggregated_gradients=average_aggregated)
        if use_minimize:
            train_op = opt.minimize(loss)
        else:  # compute_gradients, then apply_gradients with a one-shot zip iterator
            grads, variables = zip(*opt.compute_gradients(loss, var_list=[w]))
            train_op = opt.apply_gradients(zip(grads, variables))
        with tf.compat.v1.Session() as session:
            session.run([tf.compat.v1.global_variables_initializer(),
                         tf.compat.v1.local_variables_initializer()])
            session.run(train_op, feed_dict={x: _pass_data(hvd.rank(), 0)})
            after_one = session.run(w)
            session.run(train_op, feed_dict={x: _pass_data(hvd.rank(), 1)})
            after_two = session.run(w)

    # Not applied on the first pass.
    np.testing.assert_array_equal(after_one, w0)
    # Second pass: sum over passes, averaged over ranks (allreduce Average), / passes if asked.
    total = sum(_pass_data(r, s) * w0 for r in range(hvd.size()) for s in range(2))
    grad = total / hvd.size()
    if average_aggregated:
        grad = grad / 2
    np.testing.assert_allclose(after_two, w0 - LR * grad, rtol=1e-5, atol=1e-6)


# -- 2. object helpers --------------------------------------------------------------------------

def _rank_object(rank, tag=0):
    return {"rank": rank, "tag": tag, "name": "r" * (rank + 1),
            "weights": np.arange((rank + 1) * 5, dtype=np.float64).reshape(rank + 1, 5) * 0.5,
            "nested": {"ids": np.array([rank, tag], np.int64), "tuple": (rank, [tag] * rank)}}


def _assert_same_object(got, expected):
    assert sorted(got) == sorted(expected)
    assert got["rank"] == expected["rank"] and got["tag"] == expected["tag"]
    assert got["name"] == expected["name"]
    np.testing.assert_array_equal(got["weights"], expected["weights"])
    assert got["weights"].dtype == expected["weights"].dtype
    np.testing.assert_array_equal(got["nested"]["ids"], expected["nested"]["ids"])
    assert got["nested"]["tuple"] == expected["nested"]["tuple"]


def test_broadcast_object_fn_graph():
    with tf.Graph().as_default():
        with tf.compat.v1.Session() as session:
            # Explicit session; the function is reusable for several objects.
            bcast = hvd.broadcast_object_fn(root_rank=0, session=session)
            for tag in (1, 2):
                _assert_same_object(bcast(_rank_object(hvd.rank(), tag)), _rank_object(0, tag))
            # Default session, another root and name.
            root = hvd.size() - 1
            with session.as_default():
                bcast_last = hvd.broadcast_object_fn(root_rank=root, name="bcast_last")
            _assert_same_object(bcast_last(_rank_object(hvd.rank(), 7)), _rank_object(root, 7))


def test_broadcast_object_eager_and_graph():
    for root in range(hvd.size()):
        got = hvd.broadcast_object(_rank_object(hvd.rank(), 3), root_rank=root)
        _assert_same_object(got, _rank_object(root, 3))
    with tf.Graph().as_default():
        with tf.compat.v1.Session() as session:
            got = hvd.broadcast_object(_rank_object(hvd.rank(), 4), root_rank=0, session=session,
                                       name="graph_bcast_object")
    _assert_same_object(got, _rank_object(0, 4))


def test_allgather_object_uneven_sizes():
    everyone = hvd.allgather_object(_rank_object(hvd.rank(), 5))
    assert len(everyone) == hvd.size()
    for r, got in enumerate(everyone):
        _assert_same_object(got, _rank_object(r, 5))
    with tf.Graph().as_default():
        with tf.compat.v1.Session() as session:
            everyone = hvd.allgather_object(_rank_object(hvd.rank(), 6), session=session,
                                            name="graph_allgather_object")
    for r, got in enumerate(everyone):
        _assert_same_object(got, _rank_object(r, 6))


# -- 3. timeline --------------------------------------------------------------------------------

def test_start_timeline_needs_env_var(tmp_path):
    """The test processes are initialized without HOROVOD_TIMELINE: start_timeline raises the
    documented ValueError, and stop_timeline is a no-op."""
    if os.environ.get("HOROVOD_TIMELINE"):
        pytest.skip("HOROVOD_TIMELINE set for this run; covered by the nested job")
    path = tmp_path / "timeline.json"
    with pytest.raises(ValueError, match="HOROVOD_TIMELINE"):
        hvd.start_timeline(str(path), mark_cycles=True)
    hvd.stop_timeline()
    assert not path.exists()


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_", "HOROVOD_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


_TIMELINE_JOB = """
    import json, os, sys
    import tensorflow as tf
    import horovod_compat.tensorflow as hvd
    hvd.init()
    out = sys.argv[1]
    path = os.path.join(out, "timeline_rank%d.json" % hvd.rank())
    hvd.start_timeline(path, mark_cycles=True)
    # Inside tf.function the explicit names become the node names, i.e. the tensor names the
    # timeline shows (eager ops all carry the op type name "HorovodAllreduce").
    @tf.function
    def step(suffix):
        out = [hvd.allreduce(tf.constant([1.0, 2.0]), name="tl_allreduce_%d%s" % (i, suffix))
               for i in range(3)]
        return out + [hvd.allgather(tf.constant([[1.0]]), name="tl_allgather" + suffix)]
    for _ in range(2):
        step("")
    hvd.stop_timeline()
    step("_after_stop")  # after stop: nothing more is recorded
    print("TIMELINE_DONE rank=%d size=%d" % (hvd.rank(), hvd.size()), flush=True)
    hvd.shutdown()
"""


@pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ,
                    reason="nested np=2 job runs only from the test process started without mpirun")
def test_timeline_dynamic_np2(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_TIMELINE_JOB))
    out = tmp_path / "out"
    out.mkdir()
    env = _clean_env()
    env["HOROVOD_TIMELINE"] = "DYNAMIC"
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
           "--mpi-args=--timeout 200", sys.executable, str(script), str(out)]
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stdout
    assert sorted(re.findall(r"TIMELINE_DONE rank=\d size=\d", result.stdout)) == [
        "TIMELINE_DONE rank=0 size=2", "TIMELINE_DONE rank=1 size=2"], result.stdout

    # Only the coordinator writes.
    assert sorted(os.listdir(out)) == ["timeline_rank0.json"]
    text = (out / "timeline_rank0.json").read_text()
    try:
        events = json.loads(text)
    except ValueError:  # Chrome accepts an unterminated array; be as lenient
        events = json.loads(text.rstrip().rstrip(",") + "]")
    if isinstance(events, dict):
        events = events["traceEvents"]
    assert isinstance(events, list) and events
    assert all(isinstance(e, dict) and "ph" in e for e in events)
    # One Chrome-trace "process" per tensor, named by the tensor name.
    tensors = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert tensors == {"tl_allreduce_0", "tl_allreduce_1", "tl_allreduce_2", "tl_allgather"}
    activities = {e.get("name") for e in events if e["ph"] == "B"}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "ALLGATHER"} <= activities, activities
    assert any(e.get("name") == "CYCLE_START" for e in events)  # mark_cycles=True


# -- 4. PartialDistributedGradientTape ----------------------------------------------------------

def _layer_inputs(rank):
    x = (np.arange(8, dtype=np.float32).reshape(2, 4) - 3.0) * (0.5 + rank)
    y = np.array([[1.0], [-1.0]], np.float32) * (rank + 2)
    return x, y


@pytest.mark.parametrize("scale_local", [True, False], ids=["scaled", "unscaled"])
def test_partial_distributed_gradient_tape(scale_local):
    import keras
    rng = np.random.RandomState(7)
    hidden = keras.layers.Dense(3, activation="tanh")
    head = keras.layers.Dense(1)
    model = keras.Sequential([keras.Input((4,)), hidden, head])
    init = [rng.randn(*v.shape).astype(np.float32) for v in model.trainable_variables]
    for v, value in zip(model.trainable_variables, init):
        v.assign(value)

    def local_grads(rank):
        x, y = _layer_inputs(rank)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        return loss, tape

    loss, tape = local_grads(hvd.rank())
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[hidden],
                                              scale_local_gradients=scale_local)
    grads = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]

    per_rank = []
    for r in range(hvd.size()):
        loss_r, tape_r = local_grads(r)
        per_rank.append([g.numpy() for g in tape_r.gradient(loss_r, model.trainable_variables)])
    local_ids = {id(v) for v in hidden.trainable_weights}
    assert len(local_ids) == 2
    for i, v in enumerate(model.trainable_variables):
        if id(v) in local_ids:
            expected = per_rank[hvd.rank()][i]
            if scale_local:
                expected = expected / hvd.size()
        else:
            expected = np.mean([g[i] for g in per_rank], axis=0)
        np.testing.assert_allclose(grads[i], expected, rtol=1e-5, atol=1e-6, err_msg=v.name)


def test_partial_tape_rejects_non_layer():
    with tf.GradientTape() as tape:
        pass
    with pytest.raises(ValueError):
        hvd.PartialDistributedGradientTape(tape, local_layers=[tf.Variable(1.0)])


# -- 5. sparse gradients ------------------------------------------------------------------------

VOCAB, DIM = 7, 3


def _lookup_data(rank):
    ids = np.array([rank % VOCAB, (rank + 2) % VOCAB, rank % VOCAB, 5], np.int64)
    coef = (np.arange(len(ids) * DIM, dtype=np.float32).reshape(len(ids), DIM) - 4.0) * (rank + 1)
    return ids, coef


def _dense_embedding_grad(rank):
    ids, coef = _lookup_data(rank)
    grad = np.zeros((VOCAB, DIM), np.float32)
    np.add.at(grad, ids, coef)
    return grad


@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["allgather", "dense"])
def test_legacy_optimizer_sparse_gradients(sparse_as_dense):
    emb0 = (np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) * 0.1)
    ids, coef = _lookup_data(hvd.rank())
    with tf.Graph().as_default():
        emb = tf.compat.v1.get_variable("embedding", initializer=emb0)
        rows = tf.nn.embedding_lookup(emb, tf.constant(ids))
        loss = tf.reduce_sum(rows * tf.constant(coef))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR),
                                       sparse_as_dense=sparse_as_dense)
        grads_and_vars = opt.compute_gradients(loss, var_list=[emb])
        (grad, _), = grads_and_vars
        assert isinstance(grad, tf.IndexedSlices) != sparse_as_dense
        train_op = opt.apply_gradients(grads_and_vars)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op)
            updated = session.run(emb)
    expected_grad = np.mean([_dense_embedding_grad(r) for r in range(hvd.size())], axis=0)
    np.testing.assert_allclose(updated, emb0 - LR * expected_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_eager_allreduce_indexed_slices(op):
    ids, coef = _lookup_data(hvd.rank())
    sparse = tf.IndexedSlices(tf.constant(coef), tf.constant(ids),
                              dense_shape=tf.constant([VOCAB, DIM], tf.int64))
    out = hvd.allreduce(sparse, op=getattr(hvd, op), name=f"eager_sparse_{op}")
    assert isinstance(out, tf.IndexedSlices)
    dense = tf.convert_to_tensor(out).numpy()
    expected = np.sum([_dense_embedding_grad(r) for r in range(hvd.size())], axis=0)
    if op == "Average":
        expected = expected / hvd.size()
    np.testing.assert_allclose(dense, expected, rtol=1e-5, atol=1e-5)
    assert out.indices.numpy().tolist() == [int(i) for r in range(hvd.size())
                                            for i in _lookup_data(r)[0]]
