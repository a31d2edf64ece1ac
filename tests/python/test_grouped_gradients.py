"""Gradients of the grouped collectives (and the others) when a group mixes dtypes and shapes,
leaves outputs unused, or runs on a process set; compared with gradients computed numerically
(central differences) from a NumPy model of the collective over every rank's inputs.

The finite differences give the derivative of the total loss (summed over the ranks of the set)
with respect to this rank's input. Horovod's gradients are that derivative times a factor per
collective, kept here: 1 for allreduce (the gradient is allreduced with the forward op), 1/n for
allgather (the incoming gradients are averaged, as for a loss replicated on every rank) and n for
reducescatter (the gradient is allgathered, times n for Sum; Average divides the forward by n and
does not divide the gradient), n being the set's size.
"""

import numpy as np
import pytest
import tensorflow as tf

import horovod_compat.tensorflow as hvd

EPS = 1e-3


def _input(rank, k, shape, dtype):
    n = int(np.prod(shape))
    values = ((np.arange(n) * 0.37 + rank * 1.3 + k * 0.71) % 2.0 - 1.0).reshape(shape)
    return values.astype(dtype)


def _weight(rank, k, shape):
    n = int(np.prod(shape))
    return ((np.arange(n) * 0.53 + rank * 0.29 + k * 1.7) % 3.0 - 1.5).reshape(shape)


def _weight_tf(rank, k, like):
    """_weight for a tensor whose shape may only be known at run time (tf.function)."""
    n = tf.size(like)
    values = tf.math.floormod(tf.range(n, dtype=tf.float64) * 0.53 + rank * 0.29 + k * 1.7,
                              3.0) - 1.5
    return tf.reshape(values, tf.shape(like))


# NumPy models of the collectives: every rank's inputs (lists per rank) -> every rank's outputs.
def _model_allreduce(xs, op):
    total = sum(xs)
    return [total / len(xs) if op == hvd.Average else total for _ in xs]


def _model_allgather(xs, op):
    return [np.concatenate(xs, axis=0) for _ in xs]


