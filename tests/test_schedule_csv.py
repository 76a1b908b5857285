"""Schedules in torch 2.13's ``_dump_csv`` format: round trips, byte equality with torch's
own dump, and one clear error (file, row, column, what is allowed) for every bad file."""
import json
from types import SimpleNamespace

import pytest

from parsim.cli import main
from parsim.schedules import build_schedule, dump_schedule_csv, load_schedule_csv, lower_schedule
from parsim.specs import SpecError

ALL = [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("looped-bfs", 2, 3, 2), ("zb-h1", 4, 6, 1),
       ("zb-h2", 4, 9, 1), ("interleaved-zb", 4, 8, 2), ("zbv", 4, 8, 2), ("dualpipev", 4, 9, 2)]


@pytest.mark.parametrize("name, pp, m, vpp", ALL)
def test_dump_then_load_gives_back_the_schedule_compute_only_and_lowered(tmp_path, name, pp, m, vpp):
    schedule = build_schedule(name, pp, m, vpp)
    for version in (schedule, lower_schedule(schedule), lower_schedule(schedule, defer_recv=True)):
        path = dump_schedule_csv(version, tmp_path / "s.csv")
        assert load_schedule_csv(path, pp, name=name) == version


@pytest.mark.parametrize("class_name, name, pp, m", [("ScheduleZBVZeroBubble", "zbv", 4, 8),
                                                    ("ScheduleDualPipeV", "dualpipev", 2, 5),
                                                    ("ScheduleInterleavedZeroBubble", "interleaved-zb", 4, 8)])
def test_our_dump_is_byte_identical_to_torchs_and_reads_torchs(tmp_path, class_name, name, pp, m):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    stages = [SimpleNamespace(num_stages=2 * pp, group_size=pp, group_rank=0, stage_index=c * pp, submod=None)
              for c in range(2)]
    theirs = getattr(schedules, class_name)(stages, m)
    theirs._dump_csv(str(tmp_path / "torch.csv"))                           # compute_comms, torch's default
    theirs._dump_csv(str(tmp_path / "torch_compute.csv"), format="compute_only")   # with empty idle cells
    ours = build_schedule(name, pp, m, 2)
    dump_schedule_csv(lower_schedule(ours), tmp_path / "ours.csv")
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "torch.csv").read_bytes()
    assert load_schedule_csv(tmp_path / "torch.csv", pp, name=name) == lower_schedule(ours)
    assert load_schedule_csv(tmp_path / "torch_compute.csv", pp, name=name) == ours


def write(tmp_path, *rows: str):
    path = tmp_path / "bad.csv"
    path.write_text("\r\n".join(rows) + "\r\n")
    return path


GOOD = ("0F0,0SEND_F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0")


