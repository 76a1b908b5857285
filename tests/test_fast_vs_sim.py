"""The fast path and the SimPy engine agree: step time within 2% and memory to 0.1% on uniform
plans (every stage the same layers) without link contention; and a plan the fast path says
fits never runs out of memory in the SimPy engine."""
import numpy as np
import pytest

from parsim.fast import PlanTable, evaluate
from parsim.fast.honesty import PESSIMISM
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.study.enumerate import enumerate_plans
from parsim.study.space import SweepSpace

# gpt3-2.7b: 32 layers; a100-80g:8 is one NVLink node
PIPELINE_AND_TP = [
    "pp=8 gbs=32", "pp=8 gbs=8", "pp=8 gbs=32 schedule=gpipe", "pp=8 gbs=16 schedule=naive",
    "pp=8 vpp=2 gbs=32 schedule=interleaved", "tp=2 pp=4 vpp=4 gbs=16 schedule=interleaved",
    "tp=8 gbs=4", "tp=4 pp=2 gbs=16 sp=true", "tp=2 pp=4 gbs=16 recompute=full",
    "tp=2 pp=4 gbs=16 mbs=2 recompute=selective sp=true", "tp=4 pp=2 vpp=4 gbs=16 schedule=interleaved",
    "pp=8 gbs=16 dtype=fp32", "tp=8 gbs=4 mbs=2 recompute=full sp=true",
]
ZERO3 = ["dp=8 gbs=32 zero=3", "dp=4 tp=2 gbs=16 zero=3 recompute=full", "dp=8 gbs=16 zero=3 offload=optimizer+params"]
# ZeRO-2: per-layer gradient reduce-scatters in every backward, one parameter all-gather per step
ZERO2 = ["dp=8 gbs=32 zero=2", "dp=2 pp=4 gbs=32 zero=2", "dp=2 pp=4 vpp=2 gbs=32 schedule=interleaved zero=2",
         "dp=2 pp=4 gbs=32 zero=2 schedule=gpipe", "dp=8 gbs=32 zero=2 offload=optimizer", "dp=4 tp=2 gbs=16 zero=2"]
DATA_PARALLEL = ["dp=8 gbs=32", "dp=8 gbs=32 zero=1", "dp=2 tp=2 pp=2 gbs=32", "dp=2 pp=4 gbs=32",
                 "dp=8 gbs=32 zero=1 offload=optimizer", "dp=2 pp=4 vpp=2 gbs=32 schedule=interleaved",
                 "dp=8 gbs=32 dp_impl=ps"]


def _agree(plans: list[str], model_name="gpt3-2.7b", cluster_name="a100-80g:8"):
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    # the profile's own numbers (stack=torch); under the GPU stacks: tests/test_stack.py
    ps = [parse_plan(p if "stack=" in p else f"{p} stack=torch") for p in plans]
    fast = evaluate(model, cluster, PlanTable.from_plans(ps))
    for i, p in enumerate(ps):
        sim = simulate(model, cluster, p, record_events=False)
        assert fast.step_time_s[i] == pytest.approx(sim.step_time_s, rel=0.02), p.to_string()
        assert fast.peak_memory_bytes[i] == pytest.approx(sim.peak_memory_bytes, rel=1e-3), p.to_string()


@pytest.mark.parametrize("plan", PIPELINE_AND_TP)
def test_pipeline_and_tensor_parallel_plans_agree_within_2_percent(plan):
    _agree([plan])


@pytest.mark.parametrize("plan", ZERO3)
def test_zero3_plans_agree_within_2_percent(plan):
    _agree([plan])


@pytest.mark.parametrize("plan", ZERO2)
def test_zero2_plans_agree_within_2_percent(plan):
    _agree([plan])


@pytest.mark.parametrize("plan", DATA_PARALLEL)
def test_data_parallel_plans_agree_within_2_percent(plan):
    _agree([plan])


