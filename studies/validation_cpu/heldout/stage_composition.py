"""What composing ops into a pass costs, by op size: the calibration's synthetic stages
(``calibration.grid.stages``) and the held-out models, each as one stage on one thread, timed
round-robin (one forward + backward sample of each per round, the cache swept before each pass),
against their ops priced alone by PROFILE (no composition terms). Per pass, the fit of one
factor (measured = c x alone) and of two terms (c x alone + tau x ops) over all of them, and each
stage's residual under both: a factor alone prices a stage of many small ops fast and one of few
large ops slow.

    OMP_NUM_THREADS=1 .venv/bin/python studies/validation_cpu/heldout/stage_composition.py PROFILE [MODEL[:key=value...] ...]   # ~2 min

MODEL: a key of ``model_*.yaml`` here, optionally with integer fields replaced (``wide:vocab=256``).
"""
import dataclasses
import os
import statistics
import sys
from pathlib import Path

import numpy as np
os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
import torch
from parsim.calibration.layer_terms import stage_prices
from parsim.calibration.stages import stage_step
from parsim.calibration.compute import pass_samples
from parsim.calibration.cache import Evictor
from parsim.calibration.grid import stages
from parsim.calibration.timer import Clock
from parsim.executor.host_alloc import apply_host_memory_policy
from parsim.specs import load_cluster, load_model
apply_host_memory_policy(); torch.set_num_threads(1)
device, clock = load_cluster("cpu:1", profile=sys.argv[1]).device, Clock(torch.device("cpu"))
raw = dataclasses.replace(device, tables=device.tables.replace(layer_composition=None))
rounds = int(os.environ.get("ROUNDS", "10"))
vs = []
for spec, mbs in stages("cpu"):
    vs.append((spec.name, spec, mbs))
for arg in sys.argv[2:]:
    name, *kv = arg.split(':')
    model = load_model(Path(__file__).parent / f"model_{name}.yaml")
    vs.append((arg, dataclasses.replace(model, **{k: int(v) for k, v in (x.split('=') for x in kv)}), 1))
runs = []
for arg, model, mbs in vs:
    f, b, _ = stage_step(model, mbs, 'fp32', clock.device)
    pass_samples(f, b, clock, 0, 2)
    runs.append((f, b, [], []))
ev = Evictor(clock.device)
for r in range(rounds):
    for f, b, fs, bs in runs:
        a, c = pass_samples(f, b, clock, 1, 0, before_pass=ev)
        fs += a; bs += c
rows = []
for (arg, model, mbs), (f, b, fs, bs) in zip(vs, runs):
    p = stage_prices(raw, 'fp32', model, mbs)
    rows.append((arg, statistics.median(fs), statistics.median(bs), p['fwd'][0], p['bwd'][0], p['fwd'][1], p['bwd'][1]))
for i, pass_ in ((1, 'fwd'), (2, 'bwd')):
    m = np.array([r[i] for r in rows]); a = np.array([r[i + 2] for r in rows]); n = np.array([r[i + 4] for r in rows])
    c1 = np.sum(a * m / m**2) / np.sum((a / m)**2)  # one factor, relative LS
    (c, tau), *_ = np.linalg.lstsq(np.stack([a / m, n / m], 1), np.ones(len(m)), rcond=None)
    print(f"{pass_}: one factor {c1:.3f}; two terms c={c:.3f} tau={tau*1e6:.1f} us/op")
    for r, mm, aa, nn in zip(rows, m, a, n):
        print(f"   {r[0]:22s} ops {nn:4d} meas {mm*1e3:7.1f} alone {aa*1e3:7.1f} ratio {mm/aa:.3f}  one-factor {c1*aa/mm-1:+6.1%}  two-term {(c*aa+tau*nn)/mm-1:+6.1%}")
