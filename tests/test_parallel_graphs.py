"""CUDA graphs around the parallel drafters (specdec/drafters/parallel.py with the P-EAGLE, DFlash / DSpark and
Medusa heads). On CPU, through the reference capture ``capture_graph_ref``, which runs each captured step eagerly
on static input copies exactly as a replay would (the function of the *first* capture of a key, fed new inputs),
here made strict: after the warm-up, reading a tensor's value on the host (a sync, an error under capture) raises;
its drafts equal the plain eager drafter's over ragged steps, a plain (K = 0) step and K changes; generate() through
it is greedy-identical to plain decoding; each (key, shapes) is captured once. On CUDA (skipped without one) the
real graphs give the same drafts as their eager reference over a generate() run.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from tiny_models import VOCAB, tiny_model

import specdec as sd
from specdec import recipes
from specdec.drafters import Feedback, ProposeRequest
from specdec.drafters.parallel import ParallelDrafter
from specdec.gating import ConfidenceGate
from specdec.graphs import CapturedStep, GraphedDrafter, capture_graph, capture_graph_ref
from specdec.heads import DFlashHead, DSparkHead, MedusaHead, PEagleHead
from specdec.types import SamplingParams

torch.set_num_threads(1)

TREE = [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)]
METHODS = ["peagle", "dflash", "dspark", "medusa"]


def _perturbed(head, seed: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device) * scale)
    return head.eval()


def _drafter(method: str, target) -> ParallelDrafter:
    """An eager drafter of each kind, built by its recipe (``cuda_graphs=False``) on a fresh, perturbed head."""
    if method == "peagle":
        head = _perturbed(PEagleHead.from_target(target, max_drafts=4, feature_layers=(0, 1, 2)), 3, 0.2)
        return recipes.peagle(head, TREE, cuda_graphs=False)
    if method == "dflash":
        return recipes.dflash(DFlashHead.from_target(target, block_size=5, seed=4).eval(), TREE, cuda_graphs=False)
    if method == "dspark":  # the gate on: every row cut to its confidence (trim=False: static shapes)
        head = _perturbed(DSparkHead.from_target(target, block_size=4, seed=5), 8, 0.1)
        return recipes.dspark(head, None, gate=ConfidenceGate(threshold=0.3), cuda_graphs=False)
    head = _perturbed(MedusaHead.from_target(target, num_heads=4), 6, 0.05)
    return recipes.medusa(head, TREE, cuda_graphs=False)


class _Counting:
    """A capture function that counts its calls (one per captured graph)."""

    def __init__(self, capture):
        self.capture, self.calls = capture, 0

    def __call__(self, fn, inputs):
        self.calls += 1
        return self.capture(fn, inputs)


@contextlib.contextmanager
def _no_host_sync():
    """Reading a tensor's value on the host (a host-device sync on CUDA, an error under capture) raises."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("a captured step read a tensor's value on the host (a host sync)")

    names = ("item", "tolist", "__bool__", "__int__", "__float__")
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def capture_strict(fn, inputs):
    """:func:`capture_graph_ref`, whose runs after the warm-up (a capture, then replays on CUDA) refuse host syncs."""
    def guarded(*args):
        with _no_host_sync():
            return fn(*args)

    captured = capture_graph_ref(fn, inputs)
    return CapturedStep(captured.inputs, lambda: guarded(*captured.inputs))


def _on_cpu(drafter, prefetch: bool = True) -> tuple[GraphedDrafter, _Counting]:
    """The drafter graphed on CPU through the strict reference capture, by default drafting ahead in its updates
    (prefetch: the steps below check those drafts against the eager drafter's too)."""
    counter = _Counting(capture_strict)
    return GraphedDrafter(drafter, capture=counter, device_types=("cpu",), prefetch=prefetch), counter


