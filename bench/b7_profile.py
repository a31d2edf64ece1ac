"""Splits a `perf record -g` of B7's rank 0 (its steady-state loop only) into where the time goes,
by each sample's thread and own symbol (self time, not children).

    python bench/b7_profile.py perf.data OUT.json --pid PID --seconds S --freq F --calls N

Threads: the main (Python) thread (tid == PID), the runtime's `hvdc-control` (negotiation) and
`hvdc-exec-*` (reductions) threads, TensorFlow's pool threads (the other threads named python).
Categories (CATEGORIES below, first match wins):

- copies: memcpy/memmove in any thread; allocation: malloc/free/new/delete in any thread;
- negotiation: everything else on hvdc-control (its MPI polling and its sleeps/wake-ups too);
- execution: everything else on hvdc-exec-* (the MPI allreduce itself, its progress polling);
- enqueue: the op library (mpi_lib: the kernels' ComputeAsync/completion) and libhvdc_core
  (hvdc_enqueue) on the main or TF threads;
- Python: the interpreter (horovod_compat's wrapper and TensorFlow's Python);
- TF pool spin: TF's pool threads looking for work (MaybeGetTask, WaitForWork, Steal);
- op dispatch (TF): the rest of TensorFlow (eager execute, kernel lookup, function executor);
- wake-ups/scheduler: kernel scheduler, futex, condition variables, syscalls on main/TF threads;
- other.

Rough (a memcpy is a copy whoever calls it), but every figure is a measured share of rank 0's
CPU samples; the JSON keeps the top symbols per thread role so a category can be checked.
"""

import argparse
import json
import re
import subprocess
import sys
from typing import Dict, List, Tuple

ANY = r"."
TF_LIBS = r"tensorflow|_pywrap|tsl::|absl|Eigen|libprotobuf|libstdc\+\+|libgcc"
WAKE = (r"\[kernel|futex|pthread_cond|lll_lock|pthread_mutex|condition_variable|__vdso|"
        r"sched_yield|libc\.so\.6 .*(syscall|poll|epoll|nanosleep|clock_gettime)")

# (category, thread-role regex, "dso symbol" regex); first match wins.
CATEGORIES: List[Tuple[str, str, str]] = [
    ("copies", ANY, r"memcpy|memmove|copy_user|copy_to_user|copy_from_user|rep_movs"),
    ("allocation", ANY, r"\b(malloc|free|cfree|_int_malloc|_int_free|calloc|realloc|"
                        r"malloc_consolidate|unlink_chunk|sysmalloc|tcache)\b|operator new|"
                        r"operator delete|_PyObject_Malloc|_PyObject_Free|BFCAllocator"),
    ("negotiation (hvdc-control)", r"^control$", ANY),
    ("execution: MPI reduction (hvdc-exec)", r"^exec$", ANY),
    ("enqueue + completion (op kernel, hvdc_enqueue)", ANY, r"mpi_lib|libhvdc_core"),
    ("Python", ANY, r"python3|libpython"),
    ("TF pool spin", r"^tf$", r"MaybeGetTask|WaitForWork|Steal|NonBlockingThreadPool"),
    ("wake-ups / scheduler", ANY, WAKE),
    ("op dispatch (TF)", ANY, TF_LIBS),
    ("other", ANY, ANY),
]


def _role(tid: int, comm: str, pid: int) -> str:
    if tid == pid:
        return "main"
    if comm.startswith("hvdc-control"):
        return "control"
    if comm.startswith("hvdc-exec"):
        return "exec"
    return "tf" if comm.startswith("python") else "other"


def read_samples(data: str, pid: int) -> List[Tuple[int, str, str]]:
    """[(samples, role, "dso symbol")] from `perf report`'s self overhead per thread."""
    out = subprocess.run(
        ["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none", "-n",
         "--pid", str(pid), "--sort", "pid,dso,sym", "--percent-limit", "0"],
        check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\d+):(\S+)\s+(\S+)\s+\[(.)\]\s+(.*)$", line)
        if m:
            dso = m.group(4) if m.group(5) == "." else "[kernel] " + m.group(4)
            rows.append((int(m.group(1)), _role(int(m.group(2)), m.group(3), pid),
                         f"{dso} {m.group(6).strip()}"))
    return rows


def split(rows: List[Tuple[int, str, str]]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """(percent per category, percent per thread role) of all samples."""
    total = sum(r[0] for r in rows) or 1
    cats = {c: 0 for c, _, _ in CATEGORIES}
    roles: Dict[str, int] = {}
    for n, role, key in rows:
        roles[role] = roles.get(role, 0) + n
        for name, role_rx, sym_rx in CATEGORIES:
            if re.search(role_rx, role) and re.search(sym_rx, key):
                cats[name] += n
                break
    pct = lambda d: {k: round(100.0 * v / total, 1) for k, v in d.items()}  # noqa: E731
    return pct(cats), pct(roles)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--pid", type=int, required=True, help="rank 0's pid (its main thread)")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--freq", type=float, default=0.0)
    p.add_argument("--label", default="")
    p.add_argument("--calls", type=int, default=0)
    a = p.parse_args()
    rows = read_samples(a.data, a.pid)
    n = sum(r[0] for r in rows)
    cats, roles = split(rows)
    top: Dict[str, List[Dict[str, object]]] = {}
    for k, role, key in sorted(rows, reverse=True):
        if len(top.setdefault(role, [])) < 12:
            top[role].append({"percent": round(100.0 * k / max(n, 1), 2), "symbol": key[:160]})
    res = {"label": a.label, "samples": n, "seconds": a.seconds, "freq_hz": a.freq,
           "calls": a.calls, "percent": cats, "percent_by_thread": roles,
           "top_symbols_by_thread": top}
    if a.seconds and a.freq:
        # Samples land only while a thread of rank 0 is on a CPU: its CPU use, in cores.
        res["cpu_cores_busy"] = round(n / (a.seconds * a.freq), 3)
    if a.calls and a.seconds:
        res["us_per_call_while_profiled"] = round(a.seconds / a.calls * 1e6, 2)
    if a.calls and a.freq:
        # CPU µs per call of rank 0 (all its threads), by category: comparable between a loop
        # and the same loop without the runtime.
        per_call = n / a.freq / a.calls * 1e6
        res["cpu_us_per_call"] = {k: round(v / 100.0 * per_call, 3) for k, v in cats.items()}
        res["cpu_us_per_call_total"] = round(per_call, 3)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{a.label}: {n} samples, " + ", ".join(f"{k} {v:.1f} %" for k, v in cats.items() if v))
    print("  by thread: " + ", ".join(f"{k} {v:.1f} %" for k, v in roles.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
