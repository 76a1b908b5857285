"""ZeRO-2 and ZeRO-3 on the torch executor: what FSDP's collectives in one step's trace show.

ZeRO-2 (Rajbhandari et al. 2020 Sec. 5.2) keeps the parameters replicated for the whole step:
each FSDP unit (one per transformer layer, one for the rest of the chunk) is all-gathered once,
in the step's first forward, and stays gathered across the gradient accumulation; its
gradients are reduce-scattered in every microbatch's backward. ZeRO-3 frees the parameters
after forward and gathers them again, every microbatch. Loss parity is in
``test_executor_parity.py``.
"""
from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch")

from parsim.specs import parse_plan  # noqa: E402

from test_executor_cases import TINY_GPT  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]

M = 4   # microbatches per step
PLANS = {
    "zero2": f"dp=2 mbs=1 gbs={2 * M} zero=2 dtype=fp32",
    "zero3": f"dp=2 mbs=1 gbs={2 * M} zero=3 dtype=fp32",
}
UNITS = [-1, *range(TINY_GPT.layers)]   # trace layer of each FSDP unit (-1: embedding, final norm, tied head)


@pytest.fixture(scope="module")
def results():
    from parsim.executor import ExecutorConfig, RunSpec, run_plans

    # the traced step is step 1: its gathers are there only if step 0 left the parameters sharded
    config = ExecutorConfig(steps=2, warmup=1, track_memory=False)
    return dict(zip(PLANS, run_plans([RunSpec(TINY_GPT, parse_plan(p), config) for p in PLANS.values()])))


def dp_events(result, rank: int, kind: str):
    return [e for e in result.trace.events if e.rank == rank and e.stream == "dp" and e.kind == kind]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("rank", [0, 1])
def test_zero2_gathers_each_unit_once_per_step_and_reduce_scatters_it_every_microbatch(results, rank):
    r = results["zero2"]
    assert r.trace_step == 1
    gathers = dp_events(r, rank, "zero_allgather")
    assert Counter(e.layer for e in gathers) == {u: 1 for u in UNITS}
    assert {e.microbatch for e in gathers} == {0}                  # in the step's first forward
    scatters = dp_events(r, rank, "zero_reducescatter")
    assert Counter((e.layer, e.microbatch) for e in scatters) == {(u, j): 1 for u in UNITS for j in range(M)}
    assert {e.kind for e in r.trace.events if e.rank == rank and e.stream == "dp"} == {"zero_allgather",
                                                                                      "zero_reducescatter"}


@pytest.mark.timeout(600)
def test_zero3_gathers_the_parameters_again_every_microbatch(results):
    r = results["zero3"]
    gathers = Counter(e.layer for e in dp_events(r, 0, "zero_allgather"))
    assert set(gathers) == set(UNITS)
    assert all(gathers[layer] >= 2 * M for layer in range(TINY_GPT.layers))   # forward and backward
    assert len(dp_events(r, 0, "zero_reducescatter")) == len(UNITS) * M
    # the same training either way
    assert r.losses == pytest.approx(results["zero2"].losses, rel=1e-5)