# V placement (ZBV, DualPipeV): rank 0 holds the first stage and the last in two chunks; under
# ZeRO-3 each chunk gathers its own end (embedding, or final norm + head), as the engine does.
# Both ends around both chunks read these 11-13 % slower than the engine; now -0.4, +3.3 and
# +3.7 %: inside ``fast.honesty.PESSIMISM`` (5 %), the most a sweep lets the fast path over-price
# a plan it may leave out of what it re-simulates.
V_ZERO3 = ["dp=4 pp=2 vpp=2 gbs=64 schedule=dualpipev zero=3", "dp=4 pp=2 vpp=2 gbs=64 schedule=zbv zero=3",
           "dp=2 pp=4 vpp=2 gbs=64 schedule=zbv zero=3"]


@pytest.mark.parametrize("plan", V_ZERO3)
def test_v_placed_zero3_plans_agree_within_the_sweeps_5_percent(plan):
    model, cluster = load_model("gpt3-1.3b"), load_cluster("h100-sxm:8")
    p = parse_plan(plan)
    fast = evaluate(model, cluster, PlanTable.from_plans([p]))
    sim = simulate(model, cluster, p, record_events=False)
    assert fast.step_time_s[0] == pytest.approx(sim.step_time_s, rel=PESSIMISM)


def test_pipeline_across_nodes_agrees_within_2_percent():
    _agree(["tp=8 pp=8 gbs=64", "tp=8 pp=8 vpp=5 gbs=64 schedule=interleaved", "tp=8 pp=8 gbs=64 recompute=full sp=true"],
           "gpt3-13b", "a100-80g:64")


def test_a_plan_the_fast_path_says_fits_fits_in_the_simpy_engine():
    model, cluster = load_model("gpt3-1.3b"), load_cluster("a100-80g:8")
    space = SweepSpace(gbs=(16, 64), mbs=(1, 4, 8), vpp=(1, 2, 3, 4), stack="torch")
    table = enumerate_plans(model, cluster, space)
    fast = evaluate(model, cluster, table)
    m = table.microbatches
    cheap = np.flatnonzero(m * table["pp"] * table["vpp"] <= 256)
    rows = np.random.default_rng(3).choice(cheap, size=min(120, len(cheap)), replace=False)
    fits = fast.fits(0.0)
    assert 10 < fits[rows].sum() < len(rows)            # the sample has both kinds
    for i in rows:
        sim = simulate(model, cluster, table.plan(i), record_events=False)
        if fits[i]:
            assert sim.fits, table.plan(i).to_string()
        assert fast.peak_memory_bytes[i] == pytest.approx(sim.peak_memory_bytes, rel=1e-3)


BLOCKING_ZERO = ["dp=2 gbs=8 zero=3", "dp=2 gbs=8 mbs=2 zero=3 recompute=full", "dp=2 gbs=8 zero=2",
                 "dp=2 gbs=16 mbs=2 zero=2",
                 # 4 ranks: the closed form's pipeline and the split schedules' graph (``fast.split_timing``)
                 "dp=2 pp=2 gbs=8 zero=3", "dp=2 pp=2 gbs=8 zero=2 schedule=gpipe",
                 "dp=2 pp=2 gbs=8 zero=2 schedule=zb-h1", "dp=2 pp=2 vpp=2 gbs=8 zero=2 schedule=dualpipev"]


@pytest.mark.parametrize("plan", BLOCKING_ZERO)
def test_blocking_zero_collectives_agree_within_2_percent(plan):
    """A profile whose ZeRO collectives block the rank (gloo on the host's cores; FSDP2 with its
    copies and host work per unit: the frozen CPU fixture, its host-sharing curves left out, which
    the fast path does not model; 2 and 4 ranks): both engines wait for each collective in line,
    priced in situ (before, the fast path overlapped them and read ZeRO-3 half the engine's step),
    and count the waits as exposed DP time (ZeRO-3's root-unit gathers aside, which the engine
    leaves out of it: 10 %)."""
    from dataclasses import replace
    from pathlib import Path
    p = parse_plan(plan + " dtype=fp32")
    fixture = Path(__file__).parent / "fixtures" / "cpu-calibrated.yaml"
    base = load_cluster(f"cpu:{p.dp * p.pp}", profile=str(fixture))
    tables = base.device.tables
    assert tables.zero_blocking and tables.fsdp2_copies
    # a core per rank (``cores`` None): no message CPU taken from computing ranks either
    tables = tables.replace(contention=None, contention_membound=None, contention_layer=None, cores=None,
                            fsdp_gather_host_s=5e-4, fsdp_scatter_host_s=2e-4)
    cluster = replace(base, device=replace(base.device, tables=tables))
    model = load_model("cpu-small")
    fast = evaluate(model, cluster, PlanTable.from_plans([p]))
    sim = simulate(model, cluster, p, record_events=False)
    assert fast.step_time_s[0] == pytest.approx(sim.step_time_s, rel=0.02)
    assert fast.exposed_dp_s[0] == pytest.approx(sim.exposed_comm_s["dp"], rel=0.1)


