"""Pipeline messages' CPU on a host whose ranks outnumber its cores (``costs.host.message_cpu``):
which actions send and receive across ranks, when the measured cost counts, how calibration turns
the line benchmark into the profile's two curves, and that the SimPy engine and the partitioner's
shared-host replay both charge it."""
import dataclasses

import pytest

from parsim.costs.host import HostModel, message_cpu
from parsim.costs.placement import remote_messages
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.specs.tables import RankCurve

FIXTURE = "tests/fixtures/cpu-calibrated.yaml"
SEND, RECV = 0.4e-3, 1.2e-3       # s per message at 4 ranks (the order measured on a 2-vCPU VM)


def _with_messages(cluster, send=SEND, recv=RECV):
    tables = cluster.device.tables.replace(p2p_send_cpu=RankCurve(((2, send / 2), (4, send))),
                                           p2p_recv_cpu=RankCurve(((2, recv / 2), (4, recv))))
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


def test_an_action_sends_and_receives_only_across_ranks():
    loop = parse_plan("pp=2 gbs=8 schedule=1f1b")
    assert remote_messages(loop, 0, "F") == (0, 1) and remote_messages(loop, 1, "F") == (1, 0)
    assert remote_messages(loop, 1, "B") == (0, 1) and remote_messages(loop, 0, "B") == (1, 0)
    assert remote_messages(loop, 1, "W") == (0, 0)
    # ZBV at pp=2: stages 0..3 on ranks 0, 1, 1, 0; the V's turn (1 -> 2) is handed over in memory
    v = parse_plan("pp=2 gbs=8 schedule=zbv")
    assert remote_messages(v, 1, "F") == (1, 0) and remote_messages(v, 2, "F") == (0, 1)
    assert remote_messages(v, 2, "I") == (1, 0) and remote_messages(v, 1, "I") == (0, 1)
    assert remote_messages(v, 3, "B") == (0, 1)       # the last stage computes the loss: nothing comes in


def test_message_cpu_counts_only_where_ranks_outnumber_the_cores():
    cluster = _with_messages(load_cluster("cpu:4", profile=FIXTURE))
    assert cluster.device.tables.cores == 2
    assert message_cpu(cluster, 2) == (0.0, 0.0)                       # a core per rank
    assert message_cpu(cluster, 4) == pytest.approx((SEND, RECV))
    assert message_cpu(cluster, 3) == pytest.approx((0.75 * SEND, 0.75 * RECV))   # linear between counts
    assert message_cpu(cluster, 8) == pytest.approx((SEND, RECV))      # held beyond the largest
    assert HostModel(cluster, 4).message_seconds(1, 1) == pytest.approx(SEND + RECV)
    assert message_cpu(load_cluster("cpu:4", profile=FIXTURE), 4) == (0.0, 0.0)    # not measured: none
    assert message_cpu(load_cluster("h100-sxm:16"), 16) == (0.0, 0.0)


def test_calibration_fits_the_lines_cpu_per_message_and_splits_it_by_its_end_ranks():
    from parsim.calibration.tables import message_cpu_curves
    # 3 ranks in a line, two messages per block. At 1e5 bytes rank 0 (only sends) spends 0.2 ms
    # a message, rank 1 (both) 1.0, rank 2 (only receives) 0.6: one message costs 1.8 / 2 = 0.9
    # ms; at 1.6e6 bytes each rank spends 0.6 ms more, so one message (0.9 + 1.8 / 2) ms: 0.9 ms
    # more for 1.5e6 bytes is 6e-10 s a byte, and 0.9 ms - 1e5 x 6e-10 = 0.84 ms fixed, split 1 : 3
    # by the end ranks
    small, large = 100_000, 1_600_000
    ranks = [{"message_cpu": {small: [0.2e-3, 0.3e-3, 0.2e-3], large: [0.8e-3] * 3}},
             {"message_cpu": {small: [1.0e-3, 1.0e-3, 0.9e-3], large: [1.6e-3] * 3}},
             {"message_cpu": {small: [0.6e-3, 0.5e-3, 0.6e-3], large: [1.2e-3] * 3}}]
    send, recv, per_byte = message_cpu_curves({3: ranks, 2: [{"collectives": {}}] * 2})
    assert per_byte.values == ((3, pytest.approx(6e-10)),)
    assert send.values == ((3, pytest.approx(0.84e-3 * 0.25)),)
    assert recv.values == ((3, pytest.approx(0.84e-3 * 0.75)),)
    assert message_cpu_curves({2: [{}, {}]}) == (None, None, None)
    # noise below zero: no cost, not a credit; a large size that reads cheaper: no bytes term
    neg = [{"message_cpu": {small: [-1e-4], large: [-3e-4]}}, {"message_cpu": {small: [-2e-4], large: [-1e-4]}}]
    assert [c.values for c in message_cpu_curves({2: neg})] == [((2, 0.0),), ((2, 0.0),), ((2, 0.0),)]


