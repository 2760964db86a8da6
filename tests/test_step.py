"""specdec.step: one decoding step as a function, usable alone; one RandomSource drives a whole step; a step
without drafts is HF's own one-token decode (same SDPA calls, same logits, a handful of extra aten ops)."""
import collections

import pytest
import torch
from tiny_models import VOCAB, noisy_copy, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from specdec.adapter import ConsumedStateError, ModelAdapter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.generate import generate
from specdec.sampling import PredrawnNoise
from specdec.step import prefill, step
from specdec.types import Draft, DraftScheme, SamplingParams

PROMPTS = torch.tensor([[0, 0, 12, 30, 12, 30, 5], [3, 9, 27, 3, 9, 27, 3]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])


def test_prefill_and_steps_by_hand_give_generate_s_tokens():
    model = tiny_model("llama")
    drafter = DraftModelDrafter(noisy_copy(model, 0.3), num_drafts=3)
    adapter = ModelAdapter(model)
    out = prefill(adapter, PROMPTS, MASK, drafter=drafter)
    tokens = [list(t) for t in out.emitted]
    for k in [3, 0, 2, 3, 0, 1]:  # a step without drafts between speculative ones (Dynamic SD)
        out = step(adapter, out.state, drafter=drafter, num_drafts=k)
        assert (out.draft is None) == (k == 0)
        for b, new in enumerate(out.emitted):
            tokens[b] += new
    n = min(len(t) for t in tokens)
    ref = generate(model, PROMPTS, attention_mask=MASK, max_new_tokens=n, eos_token_id=[]).sequences[:, 7:]
    assert [t[:n] for t in tokens] == ref.tolist()


def test_a_consumed_state_is_refused_by_name():
    model = tiny_model("llama")
    adapter = ModelAdapter(model)
    first = prefill(adapter, PROMPTS, MASK)
    step(adapter, first.state)
    with pytest.raises(ConsumedStateError, match="already consumed by decode"):
        step(adapter, first.state)


def _noise(seed: int, n: int = 100_000):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g, dtype=torch.float64), torch.empty(n, dtype=torch.float64).exponential_(
        generator=g)


def test_predrawn_noise_drives_a_whole_sampled_step_reproducibly():
    model = tiny_model("llama")
    drafter = DraftModelDrafter(noisy_copy(model, 0.3), num_drafts=3, mode="sample")
    params = SamplingParams(temperature=1.0)
    B, K, V = PROMPTS.shape[0], 3, VOCAB

    def one_step(noise):
        adapter = ModelAdapter(model)
        source = PredrawnNoise(*noise)
        first = prefill(adapter, PROMPTS, MASK, drafter=drafter, sampling=params, source=source)
        after_prefill = source.exponentials_used
        out = step(adapter, first.state, drafter=drafter, num_drafts=K, sampling=params, source=source)
        return first.emitted, out.emitted, source, after_prefill

    a, b = one_step(_noise(0)), one_step(_noise(0))
    assert a[0] == b[0] and a[1] == b[1]
    source, after_prefill = a[2], a[3]
    assert after_prefill == B * V  # the first token: one categorical over the vocabulary per row
    # The step drew from the same source for drafting (K levels of one categorical over V per row) and for
    # verifying the sampled chain (select_verifier's i.i.d. tree walk: one coin per node, then the next token).
    assert source.exponentials_used - after_prefill == B * V * K + B * V
    assert source.uniforms_used == B * K
    other = one_step(_noise(1))
    assert (other[0], other[1]) != (a[0], a[1])  # the noise decides: other noise, other tokens


