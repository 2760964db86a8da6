"""CUDA graphs as a wrapper (specdec/graphs.py), on CPU: the eager fallback, and the wrapper's bookkeeping (one
capture per key and shape, copy-in, recapture on new buffers, buffer reuse across runs) through the reference
capture ``capture_graph_ref``, which runs each step eagerly on static input copies exactly as a replay would."""
from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from tiny_models import VOCAB, tiny_model

import specdec as sd
from specdec.drafters import Drafter, EagleDrafter, Feedback, PromptLookupDrafter, ProposeRequest
from specdec.graphs import (
    GraphedDrafter,
    Step,
    _InPlace,
    capture_graph,
    capture_graph_ref,
    cuda_graphed,
    run_step,
)
from specdec.heads import Eagle1Head
from specdec.trees import DynamicTree, SampledTree, StaticTree
from specdec.types import Draft, DraftScheme, SamplingParams

torch.set_num_threads(1)


# --------------------------------------------------------------------------------------------------------
# The capture utility
# --------------------------------------------------------------------------------------------------------


def test_captured_step_copies_inputs_in_and_returns_fresh_outputs():
    calls = []

    def fn(x, pair):
        calls.append(1)
        return x * 2, (pair[0] + pair[1],)

    x, pair = torch.arange(3.0), (torch.ones(2), torch.full((2,), 5.0))
    step = capture_graph_ref(fn, (x, pair), warmup=2)
    assert len(calls) == 2  # the warm-up runs
    a = step(torch.tensor([1.0, 2.0, 3.0]), (torch.zeros(2), torch.ones(2)))
    b = step(torch.tensor([4.0, 5.0, 6.0]), (torch.ones(2), torch.ones(2)))
    assert a[0].tolist() == [2.0, 4.0, 6.0] and a[1][0].tolist() == [1.0, 1.0]  # not overwritten by the next call
    assert b[0].tolist() == [8.0, 10.0, 12.0] and b[1][0].tolist() == [2.0, 2.0]
    assert x.tolist() == [0.0, 1.0, 2.0]  # the caller's tensors are not the static buffers
    with pytest.raises(ValueError, match="capture another step"):
        step(torch.zeros(4), pair)


def test_the_reference_capture_writes_its_outputs_where_its_first_call_put_them():
    """As a graph's replays do: every call returns the same tensors, overwritten (a caller that keeps an output across
    calls sees it change, on CPU as on CUDA)."""
    step = capture_graph_ref(lambda x: (x * 2, x), (torch.zeros(2),), warmup=0)
    step.inputs[0].copy_(torch.tensor([1.0, 2.0]))
    first = step._run()
    step.inputs[0].copy_(torch.tensor([3.0, 4.0]))
    second = step._run()
    assert second[0] is first[0] and first[0].tolist() == [6.0, 8.0]
    assert second[1] is step.inputs[0]  # an input passed through stays the input


def test_late_tokens_on_cpu_copy_the_tensor_as_the_device_copy_does():
    from specdec.step import LateTokens

    tokens = torch.tensor([5, 6])
    late = LateTokens(tokens)
    tokens.fill_(0)  # a captured step's next replay overwrites its output
    assert late.wait() == [[5], [6]]


def test_capture_graph_refuses_cpu_inputs():
    with pytest.raises(ValueError, match="CUDA device"):
        capture_graph(lambda x: x + 1, (torch.zeros(2),))


def test_closure_tensors_finds_what_a_captured_function_reads_besides_its_inputs():
    """What capture_graph keeps alive with its graph (a replay reads these where they lay at the capture): tensors in
    closures, nested closures, defaults, partials, bound methods, NamedTuples, lists, dicts, dataclasses and other
    objects' attributes (a tree policy's cached plans); each once; never a module's parameters (the module keeps
    those)."""
    import dataclasses
    import functools

    from specdec.graphs import closure_tensors

    @dataclasses.dataclass
    class Holder:
        t: torch.Tensor

    a, b, c, d, e, f, g = (torch.full((1,), float(i)) for i in range(7))
    module = torch.nn.Linear(2, 2)
    state = ToyState(offsets=c, seen=0)

    def inner(x, scale=d):
        return x * a + state.offsets + scale + module(x).sum()

    def outer(x):
        return inner(x) + [b][0] + {"k": e}["k"] + Holder(f).t + a

    class Obj:
        def __init__(self):
            self.plans = {("plan", 3): (b,)}

        def method(self, x, extra=g):
            return x + extra

    ids = [id(t) for t in closure_tensors(functools.partial(outer))]
    assert len(ids) == len(set(ids))  # each once (a is in both closures)
    assert set(ids) == {id(t) for t in (a, b, c, d, e, f)}  # c through a NamedTuple, d a default of inner
    assert not {id(p) for p in module.parameters()} & set(ids)
    assert {id(t) for t in closure_tensors(Obj().method)} == {id(g), id(b)}  # its default, its object's plan
    bag = closure_tensors(functools.partial(lambda x, h, items: x, h=Holder(f), items={"k": [e, b]}))
    assert {id(t) for t in bag} == {id(f), id(e), id(b)}
    assert closure_tensors(lambda x: x + 1) == ()
    import weakref
    gone = weakref.proxy(Obj())  # dead at once: skipped, not raised on
    assert [id(t) for t in closure_tensors(lambda x: (gone, a))] == [id(a)]


