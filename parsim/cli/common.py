"""Arguments and helpers shared by the commands (model/cluster/plan/profile, --json)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from parsim.specs import ClusterSpec, ModelSpec, Plan, plan_stacks
from parsim.specs.files import finite_json
from parsim.trace.io import jsonable


def add_spec_arguments(p: argparse.ArgumentParser, *, model="gpt3-1.3b", cluster="a100-80g:8",
                       plan="dp=8", need_cluster=True, need_plan=True) -> None:
    p.add_argument("--model", default=model, help=f"preset name, model YAML, or HF config.json [{model}]")
    if need_cluster:
        p.add_argument("--cluster", default=cluster, help=f"PRESET:NDEVICES or cluster YAML [{cluster}]")
        p.add_argument("--profile", default=None, help="calibration profile YAML overriding the cluster's device/network numbers")
    if need_plan:
        p.add_argument("--plan", default=plan, help=f"'k=v ...' plan string or plan YAML [{plan!r}]; the key "
                       f"stack= names the software stack: {', '.join(plan_stacks())} [auto: the profile's default]")
    add_json_argument(p)


def add_json_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")


def load_specs(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec, Plan, list[str]]:
    """Parse and validate model, cluster and plan; warnings go to stderr (never stdout)."""
    from parsim.api import load_specs as parse_specs
    model, cluster, plan, warnings = parse_specs(args.model, args.cluster, args.plan, getattr(args, "profile", None))
    for w in warnings:
        print(f"parsim: warning: {w}", file=sys.stderr)
    return model, cluster, plan, warnings


def emit_json(obj: dict[str, Any]) -> None:
    """One JSON object on stdout; a non-finite number is written as null (JSON has no NaN)."""
    print(finite_json(obj, default=jsonable))


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f}"


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain aligned text table."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
