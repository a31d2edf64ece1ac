"""Puts B7 results side by side (an A/B of two builds, or runs back to back): the headline figures
and the ratios to the core's own figures from each file's own run.

    python3 bench/b7_compare.py A/b7-np2.json B/b7-np2.json [more.json ...]
"""

import json
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple


def _dig(d: Any, *keys: Any) -> Optional[float]:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, (int, float)) else None


def _eager(np_key: str, variant: str) -> Callable[[Dict[str, Any]], Optional[float]]:
    return lambda r: _dig(r, np_key, "eager", "latency_us", variant, "median")


ROWS: List[Tuple[str, Callable[[Dict[str, Any]], Optional[float]]]] = [
    ("eager np=1 hvd.allreduce p50 us", _eager("tf_np1", "hvd.allreduce")),
    ("eager np=1 tf.identity p50 us", _eager("tf_np1", "tf.identity")),
    ("eager np=1 over tf.identity us (goal <= 15)",
     lambda r: _dig(r, "ratios", "eager_np1_us_over_tf_identity")),
    ("eager np=2 hvd.allreduce p50 us", _eager("tf_np2", "hvd.allreduce")),
    ("eager np=2 generated op p50 us", _eager("tf_np2", "generated op")),
    ("core B4 p50 us", lambda r: _dig(r, "core_figures", "b4_np2_p50_us")),
    ("eager np=2 / B4 (goal <= 1.3)", lambda r: _dig(r, "ratios", "eager_np2_p50_over_core_b4")),
    ("small per-tensor us/tensor", lambda r: _dig(
        r, "tf_np2", "small", "us_per_tensor_beyond_identity", "tf.function allreduce per tensor")),
    ("small grouped us/tensor", lambda r: _dig(
        r, "tf_np2", "small", "us_per_tensor_beyond_identity", "tf.function grouped_allreduce")),
    ("core B3 small_mixed us/tensor", lambda r: _dig(r, "core_figures", "b3_small_us_per_tensor")),
    ("small per-tensor / B3 (goal <= 1.5)",
     lambda r: _dig(r, "ratios", "small_per_tensor_over_core_b3")),
    ("small grouped / B3 (goal <= 1.5)", lambda r: _dig(r, "ratios", "small_grouped_over_core_b3")),
    ("ResNet-50 grouped ms", lambda r: _dig(
        r, "tf_np2", "resnet", "ms_per_set_beyond_baseline", "tf.function grouped_allreduce")),
    ("ResNet-50 per-tensor ms", lambda r: _dig(
        r, "tf_np2", "resnet", "ms_per_set_beyond_baseline", "tf.function allreduce per tensor")),
    ("ResNet-50 tape ms", lambda r: _dig(
        r, "tf_np2", "resnet", "ms_per_set_beyond_baseline", "DistributedGradientTape")),
    ("core B1 ms", lambda r: _dig(r, "core_figures", "b1_ms")),
    ("ResNet-50 grouped / B1 (goal <= 1.1)",
     lambda r: _dig(r, "ratios", "resnet_grouped_over_core_b1")),
    ("ResNet-50 per-tensor / B1 (goal <= 1.1)",
     lambda r: _dig(r, "ratios", "resnet_per_tensor_over_core_b1")),
    ("ResNet-50 tape / B1 (goal <= 1.1)", lambda r: _dig(r, "ratios", "resnet_tape_over_core_b1")),
    ("core in process (C API) ResNet-50 ms", lambda r: _dig(
        r, "tf_np2", "resnet", "ms_per_set_beyond_baseline", "core C API per tensor (in process)")),
    ("core in process (C API) ResNet-50 out of place ms", lambda r: _dig(
        r, "tf_np2", "resnet", "ms_per_set_beyond_baseline",
        "core C API per tensor, out of place (in process)")),
    ("core in process (C API) ResNet-50 average ms", lambda r: _dig(
        r, "tf_np2", "resnet", "ms_per_set_beyond_baseline",
        "core C API per tensor, average (in process)")),
    ("ResNet-50 grouped / core in process out of place",
     lambda r: _dig(r, "ratios", "resnet_grouped_over_core_in_process_out_of_place")),
    ("ResNet-50 per-tensor / core in process out of place",
     lambda r: _dig(r, "ratios", "resnet_per_tensor_over_core_in_process_out_of_place")),
    ("ResNet-50 tape / core in process average",
     lambda r: _dig(r, "ratios", "resnet_tape_over_core_in_process_average")),
    ("core in process out of place / in place",
     lambda r: _dig(r, "ratios", "core_in_process_out_of_place_over_in_place")),
    ("mpi4py ResNet-50 chunked ms", lambda r: _dig(
        r, "tf_np2", "resnet", "ms_per_set_beyond_baseline", "mpi4py chunked (best)")),
]


def main(paths: List[str]) -> int:
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    width = max(len(name) for name, _ in ROWS)
    print(" " * width + "".join(f"{'run ' + str(i + 1):>12}" for i in range(len(runs))))
    for name, get in ROWS:
        cells = []
        for r in runs:
            v = get(r)
            cells.append(f"{'n/a' if v is None else f'{v:.2f}':>12}")
        print(name.ljust(width) + "".join(cells))
    for i, (p, r) in enumerate(zip(paths, runs)):
        np2 = r.get("tf_np2") or {}
        print(f"run {i + 1}: {p}: {np2.get('date', '?')}, load {np2.get('loadavg_before', '?')}"
              f" -> {np2.get('loadavg_after', '?')}, horovod_compat {np2.get('horovod_compat')},"
              f" verified {r.get('verified')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
