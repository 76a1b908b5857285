"""The loss's forward on the last stage, against the executor on real gloo ranks.

With tp = 1 the executor's loss is ``F.cross_entropy(logits.float())``: in a 16-bit plan that
makes an fp32 copy of the logits beside them while the log-softmax is written; in fp32,
``.float()`` returns the logits themselves and there is no copy
(``activations.forward_working_bytes``). A single-microbatch ZeRO-2 step of an untied model
peaks at that forward's end (its gradient shards not made yet, ``fsdp2_absent_grads``), which
read one fp32 logits tensor high before (5.86 MiB of 122-160 MiB on a 6,000-word model)."""
from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from parsim.costs import memory_by_stage  # noqa: E402
from parsim.specs import load_cluster, load_model  # noqa: E402

from test_fsdp2_root_memory import run_measured  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]

# Llama-style and untied, its forward's end the peak: one fp32 logits tensor (128 x 3000) is 5.4 % of it
SPEC = replace(load_model("tiny"), layers=2, hidden=192, heads=6, kv_heads=2, ffn_hidden=512, vocab=3000,
               seq_len=128, activation="swiglu", norm="rmsnorm", position="rope", bias=False,
               tied_embeddings=False, flash_attention=True, dropout=False)
PLANS = ["dp=2 mbs=1 gbs=2 zero=2 dtype=fp32", "dp=2 mbs=1 gbs=2 zero=2 dtype=bf16"]


@pytest.fixture(scope="module")
def measured():
    return run_measured(SPEC, PLANS)


@pytest.mark.parametrize("text", PLANS)
def test_a_single_microbatch_zero2_step_peaks_at_the_loss_forward_as_priced(measured, text):
    plan, result = measured[text]
    logits = 4 * SPEC.seq_len * SPEC.vocab        # one fp32 logits tensor, the copy fp32 does not make
    predicted = memory_by_stage(SPEC, plan, load_cluster("cpu:2", profile="cpu-calibrated"))[0].total
    for peak in result.peak_memory_bytes_by_rank:
        assert predicted == pytest.approx(peak, rel=0.01)
        assert logits > 0.05 * peak                  # the copy, were it counted, would be seen
