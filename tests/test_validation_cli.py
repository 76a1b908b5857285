"""Every validation rule, through the CLI: exit code 2 and one message naming the field."""
import subprocess
import sys

import pytest

from parsim.cli import main


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


CASES = [
    # (model, cluster, plan, field named in the message, fragment of the message)
    ("gpt3-125m", "a100-80g:8", "dp=3", "dp*tp*pp", "device count 8"),
    ("gpt3-125m", "a100-80g:8", "dp=1 tp=8", "tp", "heads=12"),
    ("llama3-8b", "a100-80g:16", "dp=1 tp=16", "tp", "kv_heads=8"),
    ("tiny", "cpu:2", "dp=1 tp=1 pp=2 partition=3", "partition", "pp*vpp=2 entries"),
    ("tiny", "cpu:2", "dp=1 pp=2 partition=1,2", "partition", "sum to the model's 4 layers"),
    ("tiny", "cpu:8", "dp=1 pp=8", "pp*vpp", "4 layers"),
    ("tiny", "cpu:2", "dp=2 gbs=3", "gbs", "divisible by dp*mbs=2"),
    ("tiny", "cpu:2", "pp=2 schedule=interleaved vpp=1 gbs=4", "vpp", "vpp >= 2"),
    ("tiny", "cpu:2", "pp=2 schedule=interleaved vpp=2 gbs=3", "gbs", "divisible by pp=2"),
    ("tiny", "cpu:2", "pp=2 schedule=1f1b vpp=2 gbs=4", "vpp", "needs schedule=interleaved"),
    ("tiny", "cpu:2", "dp=2 sp=true", "sp", "tp > 1"),
    ("tiny", "cpu:2", "dp=1 tp=2 sp=true", None, None),  # legal: seq 32 divisible by 2
    ("cpu-small", "cpu:2", "dp=2 offload=optimizer", "offload", "zero >= 1"),
    ("cpu-small", "cpu:2", "dp=2 zero=2 offload=optimizer+params", "offload", "zero=3"),
    ("tiny", "cpu:2", "pp=2 gbs=2 recompute=stage-aware recompute_layers=1", "recompute_layers", "2 entries"),
    ("tiny", "cpu:2", "pp=2 gbs=2 recompute=stage-aware recompute_layers=3,0", "recompute_layers", "stage 0 has 2"),
    ("tiny", "cpu:2", "dp=2 tp_overlap=subpipe", "tp_overlap", "tp > 1"),
    ("tiny", "cpu:2", "tp=2 tp_overlap=subpipe", "tp_overlap", "mbs >= 2"),
    ("tiny", "cpu:2", "dp=2 zero=5", "zero", "one of 0, 1, 2, 3"),
    ("tiny", "cpu:2", "dp=2 schedule=zigzag", "schedule", "naive, gpipe, 1f1b, interleaved"),
    ("nope", "cpu:2", "dp=2", "model", "a preset"),
    ("tiny", "tpu-v9:2", "dp=2", "cluster", "PRESET one of"),   # issue 23: it named "profile"
    ("tiny", "cpu:two", "dp=2", "cluster", "PRESET:NDEVICES"),
]


@pytest.mark.parametrize("model, cluster, plan, field, fragment", CASES)
def test_memory_command_rejects_each_invalid_plan_with_exit_2(capsys, model, cluster, plan, field, fragment):
    rc, out, err = run_cli(capsys, "memory", "--model", model, "--cluster", cluster, "--plan", plan)
    if field is None:
        assert rc == 0
        return
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1, err            # one message, no traceback
    assert f"{field}=" in err and fragment in err, err


def test_sp_needs_seq_divisible_by_tp(capsys, tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("layers: 2\nhidden: 64\nheads: 4\nseq_len: 30\nvocab: 64\n")
    rc, _, err = run_cli(capsys, "memory", "--model", str(f), "--cluster", "cpu:4", "--plan", "tp=4 sp=true")
    assert rc == 2 and "seq_len=30 divisible by tp=4" in err


def test_zero2_with_pipeline_warns_like_deepspeed(capsys):
    rc, out, err = run_cli(capsys, "memory", "--model", "cpu-small", "--cluster", "cpu:4",
                           "--plan", "dp=2 pp=2 zero=2 gbs=4")
    assert rc == 0 and "warning" in err and "zero=2 with pp=2" in err


def test_tp_beyond_one_node_warns(capsys):
    rc, out, err = run_cli(capsys, "memory", "--model", "gpt3-175b", "--cluster", "a100-80g:16", "--plan", "tp=16")
    assert rc == 0 and "spans more than one node" in err


def test_json_error_is_one_object_on_stdout(capsys):
    import json
    rc, out, err = run_cli(capsys, "memory", "--json", "--cluster", "a100-80g:8", "--plan", "dp=3")
    assert rc == 2 and json.loads(out)["field"] == "dp*tp*pp"


def test_console_script_exits_2_without_traceback():
    p = subprocess.run([sys.executable, "-m", "parsim", "memory", "--plan", "dp=7"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "dp*tp*pp" in p.stderr


def test_unknown_command_exits_2():
    p = subprocess.run([sys.executable, "-m", "parsim", "frobnicate"], capture_output=True, text=True)
    assert p.returncode == 2


def test_the_command_line_is_built_without_the_sweep_or_torch_stacks():
    """Building the parser imports every command module: none may pull pandas, numba or torch
    at its top (a command imports them when it runs), so ``parsim --help`` and a rejected
    command line answer in about half a second rather than 1.3 s (the sweep's module, once)."""
    code = ("import sys\nfrom parsim.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in ('pandas', 'numba', 'torch', 'matplotlib', 'simpy') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]"
