"""Medusa training (specdec/training/medusa.py): the loss by hand, LoRA wrappers, Medusa-1 lowering its loss and
writing loadable checkpoints, Medusa-2 keeping the tuned target close to the original (and the KL term being what
keeps it there), the full fine-tune option, and the refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import VOCAB, tiny_model

from specdec.formats.medusa import load_medusa_head
from specdec.generate import generate
from specdec.heads.medusa import MedusaHead
from specdec.training.medusa import (
    LoRALinear,
    apply_lora,
    distillation_kl,
    medusa_loss,
    merge_lora,
    train_medusa1,
    train_medusa2,
)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=4, scale=4.0)


@pytest.fixture(scope="module")
def data(target):
    prompts = torch.randint(1, VOCAB, (24, 3), generator=torch.Generator().manual_seed(2))
    return generate(target, prompts, max_new_tokens=40, eos_token_id=[]).sequences


def _mean(values):
    return sum(values) / len(values)


def test_medusa_loss_by_hand_with_hard_and_soft_labels(target):
    head = MedusaHead.from_target(target, num_heads=2)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        head.block_weight.copy_(torch.randn(head.block_weight.shape, generator=g) * 0.1)
    feats = torch.randn(2, 6, 64, generator=g)
    tokens = torch.randint(0, VOCAB, (2, 6), generator=g)
    z = torch.randn(2, 6, VOCAB, generator=g)
    loss, metrics = medusa_loss(head, feats, tokens, decay=0.5)
    logits = head(feats)                                            # [2, 6, 2, V]
    hard = [F.cross_entropy(logits[:, : 6 - k - 2, k].reshape(-1, VOCAB), tokens[:, k + 2:].reshape(-1))
            for k in range(2)]
    assert torch.allclose(loss, hard[0] + 0.5 * hard[1], atol=1e-5)
    acc0 = (logits[:, :4, 0].argmax(-1) == tokens[:, 2:]).float().mean()
    assert torch.allclose(metrics["head0_acc"], acc0)
    soft_loss, _ = medusa_loss(head, feats, tokens, target_logits=z, decay=0.5)
    soft = [-(torch.softmax(z[:, k + 1: 5], -1) * torch.log_softmax(logits[:, : 6 - k - 2, k], -1)).sum(-1).mean()
            for k in range(2)]
    assert torch.allclose(soft_loss, soft[0] + 0.5 * soft[1], atol=1e-5)
    with pytest.raises(ValueError, match="too short"):
        medusa_loss(head, feats[:, :3], tokens[:, :3])


def test_lora_starts_as_the_base_and_merges_exactly():
    g = torch.Generator().manual_seed(1)
    base = torch.nn.Linear(8, 5)
    wrapper = LoRALinear(base, 3, 6.0, g)
    x = torch.randn(4, 8, generator=g)
    assert torch.equal(wrapper(x), base(x))
    with torch.no_grad():
        wrapper.lora_b.copy_(torch.randn(5, 3, generator=g))
    y = wrapper(x)
    assert not torch.allclose(y, base(x))
    assert torch.allclose(wrapper.merged()(x), y, atol=1e-5)


def test_apply_and_merge_lora_on_a_model_leave_a_plain_model(target):
    import copy

    model = copy.deepcopy(target)
    wrappers = apply_lora(model, 2, 4.0, generator=torch.Generator().manual_seed(0))
    assert len(wrappers) == 2 * 7  # q, k, v, o, gate, up, down per layer; never lm_head
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    ids = torch.randint(0, VOCAB, (1, 5))
    assert torch.allclose(model(ids).logits, target(ids).logits, atol=1e-6)  # B = 0 at start
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert type(model) is type(target)
    with pytest.raises(ValueError, match="no linear layer"):
        apply_lora(copy.deepcopy(target), 2, 4.0, generator=torch.Generator(), targets=("nope",))


def test_train_medusa1_lowers_the_loss_and_saves_loadable_checkpoints(target, data, tmp_path):
    result = train_medusa1(target, data, num_heads=3, steps=30, batch_size=8, seq_len=24, lr=1e-2, out_dir=tmp_path,
                           save_every=10, progress=False)
    losses = [r.loss for r in result.history]
    assert len(losses) == 30 and _mean(losses[-5:]) < 0.8 * _mean(losses[:5])
    assert {"head0_acc", "head2_loss"} <= set(result.history[-1].metrics)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "step-10", "step-20"]
    loaded = load_medusa_head(tmp_path / "final", target)
    f = torch.randn(3, 64)
    assert torch.allclose(loaded(f), result.head(f), atol=1e-6)
    assert result.head.dtype == torch.float32 and not result.head.training


def test_train_medusa1_soft_labels_and_shared_lm_head(target, data):
    result = train_medusa1(target, data, num_heads=2, shared_lm_head=True, labels="target", steps=20, batch_size=8,
                           seq_len=24, lr=1e-2, progress=False)
    losses = [r.loss for r in result.history]
    assert _mean(losses[-5:]) < _mean(losses[:5])
    assert result.head.lm_head_weight.data_ptr() == target.get_output_embeddings().weight.data_ptr()


def _kl_to_original(original, tuned, data):
    with torch.no_grad():
        return float(distillation_kl(original(data).logits, tuned(data).logits))


@pytest.fixture(scope="module")
def warm_head(target, data):
    return train_medusa1(target, data, num_heads=3, steps=30, batch_size=8, seq_len=24, lr=1e-2, progress=False).head


def test_train_medusa2_keeps_the_target_close_to_the_original(target, data, warm_head, tmp_path):
    before = {k: v.clone() for k, v in target.state_dict().items()}
    common = dict(steps=25, batch_size=8, seq_len=24, lr=2e-3, heads_lr=1e-2, lora_rank=4, heads_weight=0.2,
                  progress=False)
    result = train_medusa2(target, data, head=_copy_head(warm_head, target), lm_weight=10.0, out_dir=tmp_path,
                           **common)
    tuned = result.target
    assert type(tuned) is type(target) and not any(isinstance(m, LoRALinear) for m in tuned.modules())
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())  # the original is untouched
    changed = any(not torch.equal(before[k], v) for k, v in tuned.state_dict().items())
    kl = _kl_to_original(target, tuned, data[:8])
    assert changed and kl < 0.02
    assert "kl" in result.history[-1].metrics and len(result.history) == 25  # given heads: no warm-up
    # the KL term is what keeps it close: without it the same training drifts further
    free = train_medusa2(target, data, head=_copy_head(warm_head, target), lm_weight=0.0, **common)
    assert _kl_to_original(target, free.target, data[:8]) > 3 * kl
    # checkpoints: a plain HF target and loadable heads
    import transformers

    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "final" / "target")
    ids = data[:1, :6]
    assert torch.allclose(again(ids).logits, tuned(ids).logits, atol=1e-5)
    load_medusa_head(tmp_path / "final" / "medusa", again)


def _copy_head(head, target):
    fresh = MedusaHead.from_target(target, num_heads=head.config.num_heads)
    fresh.load_state_dict(head.state_dict())
    return fresh


def test_train_medusa2_warms_fresh_heads_up_and_can_fine_tune_fully(target, data):
    result = train_medusa2(target, data, num_heads=2, steps=6, head_warmup_steps=4, batch_size=4, seq_len=24,
                           lr=1e-4, lora_rank=0, progress=False)
    assert len(result.history) == 10 and "kl" not in result.history[0].metrics and "kl" in result.history[-1].metrics
    assert result.target.get_output_embeddings().weight.dtype == torch.float32
    ids = data[:2, :5]
    out = generate(result.target, ids, max_new_tokens=5)  # a usable target
    assert out.sequences.shape == (2, 10)


def test_training_refuses_bad_inputs(target, data):
    with pytest.raises(ValueError, match="labels"):
        train_medusa1(target, data, labels="both", steps=1, progress=False)
    other = MedusaHead.from_target(tiny_model("llama", seed=0, hidden=32), num_heads=2)
    with pytest.raises(ValueError, match="hidden size 32"):
        train_medusa1(target, data, head=other, steps=1, progress=False)
    with pytest.raises(ValueError, match="fewer than one window"):
        train_medusa1(target, data[:1, :5], steps=1, seq_len=24, progress=False)
