"""Corpus items: one ``parsim`` command line each, and the helpers that build them.

An item is ``{"id", "tag", "argv", "weight"[, "table"]}``: ``argv`` is a ``parsim`` command
line (``simulate`` / ``memory`` / ``partition`` / ``sweep``, always ``--json``); ``{BEFORE}`` in
it is the "before" checkout (inputs such as study profiles are read from there by both trees,
so only the code differs) and ``{ASSETS}`` the folder of model YAMLs ``corpus.write_assets``
writes. ``table`` asks the runner for a sweep's full table (every plan the fast path priced);
``weight`` orders the runner's queue (heaviest first); ``tag`` names where the item comes from.
"""
from __future__ import annotations

import csv
from pathlib import Path

SEED = 18
SLOW_LINKS = "{BEFORE}/studies/rules_of_thumb/a100-80g-slow-links.yaml"


def item(kind: str, model: str, cluster: str, plan: str, profile: str | None = None, extra: tuple = (),
         weight: float = 1.0, tag: str = "") -> dict:
    argv = [kind, "--model", model, "--cluster", cluster, "--plan", plan, *extra, "--json"]
    if profile:
        argv[5:5] = ["--profile", profile]
    return {"id": "", "tag": tag, "argv": argv, "weight": weight}


def plan_items(model: str, cluster: str, plan: str, profile: str | None = None, engine: tuple = (),
               weight: float = 1.0, tag: str = "") -> list[dict]:
    """A plan's ``simulate`` item (with the engine flags) and its ``memory`` item."""
    return [item("simulate", model, cluster, plan, profile, engine, weight, tag),
            item("memory", model, cluster, plan, profile, (), 0.05, tag)]


def plan_string(p: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in p.items())


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))
