"""Fitted numbers -> profile YAML: the template's hand-made text (datasheet numbers with their
sources, ``power_w`` / ``power_source`` included), with the marker line
``  # @runs-fit@`` (end of the device section) replaced by the fitted block, every number with
its source on its line. ``make profiles`` runs ``main`` on the shared public-runs log and
rewrites the shipped a100-80g / a100-40g / h100-sxm / h200 profiles from
``calibration/profiles/templates/``; the fit is deterministic and numbers are written to four
significant digits, so the files come out byte for byte the same.

    .venv/bin/python -m parsim.study.runs.profiles ../shared/validation/public_runs_train.csv
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from parsim.specs import profiles_dir
from parsim.specs.stack import STACK_PRESETS

from .calibrate import RunsCalibration, calibrate_runs, stack_runs

MARKER = "  # @runs-fit@\n"
SHIPPED = ("a100-80g", "a100-40g", "h100-sxm", "h200")
DEFAULT_STACK = "megatron-core"       # a plan's stack=auto on these GPUs: today's reference stack
GiB = 2**30


def templates_dir() -> Path:
    return profiles_dir() / "templates"


def template_profiles(names=SHIPPED) -> dict[str, dict]:
    return {n: yaml.safe_load((templates_dir() / f"{n}.yaml").read_text()) for n in names}


def _num(v: float) -> str:
    """Four significant digits, in a form YAML 1.1 reads as a float (``2.0e-05``, not ``2e-05``)."""
    text = f"{v:.4g}"
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exp = text.split("e")
        text = f"{mantissa}.0e{exp}"
    return text


def fitted_block(name: str, cal: RunsCalibration, log_name: str) -> str:
    """The YAML lines (inside ``device:``) holding ``name``'s fitted numbers."""
    lines = [f"  # --- fitted to run logs ({log_name}) by `make profiles`; each number says how",
             f"  default_stack: {DEFAULT_STACK}".ljust(34) + " # a plan's stack=auto (parsim.specs.stack)"]
    key = (name, "device", "membound_efficiency")
    if key in cal.values:
        lines.insert(1, f"  membound_efficiency: {_num(cal.values[key])}".ljust(34)
                     + f" # elementwise kernels of real layers: {cal.sources[key]}")
    runs = stack_runs(cal.observations)
    stacks = sorted({k[3] for k in cal.values if k[0] == name and k[1:3] == ("device", "stacks")})
    if stacks:
        lines.append("  stacks:                           # this GPU's numbers per stack (over parsim.specs.stack presets)")
    for stack in stacks:
        own = runs.get((name, stack))
        groups = own or runs.get(_donor_key(cal, name, stack), [])
        donor = _carried_from(cal, name)
        where = f"runs on {donor}: " if donor and not own else "runs: "
        lines.append(f"    {stack}:".ljust(34) + " # " + (f"{where}{', '.join(groups)}" if groups else
                                                           "no runs: numbers by analogy (parsim.study.runs.parameters)"))
        for field in sorted(k[4] for k in cal.values if k[:4] == (name, "device", "stacks", stack)):
            k = (name, "device", "stacks", stack, field)
            v = cal.values[k]
            shown = _num(v)
            extra = f" ({v / GiB:.2f} GiB)" if field == "memory_reserve_bytes" else ""
            lines.append(f"      {field}: {shown}".ljust(34) + f" # {cal.sources[k]}{extra}")
    return "\n".join(lines) + "\n"


def _carried_from(cal: RunsCalibration, name: str) -> str | None:
    src = cal.sources.get((name, "device", "membound_efficiency"), "")
    return src.split("carried over from ")[1].split(" ")[0].rstrip(":") if "carried over from " in src else None


def _donor_key(cal: RunsCalibration, name: str, stack: str) -> tuple[str, str]:
    for (p, s) in stack_runs(cal.observations):
        if s == stack:
            return (p, s)
    return (name, stack)


def render(name: str, cal: RunsCalibration, log_name: str) -> str:
    text = (templates_dir() / f"{name}.yaml").read_text()
    if MARKER not in text:
        raise ValueError(f"template {name}.yaml has no '{MARKER.strip()}' line")
    return text.replace(MARKER, fitted_block(name, cal, log_name))


def write_profiles(cal: RunsCalibration, names, out: Path, log_name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in names:
        p = out / f"{n}.yaml"
        p.write_text(render(n, cal, log_name))
        paths.append(p)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rewrite the shipped GPU profiles from the public-runs log")
    ap.add_argument("runs", help="the run log (../shared/validation/public_runs_train.csv)")
    ap.add_argument("--out", type=Path, default=profiles_dir(), help="output folder [the shipped profiles]")
    args = ap.parse_args(argv)
    assert set(STACK_PRESETS) >= {DEFAULT_STACK}
    cal = calibrate_runs(args.runs, profiles=template_profiles(), loso=False, log=print)
    for w in cal.warnings:
        print("warning:", w)
    for p in write_profiles(cal, SHIPPED, args.out, Path(args.runs).name):
        print("wrote", p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
