"""EAGLE training (specdec/training/eagle.py): draft vocabulary, training-time test, loss goes down."""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from specdec.formats import load_eagle_head
from specdec.heads import Eagle3Head
from specdec.training import build_draft_vocab, token_stream, train_eagle1, train_eagle3, ttt_forward
from specdec.training.eagle import _ttt_attention

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=4, scale=16.0)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    motifs = torch.randint(0, VOCAB, (6, 10), generator=g)
    return [motifs[torch.randint(0, 6, (300,), generator=g)].reshape(-1)]


def test_build_draft_vocab_keeps_most_frequent_ids_sorted():
    counts = torch.tensor([3, 9, 0, 9, 1, 7])
    d2t, t2d = build_draft_vocab(counts, 3)
    used = torch.arange(3) + d2t
    assert used.tolist() == [1, 3, 5]  # the three most frequent, ascending
    assert t2d.tolist() == [False, True, False, True, False, True]
    d2t, _ = build_draft_vocab(torch.tensor([1, 1, 1, 1]), 2)  # ties go to the smaller id
    assert (torch.arange(2) + d2t).tolist() == [0, 1]
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_draft_vocab(counts, 7)


def test_token_stream_joins_documents_with_the_separator():
    class Tok:
        eos_token_id = 0

        def __call__(self, text, add_special_tokens=False, verbose=True):
            return {"input_ids": [ord(c) - 96 for c in text]}

    assert token_stream(["ab", "c"], Tok()).tolist() == [1, 2, 0, 3, 0]
    assert token_stream([torch.tensor([5, 6]), [7]], separator=1).tolist() == [5, 6, 1, 7, 1]
    with pytest.raises(ValueError, match="tokenizer"):
        token_stream(["text"])


