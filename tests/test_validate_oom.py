"""``parsim validate`` records a plan that runs out of memory as a "did not fit" row and goes
on with the others (issue 23, item 8: seen on an H100, where one plan ended the whole run).

Here the memory is really exhausted: the validation runs under a 2 GiB data-segment limit
(``prlimit --data``, inherited by the executor's ranks), so torch's CPU allocator fails with
ENOMEM on the plan that needs ~3 GiB (attention scores of 32 sequences of 1,024 tokens) while the
plan that needs ~0.2 GiB runs. Short, narrow layers keep the compute to a second or so."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch]

LIMIT_BYTES = 2 * 2**30
MODEL = "name: long\nlayers: 2\nhidden: 128\nheads: 8\nvocab: 1000\nseq_len: 1024\ndropout: false\n"


@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("prlimit") is None or not sys.platform.startswith("linux"),
                    reason="needs Linux's prlimit to cap the ranks' memory")
def test_a_plan_that_runs_out_of_memory_is_a_did_not_fit_row_and_the_others_are_measured(tmp_path, capsys, monkeypatch):
    (tmp_path / "wide.yaml").write_text(MODEL)
    fits, too_big = "mbs=1 gbs=1 dtype=fp32", "mbs=32 gbs=32 dtype=fp32"
    # the plan that does not fit first: its launch fails before the other plan has run (after it,
    # the other plan's first run would be lost with the launch and run again alone)
    (tmp_path / "m.yaml").write_text(f"model: {tmp_path / 'wide.yaml'}\nsteps: 2\nwarmup: 1\n"
                                     f"plans: ['{too_big}', '{fits}']\n")
    proc = subprocess.run(["prlimit", f"--data={LIMIT_BYTES}", sys.executable, "-m", "parsim", "validate", "--matrix",
                           str(tmp_path / "m.yaml"), "--profile", "cpu", "--out", str(tmp_path / "out"), "--worst", "0",
                           "--json"], capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert [r["plan"] for r in report["rows"]] == ["dp=1 tp=1 pp=1 mbs=1 gbs=1 schedule=1f1b dtype=fp32"]
    assert report["rows"][0]["measured_step_s"] > 0
    [unfit] = report["did_not_fit"]
    assert unfit["plan"].startswith("dp=1 tp=1 pp=1 mbs=32 gbs=32")
    assert unfit["outcome"].startswith("did not fit: rank 0:") and "allocate memory" in unfit["outcome"]
    assert unfit["predicted_peak_bytes"] > LIMIT_BYTES      # the simulator also says it needs more than 3 GiB
    assert report["num_did_not_fit"] == 1
    # resuming keeps both rows and runs nothing again (in this process: nothing is launched)
    from parsim.cli import main
    # validate adopts the profile's host memory policy (os.environ): recorded here, put back after
    monkeypatch.setenv("PARSIM_HOST_MEMORY", os.environ.get("PARSIM_HOST_MEMORY", "system"))
    code = main(["validate", "--matrix", str(tmp_path / "m.yaml"), "--profile", "cpu", "--out", str(tmp_path / "out"),
                 "--worst", "0", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["num_did_not_fit"] == 1
