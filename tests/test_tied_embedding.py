"""Tied embeddings over a pipeline: before the optimizer step, the first and the last pipeline
rank all-reduce the word embedding's gradient (``costs.optimizer.tied_embedding_sync``), as the
executor (``pp_parallel.allreduce_tied_embedding_grads``) and Megatron-LM do. Both engines play
it, with the bytes of the tensor the executor all-reduces."""
from dataclasses import replace

import pytest

from parsim.costs.optimizer import tied_embedding_sync
from parsim.executor.model import StageModule
from parsim.fast import PlanTable, evaluate
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

TIED = "studies/validation_cpu/heldout/model_deep.yaml"      # 12 layers, vocab 16,384, tied


def _tied_rows(result):
    return [row for row in result.recorder.rows if row[-1] == "tied embedding grads"]


def test_first_and_last_rank_all_reduce_the_executors_embedding_gradient():
    model = load_model(TIED)
    plan = parse_plan("pp=4 vpp=3 mbs=1 gbs=8 schedule=interleaved dtype=fp32")
    result = simulate(model, load_cluster("a100-80g:4"), plan)
    rows = _tied_rows(result)
    assert sorted(row[0] for row in rows) == [0, 3]                   # the first and the last pipeline rank
    executor_weight = StageModule(model, 0, 1, is_first=True, is_last=False).embed.token_weight
    assert {row[8] for row in rows} == {executor_weight.numel() * 4.0}   # fp32 gradient bytes
    start, end = rows[0][6], rows[0][7]
    assert end > start and all((r[6], r[7]) == (start, end) for r in rows)   # one collective, together
    optimizer = [row for row in result.recorder.rows if row[3] == "optimizer" and row[0] in (0, 3)]
    assert all(row[6] >= end for row in optimizer)                    # before either rank's step


@pytest.mark.parametrize("plan", ["pp=1 mbs=1 gbs=8", "pp=2 mbs=1 gbs=8 schedule=zbv"])
def test_one_copy_of_the_embedding_needs_no_all_reduce(plan):
    """pp = 1, or a V placing the first and the last stage on one rank: one rank sums in place."""
    model = load_model(TIED)
    p = parse_plan(f"{plan} dtype=fp32")
    assert tied_embedding_sync(model, p) is None
    assert not _tied_rows(simulate(model, load_cluster(f"a100-80g:{p.world_size}"), p))


def test_untied_weights_and_zero_sharding():
    model = load_model(TIED)
    plan = parse_plan("dp=2 pp=2 mbs=1 gbs=8 dtype=fp32")
    whole = tied_embedding_sync(model, plan).elements
    assert tied_embedding_sync(model, replace(plan, zero=1)).elements == whole
    assert tied_embedding_sync(model, replace(plan, zero=2)).elements == whole / 2   # FSDP2's 1/dp shard
    assert tied_embedding_sync(replace(model, tied_embeddings=False), plan) is None


@pytest.mark.parametrize("plan", ["pp=2 mbs=1 gbs=8", "pp=4 vpp=3 mbs=1 gbs=8 schedule=interleaved",
                                  "dp=2 pp=2 mbs=1 gbs=8 zero=2", "dp=2 pp=2 mbs=1 gbs=8 zero=2 offload=optimizer",
                                  "pp=2 mbs=1 gbs=8 schedule=zb-h1", "tp=2 pp=2 mbs=1 gbs=8"])
def test_the_fast_path_times_the_all_reduce_as_the_simpy_engine_does(plan):
    """On a GPU cluster (no shared host) the fast path's step is SimPy's (exactly where the fast
    path times the schedule exactly; interleaved within its usual 1%), and both are longer than
    the same model's untied step."""
    model = load_model(TIED)
    p = parse_plan(f"{plan} dtype=fp32")
    cluster = load_cluster(f"a100-80g:{p.world_size}")
    sim = simulate(model, cluster, p)
    fast = evaluate(model, cluster, PlanTable.from_plans([p]))
    assert fast.step_time_s[0] == pytest.approx(sim.step_time_s, rel=1e-9 if p.vpp == 1 else 0.01)
    untied = replace(model, tied_embeddings=False)
    assert simulate(untied, cluster, p).step_time_s < sim.step_time_s
    assert evaluate(untied, cluster, PlanTable.from_plans([p])).step_time_s[0] < fast.step_time_s[0]
