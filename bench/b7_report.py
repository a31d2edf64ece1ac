"""B7's figures, from the files its runs leave (no TensorFlow needed):

    python bench/b7_report.py TMPDIR OUT.json          # the report of one run (run_tf.sh b7)
    python bench/b7_report.py profile perf.data OUT.json --pid PID --seconds S --freq F --calls N
    python bench/b7_report.py compare A/b7-np2.json B/b7-np2.json [more.json ...]

The report merges the TF-path runs (np=1 eager, np=2 all cases) with the core's own B1/B3/B4
from the same run, prints the table with the ratios of the issue-15 goals and writes one JSON
(bench/results/b7-np2.json). TMPDIR holds tf-np1.json, tf-np2.json, core-b1-np2.json,
core-b3-np2.json, core-b4-np2.json, core-b4-np1.json (any may be missing: its rows say n/a) and
optionally profile-*.json.

profile splits a `perf record -g` of B7's rank 0 (its steady-state loop only) into where the time
goes, by each sample's thread and own symbol (self time, not children). Threads: the main (Python)
thread (tid == PID), the runtime's `hvdc-control` (negotiation) and `hvdc-exec-*` (reductions)
threads, TensorFlow's pool threads (the other threads named python). Categories (CATEGORIES below,
first match wins):

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

compare puts B7 results side by side (an A/B of two builds, or runs back to back): the headline
figures and the ratios to the core's own figures from each file's own run.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

# b7_tf_path.CORE_IN_PROCESS (not imported: the report runs without TensorFlow).
CORE_IN_PROCESS = "core C API per tensor (in process)"
CORE_IN_PROCESS_AVG = "core C API per tensor, average (in process)"
CORE_IN_PROCESS_OOP = "core C API per tensor, out of place (in process)"


def _load(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _get(d: Optional[Dict[str, Any]], *keys: Any) -> Optional[float]:
    for k in keys:
        if d is None:
            return None
        try:
            d = d[k]
        except (KeyError, IndexError, TypeError):
            return None
    return d if isinstance(d, (int, float)) else None


def core_figures(core: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """The core's figures B7 divides by (µs for B3/B4, ms for B1)."""
    b3 = core.get("b3") or {}
    small = next((s for s in b3.get("sets", []) if s.get("tensor_set") == "small_mixed"), None)
    b1_med = _get(core.get("b1"), "ours", "time_s", "median")
    return {
        "b4_np2_p50_us": _get(core.get("b4"), "sizes", 0, "latency_us", "ours (block)", "median"),
        "b4_np2_raw_p50_us": _get(core.get("b4"), "sizes", 0, "latency_us", "raw MPI_Allreduce",
                                  "median"),
        "b4_np1_p50_us": _get(core.get("b4_np1"), "sizes", 0, "latency_us", "ours (block)",
                              "median"),
        "b3_small_us_per_tensor": _get(small, "ours_us_per_tensor"),
        "b3_small_raw_us_per_tensor": _get(small, "raw_per_tensor_us_per_tensor"),
        "b1_ms": None if b1_med is None else b1_med * 1e3,
        "b1_raw_chunked_ms": (lambda v: None if v is None else v * 1e3)(
            _get(core.get("b1"), "raw_best_chunked", "time_s", "median")),
    }


def _mean(a: Optional[float], b: Optional[float]) -> Optional[float]:
    vals = [v for v in (a, b) if v is not None]
    return sum(vals) / len(vals) if vals else None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None or b == 0 else a / b


