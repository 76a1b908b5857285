"""Executor building blocks that need no process group: sharding, optimizer, data, pipeline
messages, memory accounting, trace export, plan checks."""
from __future__ import annotations

import pytest
import torch

from parsim.schedules import build_schedule
from parsim.specs import SpecError, parse_plan

from test_executor_cases import TINY_GPT, TINY_LLAMA

pytestmark = pytest.mark.torch


def test_tp_shards_of_a_padded_vocabulary_reassemble_the_full_tensor():
    from parsim.executor.tp_parallel import shard_tensor, unshard_tensor

    full = torch.randn(130, 8)   # 130 rows over 4 ranks: padded to 132
    parts = [shard_tensor(full, "embed.token_weight", 4, r) for r in range(4)]
    assert [p.shape[0] for p in parts] == [33] * 4
    assert torch.equal(parts[3][-2:], torch.zeros(2, 8))
    assert torch.equal(unshard_tensor(parts, "embed.token_weight", 130), full)
    rows = torch.randn(8, 12)
    cols = [shard_tensor(rows, "layers.0.attn.o.weight", 2, r) for r in range(2)]
    assert [c.shape for c in cols] == [(8, 6), (8, 6)]
    assert torch.equal(unshard_tensor(cols, "layers.0.attn.o.weight", 8), rows)
    assert shard_tensor(rows, "layers.0.attn_norm.weight", 2, 1) is rows


def test_adamw_matches_torch_adamw_bit_for_bit():
    from parsim.executor.optimizer import BETAS, EPS, LEARNING_RATE, WEIGHT_DECAY, make_adamw

    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = make_adamw(ours)
    ref = torch.optim.AdamW([{"params": [theirs[0]], "weight_decay": WEIGHT_DECAY},
                             {"params": [theirs[1]], "weight_decay": 0.0}],
                            lr=LEARNING_RATE, betas=BETAS, eps=EPS, foreach=False)
    for _ in range(4):
        grads = [torch.randn_like(p) for p in ours]
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))


def test_every_sequence_of_the_global_batch_lands_in_exactly_one_microbatch():
    from parsim.executor.data import SyntheticTokens, rank_microbatches

    source = SyntheticTokens(vocab=128, seq_len=8, seed=3)
    plan = parse_plan("dp=2 mbs=2 gbs=8")
    batch = source.global_batch(5, 8)
    got = [mb for d in range(2) for mb in rank_microbatches(source, 5, plan, d, torch.device("cpu"))]
    assert len(got) == 4 and all(mb.tokens.shape == (2, 8) for mb in got)
    assert torch.equal(torch.cat([mb.tokens for mb in got]), batch[:, :-1])
    assert torch.equal(torch.cat([mb.targets for mb in got]), batch[:, 1:])
    assert not torch.equal(source.global_batch(6, 8), batch)


def test_text_data_needs_a_byte_vocabulary(tmp_path):
    from parsim.executor.data import ByteTextTokens

    path = tmp_path / "text.txt"
    path.write_text("hello pipeline " * 20)
    batch = ByteTextTokens(path, vocab=256, seq_len=16, seed=0).global_batch(0, 3)
    assert batch.shape == (3, 17) and int(batch.max()) < 256
    with pytest.raises(SpecError) as err:
        ByteTextTokens(path, vocab=128, seq_len=16, seed=0)
    assert err.value.field == "data"


def test_pipeline_messages_follow_each_ranks_action_order():
    from parsim.executor.pp_communications import Message, outgoing_messages

    schedule = build_schedule("1f1b", 2, 3)
    assert outgoing_messages(schedule, 0) == [Message("act", 0, 0), Message("act", 0, 1), Message("act", 0, 2)]
    assert outgoing_messages(schedule, 1) == [Message("grad", 1, 0), Message("grad", 1, 1), Message("grad", 1, 2)]
    inter = build_schedule("interleaved", 2, 2, vpp=2)
    kinds = {(m.kind, m.src_stage) for m in outgoing_messages(inter, 0)}
    assert kinds == {("act", 0), ("act", 2), ("grad", 2)}   # stage 0 sends no gradient


