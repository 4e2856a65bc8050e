"""A 16-bit checkpoint loaded for fp32 compute keeps its embedding and head in 16 bits (backend.vocabulary): the
same logits and gradients as the all-fp32 load, without the fp32 copy of the vocabulary matrices (issue 22)."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import state_reduction.backend.vocabulary as vocabulary
from state_reduction.checkpoints import load_model, save_model_atomic
from state_reduction.peak_memory import HeapPeak
from state_reduction.provenance import TINY_CHECKPOINTS
from state_reduction.speed.models import reduced_copy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bf16_vocabulary_computes_like_the_fp32_model(tmp_path, monkeypatch):
    monkeypatch.setattr(vocabulary, "HEAD_ROWS", 3000)  # 8192 rows in three blocks, the last one short
    config = AutoConfig.from_pretrained(TINY_CHECKPOINTS / "qwen3_5")
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    save_model_atomic(model, AutoTokenizer.from_pretrained(TINY_CHECKPOINTS / "qwen3_5"), tmp_path / "m")
    full = load_model(str(tmp_path / "m"), dtype=torch.float32, vocabulary_in_storage=False)
    with HeapPeak() as peak:
        mixed = load_model(str(tmp_path / "m"), dtype=torch.float32)
    dtypes = {n: p.dtype for n, p in mixed.named_parameters()}
    assert dtypes.pop("model.embed_tokens.weight") == dtypes.pop("lm_head.weight") == torch.bfloat16
    assert set(dtypes.values()) == {torch.float32}
    vocab_bytes = 2 * config.vocab_size * config.hidden_size
    assert peak.peak < sum(p.numel() * 4 for p in full.parameters()) - vocab_bytes  # no fp32 vocabulary copy

    ids = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    for m in (full, mixed):
        m.requires_grad_(False).model.layers[0].mlp.down_proj.weight.requires_grad_(True)
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
    assert mixed(input_ids=ids).logits.dtype == torch.float32
    torch.testing.assert_close(mixed(input_ids=ids).logits, full(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    g_full, g_mixed = (m.model.layers[0].mlp.down_proj.weight.grad for m in (full, mixed))
    torch.testing.assert_close(g_mixed, g_full, rtol=1e-4, atol=1e-6)

    copy = reduced_copy(mixed.eval(), keep=config.linear_key_head_dim // 2)
    assert copy.lm_head.weight is mixed.lm_head.weight and copy.model.embed_tokens.weight is mixed.model.embed_tokens.weight


def test_a_head_that_requires_grad_upcasts_by_blocks_without_grad_mode():
    """Loaded weights require grad: a no-grad forward (evaluation, decoding) must not upcast the whole head."""
    head = torch.nn.Linear(128, 65536, bias=False).to(torch.bfloat16)  # 32 MiB in fp32
    vocabulary.fp32_except_vocabulary(_Wrapper(head))
    x = torch.randn(1, 4, 128)
    with torch.no_grad(), HeapPeak() as peak:
        logits = head(x)
    assert peak.peak < 65536 * 128 * 4 / 2
    torch.testing.assert_close(logits, x @ head.weight.float().T)


class _Wrapper(torch.nn.Module):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def get_input_embeddings(self):
        return None

    def get_output_embeddings(self):
        return self.head
