"""EAGLE drafting (specdec/trees/dynamic.py, specdec/trees/static.py, specdec/drafters/eagle.py)."""
from __future__ import annotations

import math

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from specdec.drafters import EagleDrafter
from specdec.drafters.base import Drafter, Feedback, ProposeRequest
from specdec.heads import Eagle1Head, Eagle3Head
from specdec.recipes import eagle1, eagle2, eagle3
from specdec.sampling import TorchSource
from specdec.trees import (
    EAGLE_MC_SIM_7B_63,
    DynamicTree,
    SampledTree,
    StaticTree,
    grow_dynamic_tree,
    grow_dynamic_tree_ref,
)
from specdec.types import DraftScheme, SamplingParams

torch.set_num_threads(1)


# --------------------------------------------------------------------------------------------------------
# Dynamic tree with a mocked head
# --------------------------------------------------------------------------------------------------------


def _random_expand(V, seed=0, calls=None):
    table = torch.randn(VOCAB, V, generator=torch.Generator().manual_seed(seed)) * 2

    def expand(tokens, parent_hidden, visible, level):
        if calls is not None:
            calls.append((tokens.clone(), visible.clone(), level))
        # children depend on the token and (through the hidden state) on the whole path
        logits = table[tokens % VOCAB] + parent_hidden[..., :1] * 0.5
        return logits, parent_hidden + tokens[..., None].float() * 0.01

    return expand


def _check_tree(draft):
    parents, depths = draft.parents, draft.depths
    B, N1 = parents.shape
    assert (parents[:, 0] == -1).all() and (depths[:, 0] == 0).all()
    idx = torch.arange(1, N1)
    assert ((parents[:, 1:] >= 0) & (parents[:, 1:] < idx)).all()  # present, parents precede children
    assert torch.equal(depths[:, 1:], depths.gather(1, parents[:, 1:]) + 1)
    assert (depths[:, 1:].diff(dim=1) >= 0).all()  # breadth-first
    for b in range(B):  # siblings are distinct tokens
        pairs = set()
        for i in range(1, N1):
            key = (int(parents[b, i]), int(draft.tokens[b, i - 1]))
            assert key not in pairs
            pairs.add(key)


@pytest.mark.parametrize("depth,top_k,total", [(1, 3, 10), (3, 4, 20), (5, 3, 60), (4, 5, 200)])
def test_dynamic_tree_is_ancestor_closed_and_matches_reference(depth, top_k, total):
    V, B, H = 30, 3, 4
    g = torch.Generator().manual_seed(depth * 7 + top_k)
    root_logits, root_hidden = torch.randn(B, V, generator=g) * 2, torch.randn(B, H, generator=g)
    draft = grow_dynamic_tree(root_logits, root_hidden, _random_expand(V), depth=depth, top_k=top_k,
                              total_tokens=total)
    ref = grow_dynamic_tree_ref(root_logits, root_hidden, _random_expand(V), depth=depth, top_k=top_k,
                                total_tokens=total)
    _check_tree(draft)
    assert draft.scheme is DraftScheme.DETERMINISTIC and draft.draft_probs is None
    assert draft.num_nodes == min(total - 1, top_k + (depth - 1) * top_k ** 2)
    for a, b in zip(draft[:3], ref[:3]):
        assert torch.equal(a, b)


def test_dynamic_tree_stays_ancestor_closed_under_ties():
    B, V = 2, 12
    flat = lambda tokens, h, vis, lvl: (torch.zeros(*tokens.shape, V), h)  # every score ties
    draft = grow_dynamic_tree(torch.zeros(B, V), torch.zeros(B, 2), flat, depth=4, top_k=3, total_tokens=25)
    _check_tree(draft)
    def certain(tokens, h, vis, lvl):
        return torch.full((*tokens.shape, V), -1e4).index_fill(-1, torch.tensor([0]), 0.0), h

    root = torch.full((B, V), -1e4)
    root[:, 0] = 0.0  # log-prob 0 at every level: a child's score equals its parent's
    _check_tree(grow_dynamic_tree(root, torch.zeros(B, 2), certain, depth=4, top_k=2, total_tokens=7))