def test_the_strict_reference_capture_refuses_host_syncs():
    for sync in (lambda x: x * int(x.sum()), lambda x: x if bool(x.sum() > 0) else -x, lambda x: x[: x.sum().item()]):
        step = capture_strict(sync, (torch.ones(2, dtype=torch.long),))  # the warm-up may sync, as on CUDA
        with pytest.raises(AssertionError, match="host sync"):
            step(torch.ones(2, dtype=torch.long))
    assert capture_strict(lambda x: x * 2, (torch.ones(2),))(torch.arange(2.0)).tolist() == [0.0, 2.0]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, scale=4.0)


# --------------------------------------------------------------------------------------------------------
# Step by step: the captured steps against the eager drafter
# --------------------------------------------------------------------------------------------------------


class _Rows:
    """Feedback and requests of a made-up decoding run: per row, the committed length and the entries of a step."""

    def __init__(self, target, layers, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.hidden = target.config.hidden_size
        self.layers = layers

    def _features(self, B, M):
        return tuple(torch.randn(B, M, self.hidden, generator=self.g) for _ in self.layers)

    def prompt(self, pads: list[int], M: int) -> Feedback:
        B = len(pads)
        valid = torch.arange(M)[None] >= torch.tensor(pads)[:, None]                 # left padding
        tokens = torch.randint(1, VOCAB, (B, M), generator=self.g)
        self.lengths = valid.sum(1)
        self.roots = torch.randint(1, VOCAB, (B,), generator=self.g)
        return Feedback(tokens=tokens, next_tokens=torch.cat([tokens[:, 1:], self.roots[:, None]], 1),
                        positions=(valid.long().cumsum(1) - 1).clamp(min=0), valid=valid,
                        features=self._features(B, M), roots=self.roots)

    def request(self, k: int) -> ProposeRequest:
        B = self.lengths.shape[0]
        return ProposeRequest(roots=self.roots, root_positions=self.lengths, num_drafts=k, sampling=SamplingParams(),
                              source=None, active=torch.ones(B, dtype=torch.bool))

    def step(self, counts: list[int], M: int) -> Feedback:
        """``counts[b]`` entries committed by row ``b`` (0: a finished row), left-aligned in ``M`` columns."""
        B = len(counts)
        counts = torch.tensor(counts)
        valid = torch.arange(M)[None] < counts[:, None]
        tokens = torch.cat([self.roots[:, None], torch.randint(1, VOCAB, (B, M - 1), generator=self.g)], 1)
        new_roots = torch.randint(1, VOCAB, (B,), generator=self.g)
        next_tokens = torch.cat([tokens[:, 1:], new_roots[:, None]], 1)
        positions = self.lengths[:, None] + torch.arange(M)
        self.roots = torch.where(counts > 0, new_roots, self.roots)
        self.lengths = self.lengths + counts
        return Feedback(tokens=tokens, next_tokens=next_tokens, positions=positions, valid=valid,
                        features=self._features(B, M), roots=self.roots)


# ("propose", K) or ("update", per-row counts, width); the third row finishes after the prompt; K changes; a plain
# step (an update with no propose before it); each key recurs, so later steps replay a capture on new inputs
SCRIPT = [("propose", 4), ("update", [3, 1, 0], 5), ("propose", 4), ("update", [5, 2, 0], 5), ("propose", 2),
          ("update", [2, 3, 0], 3), ("update", [1, 1, 0], 1), ("propose", 4), ("update", [1, 4, 0], 5),
          ("propose", 4), ("update", [4, 2, 0], 5), ("propose", 4)]


@pytest.mark.parametrize("method", METHODS)
def test_captured_steps_equal_the_eager_drafter(target, method):
    eager = _drafter(method, target)
    graphed, counter = _on_cpu(_drafter(method, target))  # same seeds: an identical head
    rows = {name: _Rows(target, eager.feature_layers, seed=7) for name in ("eager", "graphed")}
    states = {"eager": eager.start(rows["eager"].prompt([0, 2, 3], 7)),
              "graphed": graphed.start(rows["graphed"].prompt([0, 2, 3], 7))}
    drafts = []
    for op, *args in SCRIPT:
        out = {}
        for name, drafter in (("eager", eager), ("graphed", graphed)):
            if op == "propose":
                out[name], states[name] = drafter.propose(states[name], rows[name].request(args[0]))
            else:
                states[name] = drafter.update(states[name], rows[name].step(*args))
        if op == "propose":
            a, b = out["eager"], out["graphed"]
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
            assert torch.equal(a.depths, b.depths) and a.scheme is b.scheme
            drafts.append(a)
    assert states["eager"].num_forwards == states["graphed"].num_forwards == len(drafts)
    keys = graphed.graph_keys
    assert any(k[0] == "propose" for k in keys) and any(k[0] != "propose" for k in keys)
    # one capture per key and shapes (and per graph reading stable inputs in place), none dropped and redone
    assert counter.calls == len(keys) + len(graphed.in_place_keys)
    proposes = [k for k in keys if k[0] == "propose"]
    assert 0 < len(proposes) < sum(op == "propose" for op, *_ in SCRIPT)  # later proposes replayed a capture
    if method == "dspark":  # the gate cut rows to different depths inside the captured step
        assert any(len(set(d.depths.amax(1).tolist())) > 1 for d in drafts)
    # the stateful heads drafted ahead inside their updates' graphs; the plain step and the K change (4 -> 2 -> 4)
    # dropped the draft made ahead and proposed anew (their drafts are checked against the eager ones above)
    assert (graphed.counts["prefetched"] > 0) == (method != "medusa")
    assert graphed.counts["prefetched"] < sum(op == "propose" for op, *_ in SCRIPT) - 1


def test_a_trimming_gate_and_heads_without_hooks_draft_eagerly(target):
    head = DSparkHead.from_target(target, block_size=4, seed=5).eval()
    graphed, counter = _on_cpu(ParallelDrafter(head, gate=ConfidenceGate(threshold=0.4, trim=True)))
    rows = _Rows(target, head.feature_layers, seed=1)
    state = graphed.start(rows.prompt([0, 1], 6))
    _, state = graphed.propose(state, rows.request(4))
    graphed.update(state, rows.step([2, 1], 5))
    assert not [k for k in graphed.graph_keys if k[0] == "propose"]  # trim reads the kept width: a host sync

    class Plain(torch.nn.Module):  # a stateful head with start/update but no step hooks
        feature_layers, num_levels, vocab_size = head.feature_layers, head.num_levels, head.vocab_size

        def start(self, feedback):
            return head.start(feedback)

        def update(self, state, feedback):
            return head.update(state, feedback)

        def level_logits(self, state, request=None):
            return head.level_logits(state, request)

    graphed, counter = _on_cpu(ParallelDrafter(Plain()))
    reference = ParallelDrafter(head)
    rows, rows_ref = _Rows(target, head.feature_layers, seed=2), _Rows(target, head.feature_layers, seed=2)
    state, state_ref = graphed.start(rows.prompt([0, 1], 6)), reference.start(rows_ref.prompt([0, 1], 6))
    for counts in ([2, 1], [3, 0]):
        (a, state), (b, state_ref) = graphed.propose(state, rows.request(3)), reference.propose(state_ref,
                                                                                                rows_ref.request(3))
        assert torch.equal(a.tokens, b.tokens)
        state, state_ref = graphed.update(state, rows.step(counts, 4)), reference.update(state_ref,
                                                                                        rows_ref.step(counts, 4))
    assert counter.calls == 0 and graphed.graph_keys == []


def test_a_stateless_head_reads_each_steps_request_on_replay():
    class RootHead:  # level d drafts root + d: it reads the request, which a replay must not take from the capture
        feature_layers, num_levels, vocab_size = (1,), 2, VOCAB

        def level_logits(self, state, request):
            (features,) = state
            tokens = (request.roots[:, None] + torch.arange(1, 3)) % VOCAB
            return torch.nn.functional.one_hot(tokens, VOCAB).float() + 0 * features.sum(-1)[:, None, None]

    graphed, counter = _on_cpu(ParallelDrafter(RootHead()))
    ids = torch.ones(2, 3, dtype=torch.long)
    state = graphed.start(Feedback(tokens=ids, next_tokens=ids, positions=ids, valid=ids.bool(),
                                   features=(torch.randn(2, 3, 4),), roots=ids[:, 0]))
    for roots in ([5, 9], [11, 2], [40, 7]):
        request = ProposeRequest(roots=torch.tensor(roots), root_positions=torch.tensor([3, 3]), num_drafts=2,
                                 sampling=SamplingParams(), source=None, active=torch.ones(2, dtype=torch.bool))
        draft, state = graphed.propose(state, request)
        assert draft.tokens.tolist() == [[r + 1, r + 2] for r in roots]
    assert counter.calls == 1  # one capture, replayed on each step's request


# --------------------------------------------------------------------------------------------------------
# generate() through the captured steps
# --------------------------------------------------------------------------------------------------------


def _prompts(batch, seed=0, length=8):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :2] = 0  # left padding, ragged rows
        mask[-1, :4] = 0
    return ids, mask


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("method", METHODS)
def test_generate_through_captures_is_greedy_identical_and_captures_once(target, method, prefetch):
    """Three generate() calls on one graphed drafter (buffers and captures reused) accept exactly what the eager
    drafter accepts, with the draft made ahead in the update and without (session 22 saw one bf16 run on the GPU
    differ with it off: no state carried between calls changes a draft here)."""
    graphed, counter = _on_cpu(_drafter(method, target), prefetch=prefetch)
    eager = _drafter(method, target)
    captures = []
    for seed in (0, 1, 0):  # later runs reuse the first run's buffers and captures; the third brings no new shape
        ids, mask = _prompts(3, seed)
        plain = sd.generate(target, ids, attention_mask=mask, max_new_tokens=14)
        a = sd.generate(target, ids, attention_mask=mask, drafter=graphed, max_new_tokens=14)
        b = sd.generate(target, ids, attention_mask=mask, drafter=eager, max_new_tokens=14)
        assert torch.equal(a.sequences, plain.sequences) and torch.equal(a.sequences, b.sequences)
        assert a.stats.num_accepted_per_step == b.stats.num_accepted_per_step
        assert a.stats.num_draft_forwards == b.stats.num_draft_forwards
        # drafts from a captured graph: a propose's, or (heads with the step hooks) the update's that drafts ahead
        assert any(k[0] in ("propose", "update+draft") for k in graphed.graph_keys)
        assert (graphed.counts["prefetched"] > 0) == (method != "medusa" and prefetch)
        # no (key, shapes) captured twice; the graphs reading stable inputs in place are captures of their own
        assert counter.calls == len(graphed.graph_keys) + len(graphed.in_place_keys)
        assert graphed.counts["captures"] == counter.calls and graphed.counts["buffer_changes"] == 0
        assert graphed.counts["replays"] > 0
        # the eager target's feedback is no captured step's output: copied in, never read in place (however often
        # the allocator hands out the same addresses again)
        assert graphed.counts["in_place"] == 0 and graphed.in_place_keys == []
        if not captures:
            buffers = graphed.buffers
        captures.append(counter.calls)
    assert graphed.buffers is buffers and captures[2] == captures[1]