def test_generate_takes_a_source_and_refuses_two_randomness_arguments():
    model = tiny_model("llama")
    kw = dict(attention_mask=MASK, temperature=0.8, max_new_tokens=9,
              drafter=DraftModelDrafter(noisy_copy(model, 0.3), 3, mode="sample"))
    runs = [generate(model, PROMPTS, source=PredrawnNoise(*_noise(4)), **kw).sequences for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    with pytest.raises(ValueError, match="not both"):
        generate(model, PROMPTS, source=PredrawnNoise(*_noise(4)), generator=torch.Generator(), **kw)


class _BadDrafter(PromptLookupDrafter):
    """Proposes id -1 at a present node of row 1 (the bug the step must name, not crash on)."""

    def propose(self, state, request):
        draft, state = super().propose(state, request)
        tokens = torch.full((draft.tokens.shape[0], 2), 5)
        tokens[1, 1] = -1
        parents = torch.tensor([[-1, 0, 1]] * tokens.shape[0])
        return Draft(tokens=tokens, parents=parents, depths=torch.tensor([[0, 1, 2]] * tokens.shape[0]),
                     draft_probs=None, scheme=DraftScheme.DETERMINISTIC), state


def test_a_bad_draft_token_id_is_a_named_error_not_an_index_error():
    with pytest.raises(ValueError, match=r"_BadDrafter proposed a token id outside .* row 1, node 2"):
        generate(tiny_model("llama"), PROMPTS, attention_mask=MASK, drafter=_BadDrafter(num_drafts=2),
                 max_new_tokens=6)


# ---------------------------------------------------------------- a plain step is HF's one-token decode
class _SDPACalls(torch.overrides.TorchFunctionMode):
    """Records what each scaled_dot_product_attention call gets: mask kind, mask shape, is_causal, shapes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.calls.append((None if mask is None else (mask.dtype, tuple(mask.shape)), kwargs.get("is_causal"),
                               tuple(args[0].shape), tuple(args[1].shape)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("padded", [False, True])
def test_plain_decoding_runs_the_same_attention_calls_as_hf_generate(padded):
    model = tiny_model("llama")
    ids, mask = (PROMPTS, MASK) if padded else (PROMPTS[1:], None)
    with _SDPACalls() as hf:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                       max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    with _SDPACalls() as ours:
        generate(model, ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[])
    assert ours.calls == hf.calls
    assert len(hf.calls) == 6 * model.config.num_hidden_layers  # prefill + 5 decodes, every layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_decoding_equals_hf_generate_token_for_token_and_logits_bit_for_bit(dtype):
    model = tiny_model("llama", scale=0.2).to(dtype)  # flat logits: near ties, so any numerical difference shows
    for ids, mask in [(PROMPTS[1:], None), (PROMPTS, MASK)]:
        hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                            max_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=None,
                            output_logits=True, return_dict_in_generate=True)
        seen = []
        hook = model.register_forward_hook(lambda module, args, out, seen=seen: seen.append(out.logits[:, -1].clone()))
        out = generate(model, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
        hook.remove()
        assert torch.equal(out.sequences, hf.sequences)
        assert len(seen) == len(hf.logits) and all(torch.equal(a.float(), b.float()) for a, b in zip(seen, hf.logits))


class _CountOutsideModel(TorchDispatchMode):
    """Counts aten ops dispatched outside the model's forward (what the loop adds to HF's own work)."""

    def __init__(self, model):
        super().__init__()
        self.ops, self.inside = collections.Counter(), 0
        self.hooks = [model.register_forward_pre_hook(lambda *a: self._enter()),
                      model.register_forward_hook(lambda *a: self._leave())]

    def _enter(self):
        self.inside += 1

    def _leave(self):
        self.inside -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def test_a_plain_step_adds_only_a_few_aten_ops_to_the_model_forward():
    model = tiny_model("llama")
    adapter = ModelAdapter(model)
    out = step(adapter, prefill(adapter, PROMPTS[1:]).state)  # warm: the adapter's [B, 1] column is cached
    counter = _CountOutsideModel(model)
    with counter:
        step(adapter, out.state)
    for hook in counter.hooks:
        hook.remove()
    # Roots and positions as [B, 1] (two views), one committed-slot column (cat), lengths + 1 (add), the last
    # logits (a view) and their argmax: no tree mask, no verifier, no cache compaction. (The old loop added
    # about 80 ops to each plain step.)
    assert sum(counter.ops.values()) <= 6, counter.ops
    assert counter.ops["aten.argmax"] == 1 and counter.ops["aten.cat"] == 1