def test_dynamic_tree_exact_expected_tree_for_a_mocked_head():
    """Hand-computed EAGLE-2 tree (cf. vLLM's test_propose_tree): V = 4, top_k = 2, depth = 3."""
    child = torch.tensor([[0.05, 0.15, 0.70, 0.10],   # children of token 0
                          [0.90, 0.04, 0.03, 0.03],   # children of token 1
                          [0.25, 0.50, 0.10, 0.15],   # children of token 2
                          [0.25, 0.25, 0.25, 0.25]]).log()
    calls = []

    def expand(tokens, parent_hidden, visible, level):
        calls.append((tokens.clone(), visible.clone(), level))
        return child[tokens], parent_hidden

    root = torch.tensor([[0.6, 0.3, 0.06, 0.04]]).log()
    # candidates (score): c0 tok0 .6 | c1 tok1 .3 | c2 tok2 .42, c3 tok1 .09 (under c0) | c4 tok0 .27,
    # c5 tok1 .012 (under c1) | frontier {c2, c4} | c6 tok1 .21, c7 tok0 .105 (under c2) | c8 tok2 .189,
    # c9 tok1 .0405 (under c4)
    d = grow_dynamic_tree(root, torch.zeros(1, 1), expand, depth=3, top_k=2, total_tokens=6)
    assert d.tokens.tolist() == [[0, 1, 2, 0, 1]]          # c0, c1, c2, c4, c6
    assert d.parents.tolist() == [[-1, 0, 0, 1, 2, 3]]
    assert d.depths.tolist() == [[0, 1, 1, 2, 2, 3]]
    assert [lvl for _, _, lvl in calls] == [1, 2]
    assert calls[0][0].tolist() == [[0, 1]] and calls[1][0].tolist() == [[2, 0]]
    # level-2 frontier (scratch slots 2, 3) sees its level-1 parent (slot 0 resp. 1) and itself
    assert calls[1][1].tolist() == [[[True, False, True, False], [False, True, False, True]]]
    d = grow_dynamic_tree(root, torch.zeros(1, 1), expand, depth=3, top_k=2, total_tokens=8)
    assert d.tokens.tolist() == [[0, 1, 2, 0, 1, 0, 2]]    # + c7 (.105) and c8 (.189)
    assert d.parents.tolist() == [[-1, 0, 0, 1, 2, 3, 3, 4]]
    assert d.depths.tolist() == [[0, 1, 1, 2, 2, 3, 3, 3]]


# --------------------------------------------------------------------------------------------------------
# The drafter on a tiny HF Llama target, ragged rows, several steps
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=4, scale=4.0)


def _features(target, rows, layers):
    """Target features of each row's full sequence (left padded), as generate()'s adapter would give."""
    B, T = len(rows), max(len(r) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, T - len(r):] = torch.tensor(r)
        valid[b, T - len(r):] = True
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        out = target(input_ids=ids, attention_mask=valid.long(), position_ids=pos, output_hidden_states=True)
    return ids, valid, pos, tuple(out.hidden_states[i] for i in layers), out.logits


def _start_feedback(target, rows, roots, layers):
    ids, valid, pos, feats, _ = _features(target, rows, layers)
    nxt = torch.cat([ids[:, 1:], torch.tensor(roots)[:, None]], 1)
    return Feedback(ids, nxt, pos, valid, feats, torch.tensor(roots))


def _request(lengths, roots, k, sampling=SamplingParams(), seed=0):
    return ProposeRequest(roots=torch.tensor(roots), root_positions=lengths, num_drafts=k, sampling=sampling,
                          source=TorchSource(torch.Generator().manual_seed(seed)),
                          active=torch.ones(len(roots), dtype=torch.bool))


