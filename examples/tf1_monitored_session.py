"""Fashion-MNIST in TF1 graph style: tf.compat.v1, DistributedOptimizer, MonitoredTrainingSession.

    python examples/tf1_monitored_session.py [--short]                 (single process)
    horovodrun -np 2 python examples/tf1_monitored_session.py [--short]
    mpirun -np 3 python examples/tf1_monitored_session.py [--short] [--checkpoint-dir DIR]

A two-layer perceptron built from tf.compat.v1.get_variable and matmul (tf.compat.v1.layers would
need tf_keras on TF >= 2.16). Only rank 0 writes checkpoints (to --checkpoint-dir, or to a
temporary folder removed at the end); BroadcastGlobalVariablesHook(0) gives every rank rank 0's
initial (or restored) variables. --steps is the number of steps a single process would run; with
N ranks each rank runs steps / N steps at a learning rate N times larger.
"""

import argparse
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.tensorflow as hvd  # noqa: E402
from fashion_mnist_data import DEFAULT_DATA_DIR, load, shard  # noqa: E402

tf1 = tf.compat.v1


def dense(x, units, name, activation=None):
    """x @ w + b with variables created by tf.compat.v1.get_variable."""
    with tf1.variable_scope(name):
        w = tf1.get_variable("kernel", [int(x.shape[-1]), units],
                             initializer=tf1.glorot_uniform_initializer())
        b = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
    y = tf.matmul(x, w) + b
    return activation(y) if activation is not None else y


class EndOfTrainingHook(tf1.train.SessionRunHook):
    """At the end of training: scores this rank's test shard and sums the counts over ranks,
    reads the final global step, and checks that every rank holds rank 0's weights."""

    def __init__(self, correct_sum, weight_diff, feed_dict, num_examples):
        self._correct_sum = correct_sum
        self._weight_diff = weight_diff
        self._feed_dict = feed_dict
        self._num_examples = num_examples
        self.accuracy = None
        self.final_step = None
        self.weight_diff = None

    def end(self, session):
        # Runs on every rank (all stop at the same global step), so the allreduce matches up.
        self.accuracy = session.run(self._correct_sum, self._feed_dict) / self._num_examples
        self.final_step = session.run(tf1.train.get_global_step())
        self.weight_diff = session.run(self._weight_diff)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000,
                        help="training steps of a single process (divided among the ranks)")
    parser.add_argument("--batch-size", type=int, default=100, help="per rank")
    parser.add_argument("--lr", type=float, default=0.001, help="single-rank learning rate")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--checkpoint-dir", default=None,
                        help="rank 0's checkpoint folder (default: a temporary one); training "
                             "resumes from a checkpoint found there")
    parser.add_argument("--short", action="store_true", help="quick run: 400 steps in all")
    args = parser.parse_args()
    if args.short:
        args.steps, args.log_every = 400, 40

    tf1.disable_eager_execution()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    x_train, y_train = shard(*load(args.data_dir, "train"), rank, size)
    x_test, y_test = load(args.data_dir, "test")
    x_train = x_train.reshape(len(x_train), -1)
    x_test_shard, y_test_shard = shard(x_test.reshape(len(x_test), -1), y_test, rank, size)

    # Different seeds per rank: the broadcast hook is what makes the initial weights agree.
    tf1.set_random_seed(1234 + rank)
    images = tf1.placeholder(tf.float32, [None, 784], name="images")
    labels = tf1.placeholder(tf.int64, [None], name="labels")
    hidden = dense(images, 256, "hidden", tf.nn.relu)
    logits = dense(hidden, 10, "logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    num_correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    correct_sum = hvd.allreduce(num_correct, op=hvd.Sum, name="test_correct")
    # Sanity check for the end: largest difference between any rank's weights and rank 0's.
    weight_diff = hvd.allreduce(
        tf.reduce_max([tf.reduce_max(tf.abs(v - hvd.broadcast(v, 0, name=f"check_{i}")))
                       for i, v in enumerate(tf1.trainable_variables())]),
        op=hvd.Max, name="check_max")

    global_step = tf1.train.get_or_create_global_step()
    # Scale the learning rate by the number of ranks; DistributedOptimizer averages the gradients.
    opt = hvd.DistributedOptimizer(tf1.train.AdamOptimizer(args.lr * size))
    train_op = opt.minimize(loss, global_step=global_step)

    last_step = max(1, args.steps // size)
    end_hook = EndOfTrainingHook(correct_sum, weight_diff,
                                 {images: x_test_shard, labels: y_test_shard}, len(y_test))
    hooks = [
        # Copies rank 0's variables to all ranks once the session exists (after init/restore).
        hvd.BroadcastGlobalVariablesHook(0),
        tf1.train.StopAtStepHook(last_step=last_step),
        end_hook,
    ]

    # Only rank 0 checkpoints, so the other ranks cannot corrupt its files.
    temp_dir = None
    checkpoint_dir = None
    if rank == 0:
        checkpoint_dir = args.checkpoint_dir
        if checkpoint_dir is None:
            checkpoint_dir = temp_dir = tempfile.mkdtemp(prefix="tf1_fashion_mnist_")

    rng = np.random.default_rng(rank)
    config = tf1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    first_loss = batch_loss = float("nan")
    with tf1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks,
                                            config=config, save_summaries_steps=None,
                                            save_summaries_secs=None,
                                            log_step_count_steps=None) as session:
        while not session.should_stop():
            batch = rng.integers(0, len(x_train), args.batch_size)
            _, step, batch_loss = session.run([train_op, global_step, loss],
                                              {images: x_train[batch], labels: y_train[batch]})
            if np.isnan(first_loss):
                first_loss = batch_loss
            if rank == 0 and (step % args.log_every == 0 or step + 1 >= last_step):
                print(f"Step #{step}\tLoss: {batch_loss:.6f}", flush=True)

    if rank == 0:
        print(f"Trained to global step {end_hook.final_step}: first loss {first_loss:.4f}, "
              f"last loss {batch_loss:.4f}", flush=True)
        print(f"Max weight difference from rank 0: {end_hook.weight_diff:g}", flush=True)
        print(f"Test accuracy: {end_hook.accuracy:.4f}", flush=True)
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        else:
            print(f"Checkpoints in {checkpoint_dir}", flush=True)


if __name__ == "__main__":
    main()
