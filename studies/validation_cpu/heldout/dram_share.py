"""What pricing memory-bound ops by what fits in a rank's cache (``costs.host.dram_share``)
changes on the held-out runs kept here (no executor run): each run's layer terms re-derived
from its stored measurements (``calibration.layer_terms.refit_data``), then its 25 plans priced
against its own measurements, once with every memory-bound op at the streaming add's
contention (before: the profile's last-level cache hidden) and once split (after)
(``before_after.compare``).

    .venv/bin/python studies/validation_cpu/heldout/dram_share.py > studies/validation_cpu/heldout/dram_share.txt   # ~20 s

Writes the re-derived profiles under /tmp/parsim-dram-share/."""
from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import parsim.specs.tables as tables

sys.path.insert(0, str(Path(__file__).parent))
from before_after import compare  # noqa: E402

OUT = Path("/tmp/parsim-dram-share")
RUNS = ["run_20261201c_zen3", "run_20261201d_zen3", "run_20261201e_zen3", "run_20261201f_zen3", "run_20261202_zen3"]


@contextmanager
def cache_hidden():
    """Every profile without a last-level cache: every memory-bound op at the add's contention."""
    llc = tables.CalibratedTables.last_level_cache
    tables.CalibratedTables.last_level_cache = property(lambda self: None)
    try:
        yield
    finally:
        tables.CalibratedTables.last_level_cache = llc


if __name__ == "__main__":
    compare(RUNS, [("before", cache_hidden), ("after", nullcontext)], OUT,
            extra=("GEMM contention at 2 ranks", lambda data: data["device"]["extra"]["contention"]["2"]))
