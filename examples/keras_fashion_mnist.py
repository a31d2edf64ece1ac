"""Fashion-MNIST with Keras 3 model.fit on horovod_compat.

    horovodrun -np 2 python examples/keras_fashion_mnist.py [--epochs 4] [--short]
    mpirun -np 2 python examples/keras_fashion_mnist.py
    python examples/keras_fashion_mnist.py                 (single process)

Reads the IDX files from Debian's /usr/share/datasets/fashion-mnist (or --data-dir); each rank
trains on its own shard of the training set.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.001, help="single-rank learning rate")
    parser.add_argument("--warmup-epochs", type=int, default=1)
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--checkpoint", default="fashion_mnist_checkpoint.weights.h5")
    parser.add_argument("--short", action="store_true",
                        help="quick run: one epoch on the first 8000 training images")
    args = parser.parse_args()
    if args.short:
        args.epochs = 1

    hvd.init()
    keras.utils.set_random_seed(1234 + hvd.rank())

    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "test")
    if args.short:
        x_train, y_train = x_train[:8000], y_train[:8000]
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

    scaled_lr = args.lr * hvd.size()
    model = build_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(learning_rate=scaled_lr))
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    callbacks = [
        # Start every rank from rank 0's initial weights.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Report metrics averaged over ranks (before anything that reads them).
        hvd.callbacks.MetricAverageCallback(),
        # Ramp the learning rate from lr to lr * size over the first epochs.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr,
                                                 warmup_epochs=args.warmup_epochs, verbose=1),
    ]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint,
                                                         save_weights_only=True))

    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=1 if hvd.rank() == 0 else 0)

    # Each rank evaluates its shard of the test set; the accuracy is averaged over ranks.
    x_shard, y_shard = x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]
    _, accuracy = model.evaluate(x_shard, y_shard, batch_size=256, verbose=0)
    correct = hvd.allreduce(accuracy * len(y_shard), name="test_correct", op=hvd.Sum)
    accuracy = float(correct) / len(y_test)
    if hvd.rank() == 0:
        print(f"Test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
