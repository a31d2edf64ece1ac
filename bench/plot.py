#!/usr/bin/env python3
"""Plots the B0 sweep (ours vs raw MPI_Allreduce vs memcpy, across sizes) from hvdc_bench's JSON.

    python3 bench/plot.py [RESULTS_DIR]      -> RESULTS_DIR/b0_sweep.png

Needs matplotlib; nothing else in bench/ does.
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label_bytes(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:g} {unit}"
    return f"{b:g} B"


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results")
    files = sorted(glob.glob(os.path.join(results, "b0-np*.json")))
    if not files:
        print(f"plot.py: no b0-np*.json in {results}")
        return 0
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(13, 5))
    xmax = 4
    colors = {2: "tab:blue", 3: "tab:orange", 4: "tab:green"}
    for path in files:
        with open(path) as f:
            r = json.load(f)
        np_ = r["np"]
        tag = f"np={np_}" + (" (oversubscribed)" if r.get("oversubscribed") else "")
        c = colors.get(np_, None)
        rows = r["sweep"]
        x = [row["bytes"] for row in rows]
        xmax = max([xmax] + x)
        raw = [row["raw_time_s"]["median"] * 1e6 for row in rows]
        ax_t.plot(x, raw, "o--", color=c, label=f"raw MPI_Allreduce, {tag}")
        if all("ours_time_s" in row for row in rows):
            ours = [row["ours_time_s"]["median"] * 1e6 for row in rows]
            ax_t.plot(x, ours, "s-", color=c, label=f"ours (hvdc_enqueue), {tag}")
            ax_r.plot(x, [o / w for o, w in zip(ours, raw)], "s-", color=c, label=f"ours / raw, {tag}")
        if np_ == 2:
            mc = [row["memcpy_time_s"]["median"] * 1e6 for row in rows]
            ax_t.plot(x, mc, ":", color="gray", label="memcpy of the same bytes (floor), np=2")
    for ax in (ax_t, ax_r):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank (fp32 sum)")
        ax.grid(True, which="both", alpha=0.3)
        ticks = [4 ** k for k in range(1, 15) if 4 ** k <= xmax]
        ax.set_xticks(ticks)
        ax.set_xticklabels([label_bytes(t) for t in ticks], rotation=45, ha="right", fontsize=8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("median time per allreduce (µs), max over ranks")
    ax_t.set_title("single-tensor allreduce: ours vs raw MPI")
    ax_t.legend(fontsize=7)
    ax_r.set_yscale("log")
    ax_r.axhline(1.0, color="black", lw=0.8)
    ax_r.set_ylabel("ours / raw MPI (median)")
    ax_r.set_title("ratio (lower is better; < 1 = faster than one MPI call)")
    ax_r.legend(fontsize=7)
    date = ""
    try:
        with open(files[0]) as f:
            date = json.load(f).get("date", "")
    except OSError:
        pass
    fig.suptitle(f"hvdc_bench B0 sweep, 2-core VM, {date}", fontsize=10)
    fig.tight_layout()
    out = os.path.join(results, "b0_sweep.png")
    fig.savefig(out, dpi=110)
    print(f"plot.py: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
