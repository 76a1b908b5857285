"""Synchronous TP collectives are priced in situ (``alpha_insitu``) where a calibrated profile
measured it, in both engines; DP collectives and profiles without the key keep their prices."""
import copy
from pathlib import Path

import pytest

from parsim.fast import PlanTable, evaluate
from parsim.sim import simulate
from parsim.specs import cluster_from_dict, load_model, load_profile_dict, parse_plan

EXTRA = 1e-3      # seconds of in-situ latency added to every calibrated entry
CPU_CALIBRATED = str(Path(__file__).resolve().parent / "fixtures" / "cpu-calibrated.yaml")   # frozen measured profile


def _clusters(world: int, shared: dict | None = None, host_contention: bool = True, block_s: float | None = None):
    """The shipped CPU profile without in-situ keys, and with alpha_insitu = alpha + EXTRA
    everywhere (and ``shared``: {ranks on the host: extra seconds} as alpha_insitu_shared).
    ``host_contention=False`` drops the measured compute contention, so ranks do not slow each
    other down (``costs.host``): a longer TP latency then moves no rank's compute against another's."""
    base = load_profile_dict(CPU_CALIBRATED)
    if not host_contention:
        for key in ("contention", "contention_membound", "contention_layer", "contention_gemm_probe"):
            base["device"]["extra"].pop(key, None)
    for per in base["network"]["collectives"].values():
        for entry in per.values():
            for key in ("alpha_insitu", "alpha_insitu_shared"):
                entry.pop(key, None)
    insitu = copy.deepcopy(base)
    for per in insitu["network"]["collectives"].values():
        for entry in per.values():
            entry["alpha_insitu"] = entry["alpha"] + EXTRA
            if shared:
                entry["alpha_insitu_shared"] = {k: entry["alpha"] + v for k, v in shared.items()}
                if block_s is not None:
                    entry["insitu_block_s"] = block_s
    return cluster_from_dict(base, num_devices=world), cluster_from_dict(insitu, num_devices=world)


def _step_times(model, plan, clusters):
    table = PlanTable.from_plans([plan])
    sim = [simulate(model, c, plan, record_events=False).step_time_s for c in clusters]
    fast = [float(evaluate(model, c, table).step_time_s[0]) for c in clusters]
    return sim, fast


@pytest.mark.parametrize("text, collectives", [
    # microbatches x (layers x (2 fwd + 2 bwd all-reduces) + embedding, output layer and loss: 4)
    ("tp=2 gbs=8 dtype=fp32", 8 * (8 * 4 + 4)),
    # with SP each all-reduce is a reduce-scatter + all-gather (the loss's two stay all-reduces)
    ("tp=2 gbs=8 sp=true dtype=fp32", 8 * (8 * 8 + 6)),
])
def test_in_situ_latency_adds_once_per_serial_tp_collective_in_both_engines(text, collectives):
    model, plan = load_model("cpu-small"), parse_plan(text)
    sim, fast = _step_times(model, plan, _clusters(plan.world_size))
    # one rank computes and communicates in one serial chain (Megatron's synchronous TP)
    assert sim[1] - sim[0] == pytest.approx(collectives * EXTRA, rel=1e-3)
    assert fast[1] - fast[0] == pytest.approx(collectives * EXTRA, rel=1e-3)


def test_tp_groups_sharing_a_host_with_more_ranks_take_the_shared_in_situ_latency():
    # dp=2 x tp=2 on one 4-rank host: the TP group of 2 is priced at alpha_insitu_shared["4"].
    # Without compute contention, so that the latency is all that changes (with it, the longer
    # collectives also shift how the 4 ranks' compute overlaps: +2.6% more with the 19:31 profile)
    model, plan = load_model("cpu-small"), parse_plan("dp=2 tp=2 gbs=8 dtype=fp32")
    sim, fast = _step_times(model, plan, _clusters(4, shared={"4": 3 * EXTRA}, host_contention=False))
    collectives = 4 * (8 * 4 + 4)                    # microbatches per replica x (layers x 4 + edges)
    assert sim[1] - sim[0] == pytest.approx(collectives * 3 * EXTRA, rel=2e-2)
    assert fast[1] - fast[0] == pytest.approx(collectives * 3 * EXTRA, rel=2e-2)
    # a host count that was not measured: alpha_insitu
    sim, fast = _step_times(model, plan, _clusters(4, shared={"8": 3 * EXTRA}, host_contention=False))
    assert sim[1] - sim[0] == pytest.approx(collectives * EXTRA, rel=2e-2)


