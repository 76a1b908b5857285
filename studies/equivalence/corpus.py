"""The corpus: every command line the equivalence check runs in both trees (corpus_items.py says what
an item is).

Built from a seeded generator (random_plans.py) and from the plans the studies simulate, read
from their committed files in the "before" checkout, plus full fast-path sweeps and the
partitioner (study_plans.py). Same seed, same files: same corpus, item for item.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from corpus_items import SEED
from random_plans import RANDOM_PLANS, random_plans
from study_plans import ASSET_MODELS, gpu_study_plans, merak_plans, sweep_study_plans, tool_items, validation_plans


def write_assets(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, spec in ASSET_MODELS.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def build(before: Path, random_count: int = RANDOM_PLANS, seed: int = SEED) -> list[dict]:
    """The whole corpus, items numbered in order (the ids name them in the report)."""
    items = (random_plans(random_count, seed) + validation_plans(before) + gpu_study_plans(before)
             + merak_plans(before) + sweep_study_plans(before, seed) + tool_items())
    for i, it in enumerate(items):
        it["id"] = f"{i:05d}-{it['argv'][0]}-{it['tag']}"
    return items
