"""Sub-pipelined TP (Merak, Lai et al. 2023) on the torch executor: every transformer layer runs
two halves of the microbatch, each issuing its own TP collectives asynchronously, so one
half's collective is in flight while the other half computes. Loss parity is in
``test_executor_parity.py``; this file checks what the timeline of one rank shows.

Only the order of events is asserted, never absolute times. The recorder has one compute event
per action (not per half), so the overlap is read off the tp stream: an asynchronous collective
event runs from its launch to its completion (stamped by the work's future callback), and
between the launches of two consecutive collectives of a layer the executor runs the other
half's compute (``model.Block._subpipe``). A second launch before the first completion
therefore means that compute ran while a collective was in flight. Blocking (Megatron)
collectives can never do that. How often it happens depends on the machine (gloo latency
against the tiny model's compute), so the test asks for at least one such pair in the step on
each rank, not for one per layer.
"""
from __future__ import annotations

from collections import Counter, defaultdict

import pytest

pytest.importorskip("torch")

from parsim.specs import parse_plan  # noqa: E402

from test_executor_cases import MODELS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]

PLANS = {
    "blocking": "tp=2 mbs=2 gbs=8 dtype=fp32",
    "subpipe": "tp=2 mbs=2 gbs=8 dtype=fp32 tp_overlap=subpipe",
    "sp-blocking": "tp=2 sp=true mbs=2 gbs=8 dtype=fp32",
    "sp-subpipe": "tp=2 sp=true mbs=2 gbs=8 dtype=fp32 tp_overlap=subpipe",
}


@pytest.fixture(scope="module")
def results():
    from parsim.executor import ExecutorConfig, RunSpec, run_plans

    config = ExecutorConfig(steps=2, warmup=1, track_memory=False)
    runs = [RunSpec(MODELS["gpt"], parse_plan(plan), config) for plan in PLANS.values()]
    return dict(zip(PLANS, run_plans(runs)))


def layer_collectives(result, rank: int = 0):
    """The rank's TP collectives of the transformer layers (embedding / head ones: layer -1)."""
    return [e for e in result.trace.events if e.rank == rank and e.stream == "tp" and e.layer >= 0]


def in_flight_pairs(events) -> dict[tuple[int, int], int]:
    """(microbatch, layer) -> how many of its collectives were launched while the one launched
    before it had not completed."""
    groups = defaultdict(list)
    for e in events:
        groups[(e.microbatch, e.layer)].append(e)
    out = {}
    for key, group in groups.items():
        group.sort(key=lambda e: e.start)
        out[key] = sum(b.start < a.end for a, b in zip(group, group[1:]))
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp-sp"])
def test_each_half_issues_its_own_collectives_of_half_the_size(results, sp):
    prefix = "sp-" if sp else ""
    blocking = layer_collectives(results[prefix + "blocking"])
    subpipe = layer_collectives(results[prefix + "subpipe"])
    assert blocking and len(subpipe) == 2 * len(blocking)
    per_key = Counter((e.kind, e.layer, e.microbatch) for e in blocking)
    assert Counter((e.kind, e.layer, e.microbatch) for e in subpipe) == {k: 2 * n for k, n in per_key.items()}
    # mbs=2: both halves hold one sequence, so every collective moves half the bytes
    assert sorted(e.bytes for e in subpipe) == sorted(e.bytes / 2 for e in blocking for _ in range(2))
    # the halves train the same model as the whole microbatch
    assert results[prefix + "subpipe"].losses == pytest.approx(results[prefix + "blocking"].losses, rel=1e-5)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp-sp"])
def test_a_halfs_collective_is_in_flight_while_the_other_half_computes(results, sp):
    prefix = "sp-" if sp else ""
    for rank in (0, 1):
        # blocking collectives: one at a time, each done before the next starts
        assert not any(in_flight_pairs(layer_collectives(results[prefix + "blocking"], rank)).values())
        overlapped = in_flight_pairs(layer_collectives(results[prefix + "subpipe"], rank))
        assert sum(overlapped.values()) > 0, overlapped
