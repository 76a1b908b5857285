"""The late start of an action on a message from another rank where ranks outnumber the host's
cores (``costs.host.message_hold``): when it counts, how calibration reads it off the line
benchmark's stamps, and that the SimPy engine and the partitioner's shared-host replay both
start such actions that much later (and only those)."""
import dataclasses
from typing import Callable

import pytest

from parsim.costs.host import HostModel, message_hold
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.specs.tables import RankCurve

FIXTURE = "tests/fixtures/cpu-calibrated.yaml"
HOLD = 2e-3       # s at 4 ranks on 2 cores (what the executor's traces read on a 2-vCPU VM)


def _with_hold(cluster, hold=HOLD):
    tables = cluster.device.tables.replace(p2p_hold=RankCurve(((2, 0.0), (4, hold))))
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


def test_the_hold_counts_only_where_ranks_outnumber_the_cores():
    cluster = _with_hold(load_cluster("cpu:4", profile=FIXTURE))
    assert cluster.device.tables.cores == 2
    assert message_hold(cluster, 2) == 0.0
    assert message_hold(cluster, 4) == pytest.approx(HOLD)
    assert message_hold(cluster, 3) == pytest.approx(0.5 * HOLD)       # linear between counts
    assert message_hold(cluster, 16) == pytest.approx(HOLD)            # held beyond the largest
    assert HostModel(cluster, 4).message_hold == pytest.approx(HOLD)
    assert message_hold(load_cluster("cpu:4", profile=FIXTURE), 4) == 0.0     # not measured: none
    assert message_hold(load_cluster("h100-sxm:16"), 16) == 0.0


def _stamps(holds_per_receiver, sent_at=0.01, gap=0.05):
    """One sample of a line: rank r - 1 sends its k-th message at ``sent_at + k gap``, rank r
    calls its k-th receive 1 ms before that (so the send decides) and it returns ``hold`` after
    the send."""
    world = len(holds_per_receiver) + 1
    out = []
    for r in range(world):
        sends = [sent_at + k * gap for k in range(3)] if r < world - 1 else []
        calls, returns = [], []
        if r > 0:
            calls = [sent_at + k * gap - 1e-3 for k in range(3)]
            returns = [sent_at + k * gap + holds_per_receiver[r - 1] for k in range(3)]
        out.append((sends, calls, returns))
    return out


def test_calibration_takes_the_late_return_beyond_the_one_where_ranks_fit():
    from parsim.calibration.tables import message_hold_curve

    def job(world, samples):
        per_rank = [{"message_stamps": {8192: [], 131072: []}} for _ in range(world)]
        for sample in samples:
            for r, stamps in enumerate(sample):
                per_rank[r]["message_stamps"][8192].append(stamps)
        return per_rank
    # 2 ranks (one receive each time): 0.2, 0.3, 0.25 ms -> median 0.25 ms, the transfer alone;
    # 4 ranks: receivers 1.0 / 2.0 / 3.0 ms late, 1.5 / 2.5 / 3.5, 2.0 / 3.0 / 4.0 -> means 2, 2.5,
    # 3 -> median 2.5 ms: 2.25 ms beyond the transfer
    two = job(2, [_stamps([h]) for h in (0.2e-3, 0.3e-3, 0.25e-3)])
    four = job(4, [_stamps([a, a + 1e-3, a + 2e-3]) for a in (1.0e-3, 1.5e-3, 2.0e-3)])
    curve = message_hold_curve({2: two, 4: four}, cores=2)
    assert curve.values == ((2, 0.0), (4, pytest.approx(2.25e-3)))
    # where no group fits on the cores, the late return is kept whole; where all fit, none counts
    assert message_hold_curve({4: four}, cores=1).values == ((4, pytest.approx(2.5e-3)),)
    assert message_hold_curve({2: two, 4: four}, cores=8).values == ((2, 0.0), (4, 0.0))
    # a receive called 4 ms after its send, returning 6 ms after it: 2 ms late from its own call
    late_call = [(s, [c + 5e-3 for c in calls], [x + 5e-3 for x in rets]) for s, calls, rets in _stamps([1e-3])]
    assert message_hold_curve({2: job(2, [late_call])}, cores=1).values == ((2, pytest.approx(2e-3)),)
    assert message_hold_curve({2: [{}, {}]}, cores=2) is None
    # noise that reads earlier than where the ranks fit: no credit
    assert message_hold_curve({2: two, 4: job(4, [_stamps([1e-4] * 3)])}, cores=2).values == ((2, 0.0), (4, 0.0))


