#!/usr/bin/env python3
"""B5: a communication-heavy Keras model through horovod_compat vs MultiWorkerMirroredStrategy.

A wide MLP (input 1024 synthetic features, Dense 2048-wide hidden layers, 10 classes; ~23-27 M
parameters), small per-rank batch, synthetic data from a fixed seed, plain SGD, trained with
``model.fit`` for ``--warmup`` + ``--steps`` steps. Each train batch is timed with
``time.perf_counter`` in a callback (on_train_batch_begin -> on_train_batch_end, after reading the
loss so the step has really finished). All modes use the same global batch (per-rank batch x 2),
the same seed, the same optimizer, and 1 intra-op / 1 inter-op thread per process.

  --mode hvd   run under mpirun/horovodrun -np 2: horovod_compat.tensorflow.keras
               DistributedOptimizer(SGD) + BroadcastGlobalVariablesCallback(0). Checks at the end
               that the weights are identical on every rank (allgather of a checksum) while each
               rank trained on different data (so the gradients really were averaged).
  --mode strategy
               run under mpirun/horovodrun -np 2: horovod_compat.tensorflow.distribute.
               HorovodStrategy; build + compile in strategy.scope(), model.fit on
               strategy.distribute_datasets_from_function (each rank builds only its shard: the
               same rows as hvd mode, per-replica batch from the InputContext) or, with
               --strategy-input global, on the global batches distributed by Keras through
               strategy.experimental_distribute_dataset (TF's DATA auto-sharding, as for MWMS).
               The same weight check as hvd mode.
  --mode mwms  spawns 2 worker processes on 127.0.0.1 (two free ports) with TF_CONFIG and runs
               tf.distribute.MultiWorkerMirroredStrategy (RING collectives over gRPC).

Result: one JSON object on the last stdout line of rank 0 / of the parent (prefixed "B5RESULT "),
and in --json if given.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", choices=["hvd", "strategy", "mwms", "mwms-worker"], required=True)
    p.add_argument("--strategy-input", choices=["function", "global"], default="function",
                   help="strategy mode: distribute_datasets_from_function over each rank's shard\n"
                        "(default) or the global batches auto-sharded by the strategy")
    p.add_argument("--model", choices=["mlp", "resnet50"], default="mlp",
                   help="mlp (the wide MLP, default) or resnet50 (keras.applications.ResNet50,\n"
                        "weights=None, --image-size square RGB inputs, --classes outputs)")
    p.add_argument("--image-size", type=int, default=64, help="resnet50: height = width")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch (global = batch x 2)")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=6, help="number of hidden Dense layers")
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--hvd-num-groups", type=int, default=0,
                   help="hvd: DistributedOptimizer(num_groups=N); 0 (default) = one allreduce per\n"
                        "gradient, 1 = all gradients in one grouped allreduce (as the strategy does)")
    p.add_argument("--workers", type=int, default=2, help="mwms: number of worker processes")
    p.add_argument("--implementation", choices=["ring", "auto"], default="ring")
    p.add_argument("--worker-timeout", type=float, default=300.0)
    p.add_argument("--json", default="", help="write the result object here")
    # internal (mwms-worker)
    p.add_argument("--task-index", type=int, default=0)
    p.add_argument("--ports", default="")
    p.add_argument("--worker-out", default="")
    return p.parse_args(argv)


def pct(values, q):
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(times_s):
    return {"median_ms": statistics.median(times_s) * 1e3, "p90_ms": pct(times_s, 0.9) * 1e3,
            "mean_ms": statistics.fmean(times_s) * 1e3, "min_ms": min(times_s) * 1e3,
            "max_ms": max(times_s) * 1e3, "n": len(times_s)}


def setup_tf(seed):
    """Import TF with 1/1 threads; must run before any op executes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    keras.utils.set_random_seed(seed)
    keras.config.disable_traceback_filtering()
    return tf, keras


