#!/usr/bin/env bash
# GPU check on one lent GPU: calibrate with --device cuda, then validate a 1-GPU matrix with the
# calibrated profile, and predict the same plans with the shipped datasheet profile (h100-sxm).
# Run in the repository root on the GPU machine; OUT is where results go (default out/gpu_h100).
set -u
OUT=${OUT:-out/gpu_h100}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
MATRIX=${MATRIX:-studies/gpu_h100/matrix.yaml}
MODEL=$(python3 -c "import yaml,sys; print(yaml.safe_load(open('$MATRIX'))['model'])")
if [ ! -f "$OUT/h100-measured.yaml" ]; then
  time timeout 300 python3 -m parsim calibrate --device cuda --ranks 1 --base h100-sxm --dtype bf16 \
      --model "$MODEL" --mbs 1,4 --tp 1 --name h100-measured --out "$OUT/h100-measured.yaml" 2>&1 | tail -12
fi
time timeout 400 python3 -m parsim validate --matrix "$MATRIX" --profile "$OUT/h100-measured.yaml" \
    --out "$OUT/val" --worst 0 2>&1 | grep -v "it/s\|run/s" | tail -25
python3 - "$MATRIX" "$OUT/val/validation.csv" <<'PY'
import sys, yaml, pandas as pd
from parsim.sim import simulate
from parsim.specs import load_cluster, parse_plan
m = yaml.safe_load(open(sys.argv[1])); v = pd.read_csv(sys.argv[2])
print(f"{'plan':40s} {'measured ms':>12s} {'calibrated ms':>14s} {'shipped ms':>11s} {'err cal':>8s} {'err shipped':>11s}")
for _, r in v.iterrows():
    res = simulate(m["model"], load_cluster("h100-sxm:1"), parse_plan(r["plan"]))
    meas = r["measured_step_s"]; cal = r["predicted_step_s"]; shp = res.step_time_s
    print(f"{r['plan']:40s} {meas*1e3:12.1f} {cal*1e3:14.1f} {shp*1e3:11.1f} {cal/meas-1:+8.1%} {shp/meas-1:+11.1%}")
PY
cp "$OUT/val/validation.csv" "$OUT/" 2>/dev/null; ls "$OUT/val"
