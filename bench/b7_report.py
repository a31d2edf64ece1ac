"""B7 report: merges the TF-path runs (np=1 eager, np=2 all cases) with the core's own B1/B3/B4
from the same run.sh invocation, prints the table with the ratios of the issue-15 goals and writes
one JSON (bench/results/b7-np2.json).

    python bench/b7_report.py TMPDIR OUT.json
TMPDIR holds tf-np1.json, tf-np2.json, core-b1-np2.json, core-b3-np2.json, core-b4-np2.json,
core-b4-np1.json (any may be missing: its rows say n/a) and optionally profile-*.json.
"""

import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

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


def main() -> int:
    tmp, out = sys.argv[1], sys.argv[2]
    result, lines = build(tmp)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print("\n".join(lines))
    print(f"values verified: {result['verified']}; wrote {out}")
    return 0 if result["verified"] else 3


if __name__ == "__main__":
    sys.exit(main())