def _heads(target):
    return {"eagle1": Eagle1Head.from_target(target).float(),
            "eagle3": Eagle3Head.from_target(target, feature_layers=(1, 2, 4)).float()}


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
@pytest.mark.parametrize("policy", ["dynamic", "static"])
def test_drafter_valid_drafts_over_steps_with_ragged_rows(target, kind, policy):
    head = _heads(target)[kind]
    tree = DynamicTree(total_tokens=16, depth=4, top_k=3) if policy == "dynamic" else StaticTree(EAGLE_MC_SIM_7B_63)
    drafter = EagleDrafter(head, tree)
    assert isinstance(drafter, Drafter)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 9, 2)]
    roots = [int(x) for x in torch.randint(1, VOCAB, (3,), generator=g)]
    state = drafter.start(_start_feedback(target, rows, roots, drafter.feature_layers))
    for step in range(4):
        k = [4, 2, 3, 4][step]
        lengths = torch.tensor([len(r) for r in rows])
        assert torch.equal(state.lengths, lengths)
        draft, state = drafter.propose(state, _request(lengths, roots, k))
        _check_tree(draft)
        assert draft.max_depth <= k and ((draft.tokens >= 0) & (draft.tokens < VOCAB)).all()
        # the drafter's state after incremental updates equals a fresh start on the whole committed sequence
        fresh = drafter.start(_start_feedback(target, rows, roots, drafter.feature_layers))
        torch.testing.assert_close(fresh.last_hidden, state.last_hidden, rtol=1e-4, atol=1e-4)
        fresh_draft, _ = drafter.propose(fresh, _request(lengths, roots, k))
        assert torch.equal(fresh_draft.tokens, draft.tokens) and torch.equal(fresh_draft.parents, draft.parents)
        # fake verification: each row accepts a random root-to-node path, then the target's next token
        committed = []
        for b in range(3):
            path, node = [], 0
            while True:
                kids = (draft.parents[b] == node).nonzero()[:, 0].tolist()
                if not kids or torch.rand(1, generator=g).item() < 0.3:
                    break
                node = kids[int(torch.randint(len(kids), (1,), generator=g))]
                path.append(int(draft.tokens[b, node - 1]))
            committed.append([roots[b]] + path)
        width = max(len(c) for c in committed)
        new_rows = [r + c for r, c in zip(rows, committed)]
        _, _, _, feats, logits = _features(target, new_rows, drafter.feature_layers)
        T = feats[0].shape[1]
        new_roots = [int(logits[b, -1].argmax()) for b in range(3)]
        tokens = torch.zeros(3, width, dtype=torch.long)
        nxt = torch.zeros(3, width, dtype=torch.long)
        valid = torch.zeros(3, width, dtype=torch.bool)
        fb_feats = [torch.zeros(3, width, f.shape[-1]) for f in feats]
        for b, c in enumerate(committed):
            tokens[b, :len(c)] = torch.tensor(c)
            nxt[b, :len(c)] = torch.tensor(c[1:] + [new_roots[b]])
            valid[b, :len(c)] = True
            for f, ff in zip(fb_feats, feats):
                f[b, :len(c)] = ff[b, T - len(c):]
        pos = torch.tensor([len(r) for r in rows])[:, None] + torch.arange(width)
        state = drafter.update(state, Feedback(tokens, nxt, pos, valid, tuple(fb_feats), torch.tensor(new_roots)))
        rows, roots = new_rows, new_roots
    assert state.num_forwards > 4