def _f(v: Optional[float], fmt: str = "{:.1f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def build(tmp: str) -> Tuple[Dict[str, Any], List[str]]:
    """The merged result and the text lines of the summary."""
    np1, np2 = _load(os.path.join(tmp, "tf-np1.json")), _load(os.path.join(tmp, "tf-np2.json"))
    names = (("b1", "b1-np2"), ("b3", "b3-np2"), ("b4", "b4-np2"), ("b4_np1", "b4-np1"))
    core = {k: _load(os.path.join(tmp, f"core-{f}.json")) for k, f in names}
    core_after = {k: _load(os.path.join(tmp, f"core-{f}-after.json")) for k, f in names}
    fig_before, fig_after = core_figures(core), core_figures(core_after)
    fig = {k: _mean(fig_before[k], fig_after[k]) for k in fig_before}
    def cf(key: str, fmt: str = "{:.1f}") -> str:
        """The core figure used (mean) with its before/after values."""
        b, a = fig_before[key], fig_after[key]
        spread = f" ({_f(b, fmt)}/{_f(a, fmt)})" if b is not None and a is not None else ""
        return _f(fig[key], fmt) + spread

    e1 = (np1 or {}).get("eager", {}).get("latency_us", {})
    e2 = (np2 or {}).get("eager", {}).get("latency_us", {})
    sm = (np2 or {}).get("small", {}).get("us_per_tensor_beyond_identity", {})
    rn = (np2 or {}).get("resnet", {}).get("ms_per_set_beyond_baseline", {})
    p50 = lambda d, k: _get(d, k, "median")  # noqa: E731
    p99 = lambda d, k: _get(d, k, "p99")  # noqa: E731
    rows: List[Tuple[str, str, str, str]] = []  # what, ours, reference, ratio / goal

    hvd1, id1 = p50(e1, "hvd.allreduce"), p50(e1, "tf.identity")
    over_id = None if hvd1 is None or id1 is None else hvd1 - id1
    rows.append(("eager allreduce 4 B, np=1 (no launcher), p50/p99 us",
                 f"{_f(hvd1)} / {_f(p99(e1, 'hvd.allreduce'))} "
                 f"(generated op {_f(p50(e1, 'generated op'))})",
                 f"tf.identity {_f(id1)} / {_f(p99(e1, 'tf.identity'))}; "
                 f"core B4 np=1 {cf('b4_np1_p50_us')}",
                 f"+{_f(over_id)} us over tf.identity (goal <= +15)"))
    hvd2 = p50(e2, "hvd.allreduce")
    r_b4 = _ratio(hvd2, fig["b4_np2_p50_us"])
    rows.append(("eager allreduce 4 B, np=2, p50/p99 us",
                 f"{_f(hvd2)} / {_f(p99(e2, 'hvd.allreduce'))} "
                 f"(generated op {_f(p50(e2, 'generated op'))})",
                 f"core B4 {cf('b4_np2_p50_us')}; mpi4py {_f(p50(e2, 'mpi4py Allreduce'))}; "
                 f"tf.identity {_f(p50(e2, 'tf.identity'))}",
                 f"{_f(r_b4, '{:.2f}x')} B4 (goal <= 1.3)"))
    b3 = fig["b3_small_us_per_tensor"]
    for k, label in (("tf.function allreduce per tensor", "per-tensor allreduce"),
                     ("tf.function grouped_allreduce", "grouped_allreduce")):
        rows.append((f"small_mixed in one tf.function, {label}, us/tensor beyond identity",
                     _f(sm.get(k), "{:.2f}"),
                     f"core B3 {cf('b3_small_us_per_tensor', '{:.2f}')}; mpi4py per tensor "
                     f"{_f(sm.get('mpi4py Allreduce per tensor'), '{:.2f}')}",
                     f"{_f(_ratio(sm.get(k), b3), '{:.2f}x')} B3 (goal <= 1.5)"))
    b1 = fig["b1_ms"]
    # The core through its C API in the same process and rounds, doing what each TF row asks of
    # it: the tf.functions' inputs are the caller's tensors, so their ops reduce into separate
    # outputs (Sum); the tape's gradients are forwarded, so its ops reduce in place (Average).
    core_ip = rn.get(CORE_IN_PROCESS)
    core_oop, core_avg = rn.get(CORE_IN_PROCESS_OOP), rn.get(CORE_IN_PROCESS_AVG)
    for k, label, ref, ref_name in (
            ("tf.function grouped_allreduce", "tf.function grouped_allreduce", core_oop,
             "out of place"),
            ("tf.function allreduce per tensor", "tf.function allreduce per tensor", core_oop,
             "out of place"),
            ("DistributedGradientTape", "DistributedGradientTape (average)", core_avg,
             "average")):
        rows.append((f"ResNet-50 set, {label}, ms beyond baseline", _f(rn.get(k)),
                     f"core B1 {cf('b1_ms')}; in process: in place {_f(core_ip)}, {ref_name} "
                     f"{_f(ref)}; mpi4py per tensor "
                     f"{_f(rn.get('mpi4py Allreduce per tensor'))}, chunked "
                     f"{_f(rn.get('mpi4py chunked (best)'))}",
                     f"{_f(_ratio(rn.get(k), b1), '{:.2f}x')} B1, "
                     f"{_f(_ratio(rn.get(k), ref), '{:.2f}x')} in process {ref_name} "
                     "(goal <= 1.1)"))
    ratios = {
        "eager_np1_us_over_tf_identity": over_id,
        "eager_np2_p50_over_core_b4": r_b4,
        "small_per_tensor_over_core_b3": _ratio(sm.get("tf.function allreduce per tensor"), b3),
        "small_grouped_over_core_b3": _ratio(sm.get("tf.function grouped_allreduce"), b3),
        "resnet_grouped_over_core_b1": _ratio(rn.get("tf.function grouped_allreduce"), b1),
        "resnet_per_tensor_over_core_b1": _ratio(rn.get("tf.function allreduce per tensor"), b1),
        "resnet_tape_over_core_b1": _ratio(rn.get("DistributedGradientTape"), b1),
        "resnet_grouped_over_core_in_process_out_of_place":
            _ratio(rn.get("tf.function grouped_allreduce"), core_oop),
        "resnet_per_tensor_over_core_in_process_out_of_place":
            _ratio(rn.get("tf.function allreduce per tensor"), core_oop),
        "resnet_tape_over_core_in_process_average": _ratio(rn.get("DistributedGradientTape"),
                                                           core_avg),
        "core_in_process_out_of_place_over_in_place": _ratio(core_oop, core_ip),
    }
    def eager_split(e: Dict[str, Any], b4: Optional[float]) -> Dict[str, Optional[float]]:
        """p50 differences: the wrapper, TF's dispatch, the rest of the op and what B4 takes."""
        hvd, gen, ident = (p50(e, k) for k in ("hvd.allreduce", "generated op", "tf.identity"))
        sub = lambda a, b: None if a is None or b is None else a - b  # noqa: E731
        op_rest = sub(gen, ident)
        return {"python_wrapper_us": sub(hvd, gen), "tf_dispatch_us (tf.identity)": ident,
                "op_kernel_runtime_completion_us": op_rest, "core_b4_us": b4,
                "tf_side_beyond_core_us": sub(op_rest, b4)}

    split_sub = {"eager_np1": eager_split(e1, fig["b4_np1_p50_us"]),
                 "eager_np2": eager_split(e2, fig["b4_np2_p50_us"])}
    profiles = {}
    for name in sorted(os.listdir(tmp)):
        if name.startswith("profile-") and name.endswith(".json"):
            profiles[name[len("profile-"):-len(".json")]] = _load(os.path.join(tmp, name))
    run = json.loads(os.environ.get("B7_RUN_INFO") or "{}")
    split_lines = []
    for name, sp in split_sub.items():
        split_lines.append(
            f"{name} by subtraction (p50 us): horovod_compat Python {_f(sp['python_wrapper_us'])}"
            f" (hvd.allreduce - generated op); TF eager dispatch ~"
            f"{_f(sp['tf_dispatch_us (tf.identity)'])} (tf.identity); op kernel + runtime + "
            f"completion {_f(sp['op_kernel_runtime_completion_us'])} (generated op - "
            f"tf.identity), of which the core's enqueue->callback (B4) {_f(sp['core_b4_us'])} "
            f"and {_f(sp['tf_side_beyond_core_us'])} beyond it")
    result = {"benchmark": "B7", "np": 2, "run": run, "tf_np1": np1, "tf_np2": np2,
              "split_by_subtraction": split_sub,
              "core_figures": fig, "core_figures_before": fig_before,
              "core_figures_after": fig_after, "ratios": ratios, "core": core,
              "core_after": core_after, "profiles": profiles,
              "verified": bool(np1 and np1.get("verified") and np2 and np2.get("verified"))}
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [" | ".join(r[i].ljust(w[i]) for i in range(4)) for r in
             [("what", "through TF", "reference (same run)", "ratio (issue-15 goal)")] + rows]
    lines.insert(1, "-+-".join("-" * x for x in w))
    lines.append("core figures: mean of hvdc_bench before and after the TF runs (before/after); "
                 f"B1 raw best-chunked {cf('b1_raw_chunked_ms')} ms, B3 raw per tensor "
                 f"{cf('b3_small_raw_us_per_tensor', '{:.2f}')} us, B4 raw "
                 f"{cf('b4_np2_raw_p50_us')} us")
    lines.extend(split_lines)
    profile_diff = {}
    for label, base, per in (("eager", "eager-identity", 1), ("small", "small-identity", 1000)):
        a, b = profiles.get(label) or {}, profiles.get(base) or {}
        if a.get("cpu_us_per_call") and b.get("cpu_us_per_call"):
            diff = {k: (v - b["cpu_us_per_call"].get(k, 0.0)) / per
                    for k, v in a["cpu_us_per_call"].items()}
            total = (a["cpu_us_per_call_total"] - b["cpu_us_per_call_total"]) / per
            profile_diff[label] = {"cpu_us_total": total, "cpu_us_by_category": diff}
            what = ("eager np=2: rank 0's CPU per allreduce beyond tf.identity" if per == 1 else
                    "small_mixed tf.function: rank 0's CPU per tensor beyond the identity function")
            lines.append(f"{what} (perf, all its threads): {total:.1f} us = " + ", ".join(
                f"{k} {v:.1f}" for k, v in sorted(diff.items(), key=lambda kv: -kv[1])
                if abs(v) >= 0.05))
    result["profile_difference"] = profile_diff
    for name, prof in profiles.items():
        if prof:
            split = ", ".join(f"{k} {v:.0f} %" for k, v in prof.get("percent", {}).items())
            lines.append(f"profile {name} (perf -g, rank 0's loop, {prof.get('samples', 0)} "
                         f"samples, {prof.get('cpu_cores_busy', 0):.2f} cores busy, "
                         f"{prof.get('us_per_call_while_profiled', 0):.0f} us/call): {split}")
            lines.append("  by thread: " + ", ".join(
                f"{k} {v:.0f} %" for k, v in prof.get("percent_by_thread", {}).items()))
    return result, lines


def report_main(argv: List[str]) -> int:
    tmp, out = argv[0], argv[1]
    result, lines = build(tmp)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print("\n".join(lines))
    print(f"values verified: {result['verified']}; wrote {out}")
    return 0 if result["verified"] else 3



# ---- profile: where rank 0's CPU goes in a perf record of one loop

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


def profile_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="b7_report.py profile")
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--pid", type=int, required=True, help="rank 0's pid (its main thread)")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--freq", type=float, default=0.0)
    p.add_argument("--label", default="")
    p.add_argument("--calls", type=int, default=0)
    a = p.parse_args(argv)
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



# ---- compare: several runs' b7-np2.json side by side

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


def compare_main(paths: List[str]) -> int:
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



def main(argv: List[str]) -> int:
    if argv and argv[0] == "profile":
        return profile_main(argv[1:])
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    return report_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
