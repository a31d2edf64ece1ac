"""Splits a `perf record` of B7's rank 0 into where the time goes, by each sample's own symbol
(self time, not children): Python, TensorFlow's op dispatch, the runtime's enqueue path,
negotiation, copies, allocation, MPI, completion wake-up (futex / scheduler), other.

    python bench/b7_profile.py perf.data OUT.json --seconds S --freq F [--label L]

The buckets are decided by library and symbol name (BUCKETS below, first match wins); the split is
rough (a memcpy is a copy whoever calls it) but every figure is a measured share of rank 0's CPU
samples. The JSON also keeps the top symbols so a bucket can be checked by eye.
"""

import argparse
import json
import re
import subprocess
import sys
from typing import Dict, List, Tuple

# (bucket, regex on "dso symbol"); first match wins.
BUCKETS: List[Tuple[str, str]] = [
    ("copies", r"memcpy|memmove|copy_user|copy_to_user|copy_from_user|rep_movs"),
    ("allocation", r"\b(malloc|free|cfree|_int_malloc|_int_free|calloc|realloc|operator new|"
                   r"operator delete|tc_|je_|malloc_consolidate|unlink_chunk|sysmalloc)|"
                   r"Allocat|BFCAllocator"),
    ("completion wake-up", r"futex|pthread_cond|__lll_lock|lll_lock|pthread_mutex|schedule|"
                           r"try_to_wake_up|wake_up|finish_task_switch|__switch_to|"
                           r"dequeue_task|enqueue_task|select_task_rq|sched_yield|"
                           r"do_syscall|entry_SYSCALL|syscall_return|native_queued_spin|"
                           r"raw_spin|_raw_spin|condition_variable|notify_one|notify_all"),
    ("negotiation", r"libhvdc_core\S* .*(ResponseCache|MessageTable|Controller|Serializ|Parse|"
                    r"WireFormat|wire_format|Negotiat|Coordinat|FusionPlanner|ExecutionOrder|"
                    r"RequestValidator|ControlChannel|ControlLoop|RunLoopOnce|ComputeResponse)"),
    ("enqueue", r"mpi_lib|hvdc_tf|hvdc_enqueue|TensorQueue|Enqueue|libhvdc_core\S* .*Submit"),
    ("runtime other", r"libhvdc_core|libhvdc"),
    ("MPI", r"libmpi|libopen-pal|libopen-rte|mca_|libucp|libucs|libuct|libfabric|libpmix|"
            r"ompi_|opal_"),
    ("Python", r"python3|libpython|_Py|Py[A-Z]"),
    ("op dispatch (TF)", r"tensorflow|_pywrap|libtensorflow|tsl::|absl|Eigen|libprotobuf"),
    ("kernel other", r"\[kernel"),
]


def read_symbols(data: str) -> List[Tuple[float, str, str]]:
    """(percent, dso, symbol) per line of `perf report` self overhead."""
    out = subprocess.run(
        ["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
         "--sort", "dso,sym", "--percent-limit", "0"],
        check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)$", line)
        if m:
            dso = m.group(2) if m.group(3) == "." else "[kernel] " + m.group(2)
            rows.append((float(m.group(1)), dso, m.group(4).strip()))
    return rows


def sample_count(data: str) -> int:
    out = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
                          "--sort", "dso", "--header-only"], capture_output=True,
                         text=True).stdout
    out += subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g",
                           "none", "--sort", "dso"], capture_output=True, text=True).stdout
    m = re.search(r"Samples:\s*([\d.]+)([KM]?)", out)
    if not m:
        return 0
    return int(float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6}[m.group(2)])


def split(rows: List[Tuple[float, str, str]]) -> Dict[str, float]:
    buckets: Dict[str, float] = {b: 0.0 for b, _ in BUCKETS}
    buckets["other"] = 0.0
    for pct, dso, sym in rows:
        key = f"{dso} {sym}"
        for name, rx in BUCKETS:
            if re.search(rx, key):
                buckets[name] += pct
                break
        else:
            buckets["other"] += pct
    return {k: round(v, 1) for k, v in buckets.items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--freq", type=float, default=0.0)
    p.add_argument("--label", default="")
    p.add_argument("--calls", type=int, default=0)
    a = p.parse_args()
    rows = read_symbols(a.data)
    n = sample_count(a.data)
    res = {"label": a.label, "samples": n, "seconds": a.seconds, "freq_hz": a.freq,
           "calls": a.calls, "percent": split(rows),
           "top_symbols": [{"percent": pct, "dso": dso, "symbol": sym[:160]}
                           for pct, dso, sym in rows[:40]]}
    if a.seconds and a.freq:
        # Samples land only while a thread of rank 0 is on a CPU: this is its CPU use in cores.
        res["cpu_cores_busy"] = round(n / (a.seconds * a.freq), 3)
    if a.calls and a.seconds:
        res["us_per_call_while_profiled"] = round(a.seconds / a.calls * 1e6, 2)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{a.label}: {n} samples; " + ", ".join(f"{k} {v:.1f} %"
                                                 for k, v in res["percent"].items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
