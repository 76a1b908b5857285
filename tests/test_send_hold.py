"""A pipeline send's call holds its rank (``costs.host.send_hold``): how calibration reads it off
the line benchmark's stamps, where it counts, and that the SimPy engine holds exactly the actions
that send to another rank for it, as exposed pipeline time."""
import dataclasses

import pytest

from parsim.costs.host import HostModel, send_hold
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.specs.tables import RankCurve

FIXTURE = "tests/fixtures/cpu-calibrated.yaml"
CALL = ((2, 0.3e-3), (4, 1.0e-3))     # s: what the executor's 128 KiB sends read on a 2-vCPU VM


def _with_call(cluster, call=CALL):
    tables = cluster.device.tables.replace(p2p_send_hold=RankCurve(call))
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


def test_the_hold_counts_at_every_count_of_ranks_and_not_on_gpus():
    cluster = _with_call(load_cluster("cpu:4", profile=FIXTURE))
    assert send_hold(cluster, 2) == pytest.approx(0.3e-3)        # ranks fit the cores: still held
    assert send_hold(cluster, 3) == pytest.approx(0.65e-3)       # linear between counts
    assert send_hold(cluster, 1) == 0.0                          # one rank sends nothing
    assert send_hold(cluster, 16) == pytest.approx(1.0e-3)       # held beyond the largest
    assert HostModel(cluster, 4).send_hold == pytest.approx(1.0e-3)
    assert send_hold(load_cluster("cpu:4", profile=FIXTURE), 4) == 0.0      # not measured: none
    assert send_hold(load_cluster("h100-sxm:16"), 16) == 0.0


def _job(world: int, calls_s: float, cpu_s: float, samples: int = 3) -> list[dict]:
    """Each rank's ``message_stamps`` of ``samples`` line passes: every send but the last rank's
    call takes ``calls_s`` (sample k: x (1 + k / 10)), ``cpu_s`` of it on the calling thread."""
    ranks = [{"message_stamps": {8192: [], 131072: []}} for _ in range(world)]
    for k in range(samples):
        wall = calls_s * (1 + k / 10)
        for r in range(world):
            sends = [0.01 + 0.05 * i for i in range(3)] if r < world - 1 else []
            ranks[r]["message_stamps"][8192].append((sends, [], [], [s + wall for s in sends], [cpu_s] * len(sends)))
    return ranks


def test_calibration_takes_the_calls_wall_time_less_the_cpu_charged_elsewhere():
    from parsim.calibration.tables import send_hold_curve

    # 2 ranks on 2 cores: the whole call (median sample: 1.1 x 0.3 ms); 4 on 2: less its CPU
    curve = send_hold_curve({2: _job(2, 0.3e-3, 0.2e-3), 4: _job(4, 1.0e-3, 0.2e-3)}, cores=2)
    assert curve.values == ((2, pytest.approx(0.33e-3)), (4, pytest.approx(1.1e-3 - 0.2e-3)))
    assert send_hold_curve({2: _job(2, 0.3e-3, 0.2e-3)}, cores=1).values == ((2, pytest.approx(0.13e-3)),)
    # stamps from before format 18 (no send returns): not measured
    old = [{"message_stamps": {8192: [([0.01], [], [])]}} for _ in range(2)]
    assert send_hold_curve({2: old}, cores=2) is None and send_hold_curve({2: [{}, {}]}, cores=2) is None


@pytest.mark.parametrize("plan", ["pp=2 gbs=8 schedule=1f1b dtype=fp32",
                                  "pp=2 vpp=2 gbs=8 schedule=interleaved dtype=fp32"])
def test_the_engine_holds_a_sender_for_each_send_it_calls(plan):
    """Every F of a stage that sends its activations to another rank, and every B of a stage that
    sends its gradients back, is followed by the hold before its rank's next action; the step
    grows, by at most the hold per send, and the hold is exposed pipeline time; a dp plan (no
    pipeline sends) is unchanged."""
    model, plan = load_model("cpu-small"), parse_plan(plan)
    plain = load_cluster("cpu:2", profile=FIXTURE)
    held, hold, last = _with_call(plain), CALL[0][1], plan.pp * plan.vpp - 1
    after = simulate(model, held, plan)
    actions = sorted((e for e in after.trace.events if e.stream == "compute" and e.kind in ("F", "B")),
                     key=lambda e: (e.rank, e.start))
    sends = [(a, b) for a, b in zip(actions, actions[1:]) if a.rank == b.rank
             and ((a.kind == "F" and a.stage < last) or (a.kind == "B" and a.stage > 0))]
    assert len(sends) >= 2 * last * 8 - 2        # all but a rank's last action of the step have a next
    assert all(b.start >= a.end + hold - 1e-9 for a, b in sends)
    before = simulate(model, plain, plan, record_events=False)
    assert before.step_time_s < after.step_time_s <= before.step_time_s + 2 * last * 8 * hold
    assert after.exposed_comm_s["pp"] > before.exposed_comm_s["pp"]
    dp = parse_plan("dp=2 gbs=8 dtype=fp32")
    assert simulate(model, held, dp, record_events=False).step_time_s == \
        simulate(model, plain, dp, record_events=False).step_time_s


def test_the_partitioners_shared_host_replay_holds_a_sender_as_the_engine_does():
    from test_message_hold import replay_step_times
    before, after = replay_step_times(2, _with_call)
    # 1F1B on 2 stages: rank 0's 8 forwards and rank 1's 8 backwards each send once; the first
    # forward's hold is on the critical path at least, all 16 at most
    hold = CALL[0][1]
    assert before + hold - 1e-9 <= after <= before + 16 * hold + 1e-9
