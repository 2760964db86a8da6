"""``generate()``: the speculative decoding loop around any HuggingFace causal LM.

The loop only wires blocks (DESIGN.md, "One decoding step, as data"): a drafter proposes a tree, the
target adapter runs it under a tree mask, a verifier accepts a path, the adapter keeps that path in the
cache, and the drafter learns the outcome. A method (SpS, EAGLE-2, prompt lookup, ...) is a choice of
drafter (+ its verifier); nothing in this file knows about any of them.
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple, Sequence

import torch

from .adapter import ModelAdapter
from .drafters.base import Drafter, Feedback, ProposeRequest
from .sampling import as_source, process_logits
from .schedule import Schedule, make_schedule
from .types import Draft, DraftScheme, SamplingParams, VerifyResult
from .verify import select_verifier, verify_greedy

__all__ = ["generate", "GenerateOutput", "GenerationStats"]


class GenerationStats(NamedTuple):
    """Measured statistics of one ``generate()`` call.

    Attributes:
        num_new_tokens: tokens emitted, summed over rows (after EOS / stop / budget truncation).
        num_target_forwards: target forwards including the prompt's (prefill) pass.
        num_steps: decoding steps (verification forwards) = ``num_target_forwards - 1``.
        num_draft_forwards: forwards of the drafter's network (0 for model-free drafters).
        tau: mean tokens emitted per verification forward and active row, next token included (the
            "mean acceptance length" of the EAGLE and Medusa tables).
        acceptance_per_depth: for d = 1..D, the fraction of (row, step) pairs with a draft at depth d in
            which a depth-d draft was accepted.
        num_accepted_per_step: per step, the accepted drafts of each active row (lists of ints).
        wall_time: seconds from the start of the prefill to the end of the loop (device synchronised).
        prefill_time: seconds of the prompt's pass (synchronised).
        depth_tries: per depth d, (row, step) pairs that drafted depth d.
        depth_hits: per depth d, (row, step) pairs that accepted a depth-d draft.
        phase_times: with ``profile=True``, synchronised seconds spent per phase of the step
            (``draft``, ``target``, ``verify``, ``commit``, ``update``); else ``None``.
    """

    num_new_tokens: int
    num_target_forwards: int
    num_steps: int
    num_draft_forwards: int
    tau: float
    acceptance_per_depth: tuple[float, ...]
    num_accepted_per_step: list
    wall_time: float
    prefill_time: float
    depth_tries: tuple[int, ...] = ()
    depth_hits: tuple[int, ...] = ()
    phase_times: dict | None = None

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of wall time."""
        return self.num_new_tokens / self.wall_time if self.wall_time > 0 else float("nan")


class GenerateOutput(NamedTuple):
    """Output of :func:`generate`.

    Attributes:
        sequences: Shape ``[B, T + max_len]``: the (left-padded) prompts followed by each row's new tokens,
            right-padded with ``pad_token_id``.
        num_new_tokens: Shape ``[B]``, new tokens per row.
        stats: :class:`GenerationStats`.
    """

    sequences: torch.Tensor
    num_new_tokens: torch.Tensor
    stats: GenerationStats


def _empty_draft(batch_size: int, device) -> Draft:
    z = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
    return Draft(z[:, :0], z - 1, z, None, DraftScheme.DETERMINISTIC)


def _sync(device) -> None:
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_inputs(target, input_ids, attention_mask, drafter, max_new_tokens, stop_strings, tokenizer):
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape [B, T], got {tuple(input_ids.shape)}; add a batch "
                         f"dimension with input_ids[None].")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: give at least one prompt token.")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids "
                         f"{tuple(input_ids.shape)}.")
    if attention_mask is not None and not bool(attention_mask.bool().any(1).all()):
        raise ValueError("a row of attention_mask has no real token: every prompt needs at least one.")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer to decode the output: pass tokenizer=...")
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(f"{type(drafter).__name__} is not a drafter: it needs max_num_drafts, "
                        f"feature_layers, start(), propose() and update() (see specdec.drafters.Drafter).")
    vocab = getattr(target.config, "vocab_size", None)
    dvocab = getattr(drafter, "vocab_size", None)
    if vocab is not None and dvocab is not None and dvocab != vocab:
        raise ValueError(f"the drafter's vocabulary ({dvocab} tokens) differs from the target's ({vocab}): "
                         f"draft and target must share one tokenizer.")


