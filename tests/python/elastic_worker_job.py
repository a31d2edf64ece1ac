"""One worker of an elastic job driven by test_elastic_job.py (the test plays the launcher).

    python elastic_worker_job.py MODE OUT_DIR TOTAL COMMIT_EVERY

MODE ``loop``: a ``tf.function`` step under ``hvd.elastic.run`` with a ``TensorFlowState``;
``keras``: Keras 3 ``fit`` with the elastic callbacks and a ``KerasState``; ``tf_keras``: the
same with tf_keras (the test sets TF_USE_LEGACY_KERAS=1).

Under the real launcher (test_elastic_e2e.py) ``HVDC_E2E_FAIL`` may hold JSON
``{"<host>:<local_rank>": {"at_step": k, "mode": "kill" | "raise"}}``: that worker SIGKILLs
itself, or raises, once its training reaches position k. Each commit also appends
"<position> <sum of the weights>" to ``OUT_DIR/<identity>.commits``.

Every step adds the average over the ranks of ``step + 1`` to the weights, so whatever the
number of workers the weights after steps 0..n-1 are exactly sum(1..n), and a step repeated
without a rollback, or skipped, shows. Progress (the committed step) goes to
``OUT_DIR/<identity>.progress``; the result (weights, step, resets) to
``OUT_DIR/<identity>.json`` when the training ends.
"""

import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.tensorflow as hvd  # noqa: E402

MODE, OUT_DIR = sys.argv[1], sys.argv[2]
TOTAL, COMMIT_EVERY = int(sys.argv[3]), int(sys.argv[4])
IDENTITY = f"{os.environ['HOROVOD_HOSTNAME']}_{os.environ['HOROVOD_LOCAL_RANK']}"
# Slow enough that the test's SIGKILL lands in the middle of the training.
STEP_SECONDS = 0.05

events = []

_FAIL = json.loads(os.environ.get("HVDC_E2E_FAIL") or "{}").get(IDENTITY.replace("_", ":"))


def _maybe_fail(position: int) -> None:
    if _FAIL is None or position != _FAIL["at_step"]:
        return
    if _FAIL["mode"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError(f"{IDENTITY}: planned failure at step {position}")


def _write_progress(step: int) -> None:
    path = os.path.join(OUT_DIR, IDENTITY + ".progress")
    with open(path + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(path + ".tmp", path)


class ProgressState:
    """Mixin: records each commit's position (after the snapshot) for the test to watch."""

    def position(self) -> int:
        raise NotImplementedError

    def weight_sum(self) -> float:
        raise NotImplementedError

    def commit(self):  # commits go through commit(): the Keras callback's too
        super().commit()
        _write_progress(self.position())
        with open(os.path.join(OUT_DIR, IDENTITY + ".commits"), "a") as f:
            f.write(f"{self.position()} {self.weight_sum()!r}\n")


def _on_reset():
    events.append({"reset_to_size": hvd.size(), "rank": hvd.rank()})


def run_loop():
    weights = tf.Variable(tf.zeros([4]), name="weights")

    class State(ProgressState, hvd.elastic.TensorFlowState):
        def position(self):
            return self.step

        def weight_sum(self):
            return float(weights.numpy().sum())

    state = State([weights], step=0)
    state.register_reset_callbacks([_on_reset])

    @tf.function
    def train_step(step):
        update = hvd.allreduce(tf.fill([4], tf.cast(step + 1, tf.float32)), op=hvd.Average,
                               name="update")
        weights.assign_add(update)

    @hvd.elastic.run
    def train(state):
        events.append({"start_at": state.step, "size": hvd.size(), "rank": hvd.rank()})
        while state.step < TOTAL:
            train_step(tf.constant(state.step))
            state.step += 1
            _maybe_fail(state.step)
            time.sleep(STEP_SECONDS)
            if state.step % COMMIT_EVERY == 0:
                state.commit()

    train(state)
    return weights.numpy(), state.step


def run_keras():
    if MODE == "tf_keras":  # TF_USE_LEGACY_KERAS=1 was set before TensorFlow's import
        keras = tf.keras
        assert "tf_keras" in keras.__name__, keras.__name__
    else:
        import keras

    import horovod_compat.tensorflow.keras as hvdk

    class Counter(keras.layers.Layer):
        """y = x @ kernel; also counts the training batches it ran (a model variable, so the
        state rolls it back with the weights)."""

        def build(self, input_shape):
            self.kernel = self.add_weight(shape=(input_shape[-1], 1), initializer="zeros")
            self.count = self.add_weight(shape=(), initializer="zeros", trainable=False)

        def call(self, x, training=False):
            if training:
                self.count.assign_add(1.0)
            return tf.matmul(x, self.kernel)

    model = keras.Sequential([keras.Input((4,)), Counter()])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")

    steps_per_epoch, epochs = COMMIT_EVERY * 3, max(1, TOTAL // (COMMIT_EVERY * 3))

    class State(ProgressState, hvdk.elastic.KerasState):
        def position(self):
            return self.epoch * steps_per_epoch + self.batch

        def weight_sum(self):
            return float(sum(np.sum(w) for w in model.get_weights()))
    state = State(model, epoch=0, batch=0)
    state.register_reset_callbacks([_on_reset])
    # The same data on every rank: the averaged gradient is the one-process gradient.
    x = np.linspace(-1.0, 1.0, steps_per_epoch * 2 * 4, dtype=np.float32).reshape(-1, 4)
    y = x.sum(axis=1, keepdims=True) * 0.5

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            _maybe_fail(state.position())
            time.sleep(STEP_SECONDS)

    @hvdk.elastic.run
    def train(state):
        events.append({"start_at": [state.epoch, state.batch], "size": hvd.size(),
                       "rank": hvd.rank()})
        while state.epoch < epochs:
            done = state.batch
            model.fit(x[done * 2:], y[done * 2:], batch_size=2, shuffle=False, verbose=0,
                      epochs=state.epoch + 1, initial_epoch=state.epoch,
                      callbacks=[hvdk.elastic.CommitStateCallback(state, COMMIT_EVERY),
                                 hvdk.elastic.UpdateBatchStateCallback(state),
                                 hvdk.elastic.UpdateEpochStateCallback(state), Slow()])

    train(state)
    layer = model.layers[0]
    return np.concatenate([layer.kernel.numpy().ravel(), [layer.count.numpy()]]), \
        epochs * steps_per_epoch


def main():
    hvd.init()
    events.append({"first_round_size": hvd.size(), "rank": hvd.rank()})
    values, step = run_loop() if MODE == "loop" else run_keras()
    with open(os.path.join(OUT_DIR, IDENTITY + ".json"), "w") as f:
        json.dump({"weights": [float(v) for v in values], "step": int(step),
                   "rank": hvd.rank(), "size": hvd.size(), "events": events}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