@pytest.mark.parametrize("kind", ["eagle1", "eagle3_reduced"])
def test_greedy_chain_equals_the_training_unroll(target, kind):
    """Inference reads what training taught: the drafter's greedy chain equals the argmax of ``ttt_forward``
    unrolled over the same tokens (step i at the root's predecessor predicts draft level i + 1)."""
    from specdec.training import ttt_forward

    heads = _heads(target)
    if kind == "eagle3_reduced":
        d2t = torch.tensor([0, 1, 3, 3, 5, 7, 8, 8, 10, 12])  # 10 draft ids -> target ids i + d2t[i]
        d2t = torch.cat([d2t, torch.full((30,), 20)])
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[torch.arange(40) + d2t] = True
        head = Eagle3Head.from_target(target, feature_layers=(1, 2, 4), draft_vocab=(d2t, t2d)).float()
    else:
        head = heads[kind]
    with torch.no_grad():  # sharp attention, so that a wrong position or mask changes the drafts
        head.fc.weight.mul_(20.0)
        for layer in head.layers:
            layer.self_attn.q_proj.weight.mul_(30.0)
            layer.self_attn.k_proj.weight.mul_(30.0)
            layer.self_attn.o_proj.weight.mul_(30.0)
    depth, L = 4, 9
    drafter = EagleDrafter(head, DynamicTree(total_tokens=depth + 1, depth=depth, top_k=1))
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        seq = torch.randint(0, VOCAB, (1, L + 1), generator=g)  # prompt x_0..x_{L-1} and root x_L
        _, _, _, feats, _ = _features(target, [seq[0].tolist()], head.feature_layers)
        fb = Feedback(seq[:, :L], seq[:, 1:], torch.arange(L)[None], torch.ones(1, L, dtype=torch.bool),
                      tuple(f[:, :L] for f in feats), seq[:, L])
        draft, _ = drafter.propose(drafter.start(fb), _request(torch.tensor([L]), [int(seq[0, L])], depth))
        assert draft.parents[0].tolist() == list(range(-1, depth))  # top_k = 1: a chain
        tokens = torch.cat([seq, draft.tokens], 1)
        with torch.no_grad():
            hidden = head.features_to_hidden(tuple(f[:, :L] for f in feats))
            # indices >= L (no target feature at inference) are padding: index L - 1 never sees them
            hidden = torch.cat([hidden, hidden.new_zeros(1, depth - 1, hidden.shape[-1])], 1)
            outs = ttt_forward(head, tokens[:, : L + depth], hidden, depth)
        unrolled = [int(head.draft_to_target(head.logits(o[:, L - 1]).argmax(-1))) for o in outs]
        assert draft.tokens[0].tolist() == unrolled


def test_static_chain_equals_dynamic_tree_with_top_k_one(target):
    head = _heads(target)["eagle3"]
    rows, roots = [[3, 4, 5, 6], [7, 8]], [9, 10]
    outs = []
    for tree in ([(0,), (0, 0), (0, 0, 0)], DynamicTree(total_tokens=4, depth=3, top_k=1)):
        drafter = EagleDrafter(head, tree)
        state = drafter.start(_start_feedback(target, rows, roots, drafter.feature_layers))
        draft, _ = drafter.propose(state, _request(state.lengths, roots, 3))
        outs.append(draft)
    assert torch.equal(outs[0].tokens, outs[1].tokens) and torch.equal(outs[0].parents, outs[1].parents)


def test_static_tree_level_one_is_the_heads_top_ranks(target):
    head = _heads(target)["eagle1"]
    drafter = eagle1(head)
    rows, roots = [[3, 4, 5, 6], [7, 8]], [9, 10]
    state = drafter.start(_start_feedback(target, rows, roots, drafter.feature_layers))
    draft, _ = drafter.propose(state, _request(state.lengths, roots, 5))
    top4 = head.logits(state.last_hidden).topk(4).indices
    assert torch.equal(draft.tokens[:, :4], top4)  # mc_sim_7b_63 level 1 = ranks 0..3
    pruned, _ = drafter.propose(state, _request(state.lengths, roots, 2))
    assert pruned.max_depth == 2 and pruned.num_nodes == 12