def test_memory_tracker_counts_live_tensors_by_category_at_the_peak():
    from parsim.executor.memory import MemoryTracker

    weight = torch.nn.Parameter(torch.zeros(256))          # 1 KiB, registered up front
    with MemoryTracker() as tracker:
        tracker.classify([weight], "params")
        with tracker.phase("activations"):
            act = torch.ones(1024) * 2                      # 4 KiB live activation
            tmp = act + 1                                   # 4 KiB, freed below
            del tmp
        with tracker.phase("other"):
            buf = torch.empty(512)                          # 2 KiB
        del act
    assert tracker.peak_total == 1024 + 4096 + 4096
    assert tracker.breakdown() == {"params": 1024, "grads": 0, "optimizer": 0, "activations": 8192, "other": 0}
    assert tracker.live["activations"] == 0 and tracker.live["other"] == 2048
    del buf


def test_chrome_trace_has_one_complete_event_per_interval_in_microseconds():
    from parsim.executor.timeline import chrome_trace
    from parsim.trace import Event

    events = [Event(rank=1, stage=1, stream="compute", kind="F", microbatch=0, layer=-1, start=0.001, end=0.003,
                    name="F1.0"),
              Event(rank=1, stage=1, stream="pp", kind="send", microbatch=0, layer=-1, start=0.003, end=0.004,
                    bytes=64.0, name="send act 1.0")]
    trace = chrome_trace(events)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["pid"], e["ts"], e["dur"]) for e in xs] == [("F1.0", 1, 1000.0, 2000.0),
                                                                     ("send act 1.0", 1, 3000.0, 1000.0)]
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"rank 1", "compute", "pp"} <= names


def test_offload_and_unexecutable_options_are_rejected_with_the_field_named():
    from parsim.executor import check_executable

    with pytest.raises(SpecError) as err:
        check_executable(TINY_GPT, parse_plan("dp=2 zero=1 offload=optimizer"))
    assert err.value.field == "offload" and "offload=none" in str(err.value)
    with pytest.raises(SpecError) as err:
        check_executable(TINY_GPT, parse_plan("dp=2 dp_impl=ps"))
    assert err.value.field == "dp_impl"
    with pytest.raises(SpecError) as err:
        check_executable(TINY_LLAMA, parse_plan("tp=4"))      # kv_heads=2
    assert err.value.field == "tp"


# a fresh interpreter: was torch imported when the fork server was first asked to run, and are
# torch and the server there once run_plan is done?
_RUN_PLAN = """
import multiprocessing.forkserver as fs, sys
from parsim.executor.config import ExecutorConfig
from parsim.executor.entry import run_plan
from parsim.specs import SpecError, load_model, parse_plan
ensure_running = fs.ensure_running
def first_call():
    print("server started with torch imported", "torch" in sys.modules)
    fs.ensure_running = ensure_running
    ensure_running()
fs.ensure_running = first_call
try:
    run_plan(load_model("tiny"), parse_plan(sys.argv[1]), ExecutorConfig(steps=1, warmup=0), print)
except SpecError as err:
    print("rejected", err.field)
print("torch imported", "torch" in sys.modules, "fork server", fs._forkserver._forkserver_pid is not None)
"""


@pytest.mark.parametrize("plan, said", [("dp=2 dp_impl=ps", ["rejected dp_impl", "torch imported False fork server False"]),
                                        ("dp=2 gbs=2", ["server started with torch imported False",
                                                        "torch imported True fork server True"])])
def test_run_plan_checks_the_plan_and_starts_the_fork_server_before_it_imports_torch(plan, said):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _RUN_PLAN, plan], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-len(said):] == said


def test_recompute_policy_per_layer_follows_the_plan():
    from parsim.executor.recompute import layer_policies

    assert layer_policies(parse_plan("recompute=selective"), 0, 3) == ["selective"] * 3
    aware = parse_plan("pp=2 recompute=stage-aware recompute_layers=2,1")
    assert layer_policies(aware, 0, 3) == ["full", "full", "none"]
    assert layer_policies(aware, 1, 3) == ["full", "none", "none"]
    shifted = parse_plan("pp=2 recompute=full shifted_critical_path=true")
    assert layer_policies(shifted, 1, 2) == ["none", "none"] and layer_policies(shifted, 0, 2) == ["full", "full"]


def test_executor_config_rejects_inconsistent_checkpoint_options():
    from parsim.executor import ExecutorConfig

    with pytest.raises(SpecError) as err:
        ExecutorConfig(steps=4, save_dir="ckpt")
    assert err.value.field == "save_at"
    with pytest.raises(SpecError):
        ExecutorConfig(steps=4, save_dir="ckpt", save_at=5)