# --------------------------------------------------------------------------------------------------------
# The wrapper's bookkeeping, on a toy drafter whose buffer stands in for a KV cache
# --------------------------------------------------------------------------------------------------------


class ToyState(NamedTuple):
    offsets: torch.Tensor  # the "cache": read in place by every step
    seen: int


class ToyDrafter:
    """Drafts the chain ``root + offsets[1..K]``; an update longer than the buffer reallocates it (times 10)."""

    max_num_drafts = 3
    feature_layers = ()

    def start(self, feedback, *, static=False, buffers=None):
        width = feedback.tokens.shape[1] + 4
        if static and buffers is not None and buffers[0].shape[0] >= width:
            return ToyState(buffers[0], 0)
        return ToyState(torch.arange(width), 0)

    def draft_step(self, state, request):
        K = min(request.num_drafts, self.max_num_drafts)
        offsets = state.offsets

        def fn(roots):
            B = roots.shape[0]
            parents = torch.arange(-1, K)[None].expand(B, K + 1).clone()
            return Draft(roots[:, None] + offsets[1:K + 1], parents, torch.arange(K + 1)[None].expand(B, K + 1).clone(),
                         None, DraftScheme.DETERMINISTIC)

        return Step(fn=fn, inputs=(request.roots,), finish=lambda draft: (draft, state), key=("propose", K),
                    buffers=(offsets,))

    def absorb_step(self, state, feedback):
        seen = state.seen + feedback.tokens.shape[1]
        offsets = state.offsets if seen < state.offsets.shape[0] else torch.arange(2 * seen) * 10
        return Step(fn=lambda tokens: tokens.sum(), inputs=(feedback.tokens,),
                    finish=lambda total: ToyState(offsets, seen), key=("update",), buffers=(offsets,))

    def propose(self, state, request):
        return run_step(self.draft_step(state, request))

    def update(self, state, feedback):
        return run_step(self.absorb_step(state, feedback))


def _feedback(B, M):
    ids = torch.zeros(B, M, dtype=torch.long)
    return Feedback(ids, ids, ids, torch.ones(B, M, dtype=torch.bool), (), torch.zeros(B, dtype=torch.long))


def _request(roots, k):
    roots = torch.tensor(roots)
    return ProposeRequest(roots=roots, root_positions=roots, num_drafts=k, sampling=SamplingParams(), source=None,
                          active=torch.ones(len(roots), dtype=torch.bool))


def _on_cpu(drafter):
    return GraphedDrafter(drafter, capture=capture_graph_ref, device_types=("cpu",))


def test_wrapper_captures_once_per_key_and_shape_and_copies_inputs_in():
    graphed = _on_cpu(ToyDrafter())
    assert isinstance(graphed, Drafter) and graphed.max_num_drafts == 3 and graphed.feature_layers == ()
    state = graphed.start(_feedback(2, 5))
    draft, state = graphed.propose(state, _request([10, 20], 2))
    assert draft.tokens.tolist() == [[11, 12], [21, 22]]
    draft, state = graphed.propose(state, _request([30, 40], 2))  # replayed with the new roots
    assert draft.tokens.tolist() == [[31, 32], [41, 42]]
    assert graphed.graph_keys == [("propose", 2)]
    graphed.propose(state, _request([1, 2], 3))
    graphed.propose(state, _request([1, 2, 3], 3))  # another batch size: another graph
    assert graphed.graph_keys == [("propose", 2), ("propose", 3), ("propose", 3)]


