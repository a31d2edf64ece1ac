"""One rank of a job that loses rank 1 mid-training (run by tests/python/test_peer_loss.py and
bench/peer_loss_times.py).

    python peer_loss_job.py MODE OUTDIR [KILL_SIGNAL]

MODE is `eager` (collectives called eagerly), `function` (inside a tf.function) or `fit`
(Keras `model.fit` with DistributedOptimizer; rank 0 keeps a ModelCheckpoint per epoch and writes
the weights it saved to OUTDIR/epoch-<n>.json). Rank 1 writes OUTDIR/killed (the wall-clock time)
and then sends itself KILL_SIGNAL (default SIGKILL) mid-training, after 2 epochs / steps. Every
other rank must catch HorovodInternalError: it writes OUTDIR/caught-<rank>.json (exception class,
message, time) and then idles -- the runtime has to end the process
(HOROVOD_PEER_LOSS_EXIT_SECONDS). Any other outcome is written there too, with a distinct exit code.
"""

import json
import os
import signal
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.keras as hk  # noqa: E402
import horovod_compat.tensorflow as hvd  # noqa: E402
from horovod_compat.common.exceptions import HorovodInternalError  # noqa: E402

MODE, OUT = sys.argv[1], sys.argv[2]
KILL_SIGNAL = getattr(signal, sys.argv[3]) if len(sys.argv) > 3 else signal.SIGKILL
VICTIM = 1
FEATURES = 4
ROWS_PER_RANK = 64
BATCH = 8
KILL_EPOCH, KILL_BATCH = 2, 3  # 0-based: two epochs complete first
KILL_STEP = 20                 # eager / function modes


def write_json(name, value):
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def die():
    """Rank 1's end: record when, then the signal (SIGSTOP leaves the process stopped)."""
    with open(os.path.join(OUT, "killed.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.replace(os.path.join(OUT, "killed.tmp"), os.path.join(OUT, "killed"))
    os.kill(os.getpid(), KILL_SIGNAL)
    time.sleep(3600)  # a stopped process resumed (SIGCONT) continues here: it must not recover


def expected_sum(step):
    return float(sum(step + r for r in range(hvd.size())))


def run_steps(step_fn):
    for step in range(10 ** 6):
        if hvd.rank() == VICTIM and step == KILL_STEP:
            die()
        got = float(step_fn(tf.constant(float(step + hvd.rank()))).numpy())
        assert got == expected_sum(step), (step, got)


def run_eager():
    run_steps(lambda x: hvd.allreduce(x, op=hvd.Sum, name="eager_step"))


def run_function():
    @tf.function
    def step_fn(x):
        return hvd.allreduce(x, op=hvd.Sum, name="function_step") * 1.0

    run_steps(step_fn)


def make_model():
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(1)])
    return model


class Victim(tf.keras.callbacks.Callback):
    """Rank 1 dies at a fixed batch of a fixed epoch."""

    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == KILL_EPOCH and batch == KILL_BATCH:
            die()


class RecordSaved(tf.keras.callbacks.Callback):
    """Rank 0: after ModelCheckpoint saved epoch n, the weights it saved (to check the file)."""

    def on_epoch_end(self, epoch, logs=None):
        write_json(f"epoch-{epoch + 1:02d}.json",
                   [w.tolist() for w in self.model.get_weights()])


def run_fit():
    rng = np.random.RandomState(1234 + hvd.rank())
    x = rng.randn(ROWS_PER_RANK, FEATURES).astype(np.float32)
    y = (x @ np.arange(1, FEATURES + 1, dtype=np.float32)).reshape(-1, 1)
    model = make_model()
    model.compile(optimizer=hk.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
    callbacks = [hk.callbacks.BroadcastGlobalVariablesCallback(0)]
    if hvd.rank() == 0:
        callbacks += [tf.keras.callbacks.ModelCheckpoint(
            os.path.join(OUT, "ckpt-{epoch:02d}.weights.h5"), save_weights_only=True),
            RecordSaved()]
    if hvd.rank() == VICTIM:
        callbacks.append(Victim())
    model.fit(x, y, batch_size=BATCH, epochs=1000, callbacks=callbacks, verbose=0)


def main():
    hvd.init()
    assert hvd.size() == 3, hvd.size()
    run = {"eager": run_eager, "function": run_function, "fit": run_fit}[MODE]
    try:
        run()
        outcome, code = {"class": None, "message": "training ended without an error"}, 6
    except HorovodInternalError as e:
        outcome = {"class": type(e).__name__, "message": str(e),
                   "unknown_error": isinstance(e, tf.errors.UnknownError)}
        code = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        payloads = getattr(e, "experimental_payloads", None) or {}
        outcome = {"class": type(e).__name__, "message": str(e),
                   "payloads": {str(k): str(v) for k, v in payloads.items()},
                   "traceback": traceback.format_exc()[-3000:]}
        code = 7
    outcome["time"] = time.time()
    write_json(f"caught-{hvd.rank()}.json", outcome)
    print("OUTCOME", json.dumps(outcome)[:2000], flush=True)
    if code is not None:
        sys.exit(code)
    time.sleep(120)  # the runtime ends this process (HOROVOD_PEER_LOSS_EXIT_SECONDS)
    sys.exit(8)


if __name__ == "__main__":
    main()