@pytest.mark.parametrize("plan", ["pp=4 gbs=8 schedule=1f1b dtype=fp32",
                                  "pp=4 vpp=2 gbs=8 schedule=interleaved dtype=fp32"])
def test_the_engine_starts_an_action_on_a_remote_message_that_much_later(plan):
    """Every F of a stage > 0 starts at least the hold after its activation arrived (the end of
    the previous stage's send), every B of a stage before the last after its gradient; the step
    grows, by at most the hold per such action."""
    from parsim.sim import simulate
    model, plain = load_model("cpu-small"), load_cluster("cpu:4", profile=FIXTURE)
    held = _with_hold(plain)
    events = simulate(model, held, parse_plan(plan)).trace.events
    arrived = {(e.name.split()[1][0], e.stage, e.microbatch): e.end for e in events if e.kind == "send"}
    actions = [e for e in events if e.stream == "compute" and e.kind in ("F", "B")]
    remote = [(e, arrived[("F", e.stage - 1, e.microbatch)] if e.kind == "F" else arrived[("B", e.stage + 1, e.microbatch)])
              for e in actions if (e.kind == "F" and e.stage > 0) or (e.kind == "B" and e.stage < max(a.stage for a in actions))]
    assert len(remote) == 2 * (4 * parse_plan(plan).vpp - 1) * 8
    assert all(e.start >= at + HOLD - 1e-9 for e, at in remote)
    before = simulate(model, plain, parse_plan(plan), record_events=False).step_time_s
    after = simulate(model, held, parse_plan(plan), record_events=False).step_time_s
    assert before < after <= before + len(remote) * HOLD


def test_a_host_with_a_core_per_rank_and_a_gpu_hold_nothing():
    from parsim.sim import simulate
    model, plan = load_model("cpu-small"), parse_plan("pp=2 gbs=8 schedule=1f1b dtype=fp32")
    plain = load_cluster("cpu:2", profile=FIXTURE)
    assert simulate(model, _with_hold(plain), plan, record_events=False).step_time_s == \
        simulate(model, plain, plan, record_events=False).step_time_s


def replay_step_times(pp: int, held: Callable) -> tuple[float, float]:
    """The partitioner's shared-host replay of 1F1B on ``pp`` ranks of equal stages, on the
    fixture's host and on ``held(host)``: (step s before, step s after)."""
    from parsim.partition.pipeline import shared_host_run
    plan = parse_plan(f"pp={pp} gbs=8 schedule=1f1b dtype=fp32")
    jobs = [(0.0, 0.02, 0.005)] * pp
    plain = load_cluster(f"cpu:{pp}", profile=FIXTURE)
    return tuple(shared_host_run(plan, jobs, jobs, [1e-4] * pp, HostModel(c, pp)).step_time_s
                 for c in (plain, held(plain)))


def test_the_partitioners_shared_host_replay_holds_as_the_engine_does():
    before, after = replay_step_times(4, _with_hold)
    # the first forward of the last stage waits for three remote messages in a row, each held
    assert after >= before + 3 * HOLD - 1e-9


def test_calibrate_prints_the_hold_it_measured():
    from pathlib import Path

    import yaml

    from parsim.cli.calibrate import render
    profile = yaml.safe_load(Path(FIXTURE).read_text())
    profile["device"]["extra"].update(p2p_send_cpu={"2": 1e-4, "4": 2.2e-4}, p2p_recv_cpu={"2": 6e-4, "4": 8.8e-4},
                                      p2p_cpu_per_byte={"2": 0.0, "4": 4e-10}, p2p_hold={"2": 0.0, "4": 1.3e-3})
    line = next(x for x in render(profile, Path(FIXTURE)).splitlines() if x.startswith("pipeline message CPU"))
    assert line.endswith("starts late by 2: 0.00 ms, 4: 1.30 ms")
