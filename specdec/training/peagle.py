"""Train a P-EAGLE head against any HF causal LM on any text: every draft depth in one forward per batch.

For a window of tokens ``x_0 .. x_{N-1}`` the frozen target gives features ``f_t`` and logits ``z_t``. The head's
*real entries* are ``(x_{t+1}, f_t)`` at position ``t``; an *anchor* ``t`` at *depth* ``d >= 1`` adds a mask slot
``(mask_token_id, mask_hidden)`` at position ``t + d``. One forward holds the real entries and, per depth, the
mask slots of the anchors kept at that depth, under the attention mask

.. math::
    \\mathrm{sees}(q, k) = (d_k = 0 \\wedge a_k \\le a_q) \\vee (a_k = a_q \\wedge d_k \\le d_q)

(``a`` = anchor, ``d`` = depth; a real entry is its own anchor at depth 0): each slot sees the real context up
to its anchor and its own anchor's earlier mask slots, exactly what it sees at inference. The output of
``(a, d)`` is trained toward the target's distribution ``softmax(z_{a+d+1})`` (soft cross-entropy: the target's
whole distribution, not only its argmax, carries signal at every depth), averaged per depth, then over depths
with weights ``w_d`` (uniform by default; ``decay_gamma`` gives DFlash's ``w_d = exp(-d / gamma)``, which favours the
early depths every accepted prefix needs):

.. math::
    \\mathcal{L} = \\frac{1}{\\sum_d w_d} \\sum_{d=0}^{K-1} \\frac{w_d}{|A_d|} \\sum_{a \\in A_d}
    \\mathrm{CE}(\\mathrm{softmax}(z_{a+d+1}), q_{a,d})

COD sampling bounds the cost: depth 0 keeps every anchor, depth ``d`` a random ``max(r^d, r_min)`` fraction of
them, nested (``A_d \\subseteq A_{d-1}``, so every kept slot has its earlier slots). Long windows are split into
segments of ``segment_len`` real entries, each with its own forward: the head's attention (quadratic in the slots)
stays bounded, while the target's features still carry the whole window's context.

References:
    P-EAGLE arXiv 2602.01469 (parallel drafting, COD ``down_sample_ratio`` 0.7, floor 0.2); EAGLE-3 arXiv
    2503.01840; vllm-project/speculators ``peagle`` trainer.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from ..formats.peagle import save_peagle_head
from ..heads.peagle import PEagleHead
from .eagle import TrainRecord, TrainResult, _check_head_target, _setup, _soft_ce, _target_forward
from .loop import cosine_schedule, fit

__all__ = ["PEagleBlock", "PEagleEval", "cod_counts", "evaluate_peagle", "peagle_block", "peagle_loss",
           "train_peagle"]


class PEagleBlock(NamedTuple):
    """One training forward's slots: real entries first, then each depth's mask slots.

    Attributes:
        anchors: Shape ``[B, Q]`` int64, the anchor ``a`` of each slot (a real entry's own index).
        depths: Shape ``[B, Q]`` int64, ``d`` (0 for real entries).
        mask: Shape ``[B, 1, Q, Q]`` bool, the attention mask (True = may attend).
    """

    anchors: torch.Tensor
    depths: torch.Tensor
    mask: torch.Tensor


class PEagleEval(NamedTuple):
    """Per-depth figures of a head on a batch (every anchor at every depth).

    Attributes:
        loss: soft cross-entropy per depth ``d = 0..K-1`` (level ``d + 1``).
        accuracy: fraction of anchors whose top-1 equals the target's top-1, per depth.
    """

    loss: list
    accuracy: list


def cod_counts(num_anchors: int, num_depths: int, ratio: float, floor: float) -> list[int]:
    """Anchors kept per depth under COD sampling: ``ceil(n * max(ratio^d, floor))`` (``d = 0`` keeps all).

    Args:
        num_anchors: ``n``, real entries of a segment.
        num_depths: ``K``.
        ratio: ``r`` (P-EAGLE: 0.7).
        floor: ``r_min`` (P-EAGLE: 0.2).

    Returns:
        ``K`` non-increasing counts.

    Example:
        >>> cod_counts(100, 4, 0.7, 0.2)
        [100, 70, 49, 35]
    """
    if not 0.0 < ratio <= 1.0 or not 0.0 <= floor <= 1.0:
        raise ValueError(f"down_sample_ratio must lie in (0, 1] and down_sample_min in [0, 1], got {ratio}, {floor}")
    return [num_anchors if d == 0 else max(1, math.ceil(num_anchors * max(ratio ** d, floor) - 1e-9))
            for d in range(num_depths)]


def peagle_block(batch_size: int, num_anchors: int, num_depths: int, *, ratio: float = 0.7, floor: float = 0.2,
                 generator: torch.Generator | None = None, device=None) -> PEagleBlock:
    """The slots and attention mask of one training forward (COD-sampled anchors, nested across depths).

    Args:
        batch_size: ``B``.
        num_anchors: ``n``, real entries (anchors ``0..n-1``).
        num_depths: ``K``: depths ``0..K-1``.
        ratio, floor: COD sampling (:func:`cod_counts`); ``ratio = 1`` keeps every anchor at every depth.
        generator: CPU generator of the per-row anchor order (``None`` only when every anchor is kept).
        device: where the tensors go.

    Returns:
        A :class:`PEagleBlock` with ``Q = sum(cod_counts(...))`` slots.
    """
    counts = cod_counts(num_anchors, num_depths, ratio, floor)
    if counts[-1] < num_anchors:
        if generator is None:
            raise ValueError("COD sampling draws anchors: pass generator=torch.Generator().manual_seed(...)")
        order = torch.rand(batch_size, num_anchors, generator=generator).argsort(1)
    else:
        order = torch.arange(num_anchors).expand(batch_size, -1)
    anchors, depths = [], []
    for d, n in enumerate(counts):
        kept = order[:, :n].sort(1).values if d else torch.arange(num_anchors).expand(batch_size, -1)
        anchors.append(kept)
        depths.append(torch.full_like(kept, d))
    anchors, depths = torch.cat(anchors, 1).to(device), torch.cat(depths, 1).to(device)
    aq, ak = anchors[:, :, None], anchors[:, None, :]
    dq, dk = depths[:, :, None], depths[:, None, :]
    mask = ((dk == 0) & (ak <= aq)) | ((ak == aq) & (dk <= dq))
    return PEagleBlock(anchors, depths, mask[:, None])


def _segment_outputs(head: PEagleHead, tokens, hidden, start: int, block: PEagleBlock) -> torch.Tensor:
    """Head outputs of one segment's block. ``hidden`` holds ``fc(f_t)`` of the segment's entries."""
    B, n = hidden.shape[:2]
    real = block.depths == 0
    ids = torch.where(real, tokens.gather(1, (block.anchors + start + 1).clamp(max=tokens.shape[1] - 1)),
                      head.mask_token_id)
    picked = hidden.gather(1, block.anchors[..., None].expand(-1, -1, hidden.shape[-1]))
    slot_hidden = torch.where(real[..., None], picked, head.mask_slot_hidden().to(hidden.dtype))
    return head(ids, slot_hidden, block.anchors + start + block.depths, block.mask)


def peagle_loss(head: PEagleHead, tokens: torch.Tensor, features: Sequence[torch.Tensor], logits: torch.Tensor, *,
                num_depths: int, segment_len: int, ratio: float = 0.7, floor: float = 0.2,
                generator: torch.Generator | None = None, decay_gamma: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The P-EAGLE objective on a batch of windows (see the module docstring), segment by segment.

    Args:
        head: the :class:`~specdec.heads.PEagleHead`.
        tokens: the windows. Shape: ``[B, N]`` int64.
        features: the target's features at every token, one per feature layer. Shape: each ``[B, N, H_t]``.
        logits: the target's logits. Shape: ``[B, N, V]``.
        num_depths: ``K`` (depths ``0..K-1``, i.e. levels ``1..K``).
        segment_len: real entries per forward.
        ratio, floor: COD sampling.
        generator: CPU generator of the COD anchors.
        decay_gamma: depth weights ``exp(-d / gamma)`` (``None``: uniform, the mean over depths).

    Returns:
        ``(loss, per_depth_ce [K], per_depth_accuracy [K])``; ``loss`` has a graph.
    """
    B, N = tokens.shape
    L = N - 1  # entries t = 0..N-2 pair f_t with x_{t+1}
    if L < 1 or num_depths < 1 or segment_len < 1:
        raise ValueError(f"need windows of >= 2 tokens, num_depths >= 1, segment_len >= 1; got N={N}, "
                         f"num_depths={num_depths}, segment_len={segment_len}")
    restricted = head.target_to_draft_logits(logits) if head.config.draft_vocab < head.config.vocab_size else logits
    in_vocab = head.t2d[logits.argmax(-1)]                                         # [B, N]
    hidden = head.features_to_hidden(tuple(f[:, :L] for f in features))            # [B, L, H]
    sums = torch.zeros(num_depths, device=tokens.device)
    hits = torch.zeros(num_depths, device=tokens.device)
    counts = torch.zeros(num_depths, device=tokens.device)
    for start in range(0, L, segment_len):
        n = min(segment_len, L - start)
        block = peagle_block(B, n, num_depths, ratio=ratio, floor=floor, generator=generator, device=tokens.device)
        out = _segment_outputs(head, tokens, hidden[:, start:start + n], start, block)
        draft_logits = head.logits(out)                                             # [B, Q, V']
        where = block.anchors + start + block.depths + 1                            # the target position predicted
        ok = (where <= N - 1) & in_vocab.gather(1, where.clamp(max=N - 1))
        target = restricted.gather(1, where.clamp(max=N - 1)[..., None].expand(-1, -1, restricted.shape[-1]))
        ce = _soft_ce(draft_logits, torch.softmax(target.float(), -1)) * ok
        agree = (draft_logits.argmax(-1) == target.argmax(-1)) & ok
        sums = sums + torch.zeros_like(sums).index_add(0, block.depths.flatten(), ce.flatten())
        hits = hits + torch.zeros_like(hits).index_add(0, block.depths.flatten(), agree.float().flatten())
        counts = counts + torch.zeros_like(counts).index_add(0, block.depths.flatten(), ok.float().flatten())
    per_depth = sums / counts.clamp(min=1.0)
    if decay_gamma is None:
        loss = per_depth.mean()
    else:
        if not decay_gamma > 0:
            raise ValueError(f"decay_gamma must be > 0 (depth weights exp(-d / gamma)) or None, got {decay_gamma}")
        weights = torch.exp(-torch.arange(num_depths, device=per_depth.device, dtype=torch.float32) / decay_gamma)
        loss = (weights * per_depth).sum() / weights.sum()
    return loss, per_depth.detach(), hits / counts.clamp(min=1.0)


@torch.no_grad()
def evaluate_peagle(target, head: PEagleHead, batch: torch.Tensor, *, num_depths: int | None = None,
                    segment_len: int | None = None) -> PEagleEval:
    """Per-depth loss and top-1 accuracy of a head on a batch of windows (every anchor at every depth).

    Args:
        target: the HF causal LM.
        head: the head.
        batch: token windows. Shape: ``[B, N]`` int64.
        num_depths: ``K`` (default: the head's ``max_drafts``).
        segment_len: real entries per forward (default: the whole window).

    Returns:
        A :class:`PEagleEval`.
    """
    K = num_depths or head.num_levels
    features, logits = _target_forward(target, batch, head.feature_layers)
    _, ce, acc = peagle_loss(head, batch, features, logits, num_depths=K, segment_len=segment_len or batch.shape[1],
                             ratio=1.0, floor=1.0)
    return PEagleEval(ce.tolist(), acc.tolist())


def train_peagle(target, data, *, tokenizer=None, head: PEagleHead | None = None, steps: int = 1000,
                 seq_len: int = 512, batch_size: int = 8, lr: float = 3e-4, max_drafts: int = 4,
                 segment_len: int | None = None, down_sample_ratio: float = 0.7, down_sample_min: float = 0.2,
                 num_layers: int = 2, feature_layers: Sequence[int] | None = None, mask_token_id: int | None = None,
                 warmup_steps: int | None = None, weight_decay: float = 0.0, grad_clip: float = 0.5,
                 amp: bool = True, out_dir=None, save_every: int = 0, progress: bool = True, seed: int = 0,
                 time_budget: float | None = None, decay_gamma: float | None = None) -> TrainResult:
    """Train a P-EAGLE head (all mask depths jointly, COD-sampled) against ``target`` on any text.

    Args:
        target: any HF causal LM (frozen; runs under ``no_grad``).
        data: texts (with ``tokenizer``), token sequences, or a 2-D tensor of ids
            (:func:`~specdec.training.token_stream`).
        tokenizer: HF tokenizer for texts.
        head: continue training this head (default: a fresh ``PEagleHead.from_target``).
        steps, seq_len, batch_size: optimiser steps; tokens per window; windows per step.
        lr, warmup_steps, weight_decay, grad_clip: AdamW (betas 0.9 / 0.95) on the cosine schedule of
            :func:`~specdec.training.fit` (``warmup_steps`` default ``min(steps // 10, 100)``).
        max_drafts: ``K``, depths trained (a fresh head's ``max_drafts``; a given head's must be ``>= K``).
        segment_len: real entries per head forward (default ``seq_len``); smaller bounds memory.
        down_sample_ratio, down_sample_min: COD sampling ``r``, ``r_min``.
        num_layers, feature_layers, mask_token_id: of a fresh head (:meth:`PEagleHead.from_target`).
        amp: bf16 autocast on CUDA.
        out_dir: checkpoints ``step-N/`` and ``final/`` in the speculators ``peagle`` layout
            (:func:`~specdec.formats.load_peagle_head`), each with ``history.json``.
        save_every: checkpoint period in steps (0: only the final one).
        progress: show a tqdm bar.
        seed: seeds the window sampler and the COD draws (the global RNG is never used).
        time_budget: wall-clock seconds after which training stops early.
        decay_gamma: weight depth ``d`` by ``exp(-d / gamma)`` (DFlash's position weights; ``None``: uniform).

    Returns:
        :class:`~specdec.training.TrainResult`; each record's ``token_loss`` / ``accuracy`` are depth 0's, and
        ``loss`` the mean over depths.

    References:
        P-EAGLE arXiv 2602.01469; speculators ``peagle`` (COD ``down_sample_ratio`` 0.7, ``_min`` 0.2).
    """
    if head is None:
        head = PEagleHead.from_target(target, num_layers=num_layers, max_drafts=max_drafts,
                                      feature_layers=feature_layers, mask_token_id=mask_token_id)
    if not isinstance(head, PEagleHead):
        raise TypeError(f"head must be a PEagleHead, got {type(head).__name__}")
    if max_drafts > head.num_levels:
        raise ValueError(f"max_drafts {max_drafts} exceeds the head's {head.num_levels} levels: build a head with "
                         f"more (PEagleHead.from_target(..., max_drafts={max_drafts}))")
    _check_head_target(head, target)
    device, _, sample = _setup(target, data, tokenizer, seq_len, batch_size, seed)
    cod = torch.Generator().manual_seed(seed + 1)
    segment = segment_len or seq_len
    final_dtype = head.dtype
    for p in head.parameters():  # fp32 master weights; the frozen embeddings stay as they are
        p.data = p.data.float()
    head.train()
    use_amp = amp and device.type == "cuda"
    warmup = max(1, min(steps // 10, 100) if warmup_steps is None else warmup_steps)

    seen: list[tuple] = []  # detached per-step values; read only when a checkpoint writes its history

    def step_loss(step: int):
        batch = sample()
        features, logits = _target_forward(target, batch, head.feature_layers)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            loss, ce, acc = peagle_loss(head, batch, features, logits, num_depths=max_drafts, segment_len=segment,
                                        ratio=down_sample_ratio, floor=down_sample_min, generator=cod,
                                        decay_gamma=decay_gamma)
        if out_dir is not None:
            seen.append((step, loss.detach(), ce, acc))
        return loss, {"token_loss": ce[0], "acc": acc[0], **{f"acc{d}": acc[d] for d in range(1, max_drafts)}}

    def rows() -> list[dict]:
        out = []
        for step, loss, ce, acc in seen:
            out.append({"step": step + 1, "loss": float(loss), "per_depth_loss": ce.tolist(),
                        "per_depth_accuracy": acc.tolist(),
                        "lr": cosine_schedule(step, total_steps=steps, peak_lr=lr, warmup_steps=warmup)})
        return out

    def checkpoint(done: int) -> None:
        if done < steps:  # the final checkpoint is written below, in the head's own dtype
            _checkpoint(head, Path(out_dir) / f"step-{done}", rows())

    fitted = fit(head.parameters(), step_loss, steps=steps, lr=lr, warmup_steps=warmup, weight_decay=weight_decay,
                 betas=(0.9, 0.95), grad_clip=grad_clip, desc="P-EAGLE", progress=progress,
                 checkpoint_every=save_every if out_dir is not None else 0,
                 checkpoint_fn=checkpoint if out_dir is not None else None, time_budget=time_budget)
    history = [TrainRecord(r.step, r.loss, r.metrics["token_loss"], 0.0, r.metrics["acc"], r.lr) for r in fitted]
    head.eval()
    for p in head.parameters():
        p.data = p.data.to(final_dtype)
    if out_dir is not None:
        _checkpoint(head, Path(out_dir) / "final", rows())
    return TrainResult(head, history)


def _checkpoint(head: PEagleHead, folder: Path, rows: list[dict]) -> None:
    save_peagle_head(head, folder)
    (folder / "history.json").write_text(json.dumps(rows))