@pytest.mark.parametrize("method", METHODS)
def test_recipes_wrap_on_request(target, method):
    drafter = _drafter(method, target)
    head, tree = drafter.head, TREE if method != "dspark" else None
    make = {"peagle": recipes.peagle, "dflash": recipes.dflash, "dspark": recipes.dspark,
            "medusa": recipes.medusa}[method]
    wrapped = make(head, tree)
    assert isinstance(wrapped, GraphedDrafter) and isinstance(wrapped.drafter, ParallelDrafter)
    assert wrapped.max_num_drafts == drafter.max_num_drafts and wrapped.feature_layers == drafter.feature_layers
    assert isinstance(make(head, tree, cuda_graphs=False), ParallelDrafter)
    if method == "medusa":
        for other in (recipes.medusa1, recipes.medusa2):
            assert isinstance(other(head, tree), GraphedDrafter)
        assert isinstance(recipes.medusa_typical(head, tree).drafter, GraphedDrafter)


# --------------------------------------------------------------------------------------------------------
# CUDA: the real graphs
# --------------------------------------------------------------------------------------------------------


class _Recorder:
    """A drafter that records every draft of the drafter it wraps."""

    def __init__(self, drafter):
        self.drafter, self.drafts = drafter, []
        self.max_num_drafts, self.feature_layers = drafter.max_num_drafts, drafter.feature_layers
        self.vocab_size = drafter.vocab_size

    def start(self, feedback):
        return self.drafter.start(feedback)

    def propose(self, state, request):
        draft, state = self.drafter.propose(state, request)
        self.drafts.append(draft)
        return draft, state

    def update(self, state, feedback):
        return self.drafter.update(state, feedback)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method", METHODS)