def test_every_plan_starts_from_the_same_weights():
    from parsim.executor.model import StageModule, canonical_name
    from parsim.executor.weights import build_full_model, init_stage

    full = dict(build_full_model(TINY_LLAMA, seed=7).named_parameters())
    last = StageModule(TINY_LLAMA, 2, 2, is_first=False, is_last=True)
    init_stage(last, seed=7)
    for name, p in last.named_parameters():
        assert torch.equal(p, full[canonical_name(name, TINY_LLAMA)])


@pytest.mark.parametrize("threads", [False, True], ids=["serial", "threads"])
@pytest.mark.parametrize("spec", [TINY_GPT, TINY_LLAMA], ids=["gpt", "llama"])
def test_a_blank_stage_takes_the_canonical_weights_of_randn_times_std(spec, threads, monkeypatch):
    """``initialised_stage`` builds without nn.Linear's default init and draws in place (on
    threads for a large model); every parameter is still exactly Normal(0, 1) draws of its own
    generator times ``init_std`` (norms 1, biases 0), as ``torch.randn(shape, generator) * std``
    gives them."""
    import zlib

    from parsim.executor import weights
    from parsim.executor.model import canonical_name
    from parsim.executor.weights import init_std, initialised_stage

    if threads:
        monkeypatch.setattr(weights, "PARALLEL_INIT_ELEMENTS", 0)
        monkeypatch.setattr("os.cpu_count", lambda: 4)      # the threaded path on any host

    stage = initialised_stage(spec, 0, spec.layers, True, True, seed=11)
    names = [n for n, _ in stage.named_parameters()]
    assert any(n.endswith("norm.weight") for n in names) and len(names) > 6
    for name, p in stage.named_parameters():
        cname = canonical_name(name, spec)
        if cname.endswith("norm.weight"):
            expected = torch.ones(p.shape)
        elif cname.endswith(".bias"):
            expected = torch.zeros(p.shape)
        else:
            gen = torch.Generator().manual_seed((11 * 1_000_003 + zlib.crc32(cname.encode())) % 2**63)
            expected = torch.randn(tuple(p.shape), generator=gen) * init_std(cname, spec)
        assert p.device.type == "cpu" and p.dtype == torch.float32 and p.requires_grad
        assert torch.equal(p.detach(), expected), name


def test_a_stage_cast_before_its_init_takes_the_same_weights_cast():
    from parsim.executor.model import StageModule
    from parsim.executor.weights import build_full_model, init_stage

    full = build_full_model(TINY_GPT, seed=5)
    cast = StageModule(TINY_GPT, 0, TINY_GPT.layers, is_first=True, is_last=True).to(torch.bfloat16)
    init_stage(cast, seed=5)
    for (name, p), q in zip(full.named_parameters(), cast.parameters()):
        assert q.dtype == torch.bfloat16 and torch.equal(p.to(torch.bfloat16), q), name


def test_ranks_on_one_hosts_clock_count_from_the_steps_common_start_and_others_from_their_own():
    from parsim.executor.results import RankResult, combine
    from parsim.trace import Event

    def rank(r: int, origin: float | None, host: str) -> RankResult:
        out = RankResult(rank=r, coords=(r, 0, 0), steps=[0, 1], step_times=[1.0, 1.0],
                         microbatch_losses=[[5.0], [5.0]] if r == 1 else [[], []], skipped=[False, False],
                         step_origins=[origin, None if origin is None else origin + 10.0], clock_host=host)
        out.events = {s: [Event(rank=r, stage=r, stream="compute", kind="F", microbatch=0, layer=-1,
                                start=0.1, end=0.2)] for s in (0, 1)}
        return out

    def run(*ranks: RankResult):
        return combine(list(ranks), model="m", plan_text="pp=2", backend="gloo", device="cpu", warmup=1)

    # rank 1 left the barrier 3 ms after rank 0 on the same clock: its step ends 3 ms later
    res = run(rank(0, 100.0, "h|b"), rank(1, 100.003, "h|b"))
    assert res.step_times == pytest.approx([1.003, 1.003])
    starts = {e.rank: e.start for e in res.trace.events}
    assert starts[0] == pytest.approx(0.1) and starts[1] == pytest.approx(0.103)
    # other hosts' clocks (or CUDA events: no host origin) do not compare: each rank's own start
    for ranks in ((rank(0, 100.0, "h|b"), rank(1, 100.003, "g|c")), (rank(0, None, "h|b"), rank(1, None, "h|b"))):
        res = run(*ranks)
        assert res.step_times == [1.0, 1.0] and {e.start for e in res.trace.events} == {0.1}