def test_token_stream_tokenizes_whole_files_without_the_max_length_message():
    import logging

    from specdec.demo.models import load_demo_tokenizer

    class Recorder(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    text = "x = 1\n" * 1500  # 6000 tokens, longer than the tokenizer's model_max_length (2048)
    message = "Token indices sequence length is longer than the specified maximum"
    recorder = Recorder()
    hf_logger = logging.getLogger("transformers")  # transformers' records end here (its children propagate to it)
    hf_logger.addHandler(recorder)
    try:
        tokenizer = load_demo_tokenizer()  # fresh: transformers says it once per tokenizer
        assert token_stream([text], tokenizer).numel() > tokenizer.model_max_length
        assert not any(message in m for m in recorder.messages)
        tokenizer(text, add_special_tokens=False)  # the control: the same call without verbose=False says it
        assert any(message in m for m in recorder.messages)
    finally:
        hf_logger.removeHandler(recorder)


def test_ttt_attention_equals_masked_attention_over_all_keys():
    g = torch.Generator().manual_seed(0)
    B, nh, nkv, T, hd, steps = 2, 4, 2, 5, 8, 3
    q = torch.randn(B, nh, T, hd, generator=g)
    k0, v0 = torch.randn(B, nkv, T, hd, generator=g), torch.randn(B, nkv, T, hd, generator=g)
    ek = [torch.randn(B, nkv, T, hd, generator=g) for _ in range(steps)]
    ev = [torch.randn(B, nkv, T, hd, generator=g) for _ in range(steps)]
    keys = torch.cat([k0] + ek, 2).repeat_interleave(nh // nkv, 1)
    values = torch.cat([v0] + ev, 2).repeat_interleave(nh // nkv, 1)
    t = torch.arange(T)
    mask = torch.cat([t[None, :] <= t[:, None]] + [torch.eye(T, dtype=torch.bool)] * steps, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    torch.testing.assert_close(_ttt_attention(q, k0, v0, ek, ev), ref, rtol=1e-5, atol=1e-5)


def test_ttt_forward_equals_tree_branch_forward(target):
    """Unrolled step i at index t sees exactly what a depth-(i+1) node sees: context <= t and its own chain."""
    head = Eagle3Head.from_target(target, feature_layers=(1, 2, 3), num_layers=2)
    g = torch.Generator().manual_seed(1)
    B, T, S, H = 2, 7, 3, target.config.hidden_size
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    hidden0 = torch.randn(B, T - 1, H, generator=g)
    outs = ttt_forward(head, tokens, hidden0, S)
    L = T - 1
    ids, hid, pos, step_of, index_of = [], [], [], [], []
    for i in range(S):  # one flat sequence of all steps, attention given by an explicit 4D mask
        n = L - i
        ids.append(tokens[:, 1 + i: 1 + i + n])
        hid.append(hidden0 if i == 0 else outs[i - 1][:, :n])
        pos.append(torch.arange(n) + i)
        step_of.append(torch.full((n,), i))
        index_of.append(torch.arange(n))
    step_of, index_of = torch.cat(step_of), torch.cat(index_of)
    sees = ((step_of[None, :] == 0) & (index_of[None, :] <= index_of[:, None])) | (
        (step_of[None, :] >= 1) & (step_of[None, :] <= step_of[:, None]) & (index_of[None, :] == index_of[:, None]))
    flat = head(torch.cat(ids, 1), torch.cat(hid, 1), torch.cat(pos)[None].expand(B, -1),
                attention_mask=sees[None, None].expand(B, 1, -1, -1))
    torch.testing.assert_close(torch.cat(outs, 1), flat, rtol=1e-5, atol=1e-5)


def _drop(history, n=8):
    first = sum(r.loss for r in history[:n]) / n
    last = sum(r.loss for r in history[-n:]) / n
    return first, last


def test_train_eagle1_reduces_loss_and_saves_loadable_checkpoints(target, data, tmp_path):
    result = train_eagle1(target, data, steps=50, batch_size=8, seq_len=32, lr=3e-3, progress=False,
                          out_dir=tmp_path, save_every=25)
    first, last = _drop(result.history)
    assert last < 0.9 * first, (first, last)
    assert result.history[-1].feature_loss > 0 and len(result.history) == 50
    for folder in ("step-25", "final"):
        loaded = load_eagle_head(tmp_path / folder, target)
        assert type(loaded).__name__ == "Eagle1Head"
    final = load_eagle_head(tmp_path / "final", target)
    for a, b in zip(final.state_dict().values(), result.head.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_train_eagle3_reduces_loss_with_reduced_vocab(target, data):
    result = train_eagle3(target, data, draft_vocab_size=70, ttt_steps=3, steps=50, batch_size=8, seq_len=32,
                          lr=3e-3, progress=False)
    first, last = _drop(result.history)
    assert last < 0.9 * first, (first, last)
    head = result.head
    assert head.config.draft_vocab == 70
    seen = torch.unique(torch.cat([d.reshape(-1) for d in data]))
    assert head.t2d[seen].all()  # every token of the training text made it into the draft vocabulary


def test_train_refuses_a_head_for_another_target(target, data):
    other = tiny_model("llama", layers=4, hidden=32)
    head = Eagle3Head.from_target(other, feature_layers=(1, 2, 3))
    with pytest.raises(ValueError, match="hidden size of 32 but the target has 64"):
        train_eagle3(target, data, head=head, steps=1, progress=False)


def test_draft_vocab_size_for_coverage_is_the_smallest_enough():
    from specdec.training import draft_vocab_size_for_coverage

    counts = torch.tensor([5, 0, 90, 5, 0])
    assert draft_vocab_size_for_coverage(counts, 0.90) == 1
    assert draft_vocab_size_for_coverage(counts, 0.95) == 2
    assert draft_vocab_size_for_coverage(counts, 0.96) == 3
    assert draft_vocab_size_for_coverage(counts, 1.0) == 3  # zero-count ids are never needed
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (200,), generator=g)
    for coverage in (0.5, 0.8, 0.99):
        n = draft_vocab_size_for_coverage(counts, coverage)
        top = torch.sort(counts, descending=True).values
        assert top[:n].sum() >= coverage * counts.sum() > top[: n - 1].sum()
    with pytest.raises(ValueError, match="coverage"):
        draft_vocab_size_for_coverage(counts, 1.5)


def test_train_eagle3_sizes_the_vocabulary_by_coverage(target, data):
    result = train_eagle3(target, data, draft_vocab_coverage=1.0, ttt_steps=2, steps=2, batch_size=2, seq_len=16,
                          progress=False)
    seen = torch.unique(torch.cat([d.reshape(-1) for d in data]))
    assert result.head.config.draft_vocab <= seen.numel() + 1  # the separator may be counted too
    assert result.head.t2d[seen].all()
    with pytest.raises(ValueError, match="not both"):
        train_eagle3(target, data, draft_vocab_size=10, draft_vocab_coverage=0.9, steps=1, progress=False)
