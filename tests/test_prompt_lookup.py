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


# --------------------------------------------------------------------------------------------------------
# The captured steps (specdec.graphs): a static history written in place, no host sync, the eager drafts
# --------------------------------------------------------------------------------------------------------


def _strict_graphed(drafter):
    """The drafter graphed on CPU through the strict reference capture (each replay refuses host syncs)."""
    from test_parallel_graphs import _Counting, capture_strict

    from specdec.graphs import GraphedDrafter

    counter = _Counting(capture_strict)
    return GraphedDrafter(drafter, capture=counter, device_types=("cpu",)), counter


def _run_steps(drafter, steps, roots_after):
    """Drive ``drafter`` by hand: a left-padded prompt, then per step a propose and a ragged update; the drafts."""
    state = drafter.start(feedback([[3, 4, 5, 3, 4], [7, 8, 7]], roots=[5, 8], left_pad=True))
    drafts = []
    for step, roots in zip(steps, roots_after):
        draft, state = drafter.propose(state, request(roots[0], 4, active=roots[1]))
        drafts.append((proposals(draft), draft.tokens.shape))
        state = drafter.update(state, feedback(step, roots=[0, 0]))
    return drafts, state


def test_graphed_steps_give_the_eager_drafts_and_write_one_static_history(monkeypatch):
    import specdec.drafters.prompt_lookup as pl

    monkeypatch.setattr(pl, "_STATIC_SLACK", 0)  # a small buffer, so that the history grows during the run
    g = torch.Generator().manual_seed(3)
    steps, roots_after = [], []
    for i in range(40):  # feedback 5 wide (K + 1): row 1 ragged, 1..5 entries (root + accepted); small alphabet
        steps.append([[int(t) for t in torch.randint(1, 6, (5 if b == 0 else 1 + i % 5,), generator=g)]
                      for b in range(2)])
        roots_after.append(([int(t) for t in torch.randint(1, 6, (2,), generator=g)], [True, i % 7 != 3]))
    eager_drafter = PromptLookupDrafter(num_drafts=4, fixed_width=True)
    want, eager_state = _run_steps(eager_drafter, steps, roots_after)
    graphed, counter = _strict_graphed(PromptLookupDrafter(num_drafts=4, fixed_width=True))
    got, state = _run_steps(graphed, steps, roots_after)
    assert got == want and sum(len(p) for d, _ in got for p in d) > 40  # the drafts found matches
    assert torch.equal(state.lengths, eager_state.lengths) and state.static and not eager_state.static
    for b, n in enumerate(state.lengths.tolist()):
        assert torch.equal(state.history[b, :n], eager_state.history[b, :n])
    assert state.history is graphed.buffers  # the state's history is the buffer the graphs write
    assert graphed.counts["buffer_changes"] >= 1  # it grew (new graphs) ...
    assert counter.calls == 2 * (graphed.counts["buffer_changes"] + 1)  # ... one propose and one update graph each
    assert set(graphed.graph_keys) == {("propose", 4), ("update",)} and graphed.counts["replays"] > 60


def test_a_static_update_writes_its_history_in_place_and_needs_no_exact_length():
    drafter = PromptLookupDrafter(num_drafts=3)
    state = drafter.start(feedback([[1, 2, 3]], roots=[4]), static=True)
    history = state.history
    new = drafter.update(state, feedback([[4, 1]], roots=[2]))
    assert new.history is history and history[0, :5].tolist() == [1, 2, 3, 4, 1] and new.bound == 3 + 2
    again = drafter.start(feedback([[5, 6]], roots=[7]), static=True, buffers=history)
    assert again.history is history and again.lengths.tolist() == [2]  # an earlier run's buffer, reused
    wider = drafter.start(feedback([[5, 6], [8, 9]], roots=[7, 1]), static=True, buffers=history)
    assert wider.history is not history  # another batch size: a new buffer
    by_hand = PromptLookupState(history.clone(), torch.tensor([2]))  # no bound: read once when needed
    assert drafter.update(by_hand, feedback([[7]], roots=[0])).lengths.tolist() == [3]


def test_only_fixed_width_static_drafts_are_captured():
    narrow, _ = _strict_graphed(PromptLookupDrafter(num_drafts=4))
    state = narrow.start(feedback([[1, 2, 3, 1, 2]], roots=[3]))
    draft, state = narrow.propose(state, request([3], 4))
    assert proposals(draft) == [[1, 2, 3]] and draft.tokens.shape == (1, 3)  # its width read on the host: eager
    narrow.update(state, feedback([[3, 1]], roots=[2]))
    assert narrow.graph_keys == [("update",)] and narrow.counts["eager"] == 1