def make_data(args, n_global_batches):
    """Deterministic synthetic data: global batch i = rows [i*G, (i+1)*G), G = batch x workers."""
    import numpy as np
    rng = np.random.default_rng(args.seed)
    g = args.batch * args.workers
    n = n_global_batches * g
    if args.model == "resnet50":
        x = rng.standard_normal((n, args.image_size, args.image_size, 3), dtype=np.float32)
        y = rng.integers(0, args.classes, size=n).astype(np.int32)
        return x, y
    x = rng.standard_normal((n, args.features), dtype=np.float32)
    teacher = rng.standard_normal((args.features, args.classes), dtype=np.float32)
    y = np.argmax(x @ teacher, axis=1).astype(np.int32)
    return x, y


def build_model(keras, args):
    if args.model == "resnet50":
        return keras.applications.ResNet50(
            weights=None, input_shape=(args.image_size, args.image_size, 3), classes=args.classes,
            classifier_activation=None)
    layers = [keras.Input(shape=(args.features,))]
    for _ in range(args.hidden):
        layers.append(keras.layers.Dense(args.width, activation="relu"))
    layers.append(keras.layers.Dense(args.classes))
    return keras.Sequential(layers)


def make_timer(keras):
    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []
            self.losses = []
            self._t0 = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            loss = float(logs["loss"]) if logs and "loss" in logs else float("nan")  # syncs
            self.times.append(time.perf_counter() - self._t0)
            self.losses.append(loss)
    return StepTimer()


def model_info(args, model):
    trainable = int(sum(int(w.numpy().size) for w in model.trainable_weights))
    info = {"model": args.model, "params": int(model.count_params()),
            "trainable_params": trainable, "grad_bytes": trainable * 4}
    if args.model == "resnet50":
        info["image_size"] = args.image_size
    return info


def weight_checksum(model):
    """(sum, sum |w|) in fp64 over the trainable weights (the MLP has no others; ResNet-50's
    BatchNorm moving statistics are per rank under DistributedOptimizer, as in Horovod)."""
    import numpy as np
    s, a = 0.0, 0.0
    for w in model.trainable_weights:
        w64 = np.asarray(w.numpy(), dtype=np.float64)
        s += float(w64.sum())
        a += float(np.abs(w64).sum())
    return s, a


def compile_model(model, keras, optimizer):
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)


# ----------------------------------------------------------------------------------------- hvd
def run_hvd(args):
    tf, keras = setup_tf(args.seed)
    import horovod_compat.tensorflow.keras as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    args.workers = size
    total = args.warmup + args.steps
    x, y = make_data(args, total)
    # rank r takes rows [i*G + r*b, i*G + (r+1)*b) of global batch i: same global batches as MWMS
    idx = shard_rows(args, rank, total)
    ds = tf.data.Dataset.from_tensor_slices((x[idx], y[idx])).batch(args.batch).repeat()

    model = build_model(keras, args)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=args.lr),
                                   num_groups=args.hvd_num_groups)
    compile_model(model, keras, opt)
    timer = make_timer(keras)
    t0 = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=total, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), timer])
    fit_s = time.perf_counter() - t0

    result = mpi_result(args, "hvd", hvd, tf, model, timer, fit_s,
                        {"hvd_num_groups": args.hvd_num_groups})
    hvd.shutdown()
    if not result["weights_identical_across_ranks"]:
        sys.exit(3)


def shard_rows(args, rank, total):
    """Row indices of rank ``rank``'s share: rows [i*G + r*b, i*G + (r+1)*b) of global batch i."""
    import numpy as np
    g = args.batch * args.workers
    return np.concatenate([np.arange(i * g + rank * args.batch, i * g + (rank + 1) * args.batch)
                           for i in range(total)])


