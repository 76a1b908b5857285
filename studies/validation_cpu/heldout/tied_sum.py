"""What pricing a tied embedding's gradient sum (``costs.ops._tied_gradient_sum``) changes on the
held-out runs kept here (no executor run): each run's layer terms re-derived from its stored
measurements (``calibration.layer_terms.refit_data``: the synthetic stages are tied models too),
then its 25 plans priced against its own measurements, without the op (before) and with it
(``before_after.compare``).

    .venv/bin/python studies/validation_cpu/heldout/tied_sum.py > studies/validation_cpu/heldout/tied_sum.txt   # ~30 s

Writes the re-derived profiles under /tmp/parsim-tied-sum/."""
from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import parsim.costs.ops as ops

sys.path.insert(0, str(Path(__file__).parent))
from before_after import compare  # noqa: E402

OUT = Path("/tmp/parsim-tied-sum")
RUNS = ["run_20261201c_zen3", "run_20261201d_zen3", "run_20261201e_zen3", "run_20261201f_zen3", "run_20261202_zen3",
        "run_20261202b_zen3"]
TIED = ("gpt", "deep", "long")       # the held-out models with tied embeddings (model_*.yaml)


@contextmanager
def without_the_sum():
    rule = ops._tied_gradient_sum
    ops._tied_gradient_sum = lambda *a: []
    try:
        yield
    finally:
        ops._tied_gradient_sum = rule


if __name__ == "__main__":
    compare(RUNS, [("before", without_the_sum), ("after", nullcontext)], OUT,
            header=" (* a stage holds both ends of a tied embedding: pp = 1)",
            mark=lambda key: "*" if key[0] in TIED and "pp=1" in key[1] else " ")
