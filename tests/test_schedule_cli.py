"""``parsim schedule``: the grid, the JSON contract, the plot, and bad input -> exit 2."""
import json
import subprocess
import sys

import pytest

from parsim.cli import main


def run_cli(capsys, *argv):
    rc = main(["schedule", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_default_is_1f1b_on_4_ranks_with_8_microbatches_and_prints_one_line_per_rank(capsys):
    rc, out, err = run_cli(capsys)
    assert rc == 0 and err == ""
    rows = [line for line in out.splitlines() if line.startswith("rank ")]
    assert [r.split("|")[0].strip() for r in rows] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert "schedule 1f1b" in out
    assert "bubble 0.2727" in out and "textbook 0.2727" in out


def test_grid_places_each_action_in_its_time_slots(capsys):
    rc, out, _ = run_cli(capsys, "--schedule", "gpipe", "--pp", "2", "--microbatches", "2")
    rows = [line.split("| ")[1] for line in out.splitlines() if line.startswith("rank ")]
    # slots are 3 characters wide; a backward fills two slots
    assert rows[0] == "F0 F1 .  .  .  B0 == B1 =="
    assert rows[1] == ".  F0 F1 B0 == B1 == .  ."


def test_interleaved_grid_labels_actions_with_stage_and_microbatch(capsys):
    rc, out, _ = run_cli(capsys, "--schedule", "interleaved", "--pp", "2", "--microbatches", "2", "--vpp", "2")
    rows = [line.split("| ")[1] for line in out.splitlines() if line.startswith("rank ")]
    assert rows[0].split()[:4] == ["F0.0", "F0.1", "F2.0", "F2.1"]
    assert "chunks of 1/vpp" in out


def test_json_carries_the_schedule_its_actions_and_bubbles(capsys):
    rc, out, err = run_cli(capsys, "--schedule", "interleaved", "--pp", "4", "--microbatches", "8", "--vpp", "2",
                           "--json")
    assert rc == 0 and err == ""
    data = json.loads(out)
    assert {"schedule", "pp", "vpp", "num_microbatches", "actions", "unit_time_bubble_fraction",
            "textbook_bubble_fraction", "peak_inflight_microbatches"} <= set(data)
    assert (data["schedule"], data["pp"], data["vpp"], data["num_microbatches"]) == ("interleaved", 4, 2, 8)
    assert len(data["actions"]) == 4 and all(len(rank) == 2 * 2 * 8 for rank in data["actions"])
    assert data["actions"][3][:3] == ["F3.0", "F3.1", "F3.2"]
    assert data["unit_time_bubble_fraction"] == data["textbook_bubble_fraction"] == 3 / 19
    assert len(data["peak_inflight_microbatches"]) == 8
    assert data["peak_inflight_per_rank"] == [11, 9, 7, 5]


def test_plan_gives_the_same_schedule_as_the_flags(capsys):
    _, from_plan, _ = run_cli(capsys, "--plan", "dp=2 pp=4 mbs=2 gbs=32 schedule=1f1b", "--json")
    _, from_flags, _ = run_cli(capsys, "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--json")
    assert json.loads(from_plan) == json.loads(from_flags)


def test_plot_writes_a_png(capsys, tmp_path):
    png = tmp_path / "grid.png"
    rc, out, _ = run_cli(capsys, "--schedule", "interleaved", "--vpp", "2", "--plot", str(png))
    assert rc == 0 and f"wrote {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("argv, field, fragment", [
    (["--schedule", "zero-bubble"], "schedule", "one of naive, gpipe, 1f1b, interleaved"),
    (["--pp", "0"], "pp", "positive integer"),
    (["--microbatches", "0"], "microbatches", "positive integer"),
    (["--vpp", "2"], "vpp", "needs schedule=interleaved"),
    (["--schedule", "interleaved"], "vpp", "vpp >= 2"),
    (["--schedule", "interleaved", "--vpp", "2", "--microbatches", "6"], "microbatches", "multiple of pp=4"),
    (["--plan", "pp=4 gbs=6 vpp=2 schedule=interleaved"], "gbs", "divisible by pp=4"),
    (["--plan", "dp=2 gbs=3"], "gbs", "divisible by dp*mbs=2"),
    (["--plan", "pp=four"], "pp", "an integer"),
    (["--plan", "pp=4", "--pp", "2"], "plan", "either --plan or --pp"),
])
def test_bad_input_exits_2_with_one_message_naming_the_field(capsys, argv, field, fragment):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith(f"parsim: error: {field}=") and fragment in err
    assert len(err.strip().splitlines()) == 1


def test_bad_input_with_json_prints_one_error_object(capsys):
    rc, out, _ = run_cli(capsys, "--pp", "0", "--json")
    assert rc == 2 and json.loads(out)["field"] == "pp"


def test_console_json_is_exactly_one_object_on_stdout():
    out = subprocess.run([sys.executable, "-m", "parsim", "schedule", "--schedule", "naive", "--pp", "2",
                          "--microbatches", "3", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["actions"] == [["F0.0", "B0.0", "F0.1", "B0.1", "F0.2", "B0.2"],
                               ["F1.0", "B1.0", "F1.1", "B1.1", "F1.2", "B1.2"]]
    assert data["unit_time_bubble_fraction"] == 0.5