SIDE_STREAM_FSDP2 = ["dp=8 gbs=32 zero=3", "dp=4 tp=2 gbs=16 zero=3 recompute=full", "dp=4 pp=2 gbs=32 zero=3",
                     "dp=4 pp=2 gbs=32 zero=3 schedule=gpipe", "dp=8 gbs=32 zero=2", "dp=2 pp=4 gbs=32 zero=2",
                     "dp=4 pp=2 vpp=2 gbs=32 zero=2 schedule=interleaved", "dp=4 pp=2 gbs=32 zero=2 schedule=zb-h1",
                     "dp=2 pp=4 gbs=32 zero=2 schedule=zbv", "dp=4 pp=2 gbs=32 zero=3 schedule=zb-h1",
                     "dp=4 pp=2 gbs=32 zero=3 schedule=zbv", "dp=2 pp=4 gbs=32 zero=3 schedule=dualpipev"]


@pytest.mark.parametrize("plan", SIDE_STREAM_FSDP2)
def test_fsdp2_copies_beside_a_side_stream_agree_within_2_percent(plan):
    """FSDP2 on a GPU (a profile ``parsim calibrate --device cuda`` writes: ``zero_copies:
    fsdp2``, collectives on a side stream): its copies and host work around each unit's
    collective are compute the rank owes, which the engine pays before its next action
    (``Device.ledger``) and the fast path adds to the layers' compute (``fast.comm.C_OWED_*``).
    Without them the fast path read these plans 6-13 % below the engine."""
    from dataclasses import replace
    p = parse_plan(plan + " stack=torch")
    base = load_cluster("a100-80g:8")
    tables = base.device.tables.replace(zero_copies="fsdp2", zero_overlap=True, fsdp_gather_host_s=2e-4,
                                        fsdp_scatter_host_s=2e-4)
    cluster = replace(base, device=replace(base.device, tables=tables))
    assert cluster.device.tables.fsdp2_copies and not cluster.device.tables.zero_blocking
    model = load_model("gpt3-2.7b")
    fast = evaluate(model, cluster, PlanTable.from_plans([p]))
    sim = simulate(model, cluster, p, record_events=False)
    assert fast.step_time_s[0] == pytest.approx(sim.step_time_s, rel=0.02)


def _with_stack(cluster, name: str, **numbers):
    """The cluster with the profile's numbers for stack ``name`` replaced (``device.stacks``)."""
    from dataclasses import replace

    from parsim.specs.stack import get_stack
    stacks = dict(cluster.device.stacks)
    stacks[name] = replace(stacks.get(name) or get_stack(name), **numbers)
    return replace(cluster, device=replace(cluster.device, stacks=stacks))


def _within(model_name: str, cluster, plan: str, rel: float) -> None:
    model, p = load_model(model_name), parse_plan(plan)
    fast = evaluate(model, cluster, PlanTable.from_plans([p]))
    sim = simulate(model, cluster, p, record_events=False)
    assert fast.step_time_s[0] == pytest.approx(sim.step_time_s, rel=rel), plan