def test_sampled_tree_draws_distinct_children_with_their_distribution(target):
    head = _heads(target)["eagle3"]
    drafter = EagleDrafter(head, SampledTree([(0,), (1,), (2,), (0, 0), (0, 1)]))
    rows, roots = [[3, 4, 5, 6], [7, 8]], [9, 10]
    state = drafter.start(_start_feedback(target, rows, roots, drafter.feature_layers))
    params = SamplingParams(temperature=0.8, top_k=20)
    draft, _ = drafter.propose(state, _request(state.lengths, roots, 2, params, seed=1))
    again, _ = drafter.propose(state, _request(state.lengths, roots, 2, params, seed=1))
    assert draft.scheme is DraftScheme.WITHOUT_REPLACEMENT and torch.equal(draft.tokens, again.tokens)
    probs = draft.draft_probs
    assert probs.shape == (2, 5, VOCAB)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 5))
    assert (probs.gather(-1, draft.tokens[..., None])[..., 0] > 0).all()
    assert torch.equal(probs[:, 0], probs[:, 1]) and torch.equal(probs[:, 3], probs[:, 4])  # siblings share q
    _check_tree(draft)
    greedy, _ = drafter.propose(state, _request(state.lengths, roots, 2))
    assert greedy.scheme is DraftScheme.DETERMINISTIC


class _RecordingHead:
    """Forwards to an EAGLE head and records the attention mask of every call."""

    def __init__(self, head):
        self.head, self.masks = head, []

    def __getattr__(self, name):
        return getattr(self.head, name)

    def __call__(self, tokens, hidden, positions, mask, cache, slots, **kwargs):
        self.masks.append(mask.clone())
        return self.head(tokens, hidden, positions, mask, cache, slots, **kwargs)


@pytest.mark.parametrize("policy", ["dynamic", "static"])
def test_drafters_tree_masks_equal_the_former_construction(target, policy):
    """The drafting mask now comes from specdec.kernels.head_tree_mask; it equals, bit for bit, what the drafter
    built before (cat of the committed prefix, the policy's ancestor sets, zeros), and with the Triton kernel forced
    (interpreted on CPU) the drafts are identical."""
    from specdec.kernels import interpreter_enabled, kernel_mode, triton_available

    head = _heads(target)["eagle1"]
    tree = DynamicTree(total_tokens=16, depth=4, top_k=3) if policy == "dynamic" else StaticTree(EAGLE_MC_SIM_7B_63)
    drafter = EagleDrafter(head, tree)
    rows, roots = [[3, 4, 5, 6, 7], [7, 8], [1, 2, 3]], [9, 10, 11]
    state = drafter.start(_start_feedback(target, rows, roots, drafter.feature_layers))
    recorder = drafter.head = _RecordingHead(head)
    visibles = []

    class RecordingPolicy:  # forwards to the policy and records the ancestor sets it hands to expand
        def __getattr__(self, name):
            return getattr(tree, name)

        def grow(self, root_logits, root_hidden, expand, **kwargs):
            def expand_and_record(tokens, parent_hidden, visible, level):
                visibles.append(visible.clone())
                return expand(tokens, parent_hidden, visible, level)
            return tree.grow(root_logits, root_hidden, expand_and_record, **kwargs)

    drafter.policy = RecordingPolicy()
    draft, _ = drafter.propose(state, _request(state.lengths, roots, 4))
    assert len(recorder.masks) == len(visibles) == 3  # one mask per expanded level
    C = state.cache.capacity
    S0 = drafter._scratch_start(state.cache)
    committed = torch.arange(S0) < state.lengths[:, None]
    for mask, visible in zip(recorder.masks, visibles):
        B, F, S = visible.shape
        before = torch.cat([committed[:, None].expand(B, F, S0), visible, visible.new_zeros(B, F, C - S0 - S)],
                           dim=-1)[:, None]
        assert mask.dtype == torch.bool and torch.equal(mask, before)
    if triton_available() and interpreter_enabled():
        with kernel_mode("triton"):
            again, _ = drafter.propose(state, _request(state.lengths, roots, 4))
        for a, b in zip(draft[:3], again[:3]):
            assert torch.equal(a, b)


