"""Faults: a rank that dies or a peer that never arrives stops every rank, within the timeout,
with one message naming the failed rank and the cause; no process is left behind."""
from __future__ import annotations

import json
import time

import pytest

from parsim.specs import SpecError

from test_executor_cases import TINY_GPT, gone

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.mark.timeout(300)
def test_a_rank_killed_mid_step_stops_all_others_within_a_minute_naming_it(capfd):
    from parsim.executor import ExecutorError, run_plan

    with pytest.raises(ExecutorError) as failure:
        run_plan(TINY_GPT, "dp=3 gbs=3 dtype=fp32", steps=4, timeout_s=30, track_memory=False,
                 inject_fault=_fault("1:1:kill"))
    err = failure.value
    assert str(err) == "rank 1: process died (SIGKILL) during step 1"
    assert err.shutdown_s < 60
    assert all(gone(pid) for pid in err.pids)
    stderr = capfd.readouterr().err
    for survivor in (0, 2):
        assert f"rank {survivor} stopping because rank 1: process died (SIGKILL)" in stderr


@pytest.mark.timeout(300)
def test_a_peer_that_never_arrives_fails_the_run_after_the_timeout_naming_it():
    from parsim.executor import ExecutorError, run_plan

    start = time.monotonic()
    with pytest.raises(ExecutorError) as failure:    # 3 s: the launcher's stall check (half of it) is 3 heartbeats
        run_plan(TINY_GPT, "dp=2 gbs=2 dtype=fp32", steps=2, timeout_s=3, track_memory=False,
                 inject_fault=_fault("1:0:absent"))
    assert "peer rank(s) 1 never arrived within 3 s" in str(failure.value)
    assert str(failure.value).startswith("rank 0: TimeoutError")
    # nothing would ever stop the rank that never checked in: killed at once, not after the grace period
    from parsim.executor.processes import GRACE_S
    assert failure.value.shutdown_s < GRACE_S
    assert all(gone(pid) for pid in failure.value.pids)
    assert time.monotonic() - start < 240


@pytest.mark.timeout(300)
def test_a_rank_that_raises_fails_execute_with_one_json_error_naming_it(capfd):
    from parsim.cli import main

    code = main(["execute", "--model", "tiny", "--plan", "pp=2 gbs=2 dtype=fp32", "--steps", "3", "--timeout", "30",
                 "--no-memory", "--json", "--inject-fault", "1:1:crash"])
    out = capfd.readouterr()           # the ranks print to this process's stderr
    assert code == 1
    error = json.loads(out.out)["error"]
    assert error.startswith("rank 1: RuntimeError: injected fault: rank 1 crashed at step 1")
    assert "rank 0 stopping because rank 1" in out.err


def test_fault_injection_spec_is_validated():
    from parsim.executor import FaultInjection

    assert FaultInjection.parse("2:5") == FaultInjection(2, 5, "crash")
    with pytest.raises(SpecError) as bad:
        FaultInjection.parse("2:five")
    assert bad.value.field == "inject_fault"
    with pytest.raises(SpecError):
        FaultInjection.parse("1:1:explode")


def _fault(text: str):
    from parsim.executor import FaultInjection
    return FaultInjection.parse(text)


@pytest.mark.parametrize("text, expected", [("1:0:slow=1.5", (1, 0, "slow", 1.5)), ("0:2:crash", (0, 2, "crash", 1.0))])
def test_slow_fault_parses(text, expected):
    f = _fault(text)
    assert (f.rank, f.step, f.kind, f.factor) == expected


@pytest.mark.parametrize("text", ["1:0:slow", "1:0:slow=0.5", "1:0:slow=x", "1:0:crash=2", "1:0:fast=2", "-1:0:slow=2"])
def test_bad_slow_faults_name_the_field(text):
    with pytest.raises(SpecError) as err:
        _fault(text)
    assert err.value.field == "inject_fault"


@pytest.mark.timeout(300)
def test_a_slow_rank_computes_slower_and_only_from_its_step():
    from parsim.executor import run_plan

    res = run_plan(TINY_GPT, "dp=2 gbs=8 mbs=2 dtype=fp32", steps=3, warmup=1, timeout_s=60, track_memory=False,
                   inject_fault=_fault("1:1:slow=16"))

    def compute(rank: int) -> float:
        return sum(e.end - e.start for e in res.trace.events if e.rank == rank and e.stream == "compute"
                   and e.kind in ("F", "B"))

    # 16x its compute CPU time: the wall time of rank 1's actions is well above rank 0's, even on a
    # loaded machine where both also wait for a core (rank 0's wall time stretches with the load,
    # rank 1's injected sleep does not: rank 1 / rank 0 is about 1 + 15 x rank 0's share of a core;
    # at a 4x factor a busy 2-core host measured 1.96x, and at 8x one run of `make test`, its other
    # worker running 4-rank tests beside it, fell under 2x)
    assert compute(1) > 2.0 * compute(0)
    # the optimizer step is stretched too (the simulator's slowdown scales it): 16x its CPU time
    optimizer = {r: sum(e.end - e.start for e in res.trace.events if e.rank == r and e.kind == "optimizer")
                 for r in (0, 1)}
    assert optimizer[1] > 1.5 * optimizer[0] > 0
