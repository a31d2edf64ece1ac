#!/usr/bin/env python3
"""Summarises hvdc_bench's JSON results as the Markdown table bench/README.md carries.

    python3 bench/summarize.py [RESULTS_DIR] [--transport tcp]

--transport tcp reads the runs of `bench/run.sh --transport tcp` (<b>-tcp-np<N>.json) instead,
and where torch.distributed's gloo backend ran beside them (<b>-torchgloo-np2.json, from
bench/torch_gloo.py) adds a table of ours over TCP vs Open MPI over TCP vs torch gloo.

Standard library only.
"""
import glob
import json
import os
import sys


TAG = ""  # "-tcp" with --transport tcp


def load(results, name):
    out = {}
    for path in sorted(glob.glob(os.path.join(results, f"{name}{TAG}-np*.json"))):
        with open(path) as f:
            r = json.load(f)
        out[r["np"]] = r
    return out


def np_label(r):
    if r.get("oversubscribed"):
        return f"{r['np']} (oversub.)"
    return f"{r['np']}" + (" pinned" if r.get("pinned") else "")


def verdict(value, limit):
    if value <= limit:
        return "**met**"
    return f"missed by {100 * (value / limit - 1):.0f} %"


def ms(x):
    return f"{x * 1e3:.1f} ms"


