import pytest
import torch

from specdec.drafters.base import Drafter, Feedback, ProposeRequest
from specdec.drafters.prompt_lookup import (
    PromptLookupDrafter,
    PromptLookupState,
    find_ngram_continuations,
    find_ngram_continuations_ref,
)
from specdec.types import DraftScheme, SamplingParams


def feedback(rows, roots, *, left_pad=False):
    """A Feedback holding ragged committed rows (left-aligned, or left-padded like a prompt batch)."""
    width = max((len(r) for r in rows), default=0)
    tokens = torch.full((len(rows), width), 99, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, row in enumerate(rows):
        lo = width - len(row) if left_pad else 0
        tokens[b, lo : lo + len(row)] = torch.tensor(row, dtype=torch.long)
        valid[b, lo : lo + len(row)] = True
    roots = torch.tensor(roots, dtype=torch.long)
    return Feedback(
        tokens=tokens,
        next_tokens=torch.zeros_like(tokens),
        positions=torch.zeros_like(tokens),
        valid=valid,
        features=(),
        roots=roots,
    )


def request(roots, k, active=None):
    roots = torch.tensor(roots, dtype=torch.long)
    return ProposeRequest(
        roots=roots,
        root_positions=torch.zeros_like(roots),
        num_drafts=k,
        sampling=SamplingParams(),
        source=None,
        active=torch.ones(len(roots), dtype=torch.bool) if active is None else torch.tensor(active),
    )


def proposals(draft):
    """Per row, the list of present draft tokens, after checking the chain layout."""
    out = []
    for b in range(draft.tokens.shape[0]):
        parents, depths = draft.parents[b].tolist(), draft.depths[b].tolist()
        k = sum(p >= 0 for p in parents)
        assert parents == [-1] + list(range(k)) + [-1] * (len(parents) - 1 - k)
        assert depths == list(range(k + 1)) + [0] * (len(depths) - 1 - k)
        out.append(draft.tokens[b, :k].tolist())
    return out


def propose(rows, roots, k, drafter=None, **kw):
    drafter = drafter or PromptLookupDrafter(num_drafts=10)
    state = drafter.start(feedback(rows, roots))
    draft, _ = drafter.propose(state, request(roots, k, **kw))
    assert draft.scheme == DraftScheme.DETERMINISTIC and draft.draft_probs is None
    assert draft.tokens.dtype == torch.long and draft.tokens.shape[1] == draft.parents.shape[1] - 1
    return proposals(draft), draft


def test_is_a_drafter_without_features():
    drafter = PromptLookupDrafter()
    assert isinstance(drafter, Drafter)
    assert drafter.feature_layers == () and drafter.max_num_drafts == 10
    assert (drafter.max_ngram_size, drafter.min_ngram_size) == (3, 1)


def test_longest_ngram_wins_over_a_more_recent_shorter_one():
    # Sequence (history + root): the suffix 1 2 3 occurred at the start (then 40 41); 3 alone recurs later (then 50).
    rows = [[1, 2, 3, 40, 41, 9, 3, 50, 8, 1, 2]]
    got, _ = propose(rows, roots=[3], k=2)
    assert got == [[40, 41]]


def test_most_recent_match_wins_among_equal_lengths():
    rows = [[7, 8, 10, 11, 7, 8, 20, 21, 5, 5, 7]]
    got, _ = propose(rows, roots=[8], k=2)
    assert got == [[20, 21]]
    got, _ = propose(rows, roots=[8], k=2, drafter=PromptLookupDrafter(most_recent=False))
    assert got == [[10, 11]]


def test_no_match_gives_zero_drafts():
    got, draft = propose([[1, 2, 3, 4]], roots=[5], k=4)
    assert got == [[]]
    assert draft.tokens.shape == (1, 0) and draft.parents.tolist() == [[-1]] and draft.depths.tolist() == [[0]]
    # The suffix alone is not an earlier occurrence of itself.
    got, _ = propose([[]], roots=[5], k=4)
    assert got == [[]]


def test_k_caps_the_chain_and_the_history_end_cuts_it():
    rows = [[4, 5, 6, 7, 8, 9, 10, 4]]
    assert propose(rows, roots=[5], k=3)[0] == [[6, 7, 8]]
    assert propose(rows, roots=[5], k=10)[0] == [[6, 7, 8, 9, 10, 4, 5]]
    # A match near the end has only the tokens up to the root to offer.
    assert propose([[1, 1, 1]], roots=[1], k=5)[0] == [[1]]


def test_min_ngram_size_excludes_short_matches():
    drafter = PromptLookupDrafter(max_ngram_size=3, min_ngram_size=2)
    assert propose([[3, 60, 61, 9]], roots=[3], k=2, drafter=drafter)[0] == [[]]
    assert propose([[9, 3, 60, 61, 9]], roots=[3], k=2, drafter=drafter)[0] == [[60, 61]]


def test_batch_rows_differ_and_pad_with_absent_nodes():
    rows = [[1, 2, 3, 4, 5, 6, 1], [7, 8, 9], [5, 6, 5]]
    got, draft = propose(rows, roots=[2, 3, 6], k=4, active=[True, True, True])
    assert got == [[3, 4, 5, 6], [], [5, 6]]
    assert draft.tokens.shape == (3, 4)
    assert draft.parents.tolist() == [[-1, 0, 1, 2, 3], [-1] * 5, [-1, 0, 1, -1, -1]]
    assert draft.depths.tolist() == [[0, 1, 2, 3, 4], [0] * 5, [0, 1, 2, 0, 0]]
    got, _ = propose(rows, roots=[2, 3, 6], k=4, active=[False, True, True])
    assert got == [[], [], [5, 6]]


def test_start_skips_left_padding_and_update_appends_exactly_the_committed_tokens():
    drafter = PromptLookupDrafter(num_drafts=4)
    prompts = [[11, 12, 13], [21]]
    state = drafter.start(feedback(prompts, roots=[14, 22], left_pad=True))
    assert state.lengths.tolist() == [3, 1]
    assert state.history[0, :3].tolist() == [11, 12, 13] and state.history[1, :1].tolist() == [21]
    committed = [list(p) for p in prompts]
    # Step feedback: root + accepted drafts, left-aligned, ragged across rows (99 = invalid filler).
    for step in ([[14, 15, 16], [22]], [[17], [23, 24, 25, 26]]):
        before = PromptLookupState(state.history.clone(), state.lengths.clone())
        new_state = drafter.update(state, feedback(step, roots=[0, 0]))
        assert torch.equal(state.history, before.history) and torch.equal(state.lengths, before.lengths)
        state = new_state
        for row, extra in zip(committed, step):
            row.extend(extra)
        assert state.lengths.tolist() == [len(r) for r in committed]
        assert [state.history[b, : len(r)].tolist() for b, r in enumerate(committed)] == committed


def test_a_decoding_loop_uses_generated_tokens():
    drafter = PromptLookupDrafter(num_drafts=3)
    state = drafter.start(feedback([[1, 2, 3, 4]], roots=[9]))
    draft, state = drafter.propose(state, request([9], 3))
    assert proposals(draft) == [[]]
    # The target emits 9 (root, now committed) and the next token 1; then 9 1 ... is still new, but 1 -> 2 3 4.
    state = drafter.update(state, feedback([[9]], roots=[1]))
    draft, state = drafter.propose(state, request([1], 3))
    assert proposals(draft) == [[2, 3, 4]]
    state = drafter.update(state, feedback([[1, 2, 3, 4]], roots=[9]))
    draft, _ = drafter.propose(state, request([9], 3))
    assert proposals(draft) == [[1, 2, 3]]


@pytest.mark.parametrize("early_exit", [True, False])
@pytest.mark.parametrize("most_recent", [True, False])
def test_vectorised_search_matches_the_reference(most_recent, early_exit):
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        batch, width = 1 + trial % 5, 1 + trial * 3
        sequences = torch.randint(0, 2 + trial % 4, (batch, width), generator=gen)
        lengths = torch.randint(0, width + 1, (batch,), generator=gen)
        k = trial % 6
        args = (sequences, lengths, k, 1 + trial % 4, 1)
        got = find_ngram_continuations(*args, most_recent=most_recent, early_exit=early_exit)
        want = find_ngram_continuations_ref(*args, most_recent=most_recent)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (trial, sequences, lengths)


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="min_ngram_size <= max_ngram_size"):
        PromptLookupDrafter(max_ngram_size=1, min_ngram_size=2)
    with pytest.raises(ValueError, match="num_drafts must be >= 1"):
        PromptLookupDrafter(num_drafts=0)
    drafter = PromptLookupDrafter(num_drafts=4)
    state = drafter.start(feedback([[1, 2]], roots=[1]))
    with pytest.raises(ValueError, match=r"num_drafts=5 is outside 1..4.*num_drafts >= 5"):
        drafter.propose(state, request([1], 5))
    with pytest.raises(ValueError, match="roots must have shape"):
        drafter.propose(state, request([1, 2], 2))
    with pytest.raises(ValueError, match="call start"):
        drafter.update(state, feedback([[1], [2]], roots=[1, 2]))