def test_cuda_graphs_draft_as_their_eager_reference(method):
    target = tiny_model("llama", seed=0, scale=4.0).cuda()
    counter = _Counting(capture_graph)
    real = _Recorder(GraphedDrafter(_drafter(method, target), capture=counter))
    reference = _Recorder(GraphedDrafter(_drafter(method, target), capture=capture_graph_ref))
    captures = []
    for seed in (0, 1, 0):
        ids, mask = (t.cuda() for t in _prompts(3, seed))
        plain = sd.generate(target, ids, attention_mask=mask, max_new_tokens=16)
        a = sd.generate(target, ids, attention_mask=mask, drafter=real, max_new_tokens=16)
        b = sd.generate(target, ids, attention_mask=mask, drafter=reference, max_new_tokens=16)
        assert torch.equal(a.sequences, plain.sequences) and torch.equal(a.sequences, b.sequences)
        # no (key, shapes) captured twice (besides the graphs reading stable inputs in place)
        assert counter.calls == len(real.drafter.graph_keys) + len(real.drafter.in_place_keys)
        captures.append(counter.calls)
    assert len(real.drafts) == len(reference.drafts) > 0
    for x, y in zip(real.drafts, reference.drafts):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.parents, y.parents)
        assert torch.equal(x.depths, y.depths)
    assert captures[2] == captures[1]  # the third run (shapes seen before) replayed, captured nothing


