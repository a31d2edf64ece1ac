#!/usr/bin/env bash
# B5 (BENCHMARKS.md): wide-MLP Keras model.fit at np=2 through horovod_compat's DistributedOptimizer
# (hvd), through horovod_compat's HorovodStrategy (strategy) and through
# tf.distribute.MultiWorkerMirroredStrategy (mwms: 2 local workers, RING over gRPC), back to back in
# one run. Prints a table (step median/p90 of each; ratios strategy/MWMS (goal <= 0.55),
# strategy/hvd (goal <= 1.05), hvd/MWMS (target <= 0.8)) and writes bench/results/b5-np2.json.
# A mode that fails is reported (log tail, "failed" in the JSON) and the script exits non-zero
# after running the others.
# MODEL=resnet50 runs the same three modes on a synthetic keras.applications.ResNet50 instead
# (IMAGE x IMAGE inputs, default 64; per-rank batch 16, 3 warm-up + 10 steps, TIMEOUT_S 600;
# writes bench/results/b5-resnet50-np2.json).
# Env: PY (python of the venv), WARMUP (5), STEPS (20), BATCH (per-rank, 32), TIMEOUT_S per mode (240),
#      ORDER ("hvd strategy mwms"), STRATEGY_INPUT ("function" | "global"), MODEL (mlp | resnet50),
#      IMAGE (64), OUT (bench/results/b5-np2.json), EXTRA (more b5_keras.py flags for every mode).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
MODEL="${MODEL:-mlp}"
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
if [[ $MODEL == resnet50 ]]; then
  WARMUP="${WARMUP:-3}"; STEPS="${STEPS:-10}"; BATCH="${BATCH:-16}"; TIMEOUT_S="${TIMEOUT_S:-600}"
  OUT="${OUT:-$ROOT/bench/results/b5-resnet50-np2.json}"
  EXTRA_ARGS+=(--model resnet50 --image-size "${IMAGE:-64}")
elif [[ $MODEL == mlp ]]; then
  WARMUP="${WARMUP:-5}"; STEPS="${STEPS:-20}"; BATCH="${BATCH:-32}"; TIMEOUT_S="${TIMEOUT_S:-240}"
  OUT="${OUT:-$ROOT/bench/results/b5-np2.json}"
else
  echo "run_b5: MODEL must be mlp or resnet50" >&2; exit 2