def test_a_messages_bytes_cost_half_on_each_side():
    cluster = _with_messages(load_cluster("cpu:4", profile=FIXTURE))
    tables = cluster.device.tables.replace(p2p_cpu_per_byte=RankCurve(((4, 1e-9),)))
    cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))
    assert message_cpu(cluster, 4, 2e6) == pytest.approx((SEND + 1e-3, RECV + 1e-3))
    assert message_cpu(cluster, 2, 2e6) == (0.0, 0.0)
    assert HostModel(cluster, 4).message_seconds(1, 1, 2e6) == pytest.approx(SEND + RECV + 2e-3)


def test_the_engine_charges_messages_to_the_pipeline_on_a_shared_host_only():
    from parsim.sim import simulate
    model = load_model("cpu-small")
    base4, msg4 = load_cluster("cpu:4", profile=FIXTURE), _with_messages(load_cluster("cpu:4", profile=FIXTURE))
    steps = {}
    for text in ("pp=4 gbs=8 schedule=1f1b dtype=fp32", "pp=4 vpp=2 gbs=8 schedule=interleaved dtype=fp32"):
        plan = parse_plan(text)
        before = simulate(model, base4, plan, record_events=False).step_time_s
        after = simulate(model, msg4, plan, record_events=False).step_time_s
        steps[plan.schedule] = after / before - 1
    # more (and shorter) actions, more messages: interleaving pays more of the host
    assert 0.005 < steps["1f1b"] < steps["interleaved"] < 0.5
    two = parse_plan("pp=2 gbs=8 schedule=1f1b dtype=fp32")
    base2, msg2 = load_cluster("cpu:2", profile=FIXTURE), _with_messages(load_cluster("cpu:2", profile=FIXTURE))
    assert simulate(model, msg2, two, record_events=False).step_time_s == \
        simulate(model, base2, two, record_events=False).step_time_s


def test_the_partitioners_shared_host_replay_charges_them_as_the_engine_does():
    from parsim.partition.pipeline import shared_host_run
    plan = parse_plan("pp=4 gbs=8 schedule=1f1b dtype=fp32")
    jobs = [(0.0, 0.02, 0.005)] * 4
    base = _with_messages(load_cluster("cpu:4", profile=FIXTURE), 0.0, 0.0)
    msg = _with_messages(load_cluster("cpu:4", profile=FIXTURE))
    before = shared_host_run(plan, jobs, jobs, [1e-4] * 4, HostModel(base, 4))
    after = shared_host_run(plan, jobs, jobs, [1e-4] * 4, HostModel(msg, 4))
    # each middle stage's F and B receive one message and send one: their solo GEMM work grows by
    # SEND + RECV, which the sharing then stretches as it stretches compute
    assert after.step_time_s > before.step_time_s
    assert after.fwd_s[1] - before.fwd_s[1] >= SEND + RECV - 1e-9
    # the boundaries' bytes: each message's copies on top (2 MB at 1e-9 s a byte: 2 ms a message)
    tables = msg.device.tables.replace(p2p_cpu_per_byte=RankCurve(((4, 1e-9),)))
    copies = dataclasses.replace(msg, device=dataclasses.replace(msg.device, tables=tables))
    heavy = shared_host_run(plan, jobs, jobs, [1e-4] * 4, HostModel(copies, 4), send_bytes=[2e6] * 3)
    assert heavy.fwd_s[1] - after.fwd_s[1] >= 2e-3 - 1e-9


def test_calibrate_prints_the_message_cpu_it_measured():
    from pathlib import Path

    import yaml

    from parsim.cli.calibrate import render
    profile = yaml.safe_load(Path(FIXTURE).read_text())
    assert "pipeline message CPU" not in render(profile, Path(FIXTURE))
    profile["device"]["extra"].update(p2p_send_cpu={"2": 1e-4, "4": 2.2e-4}, p2p_recv_cpu={"2": 6e-4, "4": 8.8e-4},
                                      p2p_cpu_per_byte={"2": 0.0, "4": 4e-10})
    line = next(x for x in render(profile, Path(FIXTURE)).splitlines() if x.startswith("pipeline message CPU"))
    assert "outnumber the 2 cores" in line and line.endswith("2: 0.10 / 0.60 + 0.00 a MiB, 4: 0.22 / 0.88 + 0.42 a MiB")
