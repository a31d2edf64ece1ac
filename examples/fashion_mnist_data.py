"""Fashion-MNIST from local IDX files (no download), shared by the examples in this folder.

Debian's fashion-mnist package puts the four ``*-idx?-ubyte.gz`` files in
/usr/share/datasets/fashion-mnist; any folder holding the same four files works (``--data-dir``).
"""

import gzip
import os

import numpy as np

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """Reads one IDX file (big-endian header: magic, then one uint32 per dimension)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split):
    """Returns (images float32 [N, 28, 28, 1] in [0, 1], labels int64 [N]) of 'train' or 'test'."""
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    return (x.astype(np.float32) / 255.0)[..., None], y.astype(np.int64)


def shard(x, y, rank, size):
    """This rank's share of (x, y): every size-th example starting at rank."""
    return x[rank::size], y[rank::size]
