"""The executor's and calibration's host allocator policy (``executor.host_alloc``; a profile's
policy: ``calibration.host_alloc``)."""
import json
import os
import subprocess
import sys
import warnings

import pytest

SCRIPT = """
import json, resource, sys, threading
import torch
from parsim.executor.host_alloc import keep_freed_host_memory
applied = [keep_freed_host_memory(), keep_freed_host_memory()] if sys.argv[1] == "keep" else None   # idempotent
elements = int(sys.argv[2])
out = {"applied": applied}

def churn():
    for _ in range(8):                          # the heap grows to hold it: in a process this light, a
                                                # 64-byte-aligned block does not fit the one freed before it
                                                # until ~6 blocks have grown the heap (glibc memalign)
        x = torch.ones(elements)                # freed and re-allocated as a backward's gradient buffers,
        del x                                   # or a gloo collective's temporaries, are
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        x = torch.ones(elements)
        del x
    out["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

if sys.argv[3] == "thread":                     # as a process group's worker thread allocates
    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
else:
    churn()
print(json.dumps(out))
"""


def _faults(mode: str, elements: int, where: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(elements), where], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


# 48 MiB on the main thread (above glibc's largest mmap threshold, 32 MiB); 96 MiB on another
# thread (above a per-thread arena's largest heap, 64 MiB: glibc maps such a block fresh whatever
# M_MMAP_MAX says, unless every thread shares the main arena)
@pytest.mark.parametrize("elements,where", [(12 * 2**20, "main"), (24 * 2**20, "thread")])
def test_kept_freed_memory_is_reused_without_page_faults(elements, where):
    pytest.importorskip("torch")
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc mallopt")
    default, kept = _faults("default", elements, where), _faults("keep", elements, where)
    assert kept["applied"] == [True, True]
    block = elements * 4 // 4096                    # the pages a tensor spans (4 KiB each)
    assert default["faults"] > 0.8 * 10 * block     # by default every re-allocation touches fresh pages
    # reused: at most a re-allocation or two that still grow the heap, each faulting in the pages
    # its block spans -- one more when it does not start on a page boundary (posix_memalign to 64
    # bytes; one run measured 2 x 12,288 + 1 for 48 MiB)
    assert kept["faults"] <= 2 * (block + 1)


def test_policy_is_read_from_the_environment_and_bad_values_name_the_variable(monkeypatch):
    from parsim.executor.host_alloc import ENV, host_memory_policy
    from parsim.specs import SpecError

    monkeypatch.delenv(ENV, raising=False)
    assert host_memory_policy() == "system"
    monkeypatch.setenv(ENV, "keep")
    assert host_memory_policy() == "keep"
    monkeypatch.setenv(ENV, "cache")
    with pytest.raises(SpecError, match="PARSIM_HOST_MEMORY='cache' is invalid: one of system, keep"):
        host_memory_policy()


def test_launchers_adopt_the_profiles_policy_unless_the_user_set_another_which_is_warned(monkeypatch):
    from parsim.calibration.host_alloc import profile_policy, use_profile_policy
    from parsim.executor.host_alloc import ENV
    from parsim.specs import SpecWarning

    probe = {"layer_probe": {"mbs": 1, "fwd_s": 0.01, "bwd_s": 0.02}}
    cpu = {"provenance": {"device": "cpu"}, "device": {"extra": probe}}
    kept = {"provenance": {"device": "cpu", "host_memory": "keep"}, "device": {"extra": probe}}
    gpu = {"provenance": {"device": "cuda"}, "device": {"extra": {}}}
    assert (profile_policy(cpu), profile_policy(kept), profile_policy(gpu)) == ("system", "keep", None)
    monkeypatch.setenv(ENV, "system")         # recorded first, so the test leaves the variable as it found it
    monkeypatch.delenv(ENV)
    assert use_profile_policy(kept) == "keep" and os.environ[ENV] == "keep"      # unset: the profile's
    monkeypatch.delenv(ENV, raising=False)
    assert use_profile_policy(gpu) is None and ENV not in os.environ
    monkeypatch.setenv(ENV, "keep")
    with pytest.warns(SpecWarning, match="calibrated with PARSIM_HOST_MEMORY=system and the executor runs with "
                                         "PARSIM_HOST_MEMORY=keep"):
        assert use_profile_policy(cpu) == "keep"                                 # the user's choice stands
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert use_profile_policy(kept) == "keep"


@pytest.mark.slow
def test_executor_ranks_run_under_the_kept_policy_with_unchanged_losses(monkeypatch):
    """A real 2-rank gloo launch whose ranks inherit PARSIM_HOST_MEMORY=keep: the policy
    changes speed, not results -- the losses equal those of a launch without it."""
    pytest.importorskip("torch")
    from parsim.executor.host_alloc import ENV
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.specs import load_model, parse_plan

    model, plan = load_model("tiny"), parse_plan("pp=2 mbs=1 gbs=4 dtype=fp32")
    config = ExecutorConfig(steps=2, warmup=1, track_memory=False)
    monkeypatch.delenv(ENV, raising=False)
    default, = run_plans([RunSpec(model, plan, config)])
    monkeypatch.setenv(ENV, "keep")
    kept, = run_plans([RunSpec(model, plan, config)])
    assert kept.losses == pytest.approx(default.losses, rel=1e-6)


@pytest.mark.parametrize("command", [["execute", "--model", "tiny", "--plan", "dp=2 gbs=4 dtype=fp32", "--steps", "2"],
                                     ["calibrate", "--quick", "--out", "unused.yaml"]])
def test_cli_rejects_a_bad_policy_with_exit_code_2(command, tmp_path, capfd, monkeypatch):
    pytest.importorskip("torch")
    from parsim.cli import main      # refused before any process starts: in this process

    monkeypatch.setenv("PARSIM_HOST_MEMORY", "cache")
    monkeypatch.chdir(tmp_path)
    assert main(command) == 2
    err = capfd.readouterr().err
    assert "PARSIM_HOST_MEMORY='cache' is invalid: one of system, keep" in err
    assert "Traceback" not in err
    assert not (tmp_path / "unused.yaml").exists()
