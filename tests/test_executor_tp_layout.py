"""The executor's sequence-parallel collectives call gloo's tensor forms, as Megatron-LM does
(the simulator and the in-situ probe price those); its activations are batch-first, so the
shards are laid out on dim 0 around the call. These tests check that layout in one process
(loss parity over real gloo ranks is in ``test_executor_parity.py``)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from parsim.executor import tp_communications as tpc  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("size", [2, 4])
def test_reduce_scatter_blocks_hold_each_ranks_sequence_chunk_on_dim0(size):
    x = torch.arange(3 * 8 * 5, dtype=torch.float32).reshape(3, 8, 5)   # [batch, seq, hidden]
    blocks, out = tpc._scatter_buffers(x, size)
    assert blocks.is_contiguous() and blocks.shape == (size * 3, 8 // size, 5)
    assert out.shape == (3, 8 // size, 5)
    for r, chunk in enumerate(x.chunk(size, dim=tpc.SEQ_DIM)):
        # reduce_scatter_tensor gives rank r the r-th 1/size of the flat input
        assert torch.equal(blocks.flatten()[r * out.numel():(r + 1) * out.numel()].view_as(out), chunk)


@pytest.mark.parametrize("size", [2, 4])
def test_gathered_buffer_is_the_shards_concatenated_along_the_sequence(size):
    shards = [torch.randn(3, 2, 5) for _ in range(size)]
    shard, buf = tpc._gather_buffers(shards[0], size)
    assert buf.shape == (size * 3, 2, 5)
    buf.copy_(torch.cat(shards, dim=0))            # what all_gather_into_tensor writes
    assert torch.equal(tpc._gathered(buf, size), torch.cat(shards, dim=tpc.SEQ_DIM))


def test_tensor_forms_prefer_torch_2_13_names_and_fall_back_to_the_older_ones():
    new = SimpleNamespace(all_gather_single="ag1", reduce_scatter_single="rs1",
                          all_gather_into_tensor="ag0", reduce_scatter_tensor="rs0")
    old = SimpleNamespace(all_gather_into_tensor="ag0", reduce_scatter_tensor="rs0")
    assert tpc.tensor_forms(new) == ("ag1", "rs1")
    assert tpc.tensor_forms(old) == ("ag0", "rs0")
