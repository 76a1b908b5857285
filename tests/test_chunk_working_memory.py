"""Each backward holds its own chunk's working set, on real gloo ranks.

Under interleaving a rank runs the backwards of several model chunks. With full recomputation a
chunk's backward re-runs that chunk's layers and holds their activations while it runs; the
last chunk's also holds the head's stash and the logits' gradient, freed before its layers'
phase. A rank-wide working set (the largest of its chunks', added at every backward) put the
middle chunk's recomputed layer beside the last chunk's head stash: the dropout study's GPT
read +6.1 % high on its last rank (studies/validation_cpu/dropout, pp=2 vpp=2, recompute=full).
Each engine now prices a backward with its own chunk's (``costs.memory._stage_working``,
``fast.memory._chunk_working``)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")

from parsim.costs import memory_by_stage  # noqa: E402
from parsim.costs.memory import stage_footprints  # noqa: E402
from parsim.costs.placement import stages_of_rank  # noqa: E402
from parsim.costs.stack import apply_stack  # noqa: E402
from parsim.fast import evaluate  # noqa: E402
from parsim.fast.plans import product_table  # noqa: E402
from parsim.specs import load_cluster, load_model, parse_plan  # noqa: E402

FIXTURE = "tests/fixtures/cpu-calibrated.yaml"
# GPT-style, explicit attention with dropout (its scores dominate a recomputed layer), tied vocabulary
SPEC = replace(load_model("tiny"), layers=4, hidden=128, heads=8, ffn_hidden=512, vocab=1000, seq_len=256,
               dropout=True, flash_attention=False, tied_embeddings=True)
PLAN = "pp=2 vpp=2 mbs=1 gbs=4 schedule=interleaved recompute=full dtype=fp32"


@pytest.fixture(scope="module")
def measured():
    from parsim.executor import ExecutorConfig, RunSpec, run_plans

    plan = parse_plan(PLAN)
    (result,) = run_plans([RunSpec(SPEC, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))])
    return plan, result


def test_the_chunks_of_the_last_rank_hold_different_working_sets():
    """The case is one where the rule matters: the middle chunk's backward (a recomputed layer
    with its dropout masks and scores) holds more than the last chunk's (the same layer, and the
    head freed before it)."""
    model, _, plan = apply_stack(SPEC, load_cluster("cpu:2", profile=FIXTURE), parse_plan(PLAN))
    stages = stage_footprints(model, plan)
    middle, last = (stages[s].backward for s in stages_of_rank(plan, 1))
    assert middle > 1.1 * last


def test_every_rank_peaks_where_the_executor_does(measured):
    plan, result = measured
    cluster = load_cluster("cpu:2", profile=FIXTURE)
    predicted = [s.total for s in memory_by_stage(SPEC, plan, cluster)]
    for rank, (peak, model) in enumerate(zip(result.peak_memory_bytes_by_rank, predicted)):
        assert model == pytest.approx(peak, rel=0.02), f"rank {rank}"


def test_the_fast_path_prices_each_chunk_as_the_analytic_model():
    cluster = load_cluster("cpu:2", profile=FIXTURE)
    table = product_table(dict(dp=(1,), tp=(1,), pp=(2,), vpp=(2,), mbs=(1,), gbs=(4, 8), schedule=("interleaved",),
                               zero=(0,), offload=("none",), recompute=("full", "none"), sp=(False,),
                               dtype=("fp32",), dp_impl=("allreduce",)))
    fast = evaluate(SPEC, cluster, table)
    for i in range(len(table)):
        stages = memory_by_stage(SPEC, table.plan(i), cluster)
        assert fast.peak_memory_bytes[i] == pytest.approx(max(s.total for s in stages), rel=1e-12)
    assert np.isfinite(fast.peak_memory_bytes).all()
