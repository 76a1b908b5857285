"""Allocation on a CPU: minor page faults per microbatch of a training stage, glibc's default
host memory policy against ``PARSIM_HOST_MEMORY=keep`` (``parsim.executor.host_alloc``).

Each model runs as one stage holding all its layers (``parsim.calibration.stages.stage_step``: the
executor's embedding, blocks, head and loss, forward then backward accumulating into ``.grad``)
in a fresh process per policy; after two warm-up microbatches, the faults of the next four
forwards and backwards are counted (``getrusage`` ``ru_minflt``, 4 KiB pages). Counts, not
times: they do not depend on how busy the machine is.

    .venv/bin/python studies/validation_cpu/page_faults.py > studies/validation_cpu/page_faults.txt
"""
from __future__ import annotations

import json
import subprocess
import sys

MODELS = ["cpu-small", "studies/validation_cpu/heldout/model_gpt.yaml:2",
          "studies/validation_cpu/heldout/model_llama.yaml", "studies/validation_cpu/heldout/model_deep.yaml"]
PAGE = 4096

CHILD = r"""
import json, resource, sys, torch
torch.set_num_threads(1)
from parsim.executor.host_alloc import apply_host_memory_policy
apply_host_memory_policy()
from parsim.specs import load_model
from parsim.calibration.stages import stage_step
spec, mbs = load_model(sys.argv[1]), int(sys.argv[2])
forward, backward, stage = stage_step(spec, mbs, "fp32", torch.device("cpu"))
flt = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for i in range(6):
    a = flt(); forward(); b = flt(); backward(); c = flt()
    if i >= 2:
        counts.append((b - a, c - b))
params = sum(p.numel() for p in stage.parameters())
print(json.dumps({"name": spec.name, "params": params, "counts": counts}))
"""


def faults(model: str, mbs: int, policy: str) -> dict:
    env_cmd = ["env", f"PARSIM_HOST_MEMORY={policy}", "OMP_NUM_THREADS=1", sys.executable, "-c", CHILD, model, str(mbs)]
    return json.loads(subprocess.run(env_cmd, capture_output=True, text=True, check=True).stdout)


def main() -> int:
    print(f"{'model':16s} {'mbs':>3s} {'params MiB':>10s} {'policy':>7s}  faulted MiB per microbatch, forward / backward "
          "(4 microbatches after 2 warm-up)")
    for entry in MODELS:
        model, _, mbs = entry.partition(":")
        for policy in ("system", "keep"):
            r = faults(model, int(mbs or 1), policy)
            fb = " ".join(f"{f * PAGE / 2**20:5.1f}/{b * PAGE / 2**20:5.1f}" for f, b in r["counts"])
            print(f"{r['name']:16s} {int(mbs or 1):3d} {r['params'] * 4 / 2**20:10.1f} {policy:>7s}  {fb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