@pytest.mark.parametrize("batch", [1, 3])
def test_generate_fast_with_the_graphed_lookup_equals_the_eager_drafter(batch):
    from test_fast_path import _prompts
    from tiny_models import tiny_model

    from specdec.generate import generate

    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(batch)
    kw = dict(attention_mask=mask, max_new_tokens=40, eos_token_id=[])
    eager = generate(model, ids, drafter=PromptLookupDrafter(num_drafts=5, fixed_width=True), **kw)
    graphed, counter = _strict_graphed(PromptLookupDrafter(num_drafts=5, fixed_width=True))
    calls = []
    for fast in (True, True, False):
        out = generate(model, ids, drafter=graphed, fast=fast, **kw)
        assert torch.equal(out.sequences, eager.sequences)
        assert out.stats.num_target_forwards == eager.stats.num_target_forwards
        assert out.stats.num_accepted_per_step == eager.stats.num_accepted_per_step
        calls.append(counter.calls)
    # the first propose captured, then the steps fold (the update and next lookup in the verify step's capture);
    # a second call reuses the buffer and its graphs
    assert calls[:2] == [1, 1] and graphed.counts["folded"] > 10 and graphed.counts["buffer_changes"] == 0
    assert eager.stats.tau > 1.2  # the motifs are found


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("batch", [1, 4])
def test_cuda_graphed_lookup_on_the_fast_path_equals_the_eager_drafter(batch):
    from test_fast_path import _prompts
    from tiny_models import tiny_model

    from specdec.generate import generate
    from specdec.graphs import cuda_graphed

    model = tiny_model("llama", scale=3.0).cuda().float()
    ids, mask = _prompts(batch, "cuda")
    kw = dict(attention_mask=mask, max_new_tokens=48, eos_token_id=[])
    eager = generate(model, ids, drafter=PromptLookupDrafter(num_drafts=6, fixed_width=True), **kw)
    graphed = cuda_graphed(PromptLookupDrafter(num_drafts=6, fixed_width=True))
    captures = []
    for fast in (True, True, False):
        out = generate(model, ids, drafter=graphed, fast=fast, **kw)
        assert torch.equal(out.sequences, eager.sequences) and out.stats.tau == eager.stats.tau
        captures.append(graphed.counts["captures"])
    # a second fast call captures nothing new (the eager path's updates, of varying widths, are captured apart)
    assert captures[0] == captures[1] > 0 and graphed.counts["folded"] > 10


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_the_fast_path_folds_the_lookup_into_its_verify_step_with_the_same_drafts(device):
    """generate(fast=True): from the second step on, the history update and the next lookup run inside the verify
    step's capture (one replay a step), with the drafts, tokens and acceptance of the unfolded steps and of the
    eager drafter; a drafter that is not fixed-width never folds."""
    from test_fast_path import _prompts
    from test_parallel_graphs import _fold_against_apart
    from tiny_models import tiny_model

    target = tiny_model("llama", scale=3.0).to(device)
    # one row: a batch's rows finish at different steps, and a folded lookup drafts for a finished row too (which
    # commits nothing: test_generate_fast_with_the_graphed_lookup_equals_the_eager_drafter checks batch 3's tokens)
    ids, mask = (t.to(device) for t in _prompts(1))
    kw = dict(attention_mask=mask, max_new_tokens=32, eos_token_id=[])
    (folded, g_fold), (apart, g_apart), eager = _fold_against_apart(
        lambda: PromptLookupDrafter(num_drafts=4, fixed_width=True), target, ids, device, kw)
    steps = folded.stats.num_steps
    assert eager.stats.tau > 1.2 and g_fold.counts["folded"] >= steps - 2 and g_apart.counts["folded"] == 0
    assert g_fold.counts["replays"] < g_apart.counts["replays"] - steps  # no update graph, no propose graph
    assert not PromptLookupDrafter(num_drafts=4).folds_drafts


def test_one_graphed_lookup_serves_runs_of_changing_batch_sizes():
    """The fold's feedback templates are per batch size: a run at another batch size relearns them (a template
    of batch 3 given to a batch-1 state was refused by the drafter's batch check)."""
    from test_fast_path import _prompts
    from tiny_models import tiny_model

    from specdec.generate import generate

    model = tiny_model("llama", scale=3.0)
    graphed, _ = _strict_graphed(PromptLookupDrafter(num_drafts=4, fixed_width=True))
    for batch in (3, 1, 3, 2):
        ids, mask = _prompts(batch)
        kw = dict(attention_mask=mask, max_new_tokens=20, eos_token_id=[])
        eager = generate(model, ids, drafter=PromptLookupDrafter(num_drafts=4, fixed_width=True), **kw)
        folded = graphed.counts["folded"]
        out = generate(model, ids, drafter=graphed, fast=True, **kw)
        assert torch.equal(out.sequences, eager.sequences) and graphed.counts["folded"] > folded