def test_wrapper_recaptures_on_new_buffers_and_reuses_buffers_across_runs():
    toy = ToyDrafter()
    graphed = _on_cpu(toy)
    state = graphed.start(_feedback(1, 5))  # offsets: 9 slots
    _, state = graphed.propose(state, _request([100], 2))
    state = graphed.update(state, _feedback(1, 3))
    old = graphed.buffers[0]
    assert set(graphed.graph_keys) == {("propose", 2), ("update",)}
    state = graphed.update(state, _feedback(1, 6))  # 14 seen > 9 slots: the buffer is reallocated
    assert graphed.buffers[0] is state.offsets and state.offsets is not old
    assert graphed.graph_keys == [("update",)]  # the graphs on the old buffer are gone
    draft, state = graphed.propose(state, _request([100], 2))
    assert draft.tokens.tolist() == [[110, 120]]  # read from the new buffer, not a stale capture
    # a new run starts on the same buffer, so the graphs survive
    state = graphed.start(_feedback(1, 5))
    assert state.offsets is graphed.buffers[0]
    assert set(graphed.graph_keys) == {("propose", 2), ("update",)}
    eager = toy.start(_feedback(1, 5))
    assert eager.offsets is not graphed.buffers[0]  # unwrapped, the drafter allocates afresh


def _held_output(value: list[float]):
    """A captured step's output (memory every replay writes) holding ``value``, and a function to set it."""
    producer = capture_graph_ref(lambda x: x + 0, (torch.zeros(len(value)),), warmup=0)

    def write(new):
        producer.inputs[0].copy_(torch.tensor(new, dtype=torch.float32))
        return producer._run()

    return write(value), write, producer


def _toy_step(graphed, x, fn=lambda x: x * 10):
    buffers = graphed.buffers if graphed.buffers is not None else (torch.zeros(1),)
    return graphed._run(Step(fn=fn, inputs=(x,), finish=lambda out: out.clone(), key=("toy",), buffers=buffers))


def test_a_step_reads_another_captured_steps_output_where_it_lies_and_sees_its_latest_value():
    graphed = _on_cpu(ToyDrafter())
    out, write, _ = _held_output([1.0, 2.0])
    assert _toy_step(graphed, out).tolist() == [10.0, 20.0]  # the first call captures the copying graph
    assert graphed.counts["in_place"] == 0
    assert _toy_step(graphed, out).tolist() == [10.0, 20.0]  # then one graph that reads it where it lies
    assert graphed.in_place_keys == [("toy",)] and graphed.counts["in_place"] == 1
    write([3.0, 4.0])  # the producer's next replay
    assert _toy_step(graphed, out).tolist() == [30.0, 40.0] and graphed.counts["in_place"] == 2
    assert _toy_step(graphed, torch.tensor([5.0, 6.0])).tolist() == [50.0, 60.0]  # not held: copied in
    assert graphed.counts["in_place"] == 2 and graphed.graph_keys == [("toy",)]
    plain = GraphedDrafter(ToyDrafter(), capture=capture_graph_ref, device_types=("cpu",), in_place=False)
    for _ in range(3):
        assert _toy_step(plain, out).tolist() == [30.0, 40.0]
    assert plain.counts["in_place"] == 0 and plain.in_place_keys == []


def test_a_step_that_writes_its_inputs_or_reads_its_buffers_never_reads_in_place():
    graphed = _on_cpu(ToyDrafter())
    out, _, _ = _held_output([1.0, 2.0])
    for _ in range(3):  # the step adds to its input: it must get a copy, never the producer's memory
        assert _toy_step(graphed, out, fn=lambda x: x.add_(1)).tolist() == [2.0, 3.0]
    assert out.tolist() == [1.0, 2.0] and graphed.counts["in_place"] == 0
    buffered = _on_cpu(ToyDrafter())
    buffers = _held_output([7.0])[0]  # a held tensor that is the drafter's buffer: the step may write it
    for _ in range(3):
        buffered._run(Step(fn=lambda x: x * 2, inputs=(buffers,), finish=lambda o: o.clone(), key=("toy",),
                           buffers=(buffers,)))
    assert buffered.counts["in_place"] == 0 and buffered.counts["replays"] == 2