def _stop_index(text_of: Callable[[list], str], tokens: list, stop_strings: Sequence[str]) -> int | None:
    """Smallest t such that the decoded ``tokens[:t]`` contains a stop string, or None."""
    if not any(s in text_of(tokens) for s in stop_strings):
        return None
    lo, hi = 1, len(tokens)
    while lo < hi:  # the predicate is monotone in t
        mid = (lo + hi) // 2
        if any(s in text_of(tokens[:mid]) for s in stop_strings):
            hi = mid
        else:
            lo = mid + 1
    return lo


@torch.no_grad()
def generate(
    target,
    input_ids: torch.Tensor,
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
    streamer=None,
    verifier: Callable[..., VerifyResult] | None = None,
    profile: bool = False,
) -> GenerateOutput:
    """Decode with speculative decoding (or plainly, with ``drafter=None``) around an HF causal LM.

    Args:
        target: an HF causal LM (``sdpa`` or ``eager`` attention).
        input_ids: Shape ``[B, T]``, left-padded prompts.
        attention_mask: Shape ``[B, T]``, 1 for real tokens.
        drafter: a :class:`~specdec.drafters.Drafter`; ``None`` decodes one token per target forward.
        num_drafts: ``K`` for every step (default: the drafter's ``max_num_drafts``).
        schedule: Dynamic SD, ``[[start_bs, end_bs, K], ...]`` or a :class:`~specdec.schedule.Schedule`;
            K is looked up each step from the number of active rows (K = 0: a plain step).
        max_new_tokens: new tokens per row, never exceeded.
        temperature, top_k, top_p: sampling parameters (temperature 0 = greedy), applied identically to
            target and draft.
        eos_token_id: a row stops right after emitting one of these. ``None`` (the default) takes the model's
            ``generation_config.eos_token_id``, as HF ``generate`` does; ``[]`` never stops at EOS.
        pad_token_id: fills ``sequences`` after a row's end (default: the model's, else EOS, else 0).
        stop_strings: a row stops right after the token that completes one of these (needs ``tokenizer``).
        tokenizer: decodes outputs for ``stop_strings``.
        generator: the randomness for ``temperature > 0`` (required then; never the global RNG).
        streamer: an HF streamer (``put`` / ``end``), batch size 1.
        verifier: override the verifier (default: the lossless one exact for the draft's scheme, or greedy).
        profile: synchronise the device between phases and report their times in ``stats.phase_times``
            (adds syncs; for measurement only).

    Returns:
        :class:`GenerateOutput`.

    Example:
        >>> out = generate(model, ids, drafter=DraftModelDrafter(small), max_new_tokens=64)  # doctest: +SKIP
        >>> out.stats.tau                                                                     # doctest: +SKIP
    """
    _check_inputs(target, input_ids, attention_mask, drafter, max_new_tokens, stop_strings, tokenizer)
    params = SamplingParams(temperature, top_k, top_p)
    source = None if params.is_greedy else as_source(generator)
    device = input_ids.device
    B, T = input_ids.shape
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
    stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or ())
    if pad_token_id is None:
        pad_token_id = getattr(target.config, "pad_token_id", None)
        pad_token_id = pad_token_id if pad_token_id is not None else (min(eos) if eos else 0)
    max_k = drafter.max_num_drafts if drafter is not None else 0
    if schedule is None:
        schedule = make_schedule(max_k if num_drafts is None else num_drafts, max_k)
    elif not isinstance(schedule, Schedule):
        schedule = make_schedule(schedule, max_k)
    adapter = ModelAdapter(target, drafter.feature_layers if drafter is not None else ())
    adapter.check_positions(T - 1 + max_new_tokens)

    def pick(probs_or_logits: torch.Tensor) -> torch.Tensor:
        if params.is_greedy:
            return probs_or_logits.argmax(-1)
        return source.categorical(process_logits(probs_or_logits, params))

    _sync(device)
    t0 = time.perf_counter()
    # 1. Prefill: the target runs the prompt; its last logits give the first new token (the first root).
    out, cache = adapter.prefill(input_ids, attention_mask)
    roots = pick(out.logits[:, -1].float())
    valid = cache.committed_valid
    positions = (valid.long().cumsum(1) - 1).clamp_(min=0)
    state = None
    if drafter is not None:
        next_in_prompt = torch.cat([input_ids[:, 1:], roots[:, None]], 1)
        state = drafter.start(Feedback(input_ids, next_in_prompt, positions, valid, out.features, roots))
    _sync(device)
    prefill_time = time.perf_counter() - t0
    if streamer is not None:
        streamer.put(input_ids.cpu())

    generated: list[list[int]] = [[] for _ in range(B)]
    active = [True] * B
    lengths = cache.lengths.tolist()  # host copy of committed tokens per row (one sync, here only)
    steps, accepted_log = 0, []
    clock = _PhaseClock(device if profile else None)
    depth_tries = torch.zeros(max_k, dtype=torch.long, device=device)
    depth_hits = torch.zeros(max_k, dtype=torch.long, device=device)
    tau_num = tau_den = 0
    max_pos = adapter.max_positions

    def emit(row: int, tokens: list[int]) -> None:
        room = max_new_tokens - len(generated[row])
        tokens = tokens[:room]
        for j, tok in enumerate(tokens):
            if tok in eos:
                tokens = tokens[: j + 1]
                active[row] = False
                break
        generated[row].extend(tokens)
        if stops:
            cut = _stop_index(lambda t: tokenizer.decode(t, skip_special_tokens=False), generated[row], stops)
            if cut is not None:
                del generated[row][cut:]
                active[row] = False
        if len(generated[row]) >= max_new_tokens:
            active[row] = False
        if streamer is not None and tokens:
            streamer.put(torch.tensor(tokens))

    first = roots.tolist()
    for b in range(B):
        emit(b, [first[b]])

    active_t, active_seen = None, None
    while any(active):
        n_active = sum(active)
        if active != active_seen:  # rebuilt only when a row finishes
            active_t, active_seen = torch.tensor(active, device=device), list(active)
        # 2. K from the Dynamic SD schedule, bounded by the remaining budget and the model's positions.
        remaining = max(max_new_tokens - len(generated[b]) for b in range(B) if active[b])
        k = min(schedule(n_active), remaining - 1)
        if max_pos is not None:
            k = min(k, max_pos - 1 - max(lengths[b] for b in range(B) if active[b]))
        clock.start()
        # 3. Draft: a tree per row (a chain is a tree); K = 0 is a plain decoding step.
        if drafter is not None and k > 0:
            draft, state = drafter.propose(state, ProposeRequest(
                roots=roots, root_positions=cache.lengths, num_drafts=k, sampling=params, source=source,
                active=active_t))
        else:
            draft = _empty_draft(B, device)
        clock.tick("draft")
        # 4. Target forward over [root] + drafts with the tree mask, positions = prefix length + depth.
        tokens = torch.cat([roots[:, None], draft.tokens], 1)
        present = draft.parents >= 0
        present[:, 0] = True  # the root (parent -1) is always there; other nodes with parent -1 are absent
        out, pending = adapter.forward(cache, tokens, draft.parents, cache.lengths[:, None] + draft.depths, present)
        clock.tick("target")
        # 5. Verify: the accepted path, its length and the next (bonus or recovered) token per row.
        depth = k if draft.num_nodes else 0  # drafts never go deeper than K: no sync to find the depth
        if verifier is not None:
            target_in = out.logits.float() if params.is_greedy else process_logits(out.logits.float(), params)
            result = verifier(target_in, draft) if params.is_greedy else verifier(target_in, draft, source)
        elif params.is_greedy:
            result = verify_greedy(out.logits, draft, max_depth=depth)
        else:
            result = select_verifier(draft.scheme, params)(process_logits(out.logits.float(), params), draft,
                                                            source, max_depth=depth)
        path = result.accepted_nodes
        path_tokens = tokens.gather(1, path.clamp(min=0))
        emitted = torch.cat([path_tokens[:, 1:], path_tokens[:, :1]], 1)
        emitted.scatter_(1, result.num_accepted[:, None], result.next_tokens[:, None])
        # The one host sync of the step: how many tokens each row emitted, and which.
        host = torch.cat([result.num_accepted[:, None], emitted], 1).tolist()
        clock.tick("verify")
        # 6. Keep only each row's accepted path (root + accepted drafts) in the cache; finished rows keep none.
        width = max(host[b][0] + 1 for b in range(B) if active[b])
        counts = (result.num_accepted + 1) * active_t
        cache = adapter.commit(pending, path[:, :width], counts)
        clock.tick("commit")
        # 7. Emit accepted tokens + next token; stop rows at EOS, stop strings and max_new_tokens.
        steps += 1
        step_accepts = []
        for b in range(B):
            if not active[b]:
                continue
            n_acc = host[b][0]
            step_accepts.append(n_acc)
            tau_num += n_acc + 1
            tau_den += 1
            lengths[b] += n_acc + 1
            emit(b, host[b][1 : n_acc + 2])
        accepted_log.append(step_accepts)
        _record_depths(draft, result, active_t, depth_tries, depth_hits)
        # 8. The drafter absorbs the outcome: committed tokens and the target's features at them.
        roots = result.next_tokens
        if drafter is not None:
            ar = torch.arange(width, device=device)[None, :]
            fb_valid = ar < counts[:, None]
            feats = tuple(f.gather(1, path[:, :width, None].clamp(min=0).expand(-1, -1, f.shape[-1]))
                          for f in out.features)
            state = drafter.update(state, Feedback(
                path_tokens[:, :width], emitted[:, :width], pending.lengths[:, None] + ar, fb_valid, feats,
                roots, path[:, :width]))
        clock.tick("update")

    _sync(device)
    wall = time.perf_counter() - t0
    if streamer is not None:
        streamer.end()
    lens = [len(g) for g in generated]
    new = torch.full((B, max(lens)), pad_token_id, dtype=input_ids.dtype)
    for b, g in enumerate(generated):
        new[b, : len(g)] = torch.tensor(g, dtype=input_ids.dtype)
    sequences = torch.cat([input_ids, new.to(device)], 1)
    stats = GenerationStats(
        num_new_tokens=sum(lens),
        num_target_forwards=steps + 1,
        num_steps=steps,
        num_draft_forwards=int(getattr(state, "num_forwards", 0) or 0),
        tau=tau_num / tau_den if tau_den else float("nan"),
        acceptance_per_depth=tuple(h / t for h, t in zip(depth_hits.tolist(), depth_tries.tolist()) if t),
        num_accepted_per_step=accepted_log,
        wall_time=wall,
        prefill_time=prefill_time,
        depth_tries=tuple(depth_tries.tolist()),
        depth_hits=tuple(depth_hits.tolist()),
        phase_times=clock.totals if profile else None,
    )
    return GenerateOutput(sequences, torch.tensor(lens), stats)


