"""The one launcher (``parsim.executor.processes``): fresh interpreters, results in rank order,
the first failure named, progress lines, and targets defined in the script being run; ranks
forked from the fork server (default) or started as fresh interpreters."""
import json
import operator
import os
import socket
import subprocess
import sys

import pytest

from parsim.executor.processes import LaunchError, free_port, run_ranks

SCRIPT = """
import json, os, sys
from parsim.executor.processes import Progress, run_ranks

def rank_main(rank, scale, progress):
    if rank == 0:
        progress.report(f"rank 0 of pid {os.getpid()}")
    return {"rank": rank, "value": rank * scale, "pid": os.getpid(), "threads": os.environ["OMP_NUM_THREADS"]}

if __name__ == "__main__":
    import tempfile
    seen = []
    with tempfile.TemporaryDirectory() as run_dir:
        out = run_ranks(rank_main, (10, Progress(run_dir)), 3, run_dir=run_dir, on_progress=seen.append)
    print(json.dumps({"out": out, "seen": seen, "me": os.getpid()}))
"""


def test_ranks_return_their_values_in_rank_order():
    assert run_ranks(operator.mul, (7,), 3) == [0, 7, 14]


@pytest.mark.parametrize("start", ["forkserver", "exec"])
def test_a_target_of_the_script_being_run_starts_in_its_own_process_with_one_thread(tmp_path, start):
    script = tmp_path / "launch_me.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "4", "PARSIM_RANK_START": start})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert [r["value"] for r in got["out"]] == [0, 10, 20]
    pids = {r["pid"] for r in got["out"]}
    assert len(pids) == 3 and got["me"] not in pids
    assert {r["threads"] for r in got["out"]} == {"1"}
    assert len(got["seen"]) == 1 and got["seen"][0].startswith("rank 0 of pid ")


def test_the_first_failure_names_the_rank_and_its_exception():
    with pytest.raises(LaunchError, match=r"^rank [01]: ZeroDivisionError: division by zero$") as err:
        run_ranks(operator.truediv, (0,), 2)
    assert len(err.value.pids) == 2


def test_a_rank_that_exits_without_a_word_is_named_by_its_exit_code():
    # os._exit(rank): rank 1 exits with code 1, rank 0 with code 0 but no result
    with pytest.raises(LaunchError, match=r"^rank 1: process exited with code 1$"):
        run_ranks(os._exit, (), 2)
    with pytest.raises(LaunchError, match=r"^rank 0: process exited with code 0 without a result$"):
        run_ranks(os._exit, (), 1)


def test_free_port_is_free_to_bind():
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_ranks_forked_from_the_fork_server_take_the_environment_of_each_launch(monkeypatch):
    monkeypatch.setenv("PARSIM_RANK_START", "forkserver")
    monkeypatch.setenv("PARSIM_TEST_LAUNCH", "first")
    assert run_ranks(_environment, ("PARSIM_TEST_LAUNCH",), 1) == [["first", None]]
    monkeypatch.setenv("PARSIM_TEST_LAUNCH", "second")      # the same server forks the next launch
    got = run_ranks(_environment, ("PARSIM_TEST_LAUNCH", "OMP_NUM_THREADS"), 2, env={"PARSIM_TEST_EXTRA": "x"})
    assert got == [["second", "1", "x"]] * 2


def _environment(rank: int, *names: str) -> list:
    return [os.environ.get(n) for n in (*names, "PARSIM_TEST_EXTRA")]


def test_a_bad_start_method_is_one_line_naming_the_variable_exit_2(capfd, monkeypatch):
    from parsim.cli import main      # refused before any rank starts: in this process

    monkeypatch.setenv("PARSIM_RANK_START", "vfork")
    code = main(["execute", "--model", "tiny", "--plan", "dp=2 gbs=2", "--steps", "1"])
    assert code == 2
    [line] = capfd.readouterr().err.strip().splitlines()
    assert "PARSIM_RANK_START" in line and "vfork" in line and "forkserver" in line and "exec" in line


def _parent(rank: int) -> int:
    return os.getppid()


def test_exec_ranks_are_children_of_the_launcher_and_forked_ones_are_not(monkeypatch):
    # exec ranks are joined children, whose CPU os.times counts; forked ones report their own (calibration.comm)
    monkeypatch.setenv("PARSIM_RANK_START", "forkserver")
    here = {"PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    assert run_ranks(_parent, (), 2, start="exec", env=here) == [os.getpid()] * 2
    assert os.getpid() not in run_ranks(_parent, (), 2)


def _launch_from_a_daemon(conn) -> None:
    try:
        conn.send(run_ranks(operator.mul, (7,), 2))
    except BaseException as err:  # noqa: BLE001 -- sent back to the test
        conn.send(f"{type(err).__name__}: {err}")


def _sweep_from_a_daemon(conn) -> None:
    import contextlib
    import io

    from parsim.cli import main
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            code = main(["sweep", "--model", "gpt3-125m", "--cluster", "h100-sxm:8", "--json", "--no-progress",
                         "--resimulate", "3"])
        except BaseException as err:  # noqa: BLE001 -- sent back to the test
            code = f"{type(err).__name__}: {err}"
    conn.send((code, len(json.loads(out.getvalue())["rows"]) if code == 0 else None))


@pytest.mark.parametrize("target, expected", [(_launch_from_a_daemon, [0, 7]), (_sweep_from_a_daemon, (0, None))])
def test_parsim_works_inside_a_daemonic_worker_process(target, expected, monkeypatch):
    """A daemonic multiprocessing worker (a Pool's, the fuzzer's) may not start multiprocessing
    children: ranks then start as fresh interpreters and re-simulation runs in the process (the
    fuzzer found 28 tracebacks "daemonic processes are not allowed to have children")."""
    import multiprocessing
    monkeypatch.setenv("PARSIM_RANK_START", "forkserver")
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    worker = ctx.Process(target=target, args=(there,), daemon=True)
    worker.start()
    assert here.poll(240), "the daemonic worker did not answer"
    got = here.recv()
    worker.join(30)
    if expected == (0, None):
        assert got[0] == 0 and got[1] > 0, got
    else:
        assert got == expected


_UNGUARDED_LAUNCH = """
import operator
from parsim.executor.processes import LaunchError, run_ranks
try:
    print("results", run_ranks(operator.mul, (7,), 2))
except LaunchError as err:
    print("failed", err)
"""


@pytest.mark.parametrize("start", ["forkserver", "exec"])
def test_a_launch_from_a_script_without_a_main_guard_works_or_says_why(tmp_path, start):
    """Forked ranks import the launching script again (multiprocessing), so a script that
    launches at its top level fails in them; the launcher says so and how to fix it, and
    fresh interpreters (exec) run it."""
    script = tmp_path / "launch_here.py"
    script.write_text(_UNGUARDED_LAUNCH)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PARSIM_RANK_START": start})
    last = proc.stdout.strip().splitlines()[-1]
    if start == "exec":
        assert last == "results [0, 7]"
    else:
        assert last.startswith("failed rank ") and "it never started" in last and str(script) in last
        assert '__name__ == "__main__"' in last and "PARSIM_RANK_START=exec" in last
