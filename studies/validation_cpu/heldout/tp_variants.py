"""Two changes to how the TP collectives are priced, tried on every kept held-out run before
either is built (``tp_calls.py`` shows the per-call errors that motivate them): each run's tp
plans re-priced (SimPy, no executor) with its own profile.

* ``block``: the 2-rank in-situ premium (``alpha_insitu`` over the back-to-back ``alpha``)
  scaled by the solo compute before the call against the probe's block
  (``min(block_s / insitu_block_s, 1)``), as the 4-rank shared premium already is
  (``CollectiveFit.shared_alpha``). The motive: an SP all-gather that follows its
  reduce-scatter after only a layernorm ran at about the back-to-back price in the executor's
  traces (gpt tp=2 SP: 0.4-0.9 ms against 2.4 priced), the ranks still in step and their
  threads awake.
* ``block + k``: the same plus ``k`` seconds a call (0.3, 0.6, 1 ms), standing for what the
  in-situ probe does not count: it subtracts the compute it ran between the calls as timed in
  line, so a compute block slowed by the call before it (GEMMs in line between collectives ran
  8-10 % slower than back to back in a one-off probe, 2026-12-02) is priced at its
  back-to-back time.
* ``contention net of TP``: the shared host's mean-field slowdown (``HostModel.settle``) read
  at the ranks computing net of the time they wait in TP collectives, as the TP premium's busy
  share already is (``sim.run.computing_share``), instead of counting those waits as compute.
  The motive: on the 4-rank plans the TP calls' sum is priced 8-10 % of the step low and the
  rest as much high (``tp_calls.txt``), as if a rank blocked in a gloo call left its core to
  the others.

    .venv/bin/python studies/validation_cpu/heldout/tp_variants.py [RUN ...] > studies/validation_cpu/heldout/tp_variants.txt

About a minute for the 17 runs of ``cost_variants.RUNS`` (one core). Prints, per run and
variant, the tp plans' median and max |step error|, the plans predicted slow and the signed
median; then pooled by kind of plan, and each plan's median signed error over the runs.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import parsim.sim.run as sim_run
import parsim.specs.collectives as collectives
from parsim.costs.host import HostModel
from parsim.sim import simulate
from parsim.specs import load_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_variants import HERE, RUNS, plan_kind, variant_table  # noqa: E402
from kept_rows import measured_rows, plan_label  # noqa: E402

# name -> (k: None prices the premium as calibrated, else block-scaled with k s a call added;
#          whether the mean field is read net of TP waits)
VARIANTS = {"as calibrated": (None, False), "block": (0.0, False), "block + 0.3 ms": (3e-4, False),
            "block + 0.6 ms": (6e-4, False), "block + 1 ms": (1e-3, False), "contention net of TP": (None, True)}
_as_calibrated = collectives.CollectiveFit.seconds
_extra: dict = {"k": None, "net": False, "sim": None}
_run, _settle = sim_run._run, HostModel.settle


def _recording_run(*args, **kwargs):
    """``sim.run._run``, keeping the simulation the mean-field loop is about to settle."""
    sim = _extra["sim"] = _run(*args, **kwargs)
    return sim


def _settle_net(self, busy_s, step_s, now):
    """``HostModel.settle`` with the rank-seconds of compute net of TP waits while
    ``contention net of TP`` prices."""
    sim = _extra["sim"]
    if _extra["net"] and sim is not None and sim.devices:
        rec = sim.recorder
        busy_s = (sum(max(rec.busy[r] - rec.exposed[r]["tp"], 0.0) for r in sim.devices)
                  * sim.plan.world_size / len(sim.devices))
    return _settle(self, busy_s, step_s, now)


sim_run._run = _recording_run
HostModel.settle = _settle_net


def _seconds(self, x, in_situ=False, host_ranks=None, group=0, block_s=None, busy=None):
    """``CollectiveFit.seconds`` with the own group's in-situ premium scaled by the block and
    ``k`` added, while a variant prices (``_extra["k"]`` not None)."""
    k = _extra["k"]
    if k is None or not in_situ or self.alpha_insitu is None or block_s is None or not self.insitu_block_s:
        return _as_calibrated(self, x, in_situ, host_ranks, group, block_s, busy)
    own = self.alpha + (self.alpha_insitu - self.alpha) * min(max(block_s, 0.0) / self.insitu_block_s, 1.0)
    alpha = own
    if host_ranks is not None and host_ranks > group and self.alpha_insitu_shared is not None:
        alpha = self.shared_alpha(host_ranks, own, block_s, busy)
    return float(alpha) + self.bytes_seconds(x) + k


collectives.CollectiveFit.seconds = _seconds


def run_errors(run: Path, k: float | None, net: bool) -> list[tuple[str, str, float]]:
    """(kind of plan, model and plan, signed step error) of the run's tp plans."""
    _extra["k"], _extra["net"] = k, net
    out = []
    try:
        for _table, _i, model, plan, row in measured_rows(run):
            if plan.tp < 2:
                continue
            result = simulate(model, load_cluster(f"cpu:{plan.world_size}", profile=run / "profile.yaml"), plan,
                              record_events=False)
            out.append((plan_kind(plan), plan_label(model, plan, row),
                        result.step_time_s / float(row["measured_step_s"]) - 1.0))
    finally:
        _extra["k"], _extra["net"] = None, False
    return out


def main(runs: list[str]) -> None:
    print("tp plans, per run and variant: median |step error|, max, plans predicted slow, signed median")
    by_plan = variant_table(runs, VARIANTS, lambda run, v: run_errors(run, *VARIANTS[v]), width=22)
    print("\neach plan's median signed step error over the runs")
    for plan in sorted({p for _, p in by_plan}):
        print(f"  {plan:84s}" + "".join(f" | {statistics.median(by_plan[(v, plan)]):+6.1%}" for v in VARIANTS))


if __name__ == "__main__":
    main(sys.argv[1:] or list(RUNS))
