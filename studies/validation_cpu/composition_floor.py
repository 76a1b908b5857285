"""Which kept calibrations does the layer floor move? Every calibrated profile kept in studies/
(the held-out and zero-bubble runs' and the shipped cpu-calibrated) re-derived with and without
``calibration.layer_terms.at_least_the_layer``: a profile is listed where the floor raised a
pass's composition terms (they priced the probe's layer below what it measured alone).

    .venv/bin/python studies/validation_cpu/composition_floor.py > studies/validation_cpu/composition_floor.txt   # ~2 s
"""
from __future__ import annotations

from pathlib import Path

import yaml

import parsim.calibration.layer_terms as layer_terms
from parsim.specs import device_from_dict

ROOT = Path(__file__).resolve().parents[2]


def composition(data: dict, floor: bool):
    keep = layer_terms.at_least_the_layer
    if not floor:
        layer_terms.at_least_the_layer = lambda device, comp, *a, **k: comp
    try:
        out = layer_terms.refit_data(data)
    finally:
        layer_terms.at_least_the_layer = keep
    return device_from_dict(out["device"]).tables.layer_composition


def main() -> None:
    paths = sorted(ROOT.glob("studies/validation_cpu/heldout/run_*/profile.yaml")) + \
        sorted(ROOT.glob("studies/zero_bubble/validation*/profile.yaml")) + [ROOT / "calibration/profiles/cpu-calibrated.yaml"]
    moved = 0
    for path in paths:
        data = yaml.safe_load(path.read_text())
        if device_from_dict(data["device"]).tables.stage_probes is None:
            continue
        free, floored = composition(data, False), composition(data, True)
        if floored != free:
            moved += 1
            print(f"{path.relative_to(ROOT)}: forward x{floored.fwd / free.fwd:.3f}, backward x{floored.bwd / free.bwd:.3f}")
    print(f"{moved} of {len(paths)} calibrations raised to their layer probe")


if __name__ == "__main__":
    main()
