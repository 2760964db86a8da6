"""Train DFlash / DSpark heads against any HF causal LM on any text (online: the frozen target runs each step).

**Block-diffusion objective.** Each step draws random windows of the token stream; the target runs them once
(features of every position, and its logits). In every window ``A`` anchor positions ``a`` are drawn (distinct,
``1 <= a <= T - 1 - D``). Anchor ``a``'s block ``[x_a, mask, ..., mask]`` sees the context (the target's fused
features) at positions ``< a`` and its own slots; a block-sparse mask lets all ``A`` blocks of a window train in
ONE forward (:meth:`specdec.heads.DFlashHead.blocks_hidden`). Level ``d`` of the block predicts the token at
``a + d``; its loss is the soft cross-entropy to the *target's* distribution there (given the true prefix),
which is what acceptance is measured against, with position weights ``w_d = exp(-(d - 1) / gamma)``
(speculators' ``dflash_decay_gamma``; ``gamma=None``: uniform):

.. math::
    \\mathcal{L}_{tok} = \\frac{\\sum_d w_d\\, \\overline{\\mathrm{CE}}(p_{target}(\\cdot \\mid x_{<a+d}),
    \\ q_d)}{\\sum_d w_d}

**DSpark** adds (a) the Markov head, teacher-forced: level ``d``'s logits get the bias of the *true* previous
token ``x_{a+d-1}`` (the anchor for ``d = 1``), as at inference where the parent is an accepted token; (b) the
confidence head: binary cross-entropy between ``c_d`` and ``y_d = [argmax q'_d = argmax p_target]``, counted only
where every earlier level of the block was right (``c_d`` estimates ``P(d accepted | levels < d accepted)``),
weight ``confidence_head_alpha``:

.. math::
    \\mathcal{L} = \\mathcal{L}_{tok} + \\alpha\\, \\frac{\\sum_{b,d} m_{b,d}\\, \\mathrm{BCE}(c_{b,d}, y_{b,d})}
    {\\sum_{b,d} m_{b,d}}, \\qquad m_{b,d} = \\prod_{i<d} y_{b,i}

Runs on the project's one loop (:func:`specdec.training.loop.fit`: AdamW, warm-up + cosine, clipping, tqdm);
deterministic given ``seed`` (windows and anchors from ``torch.Generator`` s); checkpoints in the speculators
layout (:func:`specdec.formats.save_dflash_head`).

References:
    DFlash arXiv 2602.06036 (block diffusion training, anchors, exponentially decaying position weights);
    DSpark arXiv 2607.05147 (Markov head, confidence head BCE); vllm-project/speculators ``dflash`` / ``dspark``.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..formats.dflash import save_dflash_head
from ..heads.common import target_dims
from ..heads.dflash import DFlashHead, DSparkHead
from .eagle import TrainResult, _setup, _soft_ce, _target_forward
from .loop import fit

__all__ = ["DFlashTrainRecord", "BlockLoss", "dflash_loss", "sample_anchors", "block_accuracy", "train_dflash",
           "train_dspark"]


class DFlashTrainRecord(NamedTuple):
    """One optimisation step of :func:`train_dflash`.

    Attributes:
        step: 1-based step number.
        loss: the total loss minimised.
        token_loss: the weighted soft cross-entropy to the target.
        confidence_loss: DSpark's confidence BCE (0 without a confidence head).
        accuracy: level-1 top-1 agreement with the target's top-1.
        block_accuracy: mean top-1 agreement over all levels.
        lr: learning rate used.
    """

    step: int
    loss: float
    token_loss: float
    confidence_loss: float
    accuracy: float
    block_accuracy: float
    lr: float


class BlockLoss(NamedTuple):
    """The losses and accuracies of one batch of blocks (0-d tensors, except ``level_accuracy``).

    Attributes:
        loss: the total loss.
        token_loss: weighted soft cross-entropy.
        confidence_loss: confidence BCE (0 without a confidence head).
        level_accuracy: Shape ``[D]``, top-1 agreement with the target at each level (DSpark: with the Markov bias
            of the true previous token).
    """

    loss: torch.Tensor
    token_loss: torch.Tensor
    confidence_loss: torch.Tensor
    level_accuracy: torch.Tensor


def sample_anchors(batch_size: int, seq_len: int, num_levels: int, num_anchors: int, *,
                   generator: torch.Generator, device=None) -> torch.Tensor:
    """Distinct random anchor positions per window, each leaving room for a whole block of targets.

    Args:
        batch_size: ``B``.
        seq_len: ``T``, tokens per window.
        num_levels: ``D``: level ``d`` of anchor ``a`` is scored at ``a + d <= T - 1``.
        num_anchors: ``A`` per window (at most the ``T - 1 - D`` possible positions).
        generator: a CPU ``torch.Generator``, the only randomness.
        device: where to put the result.

    Returns:
        Shape ``[B, A]`` int64 in ``[1, T - 1 - D]``, sorted per row.
    """
    room = seq_len - 1 - num_levels
    if room < 1:
        raise ValueError(f"windows of {seq_len} tokens leave no anchor for blocks of {num_levels} levels: use "
                         f"seq_len >= {num_levels + 2}")
    if not 1 <= num_anchors <= room:
        raise ValueError(f"num_anchors must lie in [1, {room}] for seq_len {seq_len} and {num_levels} levels, got "
                         f"{num_anchors}")
    order = torch.rand(batch_size, room, generator=generator).argsort(1)[:, :num_anchors]
    return (order.sort(1).values + 1).to(device)


def dflash_loss(head: DFlashHead, features: Sequence[torch.Tensor], input_ids: torch.Tensor,
                target_logits: torch.Tensor, anchors: torch.Tensor, *, decay_gamma: float | None = 4.0,
                confidence_alpha: float | None = None) -> BlockLoss:
    """The block-diffusion loss (+ DSpark's Markov / confidence terms) of many blocks in one forward.

    Args:
        head: a :class:`~specdec.heads.DFlashHead` or :class:`~specdec.heads.DSparkHead` (train mode).
        features: the target's features of every position. Shape: each ``[B, T, H_t]``.
        input_ids: Shape ``[B, T]`` int64, the windows.
        target_logits: Shape ``[B, T, V]``, the target's logits (row ``p - 1`` gives the law of the token at ``p``).
        anchors: Shape ``[B, A]`` int64 (from :func:`sample_anchors`).
        decay_gamma: ``gamma`` of the position weights ``exp(-(d - 1) / gamma)``; ``None``: uniform.
        confidence_alpha: weight of the confidence BCE (default: the head's ``confidence_head_alpha``).

    Returns:
        A :class:`BlockLoss`.

    References:
        DFlash arXiv 2602.06036; DSpark arXiv 2607.05147.
    """
    D = head.num_levels
    device = input_ids.device
    B, A = anchors.shape
    hidden = head.blocks_hidden(features, input_ids, anchors)                            # [B, A, D, H]
    at = anchors[:, :, None] + torch.arange(D, device=device)                          # level d's row: a + d - 1
    flat = at.reshape(B, A * D)
    teacher = target_logits.gather(1, flat[:, :, None].expand(-1, -1, target_logits.shape[-1]))
    teacher = teacher.reshape(B, A, D, -1).float()
    logits = head.logits(hidden).float()
    prev = input_ids.gather(1, flat).reshape(B, A, D)                                   # x_{a+d-1}
    if isinstance(head, DSparkHead) and head.markov_head is not None:
        logits = logits + head.markov_bias(prev, hidden).float()
    weights = (torch.ones(D, device=device) if decay_gamma is None
               else torch.exp(-torch.arange(D, device=device, dtype=torch.float32) / decay_gamma))
    ce = _soft_ce(logits, torch.softmax(teacher, -1)).mean((0, 1))                      # [D]
    token_loss = (weights * ce).sum() / weights.sum()
    right = (logits.argmax(-1) == teacher.argmax(-1)).float()                           # [B, A, D]
    confidence_loss = torch.zeros((), device=device)
    if isinstance(head, DSparkHead) and head.confidence_head is not None:
        alpha = head.config.confidence_head_alpha if confidence_alpha is None else confidence_alpha
        conf = head.confidence_logits(hidden, prev).float()
        earlier = torch.cat([torch.ones_like(right[..., :1]), right[..., :-1].cumprod(-1)], -1)
        bce = F.binary_cross_entropy_with_logits(conf, right, reduction="none")
        confidence_loss = (bce * earlier).sum() / earlier.sum().clamp(min=1.0)
        loss = token_loss + alpha * confidence_loss
    else:
        loss = token_loss
    return BlockLoss(loss, token_loss, confidence_loss, right.mean((0, 1)))


@torch.no_grad()
def block_accuracy(head: DFlashHead, target, input_ids: torch.Tensor, *, num_anchors: int = 8,
                   seed: int = 0) -> torch.Tensor:
    """Per-level top-1 agreement of the head with the target on held-out windows (a validation figure).

    Args:
        head: the head.
        target: its HF causal LM.
        input_ids: Shape ``[B, T]`` int64, validation windows.
        num_anchors: anchors per window.
        seed: seeds the anchors.

    Returns:
        Shape ``[D]`` float: level ``d``'s agreement (teacher-forced context, as in training).
    """
    was_training = head.training
    head.eval()
    features, logits = _target_forward(target, input_ids, head.feature_layers)
    anchors = sample_anchors(input_ids.shape[0], input_ids.shape[1], head.num_levels,
                             min(num_anchors, input_ids.shape[1] - 1 - head.num_levels),
                             generator=torch.Generator().manual_seed(seed), device=input_ids.device)
    out = dflash_loss(head, features, input_ids, logits, anchors).level_accuracy
    head.train(was_training)
    return out


def _check_head_target(head: DFlashHead, target) -> None:
    hidden, _, vocab = target_dims(target)
    if head.config.vocab_size != vocab or head.config.feature_size != hidden:
        raise ValueError(f"the head was made for vocabulary {head.config.vocab_size} and target hidden size "
                         f"{head.config.feature_size}, but the target has {vocab} and {hidden}")


def train_dflash(target, data, *, tokenizer=None, head: DFlashHead | None = None, method: str = "dflash",
                 steps: int = 1000, batch_size: int = 8, seq_len: int = 512, anchors_per_seq: int = 32,
                 lr: float = 6e-4, warmup_steps: int | None = None, weight_decay: float = 0.0,
                 grad_clip: float = 1.0, block_size: int = 8, num_layers: int = 1,
                 feature_layers: Sequence[int] | None = None, mask_token_id: int | None = None,
                 decay_gamma: float | None = 4.0, amp: bool = True, out_dir=None, save_every: int = 0,
                 verifier_name_or_path: str | None = None, progress: bool = True, seed: int = 0,
                 time_budget: float | None = None, **head_options) -> TrainResult:
    """Train a DFlash (or, with ``method="dspark"``, a DSpark) head against ``target`` (see the module doc).

    Args:
        target: any HF causal LM (frozen; runs under ``no_grad``); the head trains on its device.
        data: texts (with ``tokenizer``), token sequences, or a 2-D tensor of ids (see
            :func:`~specdec.training.token_stream`).
        tokenizer: an HF tokenizer for texts.
        head: continue training this head (default: a fresh ``DFlashHead`` / ``DSparkHead.from_target``).
        method: ``"dflash"`` or ``"dspark"`` (for a fresh head).
        steps, batch_size, seq_len: optimisation steps; windows per step; tokens per window.
        anchors_per_seq: ``A``, blocks per window (all trained in one forward).
        lr, warmup_steps, weight_decay, grad_clip: AdamW (betas 0.9 / 0.95), linear warm-up then cosine decay;
            ``warmup_steps`` default ``min(steps // 10, 100)``.
        block_size, num_layers, feature_layers, mask_token_id: of a fresh head (see ``DFlashHead.from_target``).
        decay_gamma: position-weight decay (``None``: uniform).
        amp: bf16 autocast on CUDA.
        out_dir: where to save checkpoints (``step-N/``, ``final/``; speculators layout, with ``history.json``).
        save_every: checkpoint period in steps (0: only the final one).
        verifier_name_or_path: written into the checkpoints' ``speculators_config.verifier``.
        progress: show a tqdm bar.
        seed: seeds the head's initialisation, the windows and the anchors (the global RNG is never used).
        time_budget: wall-clock seconds; training stops early when spent.
        **head_options: further fields of a fresh head's config (DSpark: ``markov_rank``, ``markov_head_type``,
            ``enable_confidence_head``, ``confidence_head_with_markov``, ``confidence_head_alpha``,
            ``sample_from_anchor``).

    Returns:
        :class:`~specdec.training.TrainResult` ``(head, history)``, ``history`` a list of
        :class:`DFlashTrainRecord`.

    References:
        DFlash arXiv 2602.06036; DSpark arXiv 2607.05147.
    """
    if method not in ("dflash", "dspark"):
        raise ValueError(f"method must be 'dflash' or 'dspark', got {method!r}")
    if head is None:
        cls = DSparkHead if method == "dspark" else DFlashHead
        head = cls.from_target(target, block_size=block_size, num_layers=num_layers, feature_layers=feature_layers,
                               mask_token_id=mask_token_id, seed=seed, **head_options)
    _check_head_target(head, target)
    device, _, sample = _setup(target, data, tokenizer, seq_len, batch_size, seed)
    anchor_gen = torch.Generator().manual_seed(seed + 1)
    num_anchors = min(anchors_per_seq, seq_len - 1 - head.num_levels)
    final_dtype = head.dtype
    for p in head.parameters():  # fp32 master weights; the frozen target buffers stay as they are
        p.data = p.data.float()
    head.train()
    use_amp = amp and device.type == "cuda"

    def step_loss(step: int):
        batch = sample()
        features, logits = _target_forward(target, batch, head.feature_layers)
        anchors = sample_anchors(batch.shape[0], batch.shape[1], head.num_levels, num_anchors,
                                 generator=anchor_gen, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            out = dflash_loss(head, features, batch, logits, anchors, decay_gamma=decay_gamma)
        metrics = {"token_loss": out.token_loss, "conf_loss": out.confidence_loss,
                   "acc": out.level_accuracy[0], "block_acc": out.level_accuracy.mean()}
        return out.loss, metrics

    def checkpoint(done: int) -> None:
        if out_dir is not None and done < steps:
            save_dflash_head(head, Path(out_dir) / f"step-{done}", verifier_name_or_path=verifier_name_or_path)

    warmup = min(steps // 10, 100) if warmup_steps is None else warmup_steps
    fitted = fit(head.parameters(), step_loss, steps=steps, lr=lr, warmup_steps=max(warmup, 1),
                 weight_decay=weight_decay, betas=(0.9, 0.95), grad_clip=grad_clip, desc=head.kind,
                 progress=progress, checkpoint_every=save_every if out_dir is not None else 0,
                 checkpoint_fn=checkpoint if out_dir is not None else None, time_budget=time_budget)
    history = [DFlashTrainRecord(r.step, r.loss, r.metrics["token_loss"], r.metrics["conf_loss"], r.metrics["acc"],
                                 r.metrics["block_acc"], r.lr) for r in fitted]
    head.eval()
    for p in head.parameters():
        p.data = p.data.to(final_dtype)
    if out_dir is not None:
        folder = save_dflash_head(head, Path(out_dir) / "final", verifier_name_or_path=verifier_name_or_path)
        (folder / "history.json").write_text(json.dumps([r._asdict() for r in history]))
    return TrainResult(head, history)


def train_dspark(target, data, **kwargs) -> TrainResult:
    """Train a DSpark head: :func:`train_dflash` with ``method="dspark"`` (Markov and confidence heads on,
    ``sample_from_anchor=True`` by default).

    Args:
        target: any HF causal LM.
        data: training text or tokens (see :func:`train_dflash`).
        **kwargs: as :func:`train_dflash` (e.g. ``markov_rank``, ``markov_head_type``,
            ``confidence_head_alpha``).

    Returns:
        :class:`~specdec.training.TrainResult`.

    References:
        DSpark arXiv 2607.05147.
    """
    return train_dflash(target, data, method="dspark", **kwargs)

