"""Synthetic-data training throughput of a Keras application model (ResNet-50 by default).

    python examples/resnet50_synthetic.py [--short]                    (single process)
    horovodrun -np 2 python examples/resnet50_synthetic.py [--short]
    mpirun -np 3 python examples/resnet50_synthetic.py --batch-size 16 --image-size 64

Random images and labels, random initial weights (weights=None: nothing is downloaded). Each step
computes gradients with hvd.DistributedGradientTape inside a tf.function and applies them with
SGD. After --num-warmup-batches untimed steps, it times --num-iters iterations of
--num-batches-per-iter steps each and reports images/second per rank and in total.
"""

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_compat.tensorflow as hvd  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ResNet50", help="a keras.applications model name")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--image-size", type=int, default=224, help="height = width (>= 32)")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="compress gradients to float16 for the allreduce")
    parser.add_argument("--no-horovod", action="store_true",
                        help="plain tf.GradientTape, no runtime (the baseline of an overhead check)")
    parser.add_argument("--sync-only", action="store_true",
                        help="allreduce only the loss (one scalar) per step, not the gradients: "
                             "what keeping the ranks in step costs, without the gradient traffic")
    parser.add_argument("--short", action="store_true",
                        help="quick run: 32x32 images, batch 4, 1 warmup batch, 3 iterations of 2")
    args = parser.parse_args()
    if args.short:
        args.image_size, args.batch_size = 32, 4
        args.num_warmup_batches, args.num_batches_per_iter, args.num_iters = 1, 2, 3

    use_hvd = not args.no_horovod
    if use_hvd:
        hvd.init()
    rank, size = (hvd.rank(), hvd.size()) if use_hvd else (0, 1)
    keras.utils.set_random_seed(rank)
    log = print if rank == 0 else (lambda *a, **k: None)

    model = getattr(keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3),
        classes=args.num_classes)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()  # the application ends in a softmax
    opt = keras.optimizers.SGD(learning_rate=0.01)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # One fixed synthetic batch per rank.
    data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    target = tf.random.uniform([args.batch_size], maxval=args.num_classes, dtype=tf.int64)

    @tf.function
    def benchmark_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        if use_hvd and not args.sync_only:
            tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if use_hvd and args.sync_only:
            loss = hvd.allreduce(loss, name="sync_only_loss")
        return loss

    # First step, then broadcast rank 0's model and optimizer state to every rank (after the
    # step, so that the optimizer's variables exist). Broadcasting eagerly here rather than
    # inside the tf.function avoids tracing ResNet-50 a second time.
    benchmark_step()
    if use_hvd:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

    log(f"Model: {args.model}, image size: {args.image_size}x{args.image_size}")
    log(f"Batch size: {args.batch_size} per rank")
    log(f"Number of ranks: {size}")

    log("Running warmup...", flush=True)
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...", flush=True)
    img_secs = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{i}: {img_sec:.1f} img/sec per rank", flush=True)
        img_secs.append(img_sec)

    # Per-rank mean and 95% interval over the iterations (rank 0's measurements); the total adds
    # up every rank's own mean.
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    total = mean
    if use_hvd:
        total = float(hvd.allreduce(tf.constant(mean, tf.float64), op=hvd.Sum,
                                    name="img_sec_total"))
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} rank(s): {total:.1f} +-{size * conf:.1f}", flush=True)


if __name__ == "__main__":
    main()
