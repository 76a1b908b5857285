"""Pipeline sends across nodes: each device's share of the node's NICs, and the stacks whose
sends hold their sender (``Stack.p2p_blocking``, ``costs.p2p_holds_sender``) in both engines."""
import dataclasses

import pytest

from parsim.costs import p2p_bytes, p2p_holds_sender
from parsim.costs.links import nic_share
from parsim.costs.timing import p2p_time
from parsim.fast import PlanTable, evaluate
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.study.runs.observations import observation
from parsim.study.runs.predict import base_profiles, clusters_for

INTER_NODE = "dp=1 tp=8 pp=4 mbs=1 recompute=full"       # every stage a node: every send crosses


def test_a_send_across_nodes_gets_its_share_of_the_nodes_nics():
    dgx = load_cluster("a100-80g:16")
    net = dgx.network
    four = dataclasses.replace(dgx, network=dataclasses.replace(net, nics_per_node=4))
    nbytes = 1e8
    assert p2p_time(dgx, nbytes, 0, 8) == pytest.approx(net.inter_node.latency + nbytes / net.inter_node.bandwidth)
    # 8 devices sending at once over 4 NICs: half a NIC each
    assert p2p_time(four, nbytes, 0, 8) == pytest.approx(net.inter_node.latency + nbytes / (net.inter_node.bandwidth / 2))
    assert p2p_time(four, nbytes, 0, 1) == p2p_time(dgx, nbytes, 0, 1)        # NVLink inside the node


@pytest.mark.parametrize("plan, holds", [
    ("pp=4 stack=megatron-lm", True), ("pp=4 stack=megatron-lm-2021 schedule=gpipe", True),
    ("pp=4 stack=megatron-deepspeed schedule=interleaved vpp=2", True), ("pp=4 stack=deepspeed", True),
    ("pp=4 stack=megatron-lm schedule=naive", False), ("pp=4 stack=megatron-lm schedule=zb-h1", False),
    ("pp=1 stack=megatron-lm", False), ("pp=4 stack=megatron-core", False), ("pp=4 stack=torch", False),
    ("pp=4 stack=fsdp2", False)])
def test_which_sends_hold_their_sender(plan, holds):
    assert p2p_holds_sender(parse_plan(plan)) is holds


def _slow_links(n: int):
    """a100-80g nodes joined by one 16 Gb/s NIC each: sends that last as long as a pass."""
    c = load_cluster(f"a100-80g:{n}")
    link = dataclasses.replace(c.network.inter_node, bandwidth=2e9)
    return dataclasses.replace(c, network=dataclasses.replace(c.network, inter_node=link, nics_per_node=1))


def _compute_and_sends(stack: str, schedule: str = "1f1b"):
    res = simulate("gpt3-13b", _slow_links(32), parse_plan(f"{INTER_NODE} gbs=16 stack={stack} schedule={schedule}"),
                   record_events=True)
    events = res.trace.events
    by_rank = {}
    for e in events:
        if e.layer == -1 and (e.stream == "compute" or (e.stream == "pp" and e.kind == "send")):
            by_rank.setdefault(e.rank, []).append(e)
    return res, by_rank


def _starts_before_own_send_ends(by_rank) -> int:
    """Compute actions that start while the same rank's previous send is still on the wire."""
    early = 0
    for events in by_rank.values():
        sent_until = 0.0
        for e in sorted(events, key=lambda e: (e.start, e.stream != "compute")):
            if e.stream == "compute":
                early += e.start < sent_until - 1e-12
            else:
                sent_until = max(sent_until, e.end)
    return early


def test_a_blocking_stacks_rank_computes_nothing_while_its_send_is_on_the_wire():
    _, blocking = _compute_and_sends("megatron-deepspeed")
    _, overlapped = _compute_and_sends("megatron-core")
    assert _starts_before_own_send_ends(blocking) == 0
    assert _starts_before_own_send_ends(overlapped) > 0


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved", "naive", "zb-h1"])
@pytest.mark.parametrize("stack", ["megatron-deepspeed", "megatron-lm"])
def test_fast_path_prices_held_sends_as_the_simpy_engine_plays_them(stack, schedule):
    model, cluster = load_model("gpt3-13b"), load_cluster("a100-80g:32")
    plan = parse_plan(f"{INTER_NODE} gbs=32 stack={stack} schedule={schedule}"
                      + (" vpp=2" if schedule == "interleaved" else ""))
    fast = evaluate(model, cluster, PlanTable.from_plans([plan]))
    sim = simulate(model, cluster, plan, record_events=False)
    assert fast.step_time_s[0] == pytest.approx(sim.step_time_s, rel=0.01)
    if p2p_holds_sender(plan):
        # the held sends are exposed pipeline time: at least one send per microbatch per rank
        one = p2p_time(cluster, p2p_bytes(model, plan), 0, 8)
        assert sim.exposed_comm_s["pp"] >= plan.gbs // plan.mbs * one


def test_bloom_runs_are_simulated_on_jean_zays_network():
    row = dict(source="BLOOM_tr11_chronicles_prequel", model="BLOOM-prototype", params_b=176, layers=70,
               hidden=14336, heads=112, seq_len=2048, vocab="250k", gpus=384, gpu_type="A100-SXM4-80GB (Jean Zay)",
               tp=4, pp=12, dp=8, zero_stage=1, microbatch=2, global_batch=2048, recompute="full",
               metric="iteration_time", value=100.0, notes="date 02-25")
    o = observation(0, row)
    cluster = clusters_for(base_profiles([o.profile]), [o])[o.cluster_key]
    assert cluster.network.nics_per_node == 4
    assert nic_share(cluster) == pytest.approx(11.5e9 * 4 / 8)
    assert load_cluster("a100-80g:384").network.nics_per_node == 8        # the profile itself is unchanged
