"""Train EAGLE heads against any HF causal LM on any text (online: the frozen target runs inside each step).

- :func:`train_eagle1`: EAGLE-1 objective. The head sees ``(f_t + noise, x_{t+1})`` and regresses the target's
  next feature ``f_{t+1}`` (SmoothL1) while matching the target's next-token distribution through the target's
  ``lm_head`` (soft cross-entropy); weights 1.0 / 0.1 and uniform feature noise as the authors.
- :func:`train_eagle3`: EAGLE-3 objective with *training-time test*: ``ttt_steps`` unrolled draft steps, step
  ``i`` feeding the head's own output of step ``i - 1`` back (as at inference), each step's query seeing the
  true context plus its own chain of earlier draft steps; soft cross-entropy against the target distribution
  restricted to the draft vocabulary, step weights ``0.8 ** i``.
- :func:`build_draft_vocab`: the EAGLE-3 reduced vocabulary from token frequencies (``d2t`` offsets, ``t2d``).

Both run on the project's one loop, :func:`specdec.training.loop.fit`: AdamW (betas 0.9 / 0.95), linear warm-up
then cosine decay, gradient clipping, a tqdm bar; here add bf16 autocast on CUDA, random windows of a token stream
(:func:`~specdec.training.loop.sample_windows`), periodic checkpoints in the format
:func:`specdec.formats.load_eagle_head` reads.

References:
    EAGLE arXiv 2401.15077 (Sec. 4.2, training); EAGLE-3 arXiv 2503.01840 (training-time test, Sec. 3);
    authors' ``train/main.py`` and ``traineagle3/cnets.py``.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..formats.eagle import save_eagle_head
from ..heads.eagle import Eagle1Head, Eagle3Head, target_dims
from .loop import cosine_schedule, fit, sample_windows

__all__ = [
    "TrainRecord",
    "TrainResult",
    "build_draft_vocab",
    "draft_vocab_size_for_coverage",
    "token_stream",
    "train_eagle1",
    "train_eagle3",
    "ttt_forward",
]


class TrainRecord(NamedTuple):
    """One optimisation step of a training run.

    Attributes:
        step: 1-based step number.
        loss: the total loss that was minimised.
        token_loss: soft cross-entropy to the target (EAGLE-3: step 0's).
        feature_loss: SmoothL1 feature regression (EAGLE-1; 0 for EAGLE-3).
        accuracy: fraction of positions where the head's top-1 equals the target's top-1 (step 0).
        lr: learning rate used.
    """

    step: int
    loss: float
    token_loss: float
    feature_loss: float
    accuracy: float
    lr: float


class TrainResult(NamedTuple):
    """What a training run returns.

    Attributes:
        head: the trained head (in the target's dtype, eval mode).
        history: one :class:`TrainRecord` per step.
    """

    head: torch.nn.Module
    history: list


# --------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------


def build_draft_vocab(token_counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Build the EAGLE-3 draft vocabulary: the ``draft_vocab_size`` most frequent target tokens.

    Ties are broken toward the smaller id; the kept ids are sorted ascending.

    .. math::
        \\mathrm{used} = \\mathrm{sort}(\\mathrm{top}_n(\\mathrm{counts})), \\quad d2t[i] = \\mathrm{used}[i] - i,
        \\quad t2d[v] = [v \\in \\mathrm{used}]

    Args:
        token_counts: occurrences of each target token in the training text. Shape: ``[V]``.
        draft_vocab_size: ``V'``, ``1 <= V' <= V``.

    Returns:
        ``(d2t, t2d)``: Shape ``[V']`` int64 offsets (``target_id = i + d2t[i]``) and Shape ``[V]`` bool.

    Example:
        >>> d2t, t2d = build_draft_vocab(torch.tensor([5, 0, 9, 1]), 2)
        >>> (torch.arange(2) + d2t).tolist(), t2d.tolist()
        ([0, 2], [True, False, True, False])

    References:
        EAGLE-3 arXiv 2503.01840; authors' ``traineagle3`` ``scandata`` (offset convention, read by vLLM/SGLang).
    """
    counts = torch.as_tensor(token_counts).flatten().to(torch.float64).cpu()
    V = counts.shape[0]
    if not 1 <= draft_vocab_size <= V:
        raise ValueError(f"draft_vocab_size must lie in [1, {V}] (the target vocabulary), got {draft_vocab_size}")
    order = torch.sort(-counts, stable=True).indices[:draft_vocab_size]
    used = order.sort().values
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def draft_vocab_size_for_coverage(token_counts: torch.Tensor, coverage: float) -> int:
    """Smallest EAGLE-3 draft vocabulary whose most frequent tokens cover ``coverage`` of the token occurrences.

    A token outside the draft vocabulary can never be drafted, so the uncovered fraction bounds acceptance. On an
    8k-token code model, 4096 tokens covered only 93.3% of held-out tokens (docs/eagle.md); a coverage target
    sizes the vocabulary from the data instead.

    Args:
        token_counts: occurrences of each target token. Shape: ``[V]``.
        coverage: wanted fraction of occurrences, in ``(0, 1]``.

    Returns:
        ``n`` in ``[1, V]``: the smallest ``n`` with ``sum(top_n(counts)) >= coverage * sum(counts)``.

    Example:
        >>> draft_vocab_size_for_coverage(torch.tensor([5, 0, 90, 5]), 0.95)
        2
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must lie in (0, 1], got {coverage}")
    counts = torch.as_tensor(token_counts).flatten().to(torch.float64).cpu()
    total = float(counts.sum())
    if total <= 0:
        raise ValueError("token_counts has no occurrences: count tokens of the training text first")
    mass = torch.sort(counts, descending=True).values.cumsum(0)
    n = int(torch.searchsorted(mass, coverage * total * (1 - 1e-12))) + 1
    return min(max(n, 1), counts.shape[0])


def token_stream(data, tokenizer=None, separator: int | None = None) -> torch.Tensor:
    """Concatenate training data into one token stream.

    Args:
        data: texts (``str``, needs ``tokenizer``), token-id sequences (lists or 1-D tensors), or a 2-D tensor
            of token ids ``[num, T]`` (rows concatenated).
        tokenizer: an HF tokenizer for texts.
        separator: token put between documents (default: the tokenizer's EOS, if any).

    Returns:
        Shape ``[T_total]`` int64 on CPU.

    References:
        GPT-2-style packed language-model training.
    """
    if isinstance(data, torch.Tensor):
        return data.reshape(-1).long().cpu()
    if separator is None and tokenizer is not None:
        separator = tokenizer.eos_token_id
    pieces = []
    for item in data:
        if isinstance(item, str):
            if tokenizer is None:
                raise ValueError("the training data are texts: pass tokenizer=... to tokenize them")
            ids = torch.tensor(tokenizer(item, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.long)
        else:
            ids = torch.as_tensor(item, dtype=torch.long).reshape(-1).cpu()
        pieces.append(ids)
        if separator is not None:
            pieces.append(torch.tensor([separator], dtype=torch.long))
    if not pieces:
        raise ValueError("no training data")
    return torch.cat(pieces)


# --------------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------------


def _target_forward(target, batch: torch.Tensor, layers: Sequence[int]):
    with torch.no_grad():
        out = target(input_ids=batch, output_hidden_states=True, use_cache=False)
    return tuple(out.hidden_states[i] for i in layers), out.logits


def _fit(head, sample, loss_fn, *, steps, lr, warmup_steps, weight_decay, grad_clip, amp, out_dir, save_every,
         progress, desc) -> TrainResult:
    """Train ``head`` on :func:`~specdec.training.loop.fit` (fp32 master weights, bf16 autocast on CUDA).

    ``loss_fn(batch) -> (loss, token_loss, feature_loss, accuracy)`` (0-d tensors); ``sample()`` draws a batch.
    """
    device = head.device
    final_dtype = head.dtype
    for p in head.parameters():  # fp32 master weights; frozen target buffers stay as they are
        p.data = p.data.float()
    head.train()
    warmup = min(steps // 10, 100) if warmup_steps is None else warmup_steps
    use_amp = amp and device.type == "cuda"
    keep = out_dir is not None and bool(save_every)
    seen: list[tuple] = []  # detached per-step values, read only when a checkpoint writes its history

    def step_loss(step: int):
        batch = sample()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            loss, token_loss, feature_loss, accuracy = loss_fn(batch)
        metrics = {"token_loss": token_loss, "feature_loss": feature_loss, "acc": accuracy}
        if keep:
            seen.append((step, loss.detach(), token_loss.detach(), feature_loss.detach(), accuracy.detach()))
        return loss, metrics

    def records_so_far() -> list[TrainRecord]:
        values = torch.stack([torch.stack([v.float() for v in row[1:]]) for row in seen]).tolist()
        return [TrainRecord(step + 1, *vals, cosine_schedule(step, total_steps=steps, peak_lr=lr,
                                                               warmup_steps=max(warmup, 1)))
                for (step, *_), vals in zip(seen, values)]

    def checkpoint(done: int) -> None:
        if done < steps:  # the final checkpoint is written below, in the head's own dtype
            _checkpoint(head, Path(out_dir) / f"step-{done}", records_so_far())

    fitted = fit(head.parameters(), step_loss, steps=steps, lr=lr, warmup_steps=max(warmup, 1),
                 weight_decay=weight_decay, betas=(0.9, 0.95), grad_clip=grad_clip, desc=desc, progress=progress,
                 checkpoint_every=save_every if out_dir is not None else 0,
                 checkpoint_fn=checkpoint if out_dir is not None else None)
    history = [TrainRecord(r.step, r.loss, r.metrics["token_loss"], r.metrics["feature_loss"], r.metrics["acc"], r.lr)
               for r in fitted]
    head.eval()
    for p in head.parameters():
        p.data = p.data.to(final_dtype)
    if out_dir is not None:
        _checkpoint(head, Path(out_dir) / "final", history)
    return TrainResult(head, history)


def _checkpoint(head, folder: Path, history) -> None:
    save_eagle_head(head, folder)
    (folder / "history.json").write_text(json.dumps([r._asdict() for r in history]))


def _setup(target, data, tokenizer, seq_len, batch_size, seed):
    device = target.get_input_embeddings().weight.device
    stream = token_stream(data, tokenizer)
    if stream.numel() < seq_len:
        raise ValueError(f"the training data have {stream.numel()} tokens, fewer than one window of seq_len + 1 = "
                         f"{seq_len}: lower seq_len or give more text")
    generator = torch.Generator().manual_seed(seed)
    on_device = stream.to(device)
    return device, stream, lambda: sample_windows(on_device, batch_size, seq_len, generator=generator)


def _soft_ce(draft_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    return -(target_probs * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)


# --------------------------------------------------------------------------------------------------------
# EAGLE-1
# --------------------------------------------------------------------------------------------------------


def train_eagle1(target, data, *, tokenizer=None, head: Eagle1Head | None = None, steps: int = 1000,
                 batch_size: int = 8, seq_len: int = 512, lr: float = 3e-4, warmup_steps: int | None = None,
                 weight_decay: float = 0.0, grad_clip: float = 0.5, feature_weight: float = 1.0,
                 token_weight: float = 0.1, noise_std: float = 0.2, num_layers: int = 1, amp: bool = True,
                 out_dir=None, save_every: int = 0, progress: bool = True, seed: int = 0) -> TrainResult:
    """Train an EAGLE-1 head (feature regression + token cross-entropy) against ``target``.

    .. math::
        \\mathcal{L} = w_f\\, \\mathrm{SmoothL1}(\\hat f_{t+1}, f_{t+1})
        + w_p\\, \\mathrm{CE}(p_{target}(\\cdot \\mid x_{\\le t+1}),
        \\ \\mathrm{softmax}(\\mathrm{lm\\_head}(\\hat f_{t+1}))),
        \\qquad \\hat f_{t+1} = \\mathrm{head}(f_t + u, x_{t+1}),
        \\ u \\sim U(-\\tfrac{s}{2}, \\tfrac{s}{2}) \\cdot 512 / T

    Args:
        target: any HF causal LM (frozen; runs under ``no_grad``); the head is trained on its device.
        data: texts (with ``tokenizer``), token sequences, or a 2-D tensor of token ids (see :func:`token_stream`).
        tokenizer: HF tokenizer for texts.
        head: continue training this head (default: a fresh ``Eagle1Head.from_target``).
        steps, batch_size, seq_len: optimisation steps; windows per step; tokens per window.
        lr, warmup_steps, weight_decay, grad_clip: AdamW (betas 0.9 / 0.95), linear warm-up then cosine decay
            to 10 %; ``warmup_steps`` default ``min(steps // 10, 100)``.
        feature_weight, token_weight: ``w_f``, ``w_p`` (authors: 1.0, 0.1).
        noise_std: ``s`` of the uniform feature noise (authors: 0.2).
        num_layers: decoder layers of a fresh head.
        amp: bf16 autocast on CUDA.
        out_dir: where to save checkpoints (``step-N/``, ``final/``), each loadable with ``load_eagle_head``.
        save_every: checkpoint period in steps (0: only the final one).
        progress: show a tqdm bar.
        seed: seeds the window sampler and the noise (the global RNG is never used).

    Returns:
        :class:`TrainResult` ``(head, history)``.

    References:
        EAGLE arXiv 2401.15077, Sec. 4.2; authors' ``train/main.py`` (``p_w = 0.1``, ``v_w = 1.0``,
        ``AddUniformNoise(std=0.2)``).
    """
    if head is None:
        head = Eagle1Head.from_target(target, num_layers=num_layers)
    _check_head_target(head, target)
    device, _, sample = _setup(target, data, tokenizer, seq_len + 1, batch_size, seed)
    noise_gen = torch.Generator(device=device).manual_seed(seed + 1)
    layer = head.feature_layers[0]

    def loss_fn(batch):
        (feats,), logits = _target_forward(target, batch, (layer,))
        B, T = batch.shape
        f_in = feats[:, :-1].float()
        noise = (torch.rand(f_in.shape, generator=noise_gen, device=device) - 0.5) * noise_std * 512 / (T - 1)
        positions = torch.arange(T - 1, device=device)[None].expand(B, -1)
        pred = head(batch[:, 1:], (f_in + noise).to(head.dtype), positions)
        feature_loss = F.smooth_l1_loss(pred.float(), feats[:, 1:].float())
        draft_logits = head.logits(pred)
        target_logits = logits[:, 1:].float()
        token_loss = _soft_ce(draft_logits, torch.softmax(target_logits, -1)).mean()
        accuracy = (draft_logits.argmax(-1) == target_logits.argmax(-1)).float().mean()
        return feature_weight * feature_loss + token_weight * token_loss, token_loss, feature_loss, accuracy

    return _fit(head, sample, loss_fn, steps=steps, lr=lr, warmup_steps=warmup_steps,
                weight_decay=weight_decay, grad_clip=grad_clip, amp=amp, out_dir=out_dir, save_every=save_every,
                progress=progress, desc="EAGLE-1")


# --------------------------------------------------------------------------------------------------------
# EAGLE-3 (training-time test)
# --------------------------------------------------------------------------------------------------------


def _ttt_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, extra_k: list, extra_v: list) -> torch.Tensor:
    """Attention of unrolled step ``i``: causal over step 0's keys, plus the same position's keys of steps 1..i.

    Shapes: ``q [B, nh, T, hd]``, ``k0/v0 [B, nkv, T, hd]``, each extra ``[B, nkv, T, hd]``.
    """
    rep = q.shape[1] // k0.shape[1]
    if rep > 1:
        k0, v0 = k0.repeat_interleave(rep, 1), v0.repeat_interleave(rep, 1)
        extra_k = [k.repeat_interleave(rep, 1) for k in extra_k]
        extra_v = [v.repeat_interleave(rep, 1) for v in extra_v]
    T = q.shape[2]
    scale = q.shape[-1] ** -0.5
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    context = (q @ k0.transpose(-1, -2)).float().mul(scale).masked_fill(~causal, float("-inf"))
    own = torch.stack([(q * k).sum(-1) for k in extra_k], dim=-1).float().mul(scale)
    weights = torch.softmax(torch.cat([context, own], dim=-1), dim=-1).to(v0.dtype)
    out = weights[..., :T] @ v0
    for j, v in enumerate(extra_v):
        out = out + weights[..., T + j, None] * v
    return out


def ttt_forward(head, tokens: torch.Tensor, hidden: torch.Tensor, num_steps: int) -> list:
    """Unroll a head for training-time test: step ``i`` re-reads its own step ``i - 1`` output.

    Step ``i`` at index ``t`` pairs token ``tokens[:, t + 1 + i]`` with the hidden state of step ``i - 1`` at
    ``t`` (step 0: ``hidden[:, t]``), sits at RoPE position ``t + i``, and attends to step 0's keys at indices
    ``<= t`` plus the keys of steps ``1..i`` at index ``t``: exactly what a depth-``(i + 1)`` tree node sees at
    inference (the committed context and its own ancestors).

    Args:
        head: an EAGLE head (EAGLE-3 in the authors' recipe; any head works).
        tokens: a window of token ids. Shape: ``[B, T]``.
        hidden: step 0's conditioning hidden states for indices ``0..T-2``. Shape: ``[B, T - 1, H]``.
        num_steps: ``S``, unrolled steps (``<= T - 1``).

    Returns:
        ``S`` tensors; step ``i`` has shape ``[B, T - 1 - i, H]`` (pre-norm outputs).

    References:
        EAGLE-3 arXiv 2503.01840, Sec. 3 ("training-time test"); authors' ``traineagle3/cnets.py``.
    """
    B, T = tokens.shape
    L = T - 1
    if not 1 <= num_steps <= L:
        raise ValueError(f"num_steps must lie in [1, {L}] for windows of {T} tokens, got {num_steps}")
    if hidden.shape[:2] != (B, L):
        raise ValueError(f"hidden must have shape [B={B}, T-1={L}, H], got {tuple(hidden.shape)}")
    context: list = [None] * len(head.layers)
    extras: list = [([], []) for _ in head.layers]
    outputs = []
    for i in range(num_steps):
        n = L - i
        ids = tokens[:, 1 + i: 1 + i + n]
        positions = (torch.arange(n, device=tokens.device) + i)[None].expand(B, -1)

        def attend_for_layer(layer: int, i=i, n=n):
            def attend(q, k, v):
                if i == 0:
                    context[layer] = (k, v)
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
                ks, vs = extras[layer]
                ks.append(k)
                vs.append(v)
                k0, v0 = context[layer]
                return _ttt_attention(q, k0[:, :, :n], v0[:, :, :n], [x[:, :, :n] for x in ks],
                                      [x[:, :, :n] for x in vs])
            return attend

        out = head.run_layers(ids, hidden, positions, attend_for_layer)
        outputs.append(out)
        hidden = out[:, :-1]  # step i + 1 covers one index fewer
    return outputs


def train_eagle3(target, data, *, tokenizer=None, head: Eagle3Head | None = None,
                 draft_vocab_size: int | None = None, draft_vocab_coverage: float | None = None,
                 feature_layers: Sequence[int] | None = None,
                 ttt_steps: int = 7, step_weight: float = 0.8, steps: int = 1000, batch_size: int = 8,
                 seq_len: int = 512, lr: float = 3e-4, warmup_steps: int | None = None, weight_decay: float = 0.0,
                 grad_clip: float = 0.5, num_layers: int = 1, amp: bool = True, out_dir=None, save_every: int = 0,
                 progress: bool = True, seed: int = 0) -> TrainResult:
    """Train an EAGLE-3 head with training-time test against ``target``.

    Step ``i = 0..S-1`` at index ``t`` reads token ``x_{t+1+i}`` and the hidden state of step ``i - 1`` (step 0:
    ``fc`` of the fused target features ``f_t``), sits at RoPE position ``t + i``, and attends to step 0's keys at
    indices ``<= t`` plus steps ``1..i``'s keys at index ``t`` (its own draft chain, as a tree branch at inference).

    .. math::
        \\mathcal{L} = \\sum_{i=0}^{S-1} \\lambda^i\\,
        \\frac{\\sum_t m_{i,t}\\, \\mathrm{CE}(\\mathrm{softmax}(z^{target}_{t+1+i}[\\mathrm{draft\\ vocab}]),
        \\ q_{i,t})}
        {\\sum_t m_{i,t}}

    with ``m`` masking positions whose target argmax lies outside the draft vocabulary (as the authors).

    Args:
        target: any HF causal LM (frozen).
        data: texts (with ``tokenizer``), token sequences, or a 2-D tensor of ids (see :func:`token_stream`).
        tokenizer: HF tokenizer for texts.
        head: continue training this head (default: a fresh ``Eagle3Head.from_target``).
        draft_vocab_size: reduced vocabulary of a fresh head, from the data's token counts
            (:func:`build_draft_vocab`); ``None`` keeps the full vocabulary.
        draft_vocab_coverage: instead of a size, the fraction of the data's token occurrences the reduced
            vocabulary must cover (:func:`draft_vocab_size_for_coverage`); exclusive with ``draft_vocab_size``.
        feature_layers: target layers of a fresh head (default ``(2, N // 2, N - 3)``).
        ttt_steps: ``S``, unrolled steps (authors: 7).
        step_weight: ``lambda`` (authors: 0.8).
        steps, batch_size, seq_len, lr, warmup_steps, weight_decay, grad_clip, num_layers, amp, out_dir,
            save_every, progress, seed: as in :func:`train_eagle1`.

    Returns:
        :class:`TrainResult` ``(head, history)``.

    References:
        EAGLE-3 arXiv 2503.01840 (training-time test); authors' ``traineagle3/cnets.py`` (``length = 7``,
        weights ``0.8 ** i``, loss mask by target argmax in the draft vocabulary).
    """
    if ttt_steps < 1:
        raise ValueError(f"ttt_steps must be >= 1, got {ttt_steps}")
    device, stream, sample = _setup(target, data, tokenizer, seq_len + 1, batch_size, seed)
    if draft_vocab_size is not None and draft_vocab_coverage is not None:
        raise ValueError("give draft_vocab_size or draft_vocab_coverage, not both")
    if head is None:
        vocab = None
        if draft_vocab_size is not None or draft_vocab_coverage is not None:
            _, _, V = target_dims(target)
            counts = torch.bincount(stream.clamp(0, V - 1), minlength=V)
            if draft_vocab_coverage is not None:
                draft_vocab_size = draft_vocab_size_for_coverage(counts, draft_vocab_coverage)
            vocab = build_draft_vocab(counts, draft_vocab_size)
        head = Eagle3Head.from_target(target, draft_vocab=vocab, feature_layers=feature_layers, num_layers=num_layers)
    _check_head_target(head, target)
    layers = head.feature_layers
    steps_ttt = min(ttt_steps, seq_len - 1)

    def loss_fn(batch):
        feats, logits = _target_forward(target, batch, layers)
        L = batch.shape[1] - 1
        restricted = head.target_to_draft_logits(logits)                 # [B, T, V']
        in_vocab = head.t2d[logits.argmax(-1)]                           # [B, T]
        hidden = head.features_to_hidden(tuple(f[:, :L] for f in feats))
        total = torch.zeros((), device=device)
        first = None
        for i, out in enumerate(ttt_forward(head, batch, hidden, steps_ttt)):
            n = out.shape[1]
            draft_logits = head.logits(out)
            target_probs = torch.softmax(restricted[:, 1 + i: 1 + i + n].float(), dim=-1)
            mask = in_vocab[:, 1 + i: 1 + i + n].float()
            ce = (_soft_ce(draft_logits, target_probs) * mask).sum() / mask.sum().clamp(min=1.0)
            total = total + (step_weight ** i) * ce
            if i == 0:
                agree = draft_logits.argmax(-1) == restricted[:, 1: 1 + n].argmax(-1)
                first = (ce, (agree.float() * mask).sum() / mask.sum().clamp(min=1.0))
        return total, first[0], torch.zeros((), device=device), first[1]

    return _fit(head, sample, loss_fn, steps=steps, lr=lr, warmup_steps=warmup_steps,
                weight_decay=weight_decay, grad_clip=grad_clip, amp=amp, out_dir=out_dir, save_every=save_every,
                progress=progress, desc="EAGLE-3")


def _check_head_target(head, target) -> None:
    hidden, _, vocab = target_dims(target)
    if head.config.vocab_size != vocab:
        raise ValueError(f"the head was made for a vocabulary of {head.config.vocab_size} tokens but the target has "
                         f"{vocab}")
    if head.config.feature_size != hidden:
        raise ValueError(f"the head was made for a target hidden size of {head.config.feature_size} but the target "
                         f"has {hidden}")
    if getattr(head, "draft_ids", None) is not None:
        raise ValueError("the EAGLE-1 head's vocabulary is restricted (restrict_vocab): train it over the full "
                         "vocabulary (head.restrict_vocab(None)) and restrict it for inference afterwards")
