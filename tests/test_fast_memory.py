"""The fast path's memory is ``costs.memory_by_stage`` to the byte, over whole sweep spaces."""
import numpy as np
import pytest

from parsim.costs import device_capacity, memory_by_stage
from parsim.fast import evaluate
from parsim.specs import RECOMPUTES, load_cluster, load_model
from parsim.study.enumerate import enumerate_plans
from parsim.study.space import SweepSpace, build_space

CASES = [
    ("gpt3-175b", "a100-80g:1024", build_space(gbs=1536)),
    ("llama3-70b", "h100-sxm:64", build_space(gbs=256)),
    ("megatron-7.5b", "a100-80g:64", build_space(gbs=512, fix="dtype=bf16,fp32,fp16 recompute="
                                                 + ",".join(RECOMPUTES))),
    ("tiny", "cpu:8", SweepSpace(gbs=(8, 24), vpp=(1, 2, 4), mbs=(1, 2, 3))),
]


@pytest.mark.parametrize("model_name, cluster_name, space", CASES, ids=[c[0] for c in CASES])
def test_fast_peak_memory_equals_memory_by_stage(model_name, cluster_name, space):
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    space_table = enumerate_plans(model, cluster, space)
    # 150 plans drawn from the whole space, evaluated as a table of their own (a plan prices
    # alike in any table: below; the whole space took 4-8 s more per case)
    table = space_table.take(np.random.default_rng(0).choice(len(space_table), size=min(150, len(space_table)),
                                                             replace=False))
    assert_fast_memory_is_memory_by_stage(model, cluster, table)


def assert_fast_memory_is_memory_by_stage(model, cluster, table):
    """Every plan of ``table``: the fast path's peak, its stage and its breakdown are
    ``memory_by_stage``'s."""
    fast = evaluate(model, cluster, table)
    for i in range(len(table)):
        stages = memory_by_stage(model, table.plan(i), cluster)
        peak = max(stages, key=lambda s: s.total)
        assert fast.peak_memory_bytes[i] == pytest.approx(peak.total, rel=1e-12)
        assert fast.peak_stage[i] == peak.stage
        for cat in ("params", "grads", "optimizer", "activations", "other"):
            assert getattr(fast, f"peak_{cat}_bytes")[i] == pytest.approx(getattr(peak, cat), rel=1e-12, abs=1e-6)


@pytest.mark.parametrize("model_name, cluster_name, space", [CASES[1], CASES[3]], ids=["llama3-70b", "tiny"])
def test_a_plans_numbers_do_not_depend_on_the_table_it_is_evaluated_in(model_name, cluster_name, space):
    """The fast path shares cost rows between plans with equal keys (``fast.tables``): a plan
    evaluated among a few others gets exactly what it gets in the whole sweep space."""
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    table = enumerate_plans(model, cluster, space)
    rows = np.random.default_rng(1).choice(len(table), size=min(40, len(table)), replace=False)
    whole, part = evaluate(model, cluster, table).columns(), evaluate(model, cluster, table.take(rows)).columns()
    for name, values in part.items():
        np.testing.assert_array_equal(values, whole[name][rows], err_msg=name)

def test_fits_applies_headroom_to_the_device_capacity():
    model, cluster = load_model("megatron-7.5b"), load_cluster("a100-80g:8")
    table = enumerate_plans(model, cluster, build_space(gbs=64))
    fast = evaluate(model, cluster, table)
    cap = device_capacity(cluster)
    assert (fast.fits(0.0) == (fast.peak_memory_bytes <= cap)).all()
    assert (fast.fits(0.1) == (fast.peak_memory_bytes <= 0.9 * cap)).all()
    assert fast.fits(0.1).sum() < fast.fits(0.0).sum()


def test_fast_path_finds_the_optimizer_step_peak_where_memory_by_stage_does():
    """A wide vocabulary under the torch stack (eager AdamW: two fp32 copies of the largest
    tensor, ``footprint.optimizer_temporaries``): many plans peak at the optimizer step, with
    nothing in ``activations``, under ZeRO-1 too (the executor gives the embedding whole to one
    replica); the fast path agrees to the byte."""
    from dataclasses import replace
    model, cluster = replace(load_model("tiny"), vocab=32768), load_cluster("cpu:4")
    table = enumerate_plans(model, cluster, SweepSpace(gbs=(8,), vpp=(1, 2), mbs=(1,), recompute=("full",),
                                                       dtype=("fp32",)))
    fast = evaluate(model, cluster, table)
    at_step = set()
    for i in range(len(table)):
        plan = table.plan(i)
        peak = max(memory_by_stage(model, plan, cluster), key=lambda s: s.total)
        assert fast.peak_memory_bytes[i] == pytest.approx(peak.total, rel=1e-12)
        assert fast.peak_activations_bytes[i] == pytest.approx(peak.activations, rel=1e-12, abs=1e-6)
        if peak.activations == 0.0:
            at_step.add(plan.zero)
    assert {0, 1} <= at_step


def test_fast_peak_memory_equals_memory_by_stage_where_zero_runs_as_fsdp2():
    """A calibrated profile runs ZeRO-2/3 as FSDP2 (``tables.zero_copies``): its buffers and root
    unit are in ``memory_by_stage``, which the fast path takes for those plans (it read them
    4-19 % low before); every other plan stays the kernel's."""
    from pathlib import Path
    fixture = Path(__file__).parent / "fixtures" / "cpu-calibrated.yaml"
    model, cluster = load_model("cpu-small"), load_cluster("cpu:4", profile=str(fixture))
    assert cluster.device.tables.fsdp2_copies
    table = enumerate_plans(model, cluster, SweepSpace(gbs=(8,), vpp=(1, 2), mbs=(1, 2)))
    zero = table.cols["zero"]
    assert ((zero >= 2) & (table.cols["dp"] > 1)).sum() >= 10 and (zero < 2).sum() >= 10
    assert_fast_memory_is_memory_by_stage(model, cluster, table)