def test_the_levels_rope_made_once_per_step_equals_the_heads_own(target):
    """The drafter hands each level's RoPE rows (made for every level at once) to the head: the same tables the head
    makes from the positions, so the head's outputs are unchanged."""
    head = _heads(target)["eagle1"]
    g = torch.Generator().manual_seed(3)
    B, F, C = 2, 3, 16
    tokens = torch.randint(0, VOCAB, (B, F), generator=g)
    hidden = torch.randn(B, F, head.config.hidden_size, generator=g)
    root = torch.tensor([4, 7])
    cos_all, sin_all = head.rotary(root[:, None] + torch.arange(3), head.dtype)
    positions = (root + 2)[:, None].expand(B, F)  # level 3
    mask = torch.ones(B, 1, F, C, dtype=torch.bool)
    slots = torch.arange(F)[None].expand(B, F) + 10
    outs = []
    for rope in (None, tuple(t[:, :, 2:3].expand(B, 1, F, t.shape[-1]) for t in (cos_all, sin_all))):
        cache = head.new_cache(B, C)
        with torch.no_grad():
            outs.append((head(tokens, hidden, positions, mask, cache, slots, rope=rope), cache.keys.clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_drafters_rope_table_equals_the_heads_rotary_and_is_made_once_per_capacity(target, dtype):
    """The drafter reads every RoPE row from one table per cache capacity (made on the host, kept while the drafter
    lives): bit for bit the head's own ``rotary`` at those positions; padded entries' stale positions are clamped into
    the table (never an index past it); a propose and an update compute no cosine or sine."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from specdec.drafters.eagle import _rope_rows

    head = _heads(target)["eagle1"].to(dtype)
    drafter = eagle2(head, total_tokens=12, depth=3, top_k=3, cuda_graphs=False)
    cache = head.new_cache(2, 40)
    tables = drafter._tables_for(cache)
    assert drafter._tables_for(cache) is tables and drafter._tables_for(head.new_cache(2, 40)) is tables
    assert drafter._tables_for(head.new_cache(2, 48)) is not tables
    positions = torch.tensor([[0, 5, 39], [17, 38, 2]])
    cos, sin = _rope_rows(tables.rope, positions)
    want_cos, want_sin = head.rotary(positions, dtype)
    assert cos.dtype == dtype and torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    far = _rope_rows(tables.rope, torch.tensor([[-3, 40, 1000]]))
    assert torch.equal(far[0][0, 0], tables.rope[[0, 39, 39], 0])
    assert torch.equal(tables.scratch, torch.arange(drafter._scratch_start(cache), 39))

    class Trig(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.cos, torch.ops.aten.sin):
                Trig.calls += 1
            return func(*args, **(kwargs or {}))

    roots = [3, 4]
    state = drafter.start(_start_feedback(target, [[5, 6, 7, 8], [9, 10, 11, 12]], roots, head.feature_layers))
    drafter._tables_for(state.cache)  # the capacity's table (the first step makes it)
    with Trig():
        draft, state = drafter.propose(state, _request(state.lengths, roots, 3))
    assert Trig.calls == 0 and draft.tokens.shape == (2, 11)


def test_drafter_refuses_a_non_eagle_head():
    with pytest.raises(TypeError, match="load_eagle_head"):
        EagleDrafter(torch.nn.Linear(2, 2))


# --------------------------------------------------------------------------------------------------------
# End to end: float32 greedy generate() with EAGLE drafters equals plain greedy decoding
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(target):
    from specdec.generate import generate
    from specdec.training import train_eagle1, train_eagle3

    prompts = torch.randint(1, VOCAB, (16, 3), generator=torch.Generator().manual_seed(5))
    data = generate(target, prompts, max_new_tokens=40).sequences  # the target's own continuations
    e1 = train_eagle1(target, data, steps=60, batch_size=8, seq_len=24, lr=3e-3, progress=False).head
    e3 = train_eagle3(target, data, steps=60, batch_size=8, seq_len=24, lr=3e-3, ttt_steps=3, draft_vocab_size=80,
                      feature_layers=(1, 2, 4), progress=False).head
    return {"eagle1": e1, "eagle3": e3}


@pytest.mark.parametrize("recipe", ["eagle1_static", "eagle2_dynamic", "eagle3_dynamic"])
@pytest.mark.parametrize("batch", [1, 3])
def test_generate_greedy_is_token_identical_to_plain_greedy(target, trained, recipe, batch):
    from specdec.generate import generate

    drafter = {"eagle1_static": lambda: eagle1(trained["eagle1"]),
               "eagle2_dynamic": lambda: eagle2(trained["eagle1"], total_tokens=20, depth=4, top_k=4),
               "eagle3_dynamic": lambda: eagle3(trained["eagle3"], total_tokens=20, depth=5, top_k=4)}[recipe]()
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, 6), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :2] = 0  # left padding, ragged rows
        mask[2, :4] = 0
    plain = generate(target, ids, attention_mask=mask, max_new_tokens=20)
    spec = generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=20)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.tau > 1.0 and spec.stats.num_target_forwards < plain.stats.num_target_forwards
    assert not math.isnan(spec.stats.tau)


def test_the_cache_bound_is_retightened_without_a_host_sync():
    """Every resync_every updates the drafter copies the lengths to the host (non-blocking) and lowers its bound once
    the copy has arrived (at once on CPU): the bound stays an upper bound and never drifts by more than a few
    updates' widths. On the fast path's late steps every update is K + 1 wide, so without it the bound would run
    ahead by about K per step."""
    from specdec.static import StaticAdapter, capacity_for
    from specdec.step import prefill, step

    model = tiny_model("llama", scale=3.0)
    drafter = EagleDrafter(Eagle1Head.from_target(model), DynamicTree(8, 3, 2), resync_every=2)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    adapter = StaticAdapter(model, drafter.feature_layers, capacity=capacity_for(9, 60, 64))
    out = prefill(adapter, ids, drafter=drafter)
    marks = 0
    for _ in range(12):
        out = step(adapter, out.state, drafter=drafter, num_drafts=3, sync=False)
        out.emitted.wait()
        state = out.state.drafter_state
        true = int(state.lengths.max())
        marks += state.mark is not None
        assert true <= state.bound <= true + 3 * (3 + 1)  # at most ~resync_every + 1 updates of width K + 1 ahead
    assert marks > 0


def test_a_loose_bound_reads_the_true_lengths_before_growing_the_cache():
    """The host bound of the rows' lengths only grows between re-tightenings (each update adds its full width); on
    a GPU the copy that re-tightens it may lag. Before growing the cache (new graphs for a graphed drafter), the
    drafter reads the true lengths (one sync) and keeps its cache when they fit (session 11)."""
    from specdec.drafters.eagle import EagleState

    model = tiny_model("llama")
    head = Eagle1Head.from_target(model)
    drafter = eagle2(head, total_tokens=10, depth=3, top_k=3)
    drafter = getattr(drafter, "drafter", drafter)  # the EagleDrafter inside a graphed recipe
    scratch = drafter._scratch
    cache = head.new_cache(2, 64 + scratch, "cpu")
    hidden = torch.zeros(2, head.config.hidden_size)
    state = EagleState(cache, torch.tensor([20, 30]), 70, hidden, 0, 0, None)
    kept = drafter._ensure_capacity(state, 4)
    assert kept.cache is cache and kept.bound == 30
    grown = drafter._ensure_capacity(state._replace(lengths=torch.tensor([20, 62])), 4)
    assert grown.cache is not cache and grown.cache.capacity >= 62 + 4 + scratch + 1