# ZeRO-2 under stacks whose NCCL kernels slow the compute they run beside (``comm_compute_slowdown``:
# deepspeed 0.54, fsdp1 0.13 on the A100 profile): the per-microbatch reduce-scatters charge the
# compute beside them in both engines (``costs.overlap.scatter_overlap``). The fast path left it
# out and read these 17-32 % below the engine, none flagged approximate under pp = 1.
ZERO2_SLOWED = ["dp=2 mbs=1 gbs=16 zero=2 dtype=bf16 stack=deepspeed",
                "dp=2 mbs=1 gbs=16 zero=2 dtype=fp16 stack=deepspeed",
                "dp=8 mbs=1 gbs=16 zero=2 dtype=bf16 stack=deepspeed",
                "dp=2 mbs=1 gbs=2 zero=2 dtype=bf16 stack=deepspeed",
                "dp=4 mbs=1 gbs=16 zero=2 dtype=bf16 stack=fsdp1", "dp=2 pp=2 gbs=32 zero=2 stack=deepspeed",
                "dp=2 pp=2 gbs=32 zero=2 schedule=zb-h1 stack=deepspeed",
                "dp=2 pp=2 vpp=2 gbs=32 zero=2 schedule=zbv stack=deepspeed",
                "dp=2 pp=2 vpp=2 gbs=32 zero=2 schedule=dualpipev stack=deepspeed"]


@pytest.mark.parametrize("plan", ZERO2_SLOWED)
def test_zero2_reduce_scatters_slow_the_compute_beside_them_in_both_engines(plan):
    p = parse_plan(plan)
    _within("gpt3-1.3b", load_cluster(f"a100-80g:{p.dp * p.pp}"), plan, 0.03)


# ZeRO-3 whose DP traffic shares the device's port with its TP collectives (dp, tp > 1 in one
# node): a layer's first TP collective queues behind the ZeRO-3 transfer, so little compute runs
# beside it (``costs.overlap``); the fast path charged the NCCL slowdown on min(layer, transfer)
# and let no backward compute run beside the next layer's gather: 2-12 % slow under every stack,
# up to 33 % under deepspeed.
SHARED_PORT_ZERO3 = [f"dp=2 tp=2 pp=2 gbs=32 zero=3 sp=true stack={s}" for s in ("megatron-core", "fsdp1", "fsdp2",
                                                                                 "torch")] + [
    "dp=4 tp=2 gbs=32 zero=3 sp=true stack=fsdp1", "dp=2 tp=2 pp=2 gbs=32 zero=3 sp=true recompute=full stack=torch"]


@pytest.mark.parametrize("plan", SHARED_PORT_ZERO3)
def test_zero3_on_a_port_shared_with_tp_agrees_within_3_percent(plan):
    _within("gpt3-1.3b", load_cluster("a100-80g:8"), plan, 0.03)


def test_deepspeed_zero3_on_a_shared_port_agrees():
    """deepspeed's ZeRO-3 over 2 x 2 ranks with its slow gathers (``zero_comm_efficiency``): a naive
    pipeline (+25 % before), and the fuzzed 1F1B plan without the compute slowdown (+11 % before)."""
    _within("llama2-7b", load_cluster("h200:8"), "dp=2 tp=2 pp=2 mbs=2 gbs=32 schedule=naive zero=3 sp=true "
            "stack=deepspeed", 0.03)
    cluster = _with_stack(load_cluster("a100-80g:8"), "deepspeed", comm_compute_slowdown=0.0)
    _within("gpt3-1.3b", cluster, "dp=2 tp=2 pp=2 gbs=32 zero=3 sp=true stack=deepspeed", 0.03)


# ZeRO-2 whose reduce-scatters share the device's port with its TP collectives (dp, tp > 1 in one
# node): a backward layer's first TP collective queues behind the previous layer's reduce-scatter,
# a forward's behind the last one of the backward before it, and the compute beside them is only
# what runs up to that collective (``fast.timing._plan_terms``). The fast path let them overlap
# freely: 6-19 % fast under every stack, pp = 1 included (not flagged there).
SHARED_PORT_ZERO2 = ["dp=4 tp=2 gbs=32 zero=2 sp=true stack=deepspeed", "dp=4 tp=2 gbs=32 zero=2 sp=true stack=megatron-core",
                     "dp=2 tp=4 gbs=16 zero=2 sp=true stack=fsdp1"] + [
    f"dp=2 tp=2 pp=2 gbs=32 zero=2 sp=true stack={s}" for s in ("megatron-core", "deepspeed", "fsdp2")] + [
    "dp=2 tp=2 pp=2 gbs=32 zero=2 sp=true schedule=gpipe stack=deepspeed",
    "dp=2 tp=2 pp=2 vpp=2 gbs=32 zero=2 sp=true schedule=interleaved stack=deepspeed",
    "dp=2 tp=2 pp=2 gbs=8 zero=2 sp=true recompute=full stack=deepspeed"]