# --------------------------------------------------------------------------------------------------------
# The search and the chain in one kernel (specdec.kernels.ngram_chain) against its torch reference
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("most_recent", [True, False])
def test_the_ngram_kernel_gives_its_reference_chain(most_recent):
    from specdec.kernels import interpreter_enabled, kernel_mode, ngram_chain, ngram_chain_ref, triton_available

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not triton_available() or (device == "cpu" and not interpreter_enabled()):
        pytest.skip("needs triton (and, without a GPU, TRITON_INTERPRET=1 before specdec.kernels is imported)")
    g = torch.Generator().manual_seed(7)
    found = 0
    for trial in range(24):
        batch, columns = 1 + trial % 4, (2, 9, 40, 300, 700)[trial % 5]  # several blocks of window ends too
        history = torch.randint(0, 2 + trial % 5, (batch, columns), generator=g)
        lengths = torch.randint(0, columns, (batch,), generator=g)
        lengths[0] = columns - 1  # a full row (the root in the last column)
        if trial % 6 == 5:  # no room for the root (past the last column, or negative): that row proposes nothing
            lengths[-1] = columns + trial % 2 if batch > 1 else lengths[-1]
            lengths[0] = -1 if batch > 2 else lengths[0]
        roots = torch.randint(0, 2 + trial % 5, (batch,), generator=g)
        k, top = trial % 7, 1 + trial % 4
        active = None if trial % 3 else torch.rand(batch, generator=g) > 0.3
        args = [t.to(device) if isinstance(t, torch.Tensor) else t
                for t in (history, lengths, roots, k, top, 1 + (trial // 4) % top)]
        kw = dict(most_recent=most_recent, active=None if active is None else active.to(device))
        want = ngram_chain_ref(*args, **kw)
        with kernel_mode("triton"):
            got = ngram_chain(*args, **kw)
        for name, a, b in zip(want._fields, got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (trial, name, a, b)
        found += int((want.counts > 0).sum())
    assert found > 20  # the trials found continuations, not only empty chains
    assert ngram_chain(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                       torch.ones(2, dtype=torch.long), 3, 2).counts.tolist() == [0, 0]  # no column at all
    with pytest.raises(ValueError, match="min_ngram_size <= max_ngram_size"):
        ngram_chain(history, lengths, roots, 2, 1, 2)
    with pytest.raises(ValueError, match=r"active must be \[B\]"):
        ngram_chain(history, lengths, roots, 2, 2, active=torch.ones(batch + 1, dtype=torch.bool))


def test_the_fast_path_graphs_a_fixed_width_copy_of_a_narrow_lookup():
    """generate(fast=True) given the default (narrow) lookup graphs its fixed-width copy (for_fast_path): the same
    tokens and forwards as the eager narrow drafter, one wrapper kept across calls."""
    from test_fast_path import _prompts
    from tiny_models import tiny_model

    from specdec.generate import generate
    from specdec.static import fast_drafter

    narrow = PromptLookupDrafter(num_drafts=5)
    wrapper = fast_drafter(narrow)
    assert wrapper.drafter.fixed_width and wrapper.drafter.num_drafts == 5 and fast_drafter(narrow) is wrapper
    assert narrow.for_fast_path() == PromptLookupDrafter(num_drafts=5, fixed_width=True)
    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(3)
    kw = dict(attention_mask=mask, max_new_tokens=24, eos_token_id=[])
    eager, fast = (generate(model, ids, drafter=narrow, fast=f, **kw) for f in (False, True))
    assert torch.equal(eager.sequences, fast.sequences) and eager.stats.tau > 1.2
    assert eager.stats.num_target_forwards == fast.stats.num_target_forwards


def test_a_history_that_grows_during_a_folded_run_keeps_the_eager_tokens(monkeypatch):
    """The static history outgrows its buffer in the middle of a fast run: the fold is dropped with the old buffer
    (new graphs on the new one, relearnt) and the tokens stay the eager drafter's."""
    from test_fast_path import _prompts
    from tiny_models import tiny_model

    import specdec.drafters.prompt_lookup as pl
    from specdec.generate import generate

    monkeypatch.setattr(pl, "_STATIC_SLACK", 0)
    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(2)
    kw = dict(attention_mask=mask, max_new_tokens=150, eos_token_id=[])
    eager = generate(model, ids, drafter=PromptLookupDrafter(num_drafts=4, fixed_width=True), **kw)
    graphed, _ = _strict_graphed(PromptLookupDrafter(num_drafts=4, fixed_width=True))
    out = generate(model, ids, drafter=graphed, fast=True, **kw)
    assert torch.equal(out.sequences, eager.sequences)
    assert graphed.counts["buffer_changes"] >= 1 and graphed.counts["folded"] > 10