def test_the_shared_premium_grows_with_the_compute_before_each_call_in_both_engines():
    # CollectiveFit.shared_alpha: the premium over the group's own in-situ latency (here 2 x EXTRA)
    # is the probe's times min(compute before the call / the probe's block, 1)
    model, plan = load_model("cpu-small"), parse_plan("dp=2 tp=2 gbs=8 dtype=fp32")
    collectives = 4 * (8 * 4 + 4)
    base = _step_times(model, plan, _clusters(4, shared={"4": 3 * EXTRA}, host_contention=False))
    extra = {}
    for block in (1e3, 1e-2, 1e-12):
        sim, fast = _step_times(model, plan, _clusters(4, shared={"4": 3 * EXTRA}, host_contention=False,
                                                       block_s=block))
        extra[block] = (sim[1] - sim[0]) / (collectives * EXTRA)
        assert fast[1] - fast[0] == pytest.approx(sim[1] - sim[0], rel=1e-6)      # the engines agree
    # a block far longer than any layer's compute: the own latency; far shorter: the probe's whole
    # premium (every call of these chains follows some compute); between: part of it
    assert extra[1e3] == pytest.approx(1.0, abs=1e-3)
    assert extra[1e-12] == pytest.approx(3.0, abs=1e-3)
    assert 1.1 < extra[1e-2] < 2.9
    # without the probe's block in the profile: the shared latency as measured, as before
    assert base[0][1] - base[0][0] == pytest.approx(collectives * 3 * EXTRA, rel=2e-2)


def test_dp_collectives_are_not_priced_in_situ():
    model, plan = load_model("cpu-small"), parse_plan("dp=2 gbs=8 dtype=fp32")
    b2b, insitu = _clusters(2)
    assert simulate(model, insitu, plan, record_events=False).step_time_s == \
        simulate(model, b2b, plan, record_events=False).step_time_s


def test_the_shared_premium_scales_with_the_share_of_time_the_other_ranks_compute():
    # CollectiveFit.shared_alpha: a peer waits for a core only while the others compute
    from parsim.specs.collectives import CollectiveFit
    from parsim.specs.tables import RankCurve
    fit = CollectiveFit(alpha=1e-4, beta=0.0, alpha_insitu=1e-3, alpha_insitu_shared=RankCurve(((4, 3e-3),)),
                        insitu_block_s=2e-3)
    own, premium = 1e-3, 2e-3
    assert fit.shared_alpha(4, own, None) == pytest.approx(own + premium)            # as the probe measured
    assert fit.shared_alpha(4, own, None, busy=0.25) == pytest.approx(own + 0.25 * premium)
    assert fit.shared_alpha(4, own, 1e-3, busy=0.5) == pytest.approx(own + 0.5 * 0.5 * premium)
    assert fit.shared_alpha(4, own, 1e-3, busy=0.0) == pytest.approx(own)
    assert fit.shared_alpha(4, own, 5e-3, busy=7.0) == pytest.approx(own + premium)  # clamped to [0, 1]
    # the group alone on its host: no premium, whatever the share
    assert fit.seconds(0.0, in_situ=True, host_ranks=2, group=2, busy=1.0) == pytest.approx(own)


def test_the_engine_prices_a_shared_premium_by_the_share_its_ranks_compute():
    # tp=2 pp=2 on one 4-rank host: the pipeline's ranks sit in bubbles and wait for messages, so
    # the host's other ranks compute part of the step and the premium is paid in part
    model, plan = load_model("cpu-small"), parse_plan("tp=2 pp=2 gbs=8 sp=true dtype=fp32")
    own = _clusters(4, shared={"4": EXTRA})[1]                   # the shared latency = the own one
    shared = _clusters(4, shared={"4": 3 * EXTRA})[1]            # a premium of 2 x EXTRA a call
    collectives = 8 * (4 * 8 + 4)            # microbatches x (4 layers a stage x 8 + the edges' few)
    t_own, t_shared = (simulate(model, c, plan, record_events=False).step_time_s for c in (own, shared))
    paid = (t_shared - t_own) / (collectives * 2 * EXTRA)
    assert 0.1 < paid < 0.95