def test_owned_outputs_are_handed_over_uncloned_read_in_place_by_the_next_step_and_never_by_their_own():
    graphed = _on_cpu(ToyDrafter())
    buffers = (torch.zeros(1),)

    def counter(x):  # owned outputs: the captured step's own tensors, overwritten by its next replay
        return graphed._run(Step(fn=lambda x: x + 1, inputs=(x,), finish=lambda out: out, key=("count",),
                                 buffers=buffers, owned_outputs=True))

    x = counter(torch.zeros(2))
    first = x
    for i in range(2, 6):  # fed its own output: copied in every time (read in place, it would be rewritten inside)
        x = counter(x)
        assert x.tolist() == [float(i)] * 2
    assert graphed.counts["in_place"] == 0 and graphed.in_place_keys == []
    assert x.data_ptr() == first.data_ptr()  # the same memory at every replay, handed over as it is
    # another step reads those outputs where they lie, and sees their latest value
    assert _toy_step(graphed, x).tolist() == [50.0, 50.0]
    assert _toy_step(graphed, x).tolist() == [50.0, 50.0] and ("toy",) in graphed.in_place_keys
    x = counter(x)
    assert _toy_step(graphed, x).tolist() == [60.0, 60.0] and graphed.counts["in_place"] == 2


def test_in_place_variants_follow_moving_producers_up_to_a_bound():
    graphed = _on_cpu(ToyDrafter())
    keep = []
    for i in range(_InPlace.MAX_VARIANTS + _InPlace.MAX_DROPPED + 3):  # a new producer (new memory) every time
        out, _, producer = _held_output([float(i)])
        keep.append(producer)
        assert _toy_step(graphed, out).tolist() == [10.0 * i]
    assert len(graphed.in_place_keys) == _InPlace.MAX_VARIANTS  # the oldest dropped, then no more variants
    assert graphed.counts["captures"] == 1 + _InPlace.MAX_VARIANTS + _InPlace.MAX_DROPPED


def test_cuda_graphed_on_cpu_is_the_eager_drafter_and_refuses_drafters_without_steps():
    graphed = cuda_graphed(ToyDrafter())
    state = graphed.start(_feedback(2, 5))
    draft, state = graphed.propose(state, _request([10, 20], 2))
    graphed.update(state, _feedback(2, 3))
    assert draft.tokens.tolist() == [[11, 12], [21, 22]]
    assert graphed.graph_keys == [] and graphed.buffers is None
    class Eager:  # a drafter without steps
        max_num_drafts, feature_layers = 2, ()
        start = propose = update = ToyDrafter.start

    with pytest.raises(TypeError, match="draft_step"):
        cuda_graphed(Eager())
    assert isinstance(cuda_graphed(PromptLookupDrafter(num_drafts=3, fixed_width=True)), GraphedDrafter)


# --------------------------------------------------------------------------------------------------------
# The EAGLE drafter through the wrapper
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=4, scale=4.0)


@pytest.fixture(scope="module")
def head(target):
    return Eagle1Head.from_target(target).float()


def _prompts(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, :3] = 0
    return ids, mask


@pytest.mark.parametrize("policy", ["dynamic", "static"])
def test_eagle_steps_replayed_from_captures_equal_the_eager_drafter(target, head, policy):
    def make():
        return EagleDrafter(head, DynamicTree(12, 3, 3) if policy == "dynamic" else StaticTree([(0,), (1,), (0, 0)]))

    graphed, eager = _on_cpu(make()), make()
    for seed in range(2):  # the second run reuses the first run's cache and captures
        ids, mask = _prompts(2, seed)
        a = sd.generate(target, ids, attention_mask=mask, drafter=graphed, max_new_tokens=12)
        b = sd.generate(target, ids, attention_mask=mask, drafter=eager, max_new_tokens=12)
        assert torch.equal(a.sequences, b.sequences)
        assert a.stats.num_accepted_per_step == b.stats.num_accepted_per_step
        assert a.stats.num_draft_forwards == b.stats.num_draft_forwards
        assert ("update",) in graphed.graph_keys and any(k[0] == "propose" for k in graphed.graph_keys)
        if seed == 0:
            cache = graphed.buffers
    assert graphed.buffers is cache