def _model_reducescatter(xs, op):
    total = sum(xs)
    if op == hvd.Average:
        total = total / len(xs)
    n, s = total.shape[0], len(xs)
    sizes = [n // s + (1 if r < n % s else 0) for r in range(s)]
    starts = np.cumsum([0] + sizes)
    return [total[starts[r]:starts[r + 1]] for r in range(s)]


HOROVOD_FACTOR = {"allreduce": lambda n: 1.0, "allgather": lambda n: 1.0 / n,
                  "reducescatter": lambda n: float(n)}

MODELS = {"allreduce": _model_allreduce, "allgather": _model_allgather,
          "reducescatter": _model_reducescatter}


def _run_grouped(kind, tensors, op, process_set):
    if kind == "allreduce":
        return hvd.grouped_allreduce(tensors, op=op, process_set=process_set)
    if kind == "allgather":
        return hvd.grouped_allgather(tensors, process_set=process_set)
    return hvd.grouped_reducescatter(tensors, op=op, process_set=process_set)


def _shapes(kind, set_rank):
    # allgather: the first dimension differs between ranks.
    if kind == "allgather":
        return [(set_rank + 1, 3), (2 * set_rank + 1,), (set_rank + 2, 2)]
    return [(4, 3), (5,), (3, 2)]


def _numeric_grad(kind, op, dtypes, used, set_ranks, me):
    """d(total loss)/d(my inputs) by central differences, in float64."""
    model = MODELS[kind]
    inputs = [[_input(r, k, shape, np.float64)
               for k, shape in enumerate(_shapes(kind, i))]
              for i, r in enumerate(set_ranks)]

    def total_loss(all_inputs):
        loss = 0.0
        for k in used:
            outs = model([per_rank[k] for per_rank in all_inputs], op)
            for i, r in enumerate(set_ranks):
                loss += float(np.sum(_weight(r, k, outs[i].shape) * outs[i]))
        return loss

    grads = []
    for k in range(len(dtypes)):
        x = inputs[me][k]
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            saved = x[idx]
            x[idx] = saved + EPS
            up = total_loss(inputs)
            x[idx] = saved - EPS
            down = total_loss(inputs)
            x[idx] = saved
            g[idx] = (up - down) / (2 * EPS)
        grads.append(g * HOROVOD_FACTOR[kind](len(set_ranks)))
    return grads


def _tape_grad(kind, op, dtypes, used, process_set, set_rank, mode):
    shapes = _shapes(kind, set_rank)
    rank = hvd.rank()

    def inputs():
        return [tf.constant(_input(rank, k, shape, dtype))
                for k, (shape, dtype) in enumerate(zip(shapes, dtypes))]

    def loss_of(xs):
        outs = _run_grouped(kind, xs, op, process_set)
        loss = tf.constant(0.0, tf.float64)
        for k in used:
            w = tf.cast(_weight_tf(rank, k, outs[k]), outs[k].dtype)
            loss += tf.cast(tf.reduce_sum(w * outs[k]), tf.float64)
        return loss

    def compute():
        xs = inputs()
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            loss = loss_of(xs)
        grads = tape.gradient(loss, xs)
        return [tf.zeros_like(x) if g is None else g for g, x in zip(grads, xs)]

    if mode == "graph":  # tf.gradients: unused outputs reach the gradient function as None
        with tf.Graph().as_default():
            xs = inputs()
            grads = tf.gradients(loss_of(xs), xs)
            grads = [tf.zeros_like(x) if g is None else g for g, x in zip(grads, xs)]
            with tf.compat.v1.Session() as session:
                return session.run(grads)
    if mode == "function":
        compute = tf.function(compute)
    return [g.numpy() for g in compute()]


CASES = [
    # (dtypes of the group, indices of outputs the loss uses)
    ([np.float32, np.float64, np.float32], [0, 1, 2]),
    ([np.float64, np.float64, np.float64], [1]),        # unused float64 outputs
    ([np.float64, np.float32, np.float16], [0, 2]),     # an unused float32 among others
]


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
@pytest.mark.parametrize("kind,op", [("reducescatter", hvd.Sum), ("reducescatter", hvd.Average),
                                     ("allreduce", hvd.Sum), ("allreduce", hvd.Average),
                                     ("allgather", None)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_grouped_gradient_matches_numeric(kind, op, case, mode):
    dtypes, used = CASES[case]
    set_ranks = list(range(hvd.size()))
    got = _tape_grad(kind, op, dtypes, used, hvd.global_process_set, hvd.rank(), mode)
    want = _numeric_grad(kind, op, dtypes, used, set_ranks, hvd.rank())
    for k, (g, w, dtype) in enumerate(zip(got, want, dtypes)):
        assert g.dtype == dtype, (k, g.dtype, dtype)
        tol = 2e-2 if dtype == np.float16 else 1e-4
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=tol, atol=tol,
                                   err_msg=f"input {k} ({np.dtype(dtype).name})")


@pytest.mark.parametrize("kind,op", [("reducescatter", hvd.Sum), ("allreduce", hvd.Average),
                                     ("allgather", None)])
def test_grouped_gradient_on_a_process_set(kind, op):
    if hvd.size() < 3:
        pytest.skip("a proper subset of >= 2 ranks needs np >= 3")
    set_ranks = [0, hvd.size() - 1]
    ps = hvd.add_process_set(set_ranks)
    try:
        if hvd.rank() in set_ranks:
            dtypes, used = CASES[0]
            me = set_ranks.index(hvd.rank())
            got = _tape_grad(kind, op, dtypes, used, ps, me, "eager")
            want = _numeric_grad(kind, op, dtypes, used, set_ranks, me)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.astype(np.float64), w, rtol=1e-4, atol=1e-4)
    finally:
        hvd.remove_process_set(ps)


def test_mixed_dtype_group_forward_keeps_order_and_names():
    rank = hvd.rank()
    xs = [tf.constant(_input(rank, 0, (2, 2), np.float32)),
          tf.constant(_input(rank, 1, (3,), np.float64)),
          tf.constant(_input(rank, 2, (2,), np.float32))]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="mixed_group")
    for k, (x, out) in enumerate(zip(xs, outs)):
        assert out.dtype == x.dtype
        expected = sum(_input(r, k, tuple(x.shape), np.float64) for r in range(hvd.size()))
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)
    with tf.Graph().as_default():
        graph_xs = [tf.constant(x.numpy()) for x in xs]
        graph_outs = hvd.grouped_allgather(graph_xs, name="mixed_gather")
        names = sorted({o.op.name for o in graph_outs})
        assert names == ["mixed_gather_float32", "mixed_gather_float64"], names