def test_fixed_width_proposes_the_same_chains_padded_to_k():
    rows, roots = [[5, 6, 7, 8, 5, 6, 7], [1, 2, 3], [4, 4, 4, 4]], [8, 9, 4]
    narrow, narrow_draft = propose(rows, roots, 6)
    wide, wide_draft = propose(rows, roots, 6, drafter=PromptLookupDrafter(num_drafts=10, fixed_width=True))
    assert wide == narrow and any(narrow)
    assert wide_draft.tokens.shape[1] == 6 > narrow_draft.tokens.shape[1]


@pytest.mark.parametrize("fast", [False, True])
def test_fixed_width_generates_the_same_tokens(fast):
    from tiny_models import tiny_model

    from specdec.generate import generate

    model = tiny_model("llama", scale=3.0)
    ids = torch.tensor([[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [0, 0, 7, 8, 9, 7, 8, 9, 7, 8]])
    mask = (torch.arange(10) >= torch.tensor([[0], [2]])).long()
    runs = [generate(model, ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[], fast=fast,
                     drafter=PromptLookupDrafter(num_drafts=5, fixed_width=wide)) for wide in (False, True)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.num_target_forwards == runs[1].stats.num_target_forwards


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fixed_width_propose_never_synchronises():
    drafter = PromptLookupDrafter(num_drafts=6, fixed_width=True)
    fb = feedback([[5, 6, 7, 8, 5, 6, 7], [1, 2, 3]], [8, 9])
    fb = fb._replace(**{name: getattr(fb, name).cuda() for name in ("tokens", "valid", "roots")})
    state = drafter.start(fb)
    req = request([8, 9], 6)
    req = req._replace(roots=req.roots.cuda(), active=req.active.cuda())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        draft, _ = drafter.propose(state, req)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert proposals(draft) == propose([[5, 6, 7, 8, 5, 6, 7], [1, 2, 3]], [8, 9], 6)[0]