@pytest.mark.parametrize("plan", SHARED_PORT_ZERO2)
def test_zero2_on_a_port_shared_with_tp_agrees_within_3_percent(plan):
    _within("gpt3-1.3b", load_cluster("a100-80g:8"), plan, 0.03)


def test_zero2_interleaved_with_every_forward_in_the_warm_up_agrees():
    """ZeRO-2 over the NIC, interleaved with as many microbatches as ranks: every forward runs
    before the first backward, so the backwards run back to back and the DP stream drains long
    after them; the fast path paced them at forward + backward and read 17 % fast."""
    _within("gpt3-6.7b", load_cluster("a100-80g:64"),
            "dp=4 tp=8 pp=2 vpp=4 gbs=8 schedule=interleaved zero=2 sp=true stack=megatron-core", 0.03)


def test_the_last_backwards_owed_compute_is_paid_with_the_optimizer_on_the_host():
    """ZeRO-2 with the optimizer offloaded under deepspeed (its NCCL kernels slow the compute
    beside them), one microbatch a step: the SimPy engine paid the compute a backward owes only
    before a next action on the device, so with the step on the host it never paid the last
    one's; the fast path adds it, and read 25 % slower than the engine."""
    _within("gpt3-1.3b", load_cluster("a100-80g:16"),
            "dp=16 mbs=2 gbs=32 zero=2 offload=optimizer recompute=selective stack=deepspeed", 0.03)


# Split-backward schedules with ZeRO-2 where DP and TP share a port: W's reduce-scatters hold
# the port, so the next F / I / B's first TP collective waits for them (``fast.port.
# queue_node``); before, the fast path let them overlap and read these 7-13 % fast.
SPLIT_PORT_ZERO2 = [
    f"dp=2 tp=2 pp=2 gbs=32 zero=2 sp=true schedule={s} stack=deepspeed" for s in ("zb-h1", "zb-h2")] + [
    f"dp=2 tp=2 pp=2 vpp=2 gbs=32 zero=2 sp=true schedule={s} stack=deepspeed" for s in ("interleaved-zb", "zbv")] + [
    "dp=2 tp=2 pp=2 gbs=8 zero=2 sp=true schedule=zb-h1 stack=deepspeed",
    "dp=2 tp=2 pp=2 gbs=32 zero=2 sp=true recompute=full schedule=zb-h2 stack=deepspeed"]


@pytest.mark.parametrize("plan", SPLIT_PORT_ZERO2)
def test_split_schedules_zero2_on_a_port_shared_with_tp_agree_within_4_percent(plan):
    _within("gpt3-1.3b", load_cluster("a100-80g:8"), plan, 0.04)


# ZeRO-2 whose DP stream is busier than the compute under a stack whose NCCL kernels slow the
# compute (deepspeed): the compute paid for the overlap runs beside the reduce-scatters too
# (``costs.overlap.scatter_overlap``), and a split schedule's first reduce-scatter waits for its
# deferred W (``fast.split_timing._ready``); before, the fast path read these 9-13 % fast.
DP_BOUND_ZERO2 = ["dp=16 gbs=64 zero=2 stack=deepspeed",
                  "dp=8 pp=2 vpp=2 gbs=64 zero=2 schedule=zbv stack=deepspeed",
                  "dp=4 pp=4 gbs=16 zero=2 schedule=zb-h2 stack=deepspeed"]


@pytest.mark.parametrize("plan", DP_BOUND_ZERO2)
def test_dp_bound_zero2_with_the_compute_slowdown_agrees_within_4_percent(plan):
    _within("gpt3-1.3b", load_cluster("a100-80g:16"), plan, 0.04)