class _PhaseClock:
    """Synchronised per-phase timer; a no-op unless given a device."""

    def __init__(self, device):
        self.device = device
        self.totals: dict[str, float] = {}
        self._t = 0.0

    def start(self) -> None:
        if self.device is not None:
            _sync(self.device)
            self._t = time.perf_counter()

    def tick(self, phase: str) -> None:
        if self.device is not None:
            _sync(self.device)
            now = time.perf_counter()
            self.totals[phase] = self.totals.get(phase, 0.0) + now - self._t
            self._t = now


def _record_depths(draft: Draft, result: VerifyResult, active: torch.Tensor, tries: torch.Tensor,
                   hits: torch.Tensor) -> None:
    """Add, per depth d = 1..len(tries), rows that drafted depth d and rows that accepted a depth-d draft.

    Stays on the device (no host sync); read once at the end.
    """
    if draft.num_nodes == 0 or tries.numel() == 0:
        return
    drafted_depth = draft.depths.masked_fill(draft.parents < 0, 0).amax(1)  # [B]
    d = torch.arange(1, tries.numel() + 1, device=tries.device)[None, :]
    tries += ((drafted_depth[:, None] >= d) & active[:, None]).sum(0)
    hits += ((result.num_accepted[:, None] >= d) & active[:, None]).sum(0)
