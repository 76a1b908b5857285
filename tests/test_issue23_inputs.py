"""Issue 23's table, row by row, through the CLI: every malformed input is one line naming
the field, exit 2, no traceback; huge but valid plans are refused before any work.

More of the cluster / profile / run-log rows, and the outputs' finiteness: test_issue23_files.py.
"""
from __future__ import annotations

import json
import time

import pytest

from parsim.cli import main



def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def rejected(capsys, *argv: str) -> dict:
    """Exit 2, one JSON error on stdout, one line on stderr, no traceback: the error object."""
    code, out, err = run(capsys, *argv, "--json")
    assert code == 2, (code, out, err)
    lines = [ln for ln in err.splitlines() if not ln.startswith("parsim: warning:")]
    assert len(lines) == 1 and lines[0].startswith("parsim: error:"), err
    assert "Traceback" not in err
    return json.loads(out)


def memory_of_model(capsys, path) -> dict:
    return rejected(capsys, "memory", "--model", path, "--cluster", "a100-80g:1", "--plan", "dp=1")


# ------------------------------------------------------------------------------- model files

@pytest.mark.parametrize("name, body, field", [
    ("bytes.yaml", b"layers: 4\nhidden: \xff\xfe\nheads: 4\n", "model"),                      # non-UTF-8
    ("keys.yaml", b"1: 2\nlayers: 4\nhidden: 64\nheads: 4\n", "model.1"),                    # non-string key
    ("deep.yaml", ("a: " + "[" * 5000 + "]" * 5000 + "\n").encode(), "model"),              # deep nesting
    ("bomb.yaml", ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))).encode(), "model"),
    ("dup.yaml", b"layers: 4\nhidden: 64\nheads: 4\nlayers: 8\n", "model"),                  # repeated key
    ("tied.yaml", b"layers: 4\nhidden: 64\nheads: 4\ntied_embeddings: maybe\n", "model.tied_embeddings"),
    ("drop.yaml", b"layers: 4\nhidden: 64\nheads: 4\ndropout: 'false'\n", "model.dropout"),
    ("eps.yaml", b"layers: 4\nhidden: 64\nheads: 4\nnorm_eps: -1\n", "model.norm_eps"),
    ("huge.yaml", f"layers: 4\nhidden: {10 ** 309}\nheads: 4\n".encode(), "model.hidden"),     # 10^309
    ("inf.yaml", b"layers: 4\nhidden: 4.0e+400\nheads: 4\n", "model.hidden"),                # YAML inf
    ("config.json", b'{"num_hidden_layers": "four", "hidden_size": 64, "num_attention_heads": 4}',
     "model.num_hidden_layers"),
    ("hf.json", b'{"num_hidden_layers": 4, "hidden_size": 4e400, "num_attention_heads": 4}', "model.hidden_size"),
    ("hfbool.json", b'{"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, '
                    b'"tie_word_embeddings": "yes"}', "model.tie_word_embeddings"),
])
def test_a_malformed_model_file_is_one_line_naming_the_field(capsys, tmp_path, name, body, field):
    path = tmp_path / name
    path.write_bytes(body)
    assert memory_of_model(capsys, path)["field"] == field


def test_a_folder_given_as_the_model_is_rejected(capsys, tmp_path):
    (tmp_path / "m.yaml").mkdir()
    error = memory_of_model(capsys, tmp_path / "m.yaml")
    assert error["field"] == "model" and "not a directory" in error["error"]


# ------------------------------------------------------------------------------- plans

@pytest.mark.parametrize("argv, field, fragment", [
    (["simulate", "--model", "gpt3-125m", "--plan", "dp=8 gbs=1000000000000"], "gbs", "125,000,000,000 microbatches"),
    (["simulate", "--model", "gpt3-125m", "--cluster", "h100-sxm:1000000000000", "--plan", "dp=1000000000000"],
     "cluster", "devices laid out"),
    (["simulate", "--plan", f"dp=8 dp_bucket_bytes={10 ** 309}"], "dp_bucket_bytes", "2**53"),
    (["memory", "--plan", "dp=abc dp=8"], "dp", "sets dp twice"),
    (["memory", "--cluster", "foo:8"], "cluster", "PRESET one of"),
    (["sweep", "--model", "gpt3-125m", "--cluster", "h100-sxm:1000000000000", "--no-progress"], "cluster",
     "devices for a sweep"),
    (["sweep", "--model", "tiny", "--cluster", "h100-sxm:1010101010", "--no-progress"], "cluster",
     "at most 2**20"),
    (["schedule", "--microbatches", "1000000000"], "microbatches", "at most 10,000,000 actions"),
])
def test_bad_or_unboundedly_big_plans_are_refused_before_any_work(capsys, argv, field, fragment):
    start = time.monotonic()
    error = rejected(capsys, *argv)
    assert error["field"] == field and fragment in error["error"]
    assert time.monotonic() - start < 20       # refused up front, not after a long run


