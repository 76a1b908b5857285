"""``parsim execute``: one JSON object with the measured metrics, Chrome traces that load back
and list each rank's Schedule IR actions in order, memory by category, bad input -> exit 2."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest
import yaml

from parsim.schedules import build_schedule
from parsim.specs import load_model

pytestmark = [pytest.mark.slow, pytest.mark.torch]

# A GPT-style model whose vocabulary holds every byte, to train on a text file.
BYTE_MODEL = {"name": "tiny-bytes", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
              "vocab": 256, "seq_len": 32, "dropout": False}


def _execute(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parsim", "execute", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("execute")
    model = tmp / "tiny-bytes.yaml"
    model.write_text(yaml.safe_dump(BYTE_MODEL))
    text = tmp / "corpus.txt"
    text.write_text("The pipeline schedule interleaves forward and backward passes. " * 40)
    proc = _execute("--model", str(model), "--plan", "pp=2 gbs=4 schedule=1f1b dtype=fp32", "--steps", "4",
                    "--data", str(text), "--trace-dir", str(tmp / "traces"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, str(model)


def test_execute_json_is_exactly_one_object_with_the_measured_metrics(pipeline_run):
    proc, _ = pipeline_run
    assert proc.stdout.count("\n") == 1
    out = json.loads(proc.stdout)
    for key in ("step_time_s", "losses", "peak_memory_bytes_by_rank", "world_size", "memory_breakdown_by_rank",
                "trace_files", "step_times_s", "timed_steps"):
        assert key in out
    assert out["world_size"] == 2 and out["steps"] == [0, 1, 2, 3] and len(out["losses"]) == 4
    timed = [out["step_times_s"][s] for s in out["timed_steps"]]
    assert out["step_time_s"] == statistics.median(timed) > 0
    assert 0 not in out["timed_steps"]                     # warm-up left out
    assert all(4.0 < loss < 6.5 for loss in out["losses"])  # about ln(256) = 5.5 at the start


def test_memory_breakdown_counts_exactly_the_parameters_each_rank_holds(pipeline_run):
    from parsim.executor.model import StageModule

    proc, model_path = pipeline_run
    out = json.loads(proc.stdout)
    spec = load_model(model_path)
    for rank, (peak, parts) in enumerate(zip(out["peak_memory_bytes_by_rank"], out["memory_breakdown_by_rank"])):
        stage = StageModule(spec, 2 * rank, 2, is_first=rank == 0, is_last=rank == 1)
        param_bytes = sum(p.numel() * 4 for p in stage.parameters())
        assert parts["params"] == param_bytes
        assert parts["optimizer"] >= 2 * param_bytes        # AdamW's two moments (+ step counters)
        assert sum(parts.values()) == peak


def test_trace_files_are_chrome_traces_of_each_ranks_ir_actions_in_order(pipeline_run):
    proc, _ = pipeline_run
    out = json.loads(proc.stdout)
    schedule = build_schedule("1f1b", 2, 4)
    assert len(out["trace_files"]) == 2
    for rank, path in enumerate(out["trace_files"]):
        with open(path) as f:
            trace = json.load(f)
        complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert all(e["pid"] == rank and e["dur"] >= 0 and "ts" in e for e in complete)
        actions = sorted((e for e in complete if e["cat"] in ("F", "B")), key=lambda e: e["ts"])
        assert [e["name"] for e in actions] == [str(a) for a in schedule.actions[rank]]
        assert any(e["cat"] in ("send", "recv") for e in complete)


def test_a_message_is_consumed_after_it_was_produced_on_the_hosts_one_clock(pipeline_run):
    """Both ranks' events count from the step's common start (``results.aligned``): stage 1's
    forward of microbatch j starts after stage 0's forward of j ended, and stage 0's backward of
    j after stage 1's. Counted from each rank's own exit from the step's barrier, the ranks'
    timelines were offset by that exit's skew (-1.7 to +0.1 ms for the held-out 4-rank plans on 2
    cores, 2026-12-02): a message could seem to arrive before it was sent."""
    proc, _ = pipeline_run
    out = json.loads(proc.stdout)
    span = {}
    for path in out["trace_files"]:
        with open(path) as f:
            for e in json.load(f)["traceEvents"]:
                if e["ph"] == "X" and e["cat"] in ("F", "B"):
                    span[e["cat"], e["args"]["stage"], e["args"]["microbatch"]] = (e["ts"], e["ts"] + e["dur"])
    for j in range(4):
        assert span["F", 1, j][0] >= span["F", 0, j][1]       # microseconds, from the common start
        assert span["B", 0, j][0] >= span["B", 1, j][1]


def test_execute_rejects_offload_on_cpu_with_exit_code_2(capsys):
    from parsim.cli import main      # refused before any rank starts: in this process

    code = main(["execute", "--model", "tiny", "--plan", "dp=2 zero=1 offload=optimizer", "--json"])
    out = capsys.readouterr()
    assert code == 2
    assert "offload" in json.loads(out.out)["field"]
    assert "offload='optimizer' is invalid" in out.err