@pytest.mark.parametrize("rows, pp, value, fragments", [
    (("0F0,0X0,0B0", "1F0,1B0"), 2, "0X0", ["row 1 (rank 0), column 2", "kind one of F, B, I, W"]),
    (("0F0,0B,", "1F0,1B0"), 2, "0B", ["column 2", "B needs a microbatch index"]),
    (("0F0,(0F1)OVERLAP_F_B", "1F0,1B0"), 2, "(0F1)OVERLAP_F_B", ["exactly two actions"]),
    (("0F0,0SEND_F0,0B0", GOOD[1]), 2, "1SEND_B0", ["row 2 (rank 1), column 4",
                                                    "SEND_B1.0 on rank 1 has no matching RECV_B0.0 on rank 0"]),
    (("0F0,0RECV_B0,0B0", GOOD[1]), 2, "1RECV_F0", ["row 2 (rank 1), column 1",
                                                    "RECV_F1.0 on rank 1 has no matching SEND_F0.0 on rank 0"]),
    (("0F0,0F1,0B0", "1F0,1F1,1B0,1B1"), 2, None, ["row 1 (rank 0)", "B0.1 is missing",
                                                  "never fully backpropagated"]),
    (("0F0,0B0", "1F0,1B0", "2F0,2B0"), 2, None, ["has 3 rows; needs one per pipeline rank, pp=2"]),
    (("0F0,0B0,2F0,2B0", "1F0,1B0"), 2, None, ["uses stages 0..2", "multiple of the 2 ranks"]),
    (("0F0,0B0,1F1", "1F0,1B0"), 2, "1F1", ["row 1 (rank 0), column 3", "stage 1 lives on rank 1"]),
    (("0F0,0B0,0F1,0B1", "1F1,1F0,1B0,1B1"), 2, None, ["deadlock", "rank 1 waits at F1.1 for F0.1"]),
    (("0F0,0B0,0REDUCE_GRAD3", "1F0,1B0"), 2, "0REDUCE_GRAD3", ["takes no microbatch"]),
])
def test_bad_csv_gets_one_spec_error_naming_file_row_column(tmp_path, rows, pp, value, fragments):
    path = write(tmp_path, *rows)
    with pytest.raises(SpecError) as err:
        load_schedule_csv(path, pp)
    assert err.value.field == "csv"
    assert err.value.value == (value if value is not None else str(path))
    assert str(path) in str(err.value)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_missing_or_unreadable_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="a readable CSV file"):
        load_schedule_csv(tmp_path / "nope.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(SpecError, match="_dump_csv format"):
        load_schedule_csv(tmp_path / "bin.csv")


# --- the CLI ---------------------------------------------------------------------------------

def run_cli(capsys, *argv):
    rc = main(["schedule", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_dumps_and_reads_back_a_schedule_with_the_same_grid_and_bubble(capsys, tmp_path):
    csv_path = tmp_path / "zbv.csv"
    rc, out, _ = run_cli(capsys, "--schedule", "zbv", "--pp", "4", "--microbatches", "8", "--dump-csv", str(csv_path),
                         "--json")
    generated = json.loads(out)
    rc2, out2, err2 = run_cli(capsys, "--from-csv", str(csv_path), "--json")
    assert rc == rc2 == 0 and err2 == ""
    loaded = json.loads(out2)
    assert loaded["actions"] == generated["actions"] and loaded["placement"] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert loaded["unit_time_bubble_fraction"] == generated["unit_time_bubble_fraction"]
    assert loaded["textbook_bubble_fraction"] is None and generated["textbook_bubble_fraction"] == 3 / 51


def test_cli_with_comms_prints_the_compute_grid_and_dumps_torchs_lowered_form(capsys, tmp_path):
    path = tmp_path / "low.csv"
    rc, out, _ = run_cli(capsys, "--schedule", "zb-h1", "--pp", "2", "--microbatches", "2", "--with-comms",
                         "--dump-csv", str(path))
    assert rc == 0 and f"wrote {path}" in out
    rows = [line.split("| ")[1] for line in out.splitlines() if line.startswith("rank ")]
    assert rows == ["F0 F1 .  I0 W0 I1 W1", ".  F0 I0 F1 I1 W0 W1"]
    assert "1RECV_F0" in path.read_text().splitlines()[1]


def test_cli_bad_csv_exits_2_with_the_checkers_message(tmp_path):
    import subprocess
    import sys
    path = write(tmp_path, "0F0,0RECV_B0,0B0", *GOOD[1:])
    out = subprocess.run([sys.executable, "-m", "parsim", "schedule", "--from-csv", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert "no matching SEND_F0.0 on rank 0" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("argv, fragment", [
    (["--schedule", "zbv"], "either --from-csv (and --pp to check it) or --schedule"),
    (["--pp", "3"], "has 2 rows; needs one per pipeline rank, pp=3"),
])
def test_cli_from_csv_conflicts_and_rank_count(capsys, tmp_path, argv, fragment):
    path = write(tmp_path, *GOOD)
    rc = main(["schedule", "--from-csv", str(path), *argv])
    assert rc == 2 and fragment in capsys.readouterr().err


def test_cli_plots_zbv_with_i_w_and_v_placement(capsys, tmp_path):
    png = tmp_path / "grid.png"
    rc, out, _ = run_cli(capsys, "--schedule", "zbv", "--pp", "4", "--microbatches", "8", "--plot", str(png))
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from parsim.plots.schedule_grid import _legend
    from parsim.schedules import dry_run
    schedule = build_schedule("zbv", 4, 8, 2)
    labels = [h.get_label() for h in _legend(schedule, dry_run(schedule))]
    assert labels == ["forward, chunk 0", "forward, chunk 1", "backward (input grad), chunk 0",
                      "backward (input grad), chunk 1", "backward (weight grad), chunk 0",
                      "backward (weight grad), chunk 1", "idle"]


def test_new_schedules_lowering_and_csv_work_without_torch(tmp_path):
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "from parsim.schedules import build_schedule, check_schedule, lower_schedule, dump_schedule_csv, "
            "load_schedule_csv\n"
            "s = lower_schedule(build_schedule('dualpipev', 2, 4, 2))\n"
            f"p = dump_schedule_csv(s, {str(tmp_path / 'd.csv')!r})\n"
            "assert load_schedule_csv(p, 2, name='dualpipev') == s; check_schedule(s); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_directory_or_a_file_too_big_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(SpecError, match="not a directory"):
        load_schedule_csv(tmp_path / "d.csv")
    (tmp_path / "big.csv").write_text("F0," * 30 + "\n")
    monkeypatch.setattr("parsim.specs.files.MAX_INPUT_BYTES", 64)
    with pytest.raises(SpecError, match="at most 0 MiB"):
        load_schedule_csv(tmp_path / "big.csv")
    monkeypatch.setenv("PARSIM_MAX_EVENTS", "10")
    monkeypatch.setattr("parsim.specs.files.MAX_INPUT_BYTES", 2**20)
    with pytest.raises(SpecError, match="at most 10 actions"):
        load_schedule_csv(tmp_path / "big.csv")
