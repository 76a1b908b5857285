"""Engine hooks for faults: slowdowns of representative ranks, degraded NICs."""
from __future__ import annotations

import pytest

from parsim.sim import simulate
from parsim.specs import SpecError

MODEL, CLUSTER, PLAN = "gpt3-1.3b", "a100-80g:16", "dp=2 tp=2 pp=4 gbs=16"


def test_representative_slowdown_equals_full_mode_with_its_replica_and_tp_peers_slowed():
    # rank = (pp_rank * dp + dp_rank) * tp + tp_rank: ranks 4 and 5 are pipeline rank 1, replica 0
    rep = simulate(MODEL, CLUSTER, PLAN, slowdown={4: 1.7}).step_time_s
    full = simulate(MODEL, CLUSTER, PLAN, mode="full", slowdown={4: 1.7, 5: 1.7}).step_time_s
    base = simulate(MODEL, CLUSTER, PLAN).step_time_s
    assert rep == pytest.approx(full, rel=1e-9)
    assert rep > base * 1.05


def test_representative_mode_rejects_slowdowns_of_ranks_it_does_not_simulate():
    with pytest.raises(SpecError, match="representative"):
        simulate(MODEL, CLUSTER, PLAN, mode="representative", slowdown={5: 1.5})


def test_a_degraded_nic_slows_the_inter_node_gradient_all_reduce():
    # dp=8 over 8 nodes of one device each: every DP all-reduce crosses the NIC
    cluster, plan = "a100-80g:8", "dp=8 gbs=8"
    from parsim.specs import load_cluster
    one_per_node = load_cluster(cluster)
    one_per_node = type(one_per_node)(one_per_node.name, one_per_node.device, one_per_node.network, 1, 8)
    base = simulate(MODEL, one_per_node, plan)
    slow = simulate(MODEL, one_per_node, plan, link_slowdown={3: 4.0})
    assert slow.step_time_s > base.step_time_s
    assert slow.exposed_comm_s["dp"] > base.exposed_comm_s["dp"]
    # a factor of 1 changes nothing, bit for bit
    assert simulate(MODEL, one_per_node, plan, link_slowdown={3: 1.0}).step_time_s == base.step_time_s


def test_a_degraded_nic_leaves_intra_node_traffic_alone():
    base = simulate(MODEL, "a100-80g:8", "tp=8 gbs=8").step_time_s
    assert simulate(MODEL, "a100-80g:8", "tp=8 gbs=8", link_slowdown={2: 5.0}).step_time_s == base


@pytest.mark.parametrize("links, match", [({99: 2.0}, "rank must be"), ({1: 0.0}, "positive")])
def test_bad_link_slowdowns_name_the_field(links, match):
    with pytest.raises(SpecError, match=match) as err:
        simulate(MODEL, CLUSTER, PLAN, link_slowdown=links)
    assert err.value.field == "link_slowdown"