fi
ORDER="${ORDER:-hvd strategy mwms}"
STRATEGY_INPUT="${STRATEGY_INPUT:-function}"
mkdir -p "$(dirname "$OUT")"
TMP="$(mktemp -d /tmp/b5.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
COMMON=(--batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS" "${EXTRA_ARGS[@]}")
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
START="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

under_mpirun() {  # mode, extra flags...
  local mode="$1"; shift
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2 \
    timeout --kill-after=10 "$TIMEOUT_S" mpirun --timeout "$((TIMEOUT_S - 5))" --bind-to none -np 2 \
    "$PY" bench/b5_keras.py --mode "$mode" "${COMMON[@]}" "$@" --json "$TMP/$mode.json"
}
run_hvd() { under_mpirun hvd; }
run_strategy() { under_mpirun strategy --strategy-input "$STRATEGY_INPUT"; }
run_mwms() {
  TF_CPP_MIN_LOG_LEVEL=2 timeout --kill-after=10 "$TIMEOUT_S" \
    "$PY" bench/b5_keras.py --mode mwms "${COMMON[@]}" --worker-timeout "$((TIMEOUT_S - 10))" \
    --json "$TMP/mwms.json"
}
FAILED=()
for m in $ORDER; do
  rc=0
  "run_$m" >"$TMP/$m.log" 2>&1 || rc=$?
  if [[ $rc != 0 ]]; then
    echo "b5: $m run failed (rc=$rc); tail of log:" >&2
    tail -30 "$TMP/$m.log" >&2
    tail -30 "$TMP/$m.log" >"$TMP/$m.tail"
    echo "$rc" >"$TMP/$m.rc"
    rm -f "$TMP/$m.json"
    FAILED+=("$m")
  fi
  grep '^b5 ' "$TMP/$m.log" || true
done

rc=0
"$PY" - "$TMP" "$OUT" "$START" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$ORDER" <<'PYEOF' || rc=$?
import json, sys, platform, os
tmp, out, start, load0, load1, order = sys.argv[1:7]
modes = order.split()
runs, failed = {}, {}
for m in modes:
    p = os.path.join(tmp, m + ".json")
    if os.path.exists(p):
        runs[m] = json.load(open(p))
    else:
        rcf, tail = os.path.join(tmp, m + ".rc"), os.path.join(tmp, m + ".tail")
        failed[m] = {"failed": True,
                     "rc": int(open(rcf).read()) if os.path.exists(rcf) else None,
                     "log_tail": open(tail).read() if os.path.exists(tail) else ""}

def ratio(a, b, which="rank0"):
    if a not in runs or b not in runs:
        return None
    return {k: runs[a][which][k] / runs[b][which][k] for k in ("median_ms", "p90_ms")}

# (numerator, denominator, goal on the median ratio)
GOALS = [("strategy", "mwms", 0.55), ("strategy", "hvd", 1.05), ("hvd", "mwms", 0.8)]
ratios, ratios_max, verdicts = {}, {}, {}
for a, b, goal in GOALS:
    r = ratio(a, b)
    if r is None:
        continue
    key = f"{a}_over_{b}"
    ratios[key] = r
    ratios_max[key] = ratio(a, b, "max_over_ranks")
    verdicts[key] = {"goal_median_ratio_le": goal, "met": r["median_ms"] <= goal}
ref = runs.get("hvd") or next(iter(runs.values()), None)
rel = {}
if ref is not None:
    for m, r in runs.items():
        rel[m] = max(abs(a - b) / max(abs(b), 1e-30)
                     for a, b in zip(r["weight_checksum"], ref["weight_checksum"]))
ok = all(r["weights_identical_across_ranks"] for r in runs.values())
res = {"benchmark": "B5", "np": 2, "start_utc": start, "host_cpus": os.cpu_count(),
       "loadavg_before": load0, "loadavg_after": load1, "python": platform.python_version(),
       "order": modes}
res.update(runs)
res.update(failed)
res.update({"ratios": ratios, "ratios_max_over_ranks": ratios_max, "goals": verdicts,
            "weights_identical_across_ranks": ok,
            "final_weight_checksum_rel_diff_vs_" + ("hvd" if "hvd" in runs else "first"): rel,
            "failed_modes": sorted(failed)})
if "hvd_over_mwms" in ratios:  # the keys of the two-mode version of this file
    res["ratio_ours_over_mwms"] = ratios["hvd_over_mwms"]
    res["target_ratio"] = 0.8
    res["meets_target"] = verdicts["hvd_over_mwms"]["met"]
json.dump(res, open(out, "w"), indent=1)
print()
if ref is not None:
    what = ("wide MLP" if ref["model"] == "mlp" else
            f"ResNet-50 {ref['image_size']}x{ref['image_size']}")
    print(f"B5 np=2: {what} {ref['params']/1e6:.1f} M params ({ref['grad_bytes']/2**20:.1f} MiB "
          f"grads), global batch {ref['global_batch']}, {ref['warmup']} warm-up + {ref['steps']} "
          f"measured steps, loadavg {load0} -> {load1}")
names = {"hvd": "horovod_compat DistributedOptimizer", "strategy": "horovod_compat HorovodStrategy",
         "mwms": "TF MultiWorkerMirrored (ring)"}
print(f"{'runtime (rank-0 step times)':<38}{'median ms':>11}{'p90 ms':>10}{'mean ms':>10}")
for m in modes:
    if m in runs:
        s = runs[m]["rank0"]
        print(f"{names[m]:<38}{s['median_ms']:>11.1f}{s['p90_ms']:>10.1f}{s['mean_ms']:>10.1f}")
    else:
        print(f"{names[m]:<38}{'FAILED (rc=' + str(failed[m]['rc']) + ')':>31}")
for a, b, goal in GOALS:
    key = f"{a}_over_{b}"
    if key in ratios:
        r = ratios[key]
        print(f"{'ratio ' + a + '/' + b:<38}{r['median_ms']:>11.3f}{r['p90_ms']:>10.3f}"
              f"   goal <= {goal:.2f}: {'MET' if verdicts[key]['met'] else 'NOT MET'}")
print(f"weights identical across ranks: {ok}; final-weight checksum rel diff vs "
      f"{'hvd' if 'hvd' in runs else 'first run'}: "
      + ", ".join(f"{m} {v:.2e}" for m, v in rel.items()))
print(f"wrote {out}")
sys.exit(0 if ok else 3)
PYEOF
if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "b5: failed modes: ${FAILED[*]}" >&2
  exit 1
fi
exit "$rc"
