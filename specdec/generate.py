"""``generate()``: the speculative decoding loop around any HuggingFace causal LM.

The loop only wires blocks: inputs are checked and left-padded
(:mod:`specdec.inputs`), the prompt's pass starts the decoding state, and :func:`specdec.step.step` runs each step
(draft, target forward, verify, keep the accepted path, tell the drafter); :class:`specdec.rows.Rows` keeps each
row's tokens and stopping rules, :class:`specdec.stats.StatsRecorder` the statistics. A method (SpS, EAGLE-2,
prompt lookup, ...) is a choice of drafter (+ verifier); nothing in this file knows about any of them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .drafters.base import Drafter
from .inputs import check_prompt_ids, check_vocabularies, prepare_prompts, resolve_pad_token_id
from .rows import Rows
from .sampling import RandomSource, as_source
from .schedule import Schedule, make_schedule
from .static import fast_drafter, fast_mode, target_adapter
from .stats import GenerationStats, StatsRecorder
from .step import prefill, step
from .types import SamplingParams
from .verify import Verifier

__all__ = ["generate", "GenerateOutput", "GenerationStats"]


class GenerateOutput(NamedTuple):
    """Output of :func:`generate`.

    Attributes:
        sequences: Shape ``[B, T + max_b n_b]``: the prompts, left-padded (padding given on the right or on both
            sides is repacked to the left: row ``b``'s real prompt tokens end at column ``T``), followed by each
            row's new tokens, right-padded with ``pad_token_id``.
        num_new_tokens: Shape ``[B]``, new tokens per row (``n_b``).
        stats: :class:`~specdec.stats.GenerationStats`.
    """

    sequences: torch.Tensor
    num_new_tokens: torch.Tensor
    stats: GenerationStats


def _check_device(target, input_ids: torch.Tensor) -> None:
    """A prompt on another device than the target's weights: a ``ValueError`` saying how to move it."""
    embed = target.get_input_embeddings() if hasattr(target, "get_input_embeddings") else None
    weight = getattr(embed, "weight", None)  # where the ids are looked up (the first shard of a split model)
    if not isinstance(weight, torch.Tensor):
        weight = next(iter(target.parameters()), None) if isinstance(target, torch.nn.Module) else None
    if weight is not None and weight.device.type != "meta" and input_ids.device != weight.device:
        raise ValueError(f"input_ids are on {input_ids.device} but the target's weights are on {weight.device}: "
                         f"move the prompt (input_ids.to({str(weight.device)!r}), and the attention mask with it)")


@torch.no_grad()
def generate(
    target,
    input_ids,
    *,
    attention_mask: torch.Tensor | None = None,
    drafter: Drafter | None = None,
    num_drafts: int | None = None,
    schedule: Schedule | Sequence | None = None,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop_strings: str | Sequence[str] | None = None,
    tokenizer=None,
    generator: torch.Generator | None = None,
    source: RandomSource | None = None,
    streamer=None,
    verifier: Verifier | None = None,
    profile: bool = False,
    fast: bool | str = False,
    max_cache_len: int | None = None,
) -> GenerateOutput:
    """Decode with speculative decoding (or plainly, with ``drafter=None``) around an HF causal LM.

    Args:
        target: an HF causal LM (``AutoModelForCausalLM``; ``sdpa`` or ``eager`` attention). Encoder-decoders,
            masked LMs and models without an LM head are refused up front.
        input_ids: Shape ``[B, T]`` int tensor, or the ``BatchEncoding`` / dict a tokenizer returns (its
            ``attention_mask`` is used).
        attention_mask: Shape ``[B, T]``, 1 for real tokens; padding on either side (repacked to the left).
            Required when the prompts contain the pad id.
        drafter: a :class:`~specdec.drafters.Drafter`; ``None`` decodes one token per target forward.
        num_drafts: ``K`` for every step (default: the drafter's ``max_num_drafts``).
        schedule: Dynamic SD, ``[[start_bs, end_bs, K], ...]`` or a :class:`~specdec.schedule.Schedule`;
            K is looked up each step from the number of active rows (K = 0: a plain step).
        max_new_tokens: new tokens per row, never exceeded.
        temperature, top_k, top_p: sampling parameters (temperature 0 = greedy), applied identically to
            target and draft.
        eos_token_id: a row stops right after emitting one of these. ``None`` (the default) takes the model's
            ``generation_config.eos_token_id``, as HF ``generate`` does; ``[]`` never stops at EOS.
        pad_token_id: the model's pad id (default: its ``generation_config`` / ``config`` one); fills
            ``sequences`` after a row's end (then EOS, else 0).
        stop_strings: a row stops right after the token that completes one of these (needs ``tokenizer``).
        tokenizer: decodes outputs for ``stop_strings``; its size also lets the vocabulary check accept a
            target whose embedding is padded past the tokenizer.
        generator: the randomness for ``temperature > 0`` (wrapped in a
            :class:`~specdec.sampling.TorchSource`; never the global RNG).
        source: the randomness as a :class:`~specdec.sampling.RandomSource` instead (e.g.
            :class:`~specdec.sampling.PredrawnNoise`, or :class:`~specdec.sampling.PerRowSource` so that each row's
            tokens do not depend on the batch); it drives drafting and verification alike.
        streamer: an HF streamer (``put`` / ``end``), batch size 1.
        verifier: a :class:`~specdec.verify.Verifier` for steps with drafts (default: the lossless one exact for
            the draft's scheme, or greedy); steps without drafts take the argmax or sample, as HF does.
        profile: synchronise the device between phases and report their times in ``stats.phase_times``
            (adds syncs; for measurement only). The steps are those of an unprofiled run (same shapes, so a
            captured drafter replays the graphs the run captured).
        fast: the fast path (:mod:`specdec.static`): ``True`` (or ``"graphs"``): a preallocated KV cache, the
            target's forward captured as a CUDA graph per padded size, a graphable drafter wrapped by
            :func:`specdec.graphs.cuda_graphed`; ``"compile"``: the same, with each captured function (target
            forwards and drafter steps) compiled by ``torch.compile`` first (fused kernels; compiling costs seconds
            per shape on the first call). Same results as the eager path. On CPU the same static code runs
            without graphs (uncompiled); a model without static-cache support falls back to the eager path with
            one warning.
        max_cache_len: fast path only: allocate the static cache for sequences of at least this many tokens
            (prompt + new tokens; HF's ``max_cache_len``). On CUDA the cache and the steps captured on it are kept
            and reused by later calls that fit, so sizing it for the longest run of a session up front spares
            every re-capture (and, under ``"compile"``, every recompile, tens of seconds each) when a longer prompt
            comes. ``None``: sized for this call.

    Returns:
        :class:`GenerateOutput`.

    Example:
        >>> out = generate(model, ids, drafter=DraftModelDrafter(small), max_new_tokens=64)  # doctest: +SKIP
        >>> out.stats.tau                                                                     # doctest: +SKIP
    """
    # 1. Inputs: left-padded prompts, a causal LM, a drafter of its vocabulary, the run's randomness.
    pad_token_id = resolve_pad_token_id(target, pad_token_id)
    prompts = prepare_prompts(input_ids, attention_mask, pad_token_id=pad_token_id)
    _check_device(target, prompts.input_ids)
    embedding = target.get_input_embeddings() if hasattr(target, "get_input_embeddings") else None
    check_prompt_ids(prompts.input_ids, getattr(embedding, "num_embeddings", None))
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(f"{type(drafter).__name__} is not a drafter: it needs max_num_drafts, feature_layers, "
                        f"start(), propose() and update() (see specdec.drafters.Drafter).")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")
    stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or ())
    if stops and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer to decode the output: pass tokenizer=...")
    if max_cache_len is not None and (not fast or not isinstance(max_cache_len, int) or max_cache_len < 1):
        raise ValueError(f"max_cache_len sizes the fast path's static cache: pass an int >= 1 with fast=True or "
                         f"'compile', got max_cache_len={max_cache_len!r} with fast={fast!r}")
    adapter = target_adapter(target, drafter.feature_layers if drafter is not None else (), fast=fast,
                             prompt_len=prompts.input_ids.shape[1], max_new_tokens=max_new_tokens,
                             min_len=max_cache_len or 0)
    drafter = fast_drafter(drafter, fast_mode(fast)) if fast else drafter
    check_vocabularies(adapter.vocab_size, drafter, tokenizer)
    adapter.check_positions(prompts.input_ids.shape[1] - 1 + max_new_tokens)
    params = SamplingParams(temperature, top_k, top_p)
    source = _source(generator, source, params)
    max_k = drafter.max_num_drafts if drafter is not None else 0
    if not isinstance(schedule, Schedule):
        schedule = make_schedule(schedule if schedule is not None else max_k if num_drafts is None else num_drafts,
                                 max_k)
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or ())
    rows = Rows(prompts.lengths, max_new_tokens, eos=eos, stop_strings=stops, streamer=streamer,
                decode=(lambda t: tokenizer.decode(t, skip_special_tokens=False)) if stops else None)
    stats = StatsRecorder(max_k, prompts.input_ids.device, profile=profile)

    # 2. Prefill: the target runs the prompts; its last logits give each row's first token (the first root).
    stats.start()
    out = prefill(adapter, prompts.input_ids, prompts.attention_mask, drafter=drafter, sampling=params, source=source)
    stats.prefilled()
    if streamer is not None:
        streamer.put(prompts.input_ids.cpu())  # a copy to the host, once
    rows.absorb(out.emitted)

    # 3. Decode until every row is done: K from the schedule (bounded by budgets and positions), one step.
    # Sampling: each row's verify depth is cut on the device from its own root position (`last_roots`: the last
    # position a root may take with room for the step's next token), so what a row decides under the noise never
    # depends on what the host knows yet of the other rows (the fast path reads a step's tokens one step late).
    last_roots = None if params.is_greedy else torch.tensor(
        prompts.lengths, device=prompts.input_ids.device) + (max_new_tokens - 2)
    keep_shape = bool(fast) or not params.is_greedy  # see the last-step note below
    while rows.any_active:
        wanted = schedule(rows.num_active)
        depth = rows.num_drafts(wanted, adapter.max_positions)  # what the budgets let this step verify
        # Near the budgets the drafter still drafts the schedule's K (one shape for captured steps to the end), and
        # the step verifies no deeper than `depth`. On the fast path and when sampling that holds for a last step
        # with no room for a draft too (depth 0: only the root verified): on the greedy fast path ending on a plain
        # step would capture the plain forward and the drafter's plain update the first time a run ends so (~0.5 s
        # on the H200, session 19); when sampling, a plain step would draw its token from other noise than the step
        # with drafts that the other path (which learns the tokens later or sooner) may run there.
        k = rows.num_drafts(wanted, adapter.max_positions, budget=False) if depth or (keep_shape and wanted) else 0
        cut = depth
        if last_roots is not None and k and not rows.room_for(k):
            cut = (last_roots - out.state.cache.lengths).clamp_(min=0)  # per row, [B]
        active = rows.active_mask(prompts.input_ids.device)  # rebuilt only when a row has finished
        if stats.clock is not None:
            stats.clock.start()
        out = step(adapter, out.state, drafter=drafter, num_drafts=k, sampling=params, source=source,
                   active=active, verifier=verifier, clock=stats.clock, sync=False, max_depth=cut)
        # A step with drafts synchronised once (out.emitted is on the host); a plain one left its tokens on their
        # way, and rows read them after the next step is queued (so the host's work overlaps the device's).
        stats.record(out.emitted, rows.active, out.draft, out.result, active)
        rows.absorb(out.emitted)

    # 4. Outputs: prompts + each row's tokens, and the statistics (one sync for the per-depth counters).
    rows.finish()
    fill = pad_token_id if pad_token_id is not None else (min(eos) if eos else 0)
    sequences, num_new = rows.sequences(prompts.input_ids, fill)
    return GenerateOutput(sequences, num_new, stats.finish(int(num_new.sum()), out.state.drafter_state))


def _source(generator: torch.Generator | None, source: RandomSource | None, params: SamplingParams):
    """The run's one :class:`~specdec.sampling.RandomSource` (``None`` when greedy and none given)."""
    if generator is not None and source is not None:
        raise ValueError("pass the randomness once: generator=torch.Generator(...) or source=RandomSource, not both")
    given = source if source is not None else generator
    if given is None and params.is_greedy:
        return None
    return as_source(given)