_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_the_fast_path_with_each_parallel_drafter_gives_the_eager_tokens(method, device):
    """``generate(fast=True)`` (static cache, captured target buckets; on CUDA also the drafter's graphs) with a
    parallel drafter gives the eager path's tokens and steps, and plain greedy decoding's tokens (ragged rows)."""
    target = tiny_model("llama", seed=0, scale=4.0).to(device)
    drafter = _drafter(method, target)
    if device == "cuda":
        drafter = GraphedDrafter(drafter)
    ids, mask = (t.to(device) for t in _prompts(3, 1))
    plain = sd.generate(target, ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    eager = sd.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, eos_token_id=[])
    fast = sd.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, eos_token_id=[],
                       fast=True)
    assert torch.equal(fast.sequences, eager.sequences) and torch.equal(fast.sequences, plain.sequences)
    assert fast.stats.num_target_forwards == eager.stats.num_target_forwards
    assert fast.stats.num_accepted_per_step == eager.stats.num_accepted_per_step


def test_a_profiled_run_replays_the_graphs_of_an_unprofiled_one(target):
    """``generate(profile=True)`` runs the same steps (shapes) as an unprofiled run: on the fast path a captured
    P-EAGLE drafter captures nothing new while profiled (before, the profiled run's synchronous steps fed it every
    width from 1 to K + 1, and the captures inflated its draft time on the H200)."""
    graphed, counter = _on_cpu(_drafter("peagle", target))
    ids, mask = _prompts(2, 3)
    for _ in range(2):
        sd.generate(target, ids, attention_mask=mask, drafter=graphed, max_new_tokens=14, fast=True)
    captured = counter.calls
    out = sd.generate(target, ids, attention_mask=mask, drafter=graphed, max_new_tokens=14, fast=True, profile=True)
    assert counter.calls == captured and set(out.stats.phase_times) >= {"draft", "target", "verify"}