def mpi_result(args, mode, hvd, tf, model, timer, fit_s, extra=None):
    """Checks the weights across ranks, gathers the step times; rank 0 prints/writes the result.

    Every rank must call this (two allgathers). Returns the result (on every rank; the per-rank
    checksums are the same everywhere)."""
    import numpy as np
    rank, size = hvd.rank(), hvd.size()
    # correctness: identical weights on all ranks although each rank saw different rows
    s, a = weight_checksum(model)
    gathered = hvd.allgather(tf.constant([[s, a]], dtype=tf.float64)).numpy()
    same = bool(np.all(gathered == gathered[0]))
    # per-step max over ranks as well (BENCHMARKS.md convention)
    meas = np.array(timer.times[args.warmup:], dtype=np.float64)
    all_t = hvd.allgather(tf.constant(meas[None, :])).numpy()
    g = args.batch * size
    result = {
        "mode": mode, "np": size, "per_rank_batch": args.batch, "global_batch": g,
        **model_info(args, model),
        "warmup": args.warmup, "steps": args.steps,
        "rank0": summarize(list(meas)), "max_over_ranks": summarize(list(all_t.max(axis=0))),
        "warmup_ms": [t * 1e3 for t in timer.times[:args.warmup]],
        "final_loss": timer.losses[-1], "first_loss": timer.losses[0],
        "weight_checksum": gathered[0].tolist(),
        "weights_identical_across_ranks": same,
        "checksums_per_rank": gathered.tolist(), "fit_s": fit_s,
    }
    result.update(extra or {})
    if rank == 0:
        finish(args, result)
    return result


# ------------------------------------------------------------------------------------ strategy
def run_strategy(args):
    tf, keras = setup_tf(args.seed)
    import horovod_compat.tensorflow as hvd
    strategy = hvd.distribute.HorovodStrategy()  # calls hvd.init()
    size = hvd.size()
    assert strategy.num_replicas_in_sync == size, (strategy.num_replicas_in_sync, size)
    args.workers = size
    total = args.warmup + args.steps
    x, y = make_data(args, total)
    g = args.batch * size
    if args.strategy_input == "function":
        def dataset_fn(ctx):
            # this input pipeline's (= rank's) rows only, the same as hvd mode's
            per_replica = ctx.get_per_replica_batch_size(g)
            assert per_replica == args.batch and ctx.num_input_pipelines == size, \
                (per_replica, ctx.num_input_pipelines)
            idx = shard_rows(args, ctx.input_pipeline_id, total)
            return tf.data.Dataset.from_tensor_slices((x[idx], y[idx])).batch(per_replica).repeat()
        ds = strategy.distribute_datasets_from_function(dataset_fn)
    else:
        # global batches; fit() hands them to strategy.experimental_distribute_dataset, whose
        # DATA auto-sharding gives rank r half r of each (the same rows as hvd mode)
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(g).repeat().with_options(opts)
    with strategy.scope():
        model = build_model(keras, args)
        compile_model(model, keras, keras.optimizers.SGD(learning_rate=args.lr))
    timer = make_timer(keras)
    t0 = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[timer])
    fit_s = time.perf_counter() - t0
    result = mpi_result(args, "strategy", hvd, tf, model, timer, fit_s,
                        {"strategy_input": args.strategy_input})
    hvd.shutdown()
    if not result["weights_identical_across_ranks"]:
        sys.exit(3)


# ---------------------------------------------------------------------------------------- mwms
def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_mwms_parent(args):
    ports = free_ports(args.workers)
    tmpdir = tempfile.mkdtemp(prefix="b5_mwms_")
    procs, outs = [], []
    for i in range(args.workers):
        out = os.path.join(tmpdir, f"worker{i}.json")
        outs.append(out)
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", "mwms-worker",
               "--task-index", str(i), "--ports", ",".join(map(str, ports)), "--worker-out", out,
               "--batch", str(args.batch), "--width", str(args.width), "--hidden", str(args.hidden),
               "--features", str(args.features), "--classes", str(args.classes),
               "--model", args.model, "--image-size", str(args.image_size),
               "--warmup", str(args.warmup), "--steps", str(args.steps), "--lr", str(args.lr),
               "--seed", str(args.seed), "--workers", str(args.workers),
               "--implementation", args.implementation]
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.monotonic() + args.worker_timeout
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            print(f"b5 mwms: workers timed out after {args.worker_timeout}s", file=sys.stderr)
            sys.exit(124)
    if any(rcs):
        print(f"b5 mwms: worker exit codes {rcs}", file=sys.stderr)
        sys.exit(2)
    import numpy as np
    per = [json.load(open(o)) for o in outs]
    t = np.array([w["times"] for w in per], dtype=np.float64)
    meas = t[:, args.warmup:]
    w0 = per[0]
    result = {
        "mode": "mwms", "np": args.workers, "per_rank_batch": args.batch,
        "global_batch": args.batch * args.workers, **w0["info"],
        "warmup": args.warmup, "steps": args.steps,
        "implementation": args.implementation, "ports": ports,
        "rank0": summarize(list(meas[0])), "max_over_ranks": summarize(list(meas.max(axis=0))),
        "warmup_ms": [x * 1e3 for x in t[0, :args.warmup]],
        "final_loss": w0["losses"][-1], "first_loss": w0["losses"][0],
        "weight_checksum": w0["checksum"],
        "weights_identical_across_ranks": all(w["checksum"] == w0["checksum"] for w in per),
        "fit_s": w0["fit_s"],
    }
    finish(args, result)


