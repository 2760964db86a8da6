"""An EAGLE-1/2 head drafting over a restricted vocabulary (FR-Spec): logits, id map, losslessness, refusals."""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from specdec.drafters import EagleDrafter
from specdec.generate import generate
from specdec.heads import Eagle1Head
from specdec.training import build_draft_vocab, train_eagle1
from specdec.trees import DynamicTree, SampledTree
from specdec.types import SamplingParams


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=2, scale=4.0)


def _subset(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` strictly increasing target ids, drawn at random."""
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:n].sort().values


def _head(target, seed: int = 0) -> Eagle1Head:
    torch.manual_seed(seed)
    head = Eagle1Head.from_target(target).float()
    with torch.no_grad():  # a head that is not the identity: fc and the layer's output projections random
        for p in head.parameters():
            p.normal_(0.0, 0.05)
    return head


def test_restricted_logits_are_the_full_logits_columns(target):
    head = _head(target)
    hidden = torch.randn(2, 3, head.config.hidden_size)
    full = head.logits(hidden)
    ids = _subset(40)
    head.restrict_vocab(ids)
    assert head.logits(hidden).shape == (2, 3, 40)
    torch.testing.assert_close(head.logits(hidden), full[..., ids], rtol=0, atol=0)
    cols = torch.tensor([[0, 39], [5, 7]])
    assert torch.equal(head.draft_to_target(cols), ids[cols])
    head.restrict_vocab(None)  # undone: the full projection again, and the identity map
    torch.testing.assert_close(head.logits(hidden), full, rtol=0, atol=0)
    assert torch.equal(head.draft_to_target(cols), cols)


def test_restrict_takes_build_draft_vocab_output(target):
    head = _head(target)
    counts = torch.zeros(VOCAB)
    counts[_subset(30, seed=3)] = 1 + torch.arange(30, dtype=torch.float)
    d2t, t2d = build_draft_vocab(counts, 30)
    head.restrict_vocab((d2t, t2d))
    assert torch.equal(head.draft_ids, _subset(30, seed=3))
    assert torch.equal(head.draft_to_target(torch.arange(30)), _subset(30, seed=3))


@pytest.mark.parametrize("bad", [torch.tensor([3, 2, 5]), torch.tensor([1, 1]), torch.tensor([-1, 4]),
                                 torch.tensor([0, VOCAB]), torch.tensor([], dtype=torch.long)])
def test_bad_vocabularies_are_refused(target, bad):
    head = _head(target)
    with pytest.raises(ValueError, match="strictly increasing"):
        head.restrict_vocab(bad)
    assert head.draft_ids is None and head.logits(torch.randn(1, head.config.hidden_size)).shape[-1] == VOCAB


def test_inconsistent_d2t_t2d_are_refused(target):
    head = _head(target)
    d2t, t2d = build_draft_vocab(torch.arange(VOCAB, dtype=torch.float), 10)
    t2d = t2d.clone()
    t2d[0] = ~t2d[0]
    with pytest.raises(ValueError):
        head.restrict_vocab((d2t, t2d))


def test_training_a_restricted_head_is_refused(target):
    head = _head(target).restrict_vocab(_subset(20))
    data = torch.randint(1, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="restrict_vocab"):
        train_eagle1(target, data, head=head, steps=1, batch_size=2, seq_len=8, progress=False)


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_generate_is_lossless_and_drafts_only_kept_ids(target, fast, batch):
    """Greedy decoding equals plain greedy decoding token for token (eager and the static path), and every drafted
    node is a kept id. The kept ids include the target's own greedy tokens so that some drafts are accepted."""
    ids = torch.randint(1, VOCAB, (batch, 5), generator=torch.Generator().manual_seed(batch))
    plain = generate(target, ids, max_new_tokens=16)
    kept = torch.unique(torch.cat([plain.sequences.flatten(), _subset(VOCAB // 4, seed=1)]))
    head = _head(target).restrict_vocab(kept)
    drafts = []

    class Spy(EagleDrafter):
        def propose(self, state, request):
            draft, state = super().propose(state, request)
            drafts.append(draft)
            return draft, state

    spec = generate(target, ids, drafter=Spy(head, DynamicTree(12, 3, 3)), max_new_tokens=16, fast=fast)
    assert torch.equal(spec.sequences, plain.sequences)
    assert drafts, "the drafter was never asked for a draft"
    for d in drafts:
        present = d.parents[:, 1:] >= 0
        assert torch.isin(d.tokens[present], kept).all()


def test_sampled_tree_puts_no_mass_outside_the_kept_ids(target):
    """T > 0: the draft's q (draft_probs, over the target vocabulary) is zero outside the kept ids and sums to one,
    so the unchanged lossless verifier sees a valid draft law."""
    from test_eagle_drafter import _request, _start_feedback

    head = _head(target).restrict_vocab(_subset(50, seed=2))
    drafter = EagleDrafter(head, SampledTree([[0], [1], [0, 0], [1, 0]]))
    rows, roots = [[3, 9, 4, 7], [5, 6]], [11, 12]
    state = drafter.start(_start_feedback(target, rows, roots, head.feature_layers))
    draft, _ = drafter.propose(state, _request(torch.tensor([4, 2]), roots, 2, SamplingParams(temperature=0.9)))
    assert draft.draft_probs is not None and draft.draft_probs.shape[-1] == VOCAB
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[_subset(50, seed=2)] = False
    present = draft.parents[:, 1:] >= 0
    probs = draft.draft_probs[present]  # row i - 1: node i's law
    assert probs[:, outside].abs().max() == 0
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[0]))
    assert torch.isin(draft.tokens[present], _subset(50, seed=2)).all()


def test_from_target_restricts_at_once(target):
    head = Eagle1Head.from_target(target, draft_vocab=_subset(25, seed=4)).float()
    assert torch.equal(head.draft_ids, _subset(25, seed=4))
    assert head.logits(torch.randn(2, head.config.hidden_size)).shape == (2, 25)


def test_an_unrestricted_head_holds_the_projection_once_and_restrictions_chain(target):
    """Unrestricted: no second reference to the lm_head (so .to() converts it once); restricting twice cuts the full
    projection both times, not the first subset."""
    head = _head(target)
    assert head.full_lm_head_weight is None and head.lm_head_weight.data_ptr() == \
        target.get_output_embeddings().weight.data_ptr()
    hidden = torch.randn(4, head.config.hidden_size)
    full = head.logits(hidden)
    head.restrict_vocab(_subset(30)).restrict_vocab(_subset(50, seed=6))
    torch.testing.assert_close(head.logits(hidden), full[:, _subset(50, seed=6)], rtol=0, atol=0)
    head.restrict_vocab(None)
    assert head.full_lm_head_weight is None and head.draft_ids is None
    torch.testing.assert_close(head.logits(hidden), full, rtol=0, atol=0)


def test_the_heads_draft_id_tables_map_as_draft_to_target_does(target):
    """``draft_id_table`` (what a drafter hands the tree's top-k): ``None`` for a full vocabulary, the kept ids for a
    restricted EAGLE-1 head, ``arange + d2t`` for an EAGLE-3 head, made once per ``d2t`` and made again when ``d2t``
    changes in place."""
    from specdec.heads import Eagle3Head

    head = Eagle1Head.from_target(target).float()
    assert head.draft_id_table() is None
    keep = torch.tensor([1, 4, 6, 9, 20])
    head.restrict_vocab(keep)
    assert torch.equal(head.draft_id_table(), keep)
    d2t, t2d = build_draft_vocab(torch.arange(VOCAB, 0, -1).float() ** 2, 7)
    head3 = Eagle3Head.from_target(target, feature_layers=(0, 1, 2), draft_vocab=(d2t, t2d)).float()
    table = head3.draft_id_table()
    draft_ids = torch.arange(7)
    assert torch.equal(table, head3.draft_to_target(draft_ids)) and head3.draft_id_table() is table
    with torch.no_grad():
        head3.d2t.zero_()
    assert torch.equal(head3.draft_id_table(), draft_ids)