def test_a_model_of_a_billion_layers_is_refused_by_the_work_bound_naming_layers(capsys, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: x\nlayers: 1000000000\nhidden: 64\nheads: 4\n")
    error = rejected(capsys, "simulate", "--model", path, "--cluster", "a100-80g:8", "--plan", "dp=8")
    assert error["field"] == "model.layers" and "PARSIM_MAX_EVENTS" in error["error"]


def test_a_yaml_partition_of_floats_is_an_error_not_truncated(capsys, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("pp: 2\npartition: [1.7, 2.9]\n")
    error = rejected(capsys, "memory", "--model", "tiny", "--cluster", "cpu:2", "--plan", path)
    assert error["field"] == "partition"


def test_partition_takes_pp_from_the_plan_without_a_pp_flag(capsys):
    code, out, _ = run(capsys, "partition", "--model", "gpt3-125m", "--plan", "pp=4 dp=2", "--graph", "analytic",
                       "--json")
    assert code == 0 and len(json.loads(out)["partition"]) == 4


# ------------------------------------------------------------------------------- validate

@pytest.mark.parametrize("body, field", [
    (b"model: tiny\nplans: [\n", "matrix"),              # syntax error
    (b"model: tiny\nplans: 5\n", "matrix.plans"),
    (b"\x00\x01\x02\xff\xfe binary", "matrix"),
    (None, "matrix"),                                    # a directory
])
def test_validate_rejects_a_malformed_matrix(capsys, tmp_path, body, field):
    path = tmp_path / "m.yaml"
    if body is None:
        path.mkdir()
    else:
        path.write_bytes(body)
    assert rejected(capsys, "validate", "--matrix", path, "--out", tmp_path / "out")["field"] == field


def test_validate_rejects_a_profile_that_is_not_one_before_any_executor_round(capsys, tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text("model: tiny\nplans: ['dp=2 gbs=2 dtype=fp32']\nsteps: 2\n")
    not_a_profile = tmp_path / "model.yaml"
    not_a_profile.write_text("layers: 4\nhidden: 64\nheads: 4\n")
    start = time.monotonic()
    error = rejected(capsys, "validate", "--matrix", matrix, "--profile", not_a_profile, "--out", tmp_path / "out")
    assert error["field"].startswith("profile")
    assert time.monotonic() - start < 10
    assert not (tmp_path / "out" / "rounds.csv").exists()


# ------------------------------------------------------------------------------- outputs

def test_calibrate_out_under_a_file_fails_before_the_benchmarks(capsys, tmp_path):
    (tmp_path / "afile").write_text("x")
    start = time.monotonic()
    error = rejected(capsys, "calibrate", "--quick", "--out", tmp_path / "afile" / "x.yaml")
    assert error["field"] == "out" and "is a file" in error["error"]
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("argv", [
    ["simulate", "--trace", "{f}/t.json"], ["sweep", "--out", "{f}/s.csv", "--no-progress"],
    ["schedule", "--dump-csv", "{f}/s.csv"], ["plot", "timeline", "--out", "{f}/t.png"]])
def test_an_output_under_a_file_is_refused_before_the_work(capsys, tmp_path, argv):
    (tmp_path / "afile").write_text("x")
    argv = [a.replace("{f}", str(tmp_path / "afile")) for a in argv]
    assert "is a file" in rejected(capsys, *argv)["error"]


# ------------------------------------------------------------------------------- clusters and profiles

NAN, INF = float("nan"), float("inf")
CLUSTER_ROWS = [   # (where in the a100-80g profile, the value put there, what the error's field must name)
    (("network", "intra_node", "bandwidth"), 0, "bandwidth"),
    (("network", "inter_node", "bandwidth"), -1.0e9, "bandwidth"),
    (("network", "intra_node", "bandwidth"), NAN, "bandwidth"),
    (("device", "memory_bytes"), -1, "memory_bytes"),
    (("device", "peak_flops"), {"fp32": -1.0e12, "bf16": -1.0e12, "fp16": -1.0e12}, "peak_flops"),
    (("devices_per_node",), INF, "devices_per_node"),
    (("devices_per_node",), 10 ** 400, "devices_per_node"),                   # huge integer
    (("device", "memory_bytes"), 10 ** 400, "memory_bytes"),
    (("network", "host_link", "latency"), -1.0e-6, "host_link.latency"),
    (("network", "nics_per_node"), 0, "nics_per_node"),
    (("device", "usable_memory_fraction"), 1.5, "usable_memory_fraction"),
    (("device", "gemm"), {"max_efficiency": NAN}, "gemm.max_efficiency"),
    (("device", "membound_efficiency"), "fast", "membound_efficiency"),
    (("device", "peak_flops"), {"fp32": 1.0e12}, "peak_flops"),     # no bf16 peak: a SpecError inside the engine
]


def _profile_with(tmp_path, where: tuple[str, ...], value):
    import yaml
    from parsim.specs import profiles_dir

    profile = yaml.safe_load((profiles_dir() / "a100-80g.yaml").read_text())
    node = profile
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


@pytest.mark.parametrize("where, value, fragment", CLUSTER_ROWS)
def test_bad_cluster_numbers_are_one_line_naming_the_field(capsys, tmp_path, where, value, fragment):
    path = _profile_with(tmp_path, where, value)
    error = rejected(capsys, "simulate", "--model", "tiny", "--cluster", "a100-80g:2", "--plan", "dp=2",
                     "--profile", path)
    assert fragment in error["field"]


@pytest.mark.parametrize("body", [b"device: 5\nnetwork: {}\n", b"name: x\ndevice:\n  peak_flops: [1, 2]\n",
                                  b"device: {peak_flops: {bf16: 1.0e+12}, memory_bytes: x}\n"])
def test_a_malformed_profile_file_names_the_section(capsys, tmp_path, body):
    path = tmp_path / "p.yaml"
    path.write_bytes(body)
    error = rejected(capsys, "memory", "--model", "tiny", "--cluster", "cpu:2", "--plan", "dp=2", "--profile", path)
    assert error["field"].startswith("profile.")