def load_torch(results, name):
    path = os.path.join(results, f"{name}-torchgloo-np2.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def us(x):
    return f"{x:.1f} us"


def torch_table(results):
    """ours over TCP / Open MPI over TCP / torch.distributed gloo, np=2, from one run's JSON."""
    ours = {b: load(results, b).get(2) for b in ("b1", "b3", "b4")}
    gloo = {b: load_torch(results, b) for b in ("b1", "b3", "b4")}
    if not any(gloo.values()):
        return
    rows = []
    o, g = ours["b1"], gloo["b1"]
    if o and g:
        om = o["ours"]["time_s"]["median"]
        gc, gp = g["torch_best_chunked"], g["torch_per_tensor"]
        rows.append((
            "B1 resnet50_keras, ms/step (median)",
            f"{ms(om)}",
            f"best-chunked ({o['chunk_sweep']['best_chunk']}) {ms(o['raw_best_chunked']['time_s']['median'])};"
            f" per-tensor {ms(o['raw_per_tensor']['time_s']['median'])}",
            f"best-chunked ({g['chunk_sweep']['best_chunk']}) {ms(gc['time_s']['median'])};"
            f" per-tensor {ms(gp['time_s']['median'])};"
            f" async {ms(g['torch_per_tensor_async']['time_s']['median'])};"
            f" fused + copies {ms(g['torch_fused_with_copies']['time_s']['median'])}",
            f"{om / gc['time_s']['median']:.2f}x best-chunked; {om / gp['time_s']['median']:.2f}x per-tensor"))
    o, g = ours["b3"], gloo["b3"]
    if o and g:
        gsets = {s_["tensor_set"]: s_ for s_ in g["sets"]}
        for s_ in o["sets"]:
            t = gsets.get(s_["tensor_set"])
            if not t:
                continue
            rows.append((
                f"B3 {s_['tensor_set']}, us/tensor (median)",
                f"{s_['ours_us_per_tensor']:.2f}",
                f"per-tensor {s_['raw_per_tensor_us_per_tensor']:.2f}",
                f"per-tensor {t['torch_per_tensor_us_per_tensor']:.1f};"
                f" async {t['torch_per_tensor_async_us_per_tensor']:.1f};"
                f" fused {t['torch_fused_us_per_tensor']:.2f}",
                f"{s_['ours_us_per_tensor'] / t['torch_fused_us_per_tensor']:.2f}x fused;"
                f" {s_['ours_us_per_tensor'] / t['torch_per_tensor_us_per_tensor']:.3f}x per-tensor"))
    o, g = ours["b4"], gloo["b4"]
    if o and g:
        gsizes = {s_["bytes"]: s_["latency_us"]["torch all_reduce"] for s_ in g["sizes"]}
        for s_ in o["sizes"]:
            t = gsizes.get(s_["bytes"])
            if not t:
                continue
            lat = s_["latency_us"]
            mine = lat.get("ours (block)") or next(v for k, v in lat.items() if k.startswith("ours"))
            raw = lat.get("raw MPI_Allreduce", {})
            rows.append((
                f"B4 {s_['bytes']} B, p50 / p99",
                f"{us(mine['median'])} / {us(mine['p99'])} (block)",
                f"{us(raw.get('median', 0))} / {us(raw.get('p99', 0))}",
                f"{us(t['median'])} / {us(t['p99'])}",
                f"{mine['median'] / t['median']:.2f}x p50; {mine['p99'] / t['p99']:.2f}x p99"))
    if not rows:
        return
    g0 = next(r for r in gloo.values() if r)
    print()
    print(f"np=2 pinned over TCP: ours vs Open MPI (btl tcp,self) vs torch.distributed gloo"
          f" (torch {g0.get('torch_version', '?')})")
    print()
    print("| benchmark | ours over TCP | Open MPI over TCP | torch gloo | ours / torch |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    loads = [f"{b}: ours+MPI {ours[b].get('loadavg_at_end', '?').split(' ')[0]},"
             f" torch {gloo[b].get('loadavg_at_start', '?').split(' ')[0]}"
             f"..{gloo[b].get('loadavg_at_end', '?').split(' ')[0]}"
             for b in ("b1", "b3", "b4") if ours[b] and gloo[b]]
    print()
    print("1-minute load average (ours+MPI at its end; torch at its start..end): " + "; ".join(loads))


def main():
    global TAG
    args = sys.argv[1:]
    if "--transport" in args:
        i = args.index("--transport")
        TAG = "" if args[i + 1] == "mpi" else "-" + args[i + 1]
        del args[i:i + 2]
    results = args[0] if args else os.path.join(os.path.dirname(__file__), "results")
    rows = []
    add = rows.append

    for np_, r in sorted(load(results, "b1").items()) + sorted(load(results, "b2").items()):
        bid = "B1" if r["benchmark"] == "b1" else "B2"
        o, c, p = r["ours"], r["raw_best_chunked"], r["raw_per_tensor"]
        rc, rp = r["ratio_vs_best_chunked"]["median"], r["ratio_vs_per_tensor"]["median"]
        add((bid, np_label(r),
             f"{ms(o['time_s']['median'])} (p90 {ms(o['time_s']['p90'])}), busbw {o['busbw_GBps']:.2f} GB/s,"
             f" runtime CPU {ms(o['runtime_threads_cpu_s_per_step'])}/step",
             f"best-chunked ({r['chunk_sweep']['best_chunk']}) {ms(c['time_s']['median'])};"
             f" per-tensor {ms(p['time_s']['median'])}; memcpy floor {ms(r['memcpy_floor']['time_s']['median'])}",
             f"{rc:.2f}x chunked (p90 {r['ratio_vs_best_chunked']['p90']:.2f}x); {rp:.2f}x per-tensor;"
             f" {r['ratio_vs_memcpy_floor']:.1f}x memcpy",
             "<= 1.10x chunked; <= 1.0x per-tensor",
             f"{verdict(rc, 1.10)}; {verdict(rp, 1.0)}" if np_ == 2 else "(np=2 target)"))
        paced = r.get("paced", {})
        for mode in ("busy", "sleep"):
            if mode not in paced:
                continue
            pm = paced[mode]
            pct = pm["exposed_pct_of_unpaced_median"]
            add((f"{bid}p ({mode})", np_label(r),
                 f"step {ms(pm['step_time_s']['median'])} over a {ms(pm['window_s'])} window",
                 f"{bid} step {ms(pm['window_s'])}",
                 f"exposed {ms(pm['exposed_s_median'])} = {pct:.0f} % (p90 {pm['exposed_pct_of_unpaced_p90']:.0f} %)",
                 "exposed <= 30 %" if mode == "busy" else "(no target: compute off the core)",
                 verdict(pct, 30.0) if mode == "busy" and np_ == 2 else "-"))

    for np_, r in sorted(load(results, "b3").items()):
        for s in r["sets"]:
            us = s["ours_us_per_tensor"]
            sp = s["speedup_vs_per_tensor_raw"]
            coll = s.get("collectives_per_step_rank0")
            target, verdict_s = "-", "-"
            if np_ == 2:
                target, verdict_s = "<= 5 us/tensor", verdict(us, 5.0)
            elif np_ == 4:
                target, verdict_s = ">= 5x faster than per-tensor", verdict(5.0 / sp, 1.0)
            add(("B3 " + s["tensor_set"], np_label(r),
                 f"{us:.2f} us/tensor ({ms(s['ours_time_s']['median'])}/step)"
                 + (f", {coll:.1f} MPI collectives/step" if coll is not None else ""),
                 f"per-tensor raw {s['raw_per_tensor_us_per_tensor']:.2f} us/tensor",
                 f"{sp:.2f}x {'faster' if sp >= 1 else 'slower'}", target, verdict_s))

    for np_, r in sorted(load(results, "b4").items()):
        for s in r["sizes"]:
            lat = s["latency_us"]
            raw = lat.get("raw MPI_Allreduce", {})
            for name, v in lat.items():
                if not name.startswith("ours"):
                    continue
                add((f"B4 {s['bytes']} B, {name[6:-1]}", np_label(r),
                     f"p50 {v['median']:.1f} us, p99 {v['p99']:.1f} us",
                     f"raw p50 {raw.get('median', 0):.1f} us, p99 {raw.get('p99', 0):.1f} us",
                     f"{v['median'] / max(raw.get('median', 1e-9), 1e-9):.0f}x raw", "p50 <= 50 us",
                     verdict(v["median"], 50.0)))

    for np_, r in sorted(load(results, "b4i").items()):
        for ph in r["phases"]:
            pct = ph["runtime_threads_cpu_pct_of_core_max_over_ranks"]
            add((f"B4i {ph['phase']}", np_label(r),
                 f"{pct:.3f} % of a core ({ph['runtime_mpi_polls_per_s_max_over_ranks']:.0f} MPI polls/s,"
                 f" {ph['runtime_mpi_collectives_per_s_max_over_ranks']:.1f} collectives/s)",
                 "-", "-", "<= 1 %", verdict(pct, 1.0)))

    for np_, r in sorted(load(results, "b6").items()):
        for s in r["sets"]:
            mib = 1 << 20
            over = s["peak_minus_tensors_minus_before_bytes_max_over_ranks"] / mib
            lit = s["peak_minus_tensors_bytes_max_over_ranks"] / mib
            limit = (min(s["fusion_threshold_bytes"], s["tensor_bytes"]) + 32 * mib) / mib
            add((f"B6 {s['tensor_set']}", np_label(r),
                 f"peak RSS {s['peak_rss_bytes_max_over_ranks'] / mib:.0f} MiB; minus tensors {lit:.1f} MiB;"
                 f" minus tensors and prior RSS {over:.1f} MiB",
                 f"tensors {s['tensor_bytes'] / mib:.1f} MiB",
                 "-", f"<= fusion buffer used + 32 MiB (<= {limit:.0f} MiB)",
                 f"{verdict(over, limit)} (also <= 32 MiB: {'yes' if over <= 32 else 'no'})"))

    print("| benchmark | np | ours | reference | ratio | target | verdict |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")

    b0 = load(results, "b0")
    if b0:
        print()
        print("B0 sweep (median µs, max over ranks): raw MPI_Allreduce / ours (single tensor) / memcpy")
        print()
        sizes = [row["bytes"] for row in next(iter(b0.values()))["sweep"]]
        print("| bytes | " + " | ".join(f"np={k}{' (oversub.)' if v.get('oversubscribed') else ''}"
                                       for k, v in sorted(b0.items())) + " |")
        print("|---|" + "---|" * len(b0))
        for i, b in enumerate(sizes):
            cells = []
            for _, r in sorted(b0.items()):
                if i >= len(r["sweep"]):
                    cells.append("-")
                    continue
                row = r["sweep"][i]
                ours = row.get("ours_time_s", {}).get("median")
                cells.append(f"{row['raw_time_s']['median'] * 1e6:.1f} / "
                             + (f"{ours * 1e6:.1f}" if ours is not None else "-")
                             + f" / {row['memcpy_time_s']['median'] * 1e6:.1f}")
            print(f"| {b} | " + " | ".join(cells) + " |")
        print()
        for _, r in sorted(b0.items()):
            for s in r.get("tensor_sets", []):
                chunks = ", ".join(f"{e['chunk']} {e['time_s']['median'] * 1e3:.1f}" for e in s["chunks"])
                print(f"- np={r['np']} {s['tensor_set']}: chunked raw (ms) {chunks}; best {s['best_chunk']};"
                      f" memcpy {s['memcpy_time_s']['median'] * 1e3:.1f} ms ({s['memcpy_GBps_per_rank']:.2f} GB/s per rank)")

    loads = set()
    for name in ("b0", "b1", "b2", "b3", "b4", "b4i", "b6"):
        for _, r in load(results, name).items():
            loads.add(f"{name}{TAG}-np{r['np']}: {r.get('loadavg_at_end', '?').split(' ')[0]}")
    if loads:
        print()
        print("1-minute load average at the end of each run: " + ", ".join(sorted(loads)))
    if TAG == "-tcp":
        torch_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
