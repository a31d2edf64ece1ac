"""Fashion-MNIST with a custom TF2 training loop: hvd.DistributedGradientTape in a tf.function.

    python examples/tf2_gradient_tape.py [--short]                 (single process)
    horovodrun -np 2 python examples/tf2_gradient_tape.py [--short]
    mpirun -np 3 python examples/tf2_gradient_tape.py [--short]

Reads Fashion-MNIST from local IDX files (--data-dir); each rank trains on its own shard of the
training set. --steps is the number of steps a single process would run; with N ranks each rank
runs steps / N steps at a learning rate N times larger (the global batch is N times larger).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.tensorflow as hvd  # noqa: E402
from fashion_mnist_data import DEFAULT_DATA_DIR, load, shard  # noqa: E402


def build_model():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000,
                        help="training steps of a single process (divided among the ranks)")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.001, help="single-rank learning rate")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--short", action="store_true", help="quick run: 300 steps in all")
    args = parser.parse_args()
    if args.short:
        args.steps, args.log_every = 300, 25

    hvd.init()
    # A different seed per rank: the initial weights differ until the broadcast below makes every
    # rank continue from rank 0's.
    keras.utils.set_random_seed(1234 + hvd.rank())

    x_train, y_train = shard(*load(args.data_dir, "train"), hvd.rank(), hvd.size())
    x_test, y_test = load(args.data_dir, "test")
    dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
               .repeat().shuffle(10000, seed=hvd.rank()).batch(args.batch_size))

    model = build_model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Scale the learning rate by the number of ranks (the effective batch is size times larger).
    opt = keras.optimizers.Adam(learning_rate=args.lr * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        # Wrap the tape: gradient() returns gradients averaged over all ranks.
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

        # Broadcast after the first step, not before: only then do the optimizer's slot
        # variables exist. This copies rank 0's model and optimizer state to every rank.
        # (first_batch is a Python bool, so this branch is traced into the first-step graph only.)
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    steps = max(1, args.steps // hvd.size())
    for step, (images, labels) in enumerate(dataset.take(steps)):
        loss = training_step(images, labels, step == 0)
        if hvd.rank() == 0 and (step % args.log_every == 0 or step == steps - 1):
            print(f"Step #{step}\tLoss: {float(loss):.6f}", flush=True)

    # Sanity check: same start (broadcast) + same averaged gradients = same weights everywhere.
    diff = max(float(tf.reduce_max(tf.abs(v - hvd.broadcast(v, root_rank=0, name=f"check_{i}"))))
               for i, v in enumerate(model.trainable_variables))
    diff = float(hvd.allreduce(tf.constant(diff), op=hvd.Max, name="check_max"))
    if hvd.rank() == 0:
        print(f"Max weight difference from rank 0: {diff:g}", flush=True)

    # Every rank scores its shard of the test set; summing the counts gives the global accuracy.
    x_shard, y_shard = shard(x_test, y_test, hvd.rank(), hvd.size())
    predictions = np.concatenate([np.argmax(model(x_shard[i:i + 1000], training=False), axis=1)
                                  for i in range(0, len(x_shard), 1000)])
    correct = hvd.allreduce(tf.constant(float(np.sum(predictions == y_shard))), op=hvd.Sum,
                            name="test_correct")
    if hvd.rank() == 0:
        print(f"Test accuracy: {float(correct) / len(y_test):.4f}", flush=True)


if __name__ == "__main__":
    main()