@pytest.mark.parametrize("policy", ["dynamic", "static"])
def test_on_the_fast_path_eagle_updates_read_the_verify_outputs_where_they_lie(target, head, policy):
    """The update absorbs the verify step's outputs (the captured step's own tensors) without copying them in: the
    same tokens, acceptance and draft forwards as copying them and as the eager drafter."""
    def make(in_place=True):
        tree = DynamicTree(12, 3, 3) if policy == "dynamic" else StaticTree([(0,), (1,), (0, 0)])
        return GraphedDrafter(EagleDrafter(head, tree), capture=capture_graph_ref, device_types=("cpu",),
                              in_place=in_place)

    reading, copying, eager = make(), make(in_place=False), make().drafter
    for seed in range(2):
        ids, mask = _prompts(2, seed)
        captures = reading.counts["captures"]
        runs = [sd.generate(target, ids, attention_mask=mask, drafter=d, max_new_tokens=12, eos_token_id=[],
                            fast=True) for d in (reading, copying, eager)]
        for other in runs[1:]:
            assert torch.equal(runs[0].sequences, other.sequences)
            assert runs[0].stats.num_accepted_per_step == other.stats.num_accepted_per_step
            assert runs[0].stats.num_draft_forwards == other.stats.num_draft_forwards
        # on CPU each generate() builds its adapter afresh (new verify outputs: one more update graph reading them;
        # on CUDA the model's held adapter keeps its outputs); the update hands over its own outputs (owned_outputs),
        # which the next draft reads in place: one more draft graph for that update graph's outputs
        keys = reading.in_place_keys
        assert keys.count(("update",)) == seed + 1 and copying.in_place_keys == []
        assert sum(k[0] == "propose" for k in keys) == len(keys) - (seed + 1) >= seed + 1
        assert reading.counts["in_place"] > 0 and copying.counts["in_place"] == 0
        if seed == 1:
            assert reading.counts["captures"] == captures + 2


def test_sampled_tree_at_temperature_drafts_eagerly(target, head):
    graphed = _on_cpu(EagleDrafter(head, SampledTree([(0,), (1,), (0, 0)])))
    ids, mask = _prompts(2)
    out = sd.generate(target, ids, attention_mask=mask, drafter=graphed, max_new_tokens=8, temperature=1.0,
                      generator=torch.Generator().manual_seed(0))
    assert out.sequences.shape[1] == ids.shape[1] + 8
    assert not [key for key in graphed.graph_keys if key[0] == "propose"]  # its draws are never captured
    assert ("update",) in graphed.graph_keys


def test_recipes_wrap_on_request(head):
    assert isinstance(sd.recipes.eagle2(head), GraphedDrafter)
    plain = sd.recipes.eagle2(head, cuda_graphs=False)
    assert isinstance(plain, EagleDrafter) and isinstance(sd.recipes.eagle1(head).drafter, EagleDrafter)


def test_a_bound_is_retightened_from_a_copy_of_the_values_without_a_sync():
    from specdec.graphs import mark_bound, settle_bound

    lengths = torch.tensor([5, 9, 7])
    mark = mark_bound(lengths, 20)  # the bound had run ahead to 20; the true maximum is 9
    lengths += 100  # later device work: the mark holds the values of when it was taken
    assert settle_bound(23, None) == (23, None)
    # 3 more slots appended since the mark: 9 + 3 = 12, below the running bound of 23
    assert settle_bound(23, mark) == (12, None)
    tight = mark_bound(torch.tensor([20]), 20)  # the bound was exact when marked: nothing to lower
    assert settle_bound(23, tight) == (23, None)


def test_copy_changed_skips_only_the_same_unwritten_tensor():
    from specdec.graphs import copy_changed
    static, seen = torch.zeros(3), {}
    const = torch.ones(3)
    copy_changed([static], [const], seen)
    assert static.tolist() == [1.0] * 3
    static.zero_()  # the static input written since: copied again
    copy_changed([static], [const], seen)
    assert static.tolist() == [1.0] * 3
    before = static._version
    copy_changed([static], [const], seen)  # nothing changed: no copy at all
    assert static._version == before
    const.mul_(2)  # the source written in place: copied again
    copy_changed([static], [const], seen)
    assert static.tolist() == [2.0] * 3
    copy_changed([static], [torch.full((3,), 5.0)], seen)  # another tensor: copied
    assert static.tolist() == [5.0] * 3


def test_the_all_rows_mask_is_one_tensor_until_someone_writes_it():
    from specdec.step import _all_rows
    roots = torch.zeros(3, dtype=torch.long)
    a = _all_rows(roots)
    assert a.dtype == torch.bool and a.tolist() == [True] * 3 and _all_rows(roots) is a
    a[1] = False  # a caller wrote it: the next step gets a fresh, all-True one
    b = _all_rows(roots)
    assert b is not a and b.tolist() == [True] * 3
    assert _all_rows(torch.zeros(2, dtype=torch.long)).shape == (2,)
