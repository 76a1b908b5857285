"""Interleaved 1F1B over model chunks of different layer counts: the fast path times it by its
action graph (``fast.dag.timed_by_graph``), and agrees with the SimPy engine where its closed form
(``fast.timing``: every chunk 1 / vpp of its rank's work) read the step 7-17 % fast."""
from dataclasses import replace

import numpy as np
import pytest

from parsim.fast import PlanTable, evaluate
from parsim.fast.dag import timed_by_graph
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.specs.codes import WORDS


def _fast_and_sim(model, cluster_name: str, plan: str) -> tuple[float, float]:
    cluster, p = load_cluster(cluster_name), parse_plan(plan)
    fast = evaluate(model, cluster, PlanTable.from_plans([p])).step_time_s[0]
    return fast, simulate(model, cluster, p, record_events=False).step_time_s


# gpt3-1.3b with 26 layers on 12, 24 or 16 chunks: one or two layers a chunk. The closed form read
# these -7.6 (a blocking stack's held sends), -8.7, -7.3, -17.1 and -7.2 % (before 2026-11-29).
UNEQUAL = ["dp=1 tp=4 pp=4 vpp=3 mbs=2 gbs=32 schedule=interleaved stack=megatron-lm",
           "dp=2 tp=2 pp=4 vpp=3 mbs=2 gbs=32 schedule=interleaved zero=1 recompute=selective stack=deepspeed",
           "dp=2 tp=2 pp=4 vpp=3 mbs=1 gbs=32 schedule=interleaved recompute=selective stack=megatron-core",
           "dp=2 tp=1 pp=8 vpp=3 mbs=2 gbs=32 schedule=interleaved zero=3 recompute=full stack=megatron-core",
           "dp=4 tp=1 pp=4 vpp=3 mbs=2 gbs=128 schedule=interleaved zero=3 recompute=full stack=fsdp1"]


@pytest.mark.parametrize("plan", UNEQUAL)
def test_interleaved_over_unequal_chunks_agrees_within_3_percent(plan):
    fast, sim = _fast_and_sim(replace(load_model("gpt3-1.3b"), layers=26), "a100-80g:16", plan)
    assert fast == pytest.approx(sim, rel=0.03), plan


# Under DeepSpeed's compute slowdown: ZeRO-2 on the port its TP collectives use (the graph charges
# the owed compute node by node, not also in the pass: +7.7 % before), and ZeRO-3, whose backward's
# debt is paid while its last reduce-scatter drains (``fast.zero3.chunk_paid``: +8.3 % before).
SLOWED = [(32, "dp=2 tp=2 pp=4 vpp=3 mbs=2 gbs=32 schedule=interleaved zero=2 stack=deepspeed"),
          (30, "dp=2 tp=2 pp=4 vpp=4 mbs=2 gbs=32 schedule=interleaved zero=3 recompute=full stack=deepspeed")]


@pytest.mark.parametrize("layers,plan", SLOWED)
def test_unequal_interleaved_under_the_compute_slowdown_agrees_within_4_percent(layers, plan):
    fast, sim = _fast_and_sim(replace(load_model("llama2-7b"), layers=layers), "h100-sxm:16", plan)
    assert fast == pytest.approx(sim, rel=0.04), plan


def test_only_unequal_interleaved_and_the_split_family_are_timed_by_their_graph():
    code = {name: i for i, name in enumerate(WORDS["schedule"])}
    cases = [("interleaved", 4, 3, 26, True), ("interleaved", 4, 2, 24, False), ("1f1b", 4, 1, 26, False),
             ("gpipe", 4, 1, 26, False), ("zb-h1", 4, 1, 24, True), ("looped-bfs", 2, 2, 24, True)]
    for name, pp, vpp, layers, played in cases:
        got = timed_by_graph(np.array([code[name]]), np.array([pp]), np.array([vpp]), layers)
        assert bool(got[0]) is played, (name, pp, vpp, layers)
