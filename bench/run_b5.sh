#!/usr/bin/env bash
# B5 (BENCHMARKS.md): wide-MLP Keras model.fit at np=2 through horovod_compat vs
# tf.distribute.MultiWorkerMirroredStrategy (2 local workers, RING over gRPC), back to back in one run.
# Prints a table (step median/p90, ratio ours/MWMS; target <= 0.8) and writes bench/results/b5-np2.json.
# Env: PY (python of the venv), WARMUP (5), STEPS (20), BATCH (per-rank, 32), TIMEOUT_S per mode (240),
#      ORDER ("hvd mwms"), OUT (bench/results/b5-np2.json).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
WARMUP="${WARMUP:-5}"; STEPS="${STEPS:-20}"; BATCH="${BATCH:-32}"; TIMEOUT_S="${TIMEOUT_S:-240}"
ORDER="${ORDER:-hvd mwms}"
OUT="${OUT:-$ROOT/bench/results/b5-np2.json}"
mkdir -p "$(dirname "$OUT")"
TMP="$(mktemp -d /tmp/b5.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
COMMON=(--batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS")
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
START="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

run_hvd() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2 \
    timeout --kill-after=10 "$TIMEOUT_S" mpirun --timeout "$((TIMEOUT_S - 5))" --bind-to none -np 2 \
    "$PY" bench/b5_keras.py --mode hvd "${COMMON[@]}" --json "$TMP/hvd.json" >"$TMP/hvd.log" 2>&1 \
    || { echo "b5: hvd run failed (rc=$?); tail of log:" >&2; tail -30 "$TMP/hvd.log" >&2; exit 1; }
  grep '^b5 ' "$TMP/hvd.log" || true
}
run_mwms() {
  TF_CPP_MIN_LOG_LEVEL=2 timeout --kill-after=10 "$TIMEOUT_S" \
    "$PY" bench/b5_keras.py --mode mwms "${COMMON[@]}" --worker-timeout "$((TIMEOUT_S - 10))" \
    --json "$TMP/mwms.json" >"$TMP/mwms.log" 2>&1 \
    || { echo "b5: mwms run failed (rc=$?); tail of log:" >&2; tail -30 "$TMP/mwms.log" >&2; exit 1; }
  grep '^b5 ' "$TMP/mwms.log" || true
}
for m in $ORDER; do "run_$m"; done

"$PY" - "$TMP/hvd.json" "$TMP/mwms.json" "$OUT" "$START" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PYEOF'
import json, sys, platform, os
hvd, mwms = (json.load(open(p)) for p in sys.argv[1:3])
out, start, load0, load1 = sys.argv[3:7]
ratio = {k: hvd["rank0"][k] / mwms["rank0"][k] for k in ("median_ms", "p90_ms")}
ratio_max = {k: hvd["max_over_ranks"][k] / mwms["max_over_ranks"][k] for k in ("median_ms", "p90_ms")}
c_h, c_m = hvd["weight_checksum"], mwms["weight_checksum"]
rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(c_h, c_m))
ok = hvd["weights_identical_across_ranks"] and mwms["weights_identical_across_ranks"]
res = {"benchmark": "B5", "np": 2, "start_utc": start, "host_cpus": os.cpu_count(),
       "loadavg_before": load0, "loadavg_after": load1, "python": platform.python_version(),
       "hvd": hvd, "mwms": mwms, "ratio_ours_over_mwms": ratio, "ratio_max_over_ranks": ratio_max,
       "target_ratio": 0.8, "meets_target": ratio["median_ms"] <= 0.8,
       "weights_identical_across_ranks": ok,
       "final_weight_checksum_rel_diff_hvd_vs_mwms": rel}
json.dump(res, open(out, "w"), indent=1)
print()
print(f"B5 np=2: wide MLP {hvd['params']/1e6:.1f} M params ({hvd['grad_bytes']/2**20:.1f} MiB grads), "
      f"global batch {hvd['global_batch']}, {hvd['warmup']} warm-up + {hvd['steps']} measured steps, "
      f"loadavg {load0} -> {load1}")
print(f"{'runtime':<34}{'median ms':>11}{'p90 ms':>10}{'mean ms':>10}")
for name, r in (("horovod_compat (DistributedOpt)", hvd), ("TF MultiWorkerMirrored (ring)", mwms)):
    s = r["rank0"]
    print(f"{name:<34}{s['median_ms']:>11.1f}{s['p90_ms']:>10.1f}{s['mean_ms']:>10.1f}")
print(f"{'ratio ours/MWMS':<34}{ratio['median_ms']:>11.3f}{ratio['p90_ms']:>10.3f}"
      f"   target <= 0.80: {'MET' if res['meets_target'] else 'NOT MET'}")
print(f"weights identical across ranks: {ok}; final-weight checksum hvd vs mwms rel diff {rel:.2e}")
print(f"wrote {out}")
sys.exit(0 if ok else 3)
PYEOF