@pytest.mark.parametrize("method", ["peagle", "dflash"])
def test_drafting_ahead_in_the_update_changes_no_draft_and_can_be_turned_off(target, method):
    """prefetch=False: every draft from a propose of its own, no update+draft graph; the drafts, states and
    acceptance equal the prefetching wrapper's and the eager drafter's over a generate() run."""
    ids, mask = _prompts(3, seed=2)
    runs = {}
    for name, prefetch in (("ahead", True), ("apart", False)):
        counter = _Counting(capture_strict)
        graphed = GraphedDrafter(_drafter(method, target), capture=counter, device_types=("cpu",), prefetch=prefetch)
        runs[name] = (sd.generate(target, ids, attention_mask=mask, drafter=graphed, max_new_tokens=12), graphed)
    eager = sd.generate(target, ids, attention_mask=mask, drafter=_drafter(method, target), max_new_tokens=12)
    (ahead, g_ahead), (apart, g_apart) = runs["ahead"], runs["apart"]
    for out in (ahead, apart):
        assert torch.equal(out.sequences, eager.sequences)
        assert out.stats.num_accepted_per_step == eager.stats.num_accepted_per_step
    assert g_ahead.counts["prefetched"] >= ahead.stats.num_steps - 2  # all but the first step's (and a last one)
    assert any(k[0] == "update+draft" for k in g_ahead.graph_keys)
    assert g_apart.counts["prefetched"] == 0 and not any(k[0] == "update+draft" for k in g_apart.graph_keys)


def test_a_draft_made_ahead_serves_only_the_state_roots_and_k_it_was_made_for(target):
    """A propose with another state object, other roots or another K than the update drafted ahead for runs its
    own draft step (and equals the eager drafter's)."""
    def fresh():
        graphed, _ = _on_cpu(_drafter("peagle", target))
        rows = _Rows(target, graphed.feature_layers, seed=9)
        state = graphed.start(rows.prompt([0, 1], 6))
        _, state = graphed.propose(state, rows.request(3))       # the prompt's draft (eager), K = 3 remembered
        state = graphed.update(state, rows.step([2, 3], 4))       # drafts ahead for K = 3
        return graphed, rows, state

    eager = _drafter("peagle", target)
    rows_e = _Rows(target, eager.feature_layers, seed=9)
    s = eager.start(rows_e.prompt([0, 1], 6))
    _, s = eager.propose(s, rows_e.request(3))
    s = eager.update(s, rows_e.step([2, 3], 4))
    for change in ("k", "roots", "state"):
        graphed, rows, state = fresh()
        request = rows.request(2 if change == "k" else 3)
        if change == "roots":
            request = request._replace(roots=request.roots.clone())
        if change == "state":
            state = state._replace()
        draft, _ = graphed.propose(state, request)
        assert graphed.counts["prefetched"] == 0
        want, _ = eager.propose(s, rows_e.request(2 if change == "k" else 3))
        assert torch.equal(draft.tokens, want.tokens) and torch.equal(draft.parents, want.parents)
    graphed, rows, state = fresh()
    draft, _ = graphed.propose(state, rows.request(3))
    assert graphed.counts["prefetched"] == 1
    want, _ = eager.propose(s, rows_e.request(3))
    assert torch.equal(draft.tokens, want.tokens) and torch.equal(draft.parents, want.parents)


def test_the_compiled_fast_path_keeps_a_wrappers_prefetch(target):
    """fast="compile" wraps a graphed drafter again (compiled captures): with its prefetch setting, one wrapper per
    setting."""
    from specdec.static import fast_drafter

    eager = _drafter("dflash", target)
    ahead, apart = GraphedDrafter(eager, prefetch=True), GraphedDrafter(eager)
    compiled_ahead, compiled_apart = fast_drafter(ahead, "compile"), fast_drafter(apart, "compile")
    assert compiled_ahead.prefetch and not compiled_apart.prefetch and compiled_ahead.drafter is eager
    assert fast_drafter(GraphedDrafter(eager, prefetch=True), "compile") is compiled_ahead
    assert fast_drafter(ahead, "graphs") is ahead


# --------------------------------------------------------------------------------------------------------
# The update and the next draft folded into the fast path's verify step (GraphedDrafter.fold_for)
# --------------------------------------------------------------------------------------------------------


