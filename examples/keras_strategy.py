"""Fashion-MNIST with Keras 3 model.fit under HorovodStrategy (tf.distribute on horovod_compat).

    mpirun -np 2 python examples/keras_strategy.py [--epochs 4] [--short]
    horovodrun -np 2 python examples/keras_strategy.py
    python examples/keras_strategy.py                      (single process)

The script is written as for tf.distribute.MultiWorkerMirroredStrategy; the one changed line is
the strategy. Every rank builds the same input pipeline over the whole training set (same
shuffle seed); the strategy gives each rank its share of every global batch. Reads the IDX
files from Debian's /usr/share/datasets/fashion-mnist (or --data-dir).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.tensorflow as hvd  # noqa: E402
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


def dataset(x, y, global_batch, shuffle_seed=None):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle_seed is not None:
        # The same seed on every rank: all ranks see the same order, and the strategy hands
        # each rank its own part of every global batch.
        ds = ds.shuffle(10000, seed=shuffle_seed, reshuffle_each_iteration=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.batch(global_batch).with_options(options)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="per replica")
    parser.add_argument("--lr", type=float, default=0.001, help="learning rate of one replica")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--checkpoint", default="fashion_mnist_strategy.weights.h5")
    parser.add_argument("--short", action="store_true",
                        help="quick run: one epoch on the first 8000 training images")
    args = parser.parse_args()
    if args.short:
        args.epochs = 1

    # Was: strategy = tf.distribute.MultiWorkerMirroredStrategy()
    strategy = hvd.distribute.HorovodStrategy()
    replicas = strategy.num_replicas_in_sync
    keras.utils.set_random_seed(1234)  # rank 0's initial weights are broadcast anyway

    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "test")
    if args.short:
        x_train, y_train = x_train[:8000], y_train[:8000]
    global_batch = args.batch_size * replicas

    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=args.lr * replicas),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    model.fit(dataset(x_train, y_train, global_batch, shuffle_seed=42), epochs=args.epochs,
              shuffle=False,  # the dataset shuffles itself
              verbose=2 if hvd.rank() == 0 else 0)

    # evaluate runs on every rank; each scores its share and the metrics are reduced.
    _, accuracy = model.evaluate(dataset(x_test, y_test, 256 * replicas), verbose=0)
    # A collective, so every rank takes part: the ranks' weights must be identical.
    weights = tf.concat([tf.reshape(w, [-1]) for w in model.trainable_weights], axis=0)
    everyone = hvd.allgather(weights[None, :])
    difference = float(tf.reduce_max(tf.abs(everyone - everyone[0])))
    if hvd.rank() == 0:
        print(f"Max weight difference from rank 0: {difference}")
        # Reading weights needs no collective, so saving on rank 0 alone is safe.
        model.save_weights(args.checkpoint)
        print(f"Test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