def patch_keras_mwms_reduce(tf):
    """Keras 3.15 reduces each step's logs under a multi-worker strategy with
    strategy.reduce("MEAN", v, axis=0), which fails for the scalar loss ("Invalid reduction
    dimension 0 for input with 0 dimensions"). Reduce with axis=None (a mean over replicas) instead:
    the same one small cross-worker collective per logged value, just shape-correct."""
    import keras.src.backend.tensorflow.trainer as kt
    from keras.src import tree
    orig = kt.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and kt._collective_all_reduce_multi_worker(strategy):
            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return orig(values, strategy, reduction)
    kt.reduce_per_replica = reduce_per_replica


def run_mwms_worker(args):
    ports = [int(p) for p in args.ports.split(",")]
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": args.task_index}})
    tf, keras = setup_tf(args.seed)
    impl = {"ring": tf.distribute.experimental.CommunicationImplementation.RING,
            "auto": tf.distribute.experimental.CommunicationImplementation.AUTO}[args.implementation]
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=impl))
    assert strategy.num_replicas_in_sync == args.workers, strategy.num_replicas_in_sync
    total = args.warmup + args.steps
    x, y = make_data(args, total)
    g = args.batch * args.workers
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    # global batches, rebatched/sharded by the strategy into per-worker batches of args.batch
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(g).repeat().with_options(opts)
    patch_keras_mwms_reduce(tf)
    with strategy.scope():
        model = build_model(keras, args)
        compile_model(model, keras, keras.optimizers.SGD(learning_rate=args.lr))
        # Keras 3.15's fit() under MultiWorkerMirroredStrategy first pulls one distributed batch and
        # strategy.reduce()s it eagerly to build the model symbolically; with MWMS that eager reduce
        # of a PerReplica value raises. Build from a local batch's shapes instead (no effect on the
        # timed steps) and skip that pre-build.
        model._symbolic_build(data_batch=(x[:args.batch], y[:args.batch]))
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    timer = make_timer(keras)
    t0 = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[timer])
    fit_s = time.perf_counter() - t0
    s, a = weight_checksum(model)
    with open(args.worker_out, "w") as f:
        json.dump({"times": timer.times, "losses": timer.losses, "checksum": [s, a],
                   "info": model_info(args, model), "fit_s": fit_s}, f)


def finish(args, result):
    line = json.dumps(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    r = result
    print(f"b5 {r['mode']}: {r['model']} np={r['np']} params={r['params']/1e6:.1f}M global_batch="
          f"{r['global_batch']} step median {r['rank0']['median_ms']:.1f} ms p90 "
          f"{r['rank0']['p90_ms']:.1f} ms (max over ranks: median "
          f"{r['max_over_ranks']['median_ms']:.1f} p90 {r['max_over_ranks']['p90_ms']:.1f}); "
          f"loss {r['first_loss']:.4f} -> {r['final_loss']:.4f}; weights identical across ranks: "
          f"{r['weights_identical_across_ranks']}", flush=True)
    print("B5RESULT " + line, flush=True)


def main():
    args = parse_args()
    if args.mode == "hvd":
        run_hvd(args)
    elif args.mode == "strategy":
        run_strategy(args)
    elif args.mode == "mwms":
        run_mwms_parent(args)
    else:
        run_mwms_worker(args)


if __name__ == "__main__":
    main()
