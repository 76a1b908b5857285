"""Are the held-out models' passes priced right by a profile when one process runs them alone?
Each held-out model as one stage holding every layer (embedding, layers, head and loss, as the
calibration's synthetic stages run: ``calibration.stages``), at mbs 1 and 2, and the profile's
own synthetic stages beside them, timed in six alternating rounds of 3 samples; each priced op
by op by the profile (its composition terms included: ``calibration.layer_terms.stage_prices``).
A shared VM's speed moves 10-20 % within minutes, so each round's priced / measured is also read
against the median of the profile's own stages in that round (the level the calibration set
its composition terms at): the "relative" columns.

If these read near 1 where a 2-rank plan's actions read 1.1-1.2 (``action_bias.txt``), the
excess is in what the plan adds (ranks at once on the host), not in the ops' prices.

    .venv/bin/python studies/validation_cpu/heldout/stage_pricing.py [PROFILE] > studies/validation_cpu/heldout/stage_pricing.txt

PROFILE defaults to the latest kept run's; about 4 minutes, one core.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
import yaml

from parsim.calibration.layer_terms import stage_prices
from parsim.calibration.stages import stage_samples
from parsim.calibration.timer import Clock
from parsim.specs import device_from_dict, load_model, model_from_dict

HERE = Path(__file__).resolve().parent
MODELS = ("deep", "gpt", "llama", "long", "wide")
ROUNDS, SAMPLES = 6, 3


def main(profile: Path) -> None:
    torch.set_num_threads(1)
    device = device_from_dict(yaml.safe_load(profile.read_text())["device"], "profile")
    clock = Clock(torch.device("cpu"))
    cases = [(model_from_dict(s.spec), int(s.mbs)) for s in device.tables.stage_probes.stages]
    cases += [(load_model(HERE / f"model_{m}.yaml"), mbs) for m in MODELS for mbs in (1, 2)]
    probes = len(device.tables.stage_probes.stages)
    priced = [stage_prices(device, "fp32", spec, mbs) for spec, mbs in cases]
    # per round and case: (forward, backward) priced / measured, the round's median samples
    rounds = []
    for _ in range(ROUNDS):
        ratios = []
        for (spec, mbs), price in zip(cases, priced):
            f, b = stage_samples(spec, mbs, "fp32", clock, SAMPLES)
            ratios.append((price["fwd"][0] / statistics.median(f), price["bwd"][0] / statistics.median(b)))
        rounds.append(ratios)
    print(f"profile {profile.name} of {profile.parent.name}; {ROUNDS} rounds of {SAMPLES} samples; priced / measured,"
          " median over the rounds; relative: over the profile's own stages' median in the same round")
    for i, (spec, mbs) in enumerate(cases):
        cells = []
        for p in (0, 1):
            raw = [r[i][p] for r in rounds]
            rel = [r[i][p] / statistics.median(x[p] for x in r[:probes]) for r in rounds]
            cells.append(f"{statistics.median(raw):5.2f} (relative {statistics.median(rel):5.2f})")
        print(f"  {spec.name:18s} mbs {mbs}  forward {cells[0]}   backward {cells[1]}", flush=True)


if __name__ == "__main__":
    latest = sorted(HERE.glob("run_2026*/profile.yaml"))[-1]
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else latest)
