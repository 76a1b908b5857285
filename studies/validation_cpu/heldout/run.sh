#!/usr/bin/env bash
# Held-out validation (issue 20): calibrate this machine once -- the machine grid, no --model --
# then run six models the calibration never saw on the torch executor and the simulator.
# On a quiet machine: about 4 minutes of calibration and 25-50 minutes of validation, each round
# of every model in turn (ROUNDS=3, the matrices' count).
#   bash studies/validation_cpu/heldout/run.sh            # from the repository root
# QUICK=1 runs a smoke test instead (quick calibration, one round, each model's first plan on 2
# ranks and last on 4; ~10 minutes on a loaded 2-core VM) into /tmp/parsim-heldout-smoke.
# Also: make heldout / make heldout-smoke.
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=studies/validation_cpu/heldout
PY=.venv/bin/python
export OMP_NUM_THREADS=1
# freed host memory is reused, as a GPU framework's caching allocator does: no first-touch page
# faults in the executor's steps that the simulator leaves out (page_faults.txt); the profile
# records the policy and parsim validate runs the executor under it
export PARSIM_HOST_MEMORY=${PARSIM_HOST_MEMORY:-keep}
OUT=${OUT:-$HERE}
if [[ "${QUICK:-0}" == 1 ]]; then
  OUT=${OUT_QUICK:-/tmp/parsim-heldout-smoke}
  mkdir -p "$OUT"
  .venv/bin/parsim calibrate --quick --ranks 2,4 --out "$OUT/profile.yaml"
  for m in gpt llama deep wide long drop; do
    $PY - "$HERE/matrix_$m.yaml" "$OUT/matrix_$m.yaml" <<'PYEOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d.update(rounds=1, steps=4, warmup=1, plans=[d["plans"][0], d["plans"][-1]])   # 2 ranks, 4 ranks
yaml.safe_dump(d, open(sys.argv[2], "w"), sort_keys=False)
PYEOF
    .venv/bin/parsim validate --matrix "$OUT/matrix_$m.yaml" --profile "$OUT/profile.yaml" --out "$OUT/$m" --fresh
  done
else
  mkdir -p "$OUT"
  .venv/bin/parsim calibrate --ranks 2,4 --out "$OUT/profile.yaml" | tee "$OUT/calibrate.txt"
  # round 1 of every model, then round 2 of every model, ...: a slow spell of the machine (minutes)
  # falls on every model's plans, not on one model's five (runs j and before took each model's
  # three rounds back to back); a later call measures the missing round and judges again
  ROUNDS=${ROUNDS:-3}
  for r in $(seq 1 "$ROUNDS"); do
    fresh=()
    if [[ $r == 1 ]]; then fresh=(--fresh); fi
    for m in gpt llama deep wide long drop; do
      mkdir -p "$OUT/$m"
      .venv/bin/parsim validate --matrix "$HERE/matrix_$m.yaml" --profile "$OUT/profile.yaml" --out "$OUT/$m" \
        --rounds "$r" "${fresh[@]}" > "$OUT/$m/results.txt"
    done
  done
  for m in gpt llama deep wide long drop; do cat "$OUT/$m/results.txt"; done
fi
# where each plan's error sits, by action kind (F, B, optimizer, other, idle), per model
for m in gpt llama deep wide long drop; do
  $PY studies/validation_cpu/decompose.py "$OUT/$m" --profile "$OUT/profile.yaml" > "$OUT/$m/decompose.txt"
  $PY $HERE/actions.py "$OUT/$m" > "$OUT/$m/actions.txt"     # and action by action, rank by rank
done
$PY $HERE/summary.py "$OUT" | tee "$OUT/summary.txt"