# ZeRO-3 under stacks whose NCCL kernels slow the compute beside them: the engine pays a
# backward's owed compute at the next action's start while that backward's last reduce-scatters
# drain (``fast.zero3.drain_paid``), a backward's second layer gathers behind no reduce-scatter
# (``chained_backward``), and split schedules owe for I's gathers and W's reduce-scatters too
# (``split_owed``); before, the fast path read these 5-17 % slow (the split one 16 % fast).
ZERO3_SLOWDOWN = [("a100-80g:8", "dp=2 tp=2 pp=2 gbs=32 zero=3 sp=true stack=deepspeed"),
                  ("a100-80g:8", "dp=8 mbs=1 gbs=32 zero=3 dtype=bf16 stack=deepspeed"),
                  ("a100-80g:8", "dp=4 pp=2 mbs=1 gbs=32 zero=3 dtype=bf16 stack=fsdp1"),
                  ("a100-80g:16", "dp=4 pp=4 mbs=1 gbs=64 schedule=1f1b zero=3 dtype=bf16 stack=deepspeed"),
                  ("a100-80g:16", "dp=4 pp=4 mbs=1 gbs=64 schedule=gpipe zero=3 dtype=bf16 stack=deepspeed"),
                  ("a100-80g:16", "dp=8 pp=2 mbs=1 gbs=64 schedule=zb-h1 zero=3 dtype=bf16 stack=deepspeed")]


@pytest.mark.parametrize("cluster,plan", ZERO3_SLOWDOWN)
def test_zero3_with_the_compute_slowdown_agrees_within_3_percent(cluster, plan):
    _within("gpt3-1.3b", load_cluster(cluster), plan, 0.03)


# FSDP2 on a GPU (stack fsdp2): each unit's all-gather is copied out of FSDP2's flat buffer on
# the compute stream; its copy-ins run on the collectives' side streams (``costs.stack.zero_unit_time``).
FSDP2_GPU = ["dp=8 mbs=1 gbs=16 zero=3 dtype=bf16 stack=fsdp2",
             "dp=8 mbs=1 gbs=16 zero=3 recompute=full dtype=bf16 stack=fsdp2",
             "dp=8 mbs=1 gbs=16 zero=2 dtype=bf16 stack=fsdp2"]


@pytest.mark.parametrize("plan", FSDP2_GPU)
def test_fsdp2_copies_on_a_gpu_agree_between_engines(plan):
    """Within 4 %: fsdp2 takes fsdp1's NCCL compute slowdown, and its copies are owed to the
    compute like that slowdown (paid after the layer, on top of a DP-bound layer's period)."""
    _within("gpt3-1.3b", load_cluster("a100-80g:8"), plan, 0.04)


def test_fsdp2_on_a_gpu_owes_each_gathers_copy_out_to_the_compute():
    """A ZeRO-3 step of FSDP2 on one GPU node is longer than the same step without FSDP2's copies
    by the copy-outs of the all-gathers it runs: 2 x each gathered unit's bytes through HBM at the
    profile's streaming rate and one op's host time under the stack (``costs.fsdp2.fsdp_unit_time``),
    on the compute stream; the reduce-scatters' copy-ins ride their side stream."""
    from parsim.costs.fsdp2 import fsdp_unit_time
    from parsim.fast.tables import with_stack
    from parsim.trace.frame import to_dataframe
    model, plan = load_model("gpt3-1.3b"), parse_plan(FSDP2_GPU[0])
    cluster = load_cluster("a100-80g:8")
    with_copies = simulate(model, cluster, plan)
    without = simulate(model, _with_stack(cluster, "fsdp2", fsdp2_copies=False), plan, record_events=False)
    df = to_dataframe(with_copies.trace)
    gathers = df[(df["rank"] == 0) & (df["kind"] == "zero_allgather")]
    device = with_stack(model, cluster, PlanTable.from_plans([plan]))[1].device      # the stack's numbers
    owed = sum(fsdp_unit_time(device, "all_gather", b, 8)[1] for b in gathers["bytes"])
    assert len(gathers) > 2 * model.layers and owed > 0
    assert with_copies.step_time_s - without.step_time_s == pytest.approx(owed, rel=0.02)
