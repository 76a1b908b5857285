"""The executor's faults and options (issue 23, item 4): options are checked in the launcher
before any rank starts; a rank that stops making progress (SIGSTOP) is named, not the healthy
peer that waits for it; SIGTERM to the launcher ends like Ctrl-C -- one line, exit 143, no
traceback, no rank left behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parsim.cli import main
from parsim.specs import SpecError

from test_executor_cases import gone

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real checkpoint of the tiny model after 2 steps."""
    from parsim.executor import run_plan
    folder = tmp_path_factory.mktemp("ckpt") / "step2"
    run_plan("tiny", "dp=1 dtype=fp32", steps=2, save_dir=str(folder), save_at=2, track_memory=False)
    return folder


def _rejected(capsys, *argv) -> dict:
    start = time.monotonic()
    code = main(["execute", "--model", "tiny", "--plan", "dp=2 gbs=2 dtype=fp32", "--no-memory", "--json",
                 *map(str, argv)])
    out = capsys.readouterr()
    assert code == 2, out
    assert out.err.count("\n") == 1 and "Traceback" not in out.err
    assert "rank" not in out.err           # no rank ever started, so none reports
    assert time.monotonic() - start < 30
    return json.loads(out.out)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv, field, fragment", [
    (["--resume", "{tmp}/missing"], "resume", "checkpoint folder"),
    (["--resume", "{ckpt}", "--steps", "2"], "steps", "above the checkpoint's step 2"),
    (["--resume", "{ckpt}", "--steps", "4", "--save", "{tmp}/again", "--save-at", "1"], "save_at", "after the checkpoint"),
    (["--data", "{tmp}/missing.txt"], "data", "an existing text file"),
    (["--steps", str(10 ** 21)], "steps", "2**24"),
    (["--timeout", "nan"], "timeout", "positive number of seconds"),
    (["--save", "{tmp}/afile/ck", "--save-at", "1"], "save", "is a file"),
])
def test_bad_executor_options_are_refused_before_any_rank_starts(capsys, tmp_path, checkpoint, argv, field,
                                                                 fragment):
    (tmp_path / "afile").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{ckpt}", str(checkpoint)) for a in argv]
    error = _rejected(capsys, *argv)
    assert error["field"] == field and fragment in error["error"]


@pytest.mark.timeout(300)
def test_resuming_a_checkpoint_of_another_model_is_refused(checkpoint):
    from parsim.api import execute
    with pytest.raises(SpecError) as err:
        execute("cpu-small", "dp=1 dtype=fp32", steps=4, resume=checkpoint)
    assert err.value.field == "resume" and "model cpu-small" in str(err.value) and "tiny" in str(err.value)


@pytest.mark.timeout(300)
def test_a_frozen_rank_is_named_not_the_healthy_peer_that_waits_for_it(capfd):
    from parsim.executor import ExecutorError, run_plan
    start = time.monotonic()
    # the frozen rank is named after 3 s of silence (half the timeout), 3 s before its peer's collective times out
    with pytest.raises(ExecutorError) as failure:
        run_plan("tiny", "dp=2 gbs=2 dtype=fp32", steps=4, timeout_s=6, track_memory=False,
                 inject_fault="1:1:freeze")
    err = failure.value
    assert str(err).startswith("rank 1: stopped making progress during step 1: no heartbeat for")
    assert all(gone(pid) for pid in err.pids)
    assert time.monotonic() - start < 240
    stderr = capfd.readouterr().err
    assert "rank 0 stopping because rank 1: stopped making progress" in stderr
    assert "Traceback" not in stderr


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``: the ranks, and the fork server that forked them if any."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        below = [p for p, pp in parent.items() if pp in frontier]
        out += below
        frontier = below
    return out


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find the ranks")
def test_sigterm_to_the_launcher_ends_quietly_like_ctrl_c(tmp_path):
    # the checkpoint after step 1 says when the ranks are in their training steps
    step1 = tmp_path / "step1"
    proc = subprocess.Popen([sys.executable, "-m", "parsim", "execute", "--model", "tiny", "--plan",
                             "dp=2 gbs=2 dtype=fp32", "--steps", "100000", "--no-memory", "--timeout", "60",
                             "--save", str(step1), "--save-at", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from parsim.executor.processes import start_method
    started = 4 if start_method() == "forkserver" else 2   # + multiprocessing's resource tracker and fork server
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (step1 / "meta.json").exists() and proc.poll() is None:
        time.sleep(0.1)
    below = _descendants(proc.pid)
    assert len(below) >= started, "the ranks never started"
    assert (step1 / "meta.json").exists(), "the ranks never finished step 1"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip().splitlines()[-1] == "parsim: terminated (SIGTERM)"
    assert "Traceback" not in err and "frame #" not in err
    deadline = time.monotonic() + 10     # nothing outlives the launcher: ranks, fork server
    while time.monotonic() < deadline and not all(gone(pid) for pid in below):
        time.sleep(0.1)
    assert all(gone(pid) for pid in below)


def _freeze_rank_one(rank: int) -> int:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(30)
    return rank


@pytest.mark.timeout(120)
def test_the_launcher_names_a_rank_whose_heartbeat_stops():
    from parsim.executor.processes import LaunchError, run_ranks
    start = time.monotonic()
    with pytest.raises(LaunchError) as failure:
        here = str(Path(__file__).parent)      # the ranks import this module
        run_ranks(_freeze_rank_one, (), 2, stall_s=2.0, grace_s=1.0,
                  env={"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])})
    assert str(failure.value).startswith("rank 1: stopped making progress: no heartbeat for")
    assert all(gone(pid) for pid in failure.value.pids)
    assert time.monotonic() - start < 60