def _recording(graphed: GraphedDrafter) -> list:
    """Every draft ``graphed.propose`` returns, recorded on the instance (the wrapper keeps its ``fold_for``)."""
    drafts, propose = [], graphed.propose

    def recorded(state, request):
        draft, state = propose(state, request)
        drafts.append(draft)
        return draft, state
    graphed.propose = recorded
    return drafts


def _fold_against_apart(make, target, ids, device: str, kw: dict):
    """generate(fast=True) through a graphed ``make()`` with the fold on and off, and eagerly: both graphed runs give
    the eager tokens and acceptance, the same draft forwards and, step by step, the same drafts. Returns
    ``((out, wrapper) folded, (out, wrapper) apart, eager out)``."""
    runs = {}
    for fold in (True, False):
        on_cpu = dict(capture=_Counting(capture_strict), device_types=("cpu",)) if device == "cpu" else {}
        graphed = GraphedDrafter(make(), fold=fold, **on_cpu)
        drafts = _recording(graphed)
        runs[fold] = (sd.generate(target, ids, drafter=graphed, fast=True, **kw), graphed, drafts)
    eager = sd.generate(target, ids, drafter=make(), **kw)
    (folded, g_fold, d_fold), (apart, g_apart, d_apart) = runs[True], runs[False]
    for out in (folded, apart):
        assert torch.equal(out.sequences, eager.sequences)
        assert out.stats.num_accepted_per_step == eager.stats.num_accepted_per_step
    assert folded.stats.num_draft_forwards == apart.stats.num_draft_forwards
    assert len(d_fold) == len(d_apart) == folded.stats.num_steps > 3
    for x, y in zip(d_fold, d_apart):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.parents, y.parents)
        assert torch.equal(x.depths, y.depths)
    return (folded, g_fold), (apart, g_apart), eager


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("method", ["peagle", "dflash", "dspark"])
def test_the_verify_step_runs_the_update_and_next_draft_folded_with_the_same_drafts(method, device):
    """generate(fast=True) with a drafter that drafts ahead: from the second step on, the update and the next draft
    run inside the verify step's capture (one replay a step) and give the drafts, tokens and acceptance of the
    unfolded steps (fold=False) and of the eager drafter; a second call captures nothing new."""
    target = tiny_model("llama", seed=0, scale=4.0).to(device)
    ids, mask = (t.to(device) for t in _prompts(3, 1))
    kw = dict(attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    (folded, g_fold), (apart, g_apart), eager = _fold_against_apart(
        lambda: _drafter(method, target), target, ids, device, kw)
    steps = folded.stats.num_steps
    assert g_fold.counts["folded"] >= steps - 2 and g_fold.counts["prefetched"] >= steps - 2
    assert g_apart.counts["folded"] == 0 and g_apart.counts["prefetched"] == 0
    assert g_fold.counts["replays"] < g_apart.counts["replays"] - steps  # no update graph, no propose graph
    captures = g_fold.counts["captures"]
    again = sd.generate(target, ids, drafter=g_fold, fast=True, **kw)
    assert torch.equal(again.sequences, eager.sequences) and g_fold.counts["captures"] == captures


def test_a_fold_follows_k_changes_and_plain_steps_step_by_step(target):
    """Steps driven by hand on the static adapter with K changing and a plain step between: the folded drafter
    emits what the unfolded one emits at every step, folds where it has seen the K before, and drafts anew when
    the K changes (no draft made ahead serves another K)."""
    from specdec.static import StaticAdapter
    from specdec.step import prefill, step

    ids, mask = _prompts(2, 4)
    schedule = (3, 3, 3, 2, 2, 0, 3, 3, 2)
    emitted, graphed = {}, {}
    for fold in (True, False):
        g = graphed[fold] = GraphedDrafter(_drafter("dflash", target), capture=_Counting(capture_strict),
                                           device_types=("cpu",), fold=fold)
        adapter = StaticAdapter(target, g.feature_layers, capacity=128)
        out = prefill(adapter, ids, mask, drafter=g)
        rows = []
        for K in schedule:
            out = step(adapter, out.state, drafter=g, num_drafts=K, sync=False)
            rows.append([list(r) for r in out.emitted])
        emitted[fold] = rows
    assert emitted[True] == emitted[False]
    assert graphed[True].counts["folded"] >= 3 and graphed[False].counts["folded"] == 0
    # steps 2-3 and 5 fold (K seen before); a step after a K change or the plain step drafts in its propose
    assert graphed[True].counts["prefetched"] < len(schedule) - 2


class _DerivedValid(ParallelDrafter):
    """A drafter whose update reads a tensor made from the feedback (a copy of ``valid``): not foldable."""

    def absorb_step(self, state, feedback):
        return super().absorb_step(state, feedback._replace(valid=feedback.valid.clone()))


def test_a_drafter_whose_update_reads_a_tensor_made_from_the_feedback_is_not_folded(target):
    """fold_for refuses an absorb input that is neither the feedback's nor the state's (it could only be read
    from a template, stale): such a drafter updates after the step as before, with the same tokens; Medusa
    (stateless, no drafting ahead) and fold=False never fold."""
    dflash = _drafter("dflash", target)
    derived = _DerivedValid(dflash.head, TREE)
    ids, mask = _prompts(3, 1)
    kw = dict(attention_mask=mask, max_new_tokens=14, eos_token_id=[])
    plain = sd.generate(target, ids, **kw)
    for drafter, fold in ((derived, True), (_drafter("medusa", target), True), (dflash, False)):
        g = GraphedDrafter(drafter, capture=_Counting(capture_strict), device_types=("cpu",), fold=fold)
        out = sd.generate(target, ids, drafter=g, fast=True, **kw)
        assert torch.equal(out.sequences, plain.sequences)
        assert g.counts["folded"] == 0 and out.stats.num_steps > 3


def _eagle(kind: str, target):
    """An EAGLE drafter (EAGLE-2's dynamic tree on an EAGLE-1 head, or EAGLE-3 on Medusa's static tree), perturbed."""
    from specdec.drafters import EagleDrafter
    from specdec.heads import Eagle1Head, Eagle3Head
    from specdec.trees import EAGLE_MC_SIM_7B_63, DynamicTree, StaticTree

    torch.manual_seed(3)
    if kind == "eagle2":
        head, tree = Eagle1Head.from_target(target).float(), DynamicTree(total_tokens=12, depth=4, top_k=3)
    else:
        head, tree = Eagle3Head.from_target(target, feature_layers=(0, 1, 2)).float(), StaticTree(EAGLE_MC_SIM_7B_63)
    return EagleDrafter(_perturbed(head.to(next(target.parameters()).device), 7, 0.1), tree, fold=True)


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("kind", ["eagle2", "eagle3"])
def test_eagle_drafters_fold_their_update_and_next_draft_too(kind, device):
    """EAGLE's draft step also reads the request's root positions: the fold (opt-in, ``EagleDrafter(fold=True)``)
    gives it each row's length after the commit from inside the verify step. Drafts, tokens, acceptance and draft
    forwards equal fold=False's and the eager drafter's (float32, ragged rows); without the opt-in, no fold."""
    target = tiny_model("llama", seed=0, scale=4.0).to(device)
    ids, mask = (t.to(device) for t in _prompts(3, 1))
    kw = dict(attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    (folded, g_fold), (_, g_apart), eager = _fold_against_apart(lambda: _eagle(kind, target), target, ids, device, kw)
    assert g_fold.counts["folded"] >= folded.stats.num_steps - 2 and g_apart.counts["folded"] == 0
    if device == "cpu":
        default = _eagle(kind, target)
        default.fold = False  # the default: EAGLE's fold is opt-in
        graphed = GraphedDrafter(default, capture=_Counting(capture_strict), device_types=("cpu",))
        out = sd.generate(target, ids, drafter=graphed, fast=True, **kw)
        assert torch.equal(out.sequences, eager.sequences) and graphed.counts["folded"] == 0
