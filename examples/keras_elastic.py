"""Elastic Fashion-MNIST with Keras 3 model.fit on horovod_compat: workers may come and go.

    horovodrun -np 4 --min-np 2 --max-np 8 --host-discovery-script ./discover_hosts.sh \\
        python examples/keras_elastic.py
    horovodrun -np 2 --min-np 1 -H hostA:1,hostB:1 python examples/keras_elastic.py
    horovodrun -np 2 python examples/keras_elastic.py [--short]   (a fixed job works too)

(docs/elastic.md has a discovery script and what happens on a reset.) Reads the IDX
files from Debian's /usr/share/datasets/fashion-mnist (or --data-dir).

Every epoch walks one permutation of the training set (the same on every worker) in global
batches of batch-size x workers; each worker trains on its slice of every global batch. The
state remembers how many examples of the epoch are done, so after a reset -- with another
number of workers -- the epoch goes on where the last commit left it, with no example repeated
beyond the uncommitted batches and none skipped.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import horovod_compat.tensorflow.keras as hvd  # noqa: E402
from fashion_mnist_data import DEFAULT_DATA_DIR, load  # noqa: E402  (examples/ is on sys.path)


def build_model():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


class ExamplesDoneCallback(keras.callbacks.Callback):
    """Counts the examples of the epoch that all workers together finished."""

    def __init__(self, state, global_batch):
        super().__init__()
        self.state = state
        self.global_batch = global_batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.examples_done += self.global_batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.examples_done = 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--lr", type=float, default=0.001, help="single-worker learning rate")
    parser.add_argument("--batches-per-commit", type=int, default=20,
                        help="commit the state every N batches (a commit copies the model "
                             "to host memory)")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--short", action="store_true",
                        help="quick run: one epoch on the first 8000 training images")
    args = parser.parse_args()
    if args.short:
        args.epochs = 1

    # In an elastic job init() asks the launcher for this worker's rank in the current round.
    hvd.init()
    keras.utils.set_random_seed(1234)

    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "test")
    if args.short:
        x_train, y_train = x_train[:8000], y_train[:8000]

    model = build_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(learning_rate=args.lr))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    # Optimizer slots exist before the first step, so a worker that joins later has the same
    # variables to receive in the state's sync.
    optimizer.build(model.trainable_variables)

    state = hvd.elastic.KerasState(model, epoch=0, batch=0, examples_done=0)

    def scale_learning_rate():
        # After every reset: the learning rate follows the number of workers.
        optimizer.learning_rate.assign(args.lr * hvd.size())

    state.register_reset_callbacks([scale_learning_rate])
    scale_learning_rate()

    @hvd.elastic.run
    def train(state):
        size, rank = hvd.size(), hvd.rank()
        global_batch = args.batch_size * size
        while state.epoch < args.epochs:
            order = np.random.RandomState(state.epoch).permutation(len(x_train))
            left = order[state.examples_done:]
            steps = len(left) // global_batch
            if steps == 0:  # the epoch's last commit came after its last full batch
                state.epoch, state.batch, state.examples_done = state.epoch + 1, 0, 0
                continue
            # Global step k is left[k * global_batch:(k + 1) * global_batch]; this worker
            # trains on its batch-size slice of each.
            mine = left[:steps * global_batch].reshape(steps, size, args.batch_size)[:, rank]
            mine = mine.ravel()
            model.fit(x_train[mine], y_train[mine], batch_size=args.batch_size, shuffle=False,
                      epochs=state.epoch + 1, initial_epoch=state.epoch,
                      verbose=1 if rank == 0 else 0,
                      callbacks=[
                          hvd.callbacks.MetricAverageCallback(),
                          ExamplesDoneCallback(state, global_batch),
                          hvd.elastic.UpdateBatchStateCallback(state),
                          hvd.elastic.UpdateEpochStateCallback(state),
                          hvd.elastic.CommitStateCallback(state, args.batches_per_commit),
                      ])

    train(state)

    # Each worker evaluates its shard of the test set; the accuracy is averaged over workers.
    x_shard, y_shard = x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]
    _, accuracy = model.evaluate(x_shard, y_shard, batch_size=256, verbose=0)
    correct = hvd.allreduce(accuracy * len(y_shard), name="test_correct", op=hvd.Sum)
    accuracy = float(correct) / len(y_test)
    if hvd.rank() == 0:
        print(f"Test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
