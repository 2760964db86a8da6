"""Train Medusa heads: Medusa-1 on a frozen target, Medusa-2 jointly with the target (LoRA or full fine-tune).

- :func:`medusa_loss`: head ``k`` at position ``t`` against the token ``t + k + 2``, weighted ``decay ** k``::

      L_heads = sum_k decay^k * mean_t CE(p^(k)_t, y_{t+k+2})

  with ``y`` the data's tokens (``labels="data"``, the authors' Medusa-1 loss) or the target's own distribution of
  that token given the data's prefix (``labels="target"``, soft cross-entropy: self-distillation).
- :func:`train_medusa1`: the target is frozen (``no_grad``); only the heads train.
- :func:`train_medusa2`: a copy of the target trains with the heads. The loss is
  ``lm_weight * KL(p_original || p_tuned) + heads_weight * L_heads``: the language-model term is distilled from the
  *original* target's distribution (self-distillation), so the tuned target keeps its behaviour while its features
  become easier for the heads. The heads are warmed up first with the target frozen (Medusa-1), then both train,
  the heads at a larger learning rate. The target trains through LoRA adapters (merged at the end: the result is a
  plain HF model of the same class) or fully.

A Medusa-2 target is a **new target**: its speculative output equals *its own* plain decoding, not the original
model's. Both trainers run on :func:`specdec.training.loop.fit` (AdamW, warm-up + cosine, tqdm) and save
checkpoints that :func:`specdec.formats.load_medusa_head` (and ``AutoModelForCausalLM`` for a Medusa-2 target) read.

References:
    Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads", arXiv 2401.10774
    (Sec. 2.3.1 Medusa-1, ``lambda_k = 0.8^k``; Sec. 2.3.2 Medusa-2: combined loss, differential learning rates,
    heads warm-up; Sec. 2.3.3 self-distillation); Hu et al., "LoRA", arXiv 2106.09685.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.medusa import save_medusa_head
from ..heads.medusa import MedusaHead, medusa_target_dims
from .eagle import token_stream
from .loop import FitRecord, fit, sample_windows

__all__ = ["MedusaTrainResult", "Medusa2Result", "LoRALinear", "apply_lora", "merge_lora", "medusa_loss",
           "distillation_kl", "train_medusa1", "train_medusa2"]


class MedusaTrainResult(NamedTuple):
    """What :func:`train_medusa1` returns.

    Attributes:
        head: the trained :class:`~specdec.heads.MedusaHead` (in the target's dtype, eval mode).
        history: one :class:`~specdec.training.loop.FitRecord` per step (metrics ``head{k}_acc``: top-1 accuracy of
            head ``k`` against its labels, ``head{k}_loss``).
    """

    head: MedusaHead
    history: list


class Medusa2Result(NamedTuple):
    """What :func:`train_medusa2` returns.

    Attributes:
        target: the fine-tuned target, a plain HF model of the original class (LoRA merged), eval mode: the new
            target, whose own plain decoding is the losslessness reference for its heads.
        head: the jointly trained :class:`~specdec.heads.MedusaHead`, bound to ``target``.
        history: the warm-up's records followed by the joint phase's (metrics add ``kl``).
    """

    target: nn.Module
    head: MedusaHead
    history: list


# --------------------------------------------------------------------------------------------------------
# LoRA
# --------------------------------------------------------------------------------------------------------


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update.

    .. math:: y = W x + b + \\frac{\\alpha}{r} B A x, \\qquad A \\in \\mathbb{R}^{r \\times in},\\
       B \\in \\mathbb{R}^{out \\times r},\\ B = 0 \\text{ at start}

    Args:
        base: the linear layer (frozen, kept as is).
        rank: ``r``.
        alpha: ``alpha`` (the update is scaled by ``alpha / r``).
        generator: draws ``A ~ N(0, 1 / in)`` (``B`` starts at zero, so the layer starts as ``base``).

    References:
        Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", arXiv 2106.09685.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        device = base.weight.device
        a = torch.randn(rank, base.in_features, generator=generator) / math.sqrt(base.in_features)
        self.lora_a = nn.Parameter(a.to(device))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the frozen layer plus the low-rank update.

        Args:
            x: Shape ``[..., in]``.

        Returns:
            Shape ``[..., out]``.
        """
        update = F.linear(F.linear(x.to(self.lora_a.dtype), self.lora_a), self.lora_b) * self.scale
        return self.base(x) + update.to(x.dtype)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """The equivalent plain ``nn.Linear`` (``W + (alpha / r) B A``, in the base's dtype and device).

        Returns:
            The base layer with its weight updated in place.
        """
        delta = (self.lora_b.float() @ self.lora_a.float()) * self.scale
        self.base.weight.add_(delta.to(self.base.weight.dtype))
        return self.base


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, leaf = name.split(".")
    module = model
    for part in path:
        module = getattr(module, part)
    return module, leaf


def apply_lora(model: nn.Module, rank: int, alpha: float, *, generator: torch.Generator,
               targets: tuple[str, ...] | None = None) -> list[LoRALinear]:
    """Wrap the model's linear layers in :class:`LoRALinear` (in place) and freeze everything else.

    Args:
        model: an HF causal LM (modified in place: pass a copy to keep the original).
        rank, alpha: LoRA rank and scale numerator.
        generator: the randomness of the ``A`` matrices.
        targets: name suffixes of the linear layers to adapt (e.g. ``("q_proj", "v_proj")``); default every
            ``nn.Linear`` except the output embedding (``lm_head``).

    Returns:
        The wrappers, in module order.
    """
    for p in model.parameters():
        p.requires_grad_(False)
    output = model.get_output_embeddings()
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m is not output
             and (targets is None or n.split(".")[-1] in targets)]
    if not names:
        raise ValueError(f"no linear layer matches the LoRA targets {targets}: name suffixes such as 'q_proj'")
    wrappers = []
    for name in names:
        parent, leaf = _parent(model, name)
        wrapper = LoRALinear(getattr(parent, leaf), rank, alpha, generator)
        setattr(parent, leaf, wrapper)
        wrappers.append(wrapper)
    return wrappers


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` of ``model`` by its merged ``nn.Linear`` (in place).

    Args:
        model: a model with LoRA wrappers.

    Returns:
        ``model``, now free of wrappers (a plain HF model).
    """
    names = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    for name in names:
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, getattr(parent, leaf).merged())
    for p in model.parameters():
        p.requires_grad_(True)
    return model


# --------------------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------------------


def medusa_loss(head: MedusaHead, features: torch.Tensor, tokens: torch.Tensor, *,
                target_logits: torch.Tensor | None = None, decay: float = 0.8) -> tuple[torch.Tensor, dict]:
    """The Medusa heads' loss on one batch of windows.

    .. math::
        \\mathcal{L} = \\sum_{k=0}^{D-1} \\lambda^k \\frac{1}{T - k - 2} \\sum_{t=0}^{T-k-3}
        \\mathrm{CE}\\bigl(q^{(k)}_t, y_{t+k+2}\\bigr), \\qquad q^{(k)}_t = \\mathrm{softmax}(\\mathrm{head}_k(f_t))

    ``y_{t+k+2}`` is the data's token (hard labels), or with ``target_logits`` the target's distribution
    ``softmax(z_{t+k+1})`` of that token given the data's prefix (soft cross-entropy).

    Args:
        head: the Medusa heads.
        features: the target's final normed hidden states of the windows.
            Shape: ``[B, T, H]``.
        tokens: the windows' token ids. Shape: ``[B, T]``.
        target_logits: the target's logits of the windows for soft labels, or ``None`` for hard labels.
            Shape: ``[B, T, V]``.
        decay: ``lambda`` (the authors: 0.8).

    Returns:
        ``(loss, metrics)``: a scalar tensor, and per head ``head{k}_loss`` / ``head{k}_acc`` (top-1 agreement with
        the labels' argmax) as 0-d tensors.

    References:
        Medusa arXiv 2401.10774 (Sec. 2.3.1, Eq. 1, ``lambda_k = 0.8^k``).
    """
    B, T = tokens.shape
    D = head.config.num_heads
    if T < D + 2:
        raise ValueError(f"windows of {T} tokens are too short for {D} heads: need at least {D + 2}")
    total = torch.zeros((), device=features.device)
    metrics = {}
    for k in range(D):
        n = T - k - 2
        logits = head.head_logits(features[:, :n], k).float()                      # [B, n, V]
        log_q = torch.log_softmax(logits, -1)
        if target_logits is None:
            labels = tokens[:, k + 2: k + 2 + n]
            ce = -log_q.gather(-1, labels[..., None])[..., 0].mean()
        else:
            p = torch.softmax(target_logits[:, k + 1: k + 1 + n].float(), -1)
            labels = p.argmax(-1)
            ce = -(p * log_q).sum(-1).mean()
        total = total + (decay ** k) * ce
        metrics[f"head{k}_loss"] = ce.detach()
        metrics[f"head{k}_acc"] = (logits.argmax(-1) == labels).float().mean().detach()
    return total, metrics


def distillation_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of ``KL(p_teacher || p_student)`` (self-distillation of the backbone).

    .. math:: \\frac{1}{BT} \\sum_{b,t} \\sum_v p_{b,t}(v) (\\log p_{b,t}(v) - \\log q_{b,t}(v))

    Args:
        teacher_logits: the original target's logits. Shape: ``[B, T, V]``.
        student_logits: the tuned target's logits. Shape: ``[B, T, V]``.

    Returns:
        A scalar tensor (float32).

    References:
        Medusa arXiv 2401.10774 (Sec. 2.3.3, self-distillation with a KL loss against the original model).
    """
    log_p = torch.log_softmax(teacher_logits.float(), -1)
    log_q = torch.log_softmax(student_logits.float(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


# --------------------------------------------------------------------------------------------------------
# Training loops
# --------------------------------------------------------------------------------------------------------


def _device_of(model) -> torch.device:
    return model.get_output_embeddings().weight.device


def _stream(target, data, tokenizer, seq_len: int) -> torch.Tensor:
    stream = token_stream(data, tokenizer).to(_device_of(target))
    if stream.numel() < seq_len:
        raise ValueError(f"the training data have {stream.numel()} tokens, fewer than one window of {seq_len}: lower "
                         f"seq_len or give more text")
    return stream


def _check_head(head: MedusaHead, target) -> None:
    hidden, layers, vocab = medusa_target_dims(target)
    if (head.config.hidden_size, head.config.vocab_size) != (hidden, vocab):
        raise ValueError(f"the Medusa heads were made for hidden size {head.config.hidden_size} and vocabulary "
                         f"{head.config.vocab_size}, but the target has {hidden} and {vocab}")


def _autocast(device: torch.device, amp: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp and device.type == "cuda")


def _write_history(folder: Path, history: list) -> None:
    (folder / "history.json").write_text(json.dumps([r._asdict() for r in history]))


def _fit_heads(target, head: MedusaHead, stream: torch.Tensor, *, steps, batch_size, seq_len, lr, warmup_steps,
               weight_decay, grad_clip, decay, labels, amp, out_dir, save_every, progress, seed, time_budget,
               desc) -> list:
    device = _device_of(target)
    generator = torch.Generator().manual_seed(seed)
    layer = head.config.feature_layer
    for p in head.parameters():  # fp32 master weights
        p.data = p.data.float()
    head.train()

    def loss_fn(step: int):
        batch = sample_windows(stream, batch_size, seq_len, generator=generator)
        with torch.no_grad(), _autocast(device, amp):
            out = target(input_ids=batch, output_hidden_states=True, use_cache=False)
        with _autocast(device, amp):
            return medusa_loss(head, out.hidden_states[layer], batch,
                               target_logits=out.logits if labels == "target" else None, decay=decay)

    def checkpoint(done: int) -> None:
        if out_dir is not None and done < steps:
            save_medusa_head(head, Path(out_dir) / f"step-{done}")

    warmup = min(steps // 10, 100) if warmup_steps is None else warmup_steps
    return fit(list(head.parameters()), loss_fn, steps=steps, lr=lr, warmup_steps=warmup, weight_decay=weight_decay,
               grad_clip=grad_clip, desc=desc, progress=progress, checkpoint_every=save_every if out_dir else 0,
               checkpoint_fn=checkpoint if out_dir else None, time_budget=time_budget)


def _check_labels(labels: str) -> None:
    if labels not in ("data", "target"):
        raise ValueError(f"labels must be 'data' (the data's tokens) or 'target' (the target's distributions), got "
                         f"{labels!r}")


def train_medusa1(target, data, *, tokenizer=None, head: MedusaHead | None = None, num_heads: int = 5,
                  num_layers: int = 1, shared_lm_head: bool = False, steps: int = 1000, batch_size: int = 8,
                  seq_len: int = 512, lr: float = 1e-3, warmup_steps: int | None = None, weight_decay: float = 0.0,
                  grad_clip: float = 1.0, decay: float = 0.8, labels: str = "data", amp: bool = True, out_dir=None,
                  save_every: int = 0, progress: bool = True, seed: int = 0,
                  time_budget: float | None = None) -> MedusaTrainResult:
    """Train Medusa-1 heads on a frozen target (:func:`medusa_loss` on random windows of the data).

    Args:
        target: any HF causal LM (frozen: runs under ``no_grad``); the heads train on its device.
        data: texts (with ``tokenizer``), token sequences, or a 2-D tensor of ids
            (:func:`specdec.training.token_stream`).
        tokenizer: HF tokenizer for texts.
        head: continue training these heads (default: fresh ``MedusaHead.from_target``).
        num_heads, num_layers, shared_lm_head: sizes of fresh heads.
        steps, batch_size, seq_len: optimiser steps, windows per step, tokens per window.
        lr, warmup_steps, weight_decay, grad_clip: AdamW on the warm-up + cosine schedule
            (``warmup_steps`` default ``min(steps // 10, 100)``).
        decay: per-head loss weight ``decay ** k`` (the authors: 0.8).
        labels: ``"data"`` (the data's next tokens: the authors' Medusa-1 loss) or ``"target"`` (soft labels from
            the target: self-distillation, for text the target did not write).
        amp: bf16 autocast on CUDA.
        out_dir: checkpoints ``step-N/`` (every ``save_every`` steps) and ``final/`` in the Medusa authors' layout
            (:func:`specdec.formats.load_medusa_head`), with ``history.json``.
        save_every: checkpoint period (0: only the final one).
        progress: a tqdm bar.
        seed: seeds the window sampler (the global RNG is never used).
        time_budget: stop after this many seconds (``None``: exactly ``steps``).

    Returns:
        :class:`MedusaTrainResult` ``(head, history)``.

    References:
        Medusa arXiv 2401.10774 (Sec. 2.3.1, Medusa-1).
    """
    _check_labels(labels)
    if head is None:
        head = MedusaHead.from_target(target, num_heads=num_heads, num_layers=num_layers,
                                      shared_lm_head=shared_lm_head)
    _check_head(head, target)
    final_dtype = target.get_output_embeddings().weight.dtype
    stream = _stream(target, data, tokenizer, seq_len)
    history = _fit_heads(target, head, stream, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                         warmup_steps=warmup_steps, weight_decay=weight_decay, grad_clip=grad_clip, decay=decay,
                         labels=labels, amp=amp, out_dir=out_dir, save_every=save_every, progress=progress, seed=seed,
                         time_budget=time_budget, desc="Medusa-1")
    head = head.to(dtype=final_dtype).eval()
    if out_dir is not None:
        folder = save_medusa_head(head, Path(out_dir) / "final")
        _write_history(folder, history)
    return MedusaTrainResult(head, history)


def train_medusa2(target, data, *, tokenizer=None, head: MedusaHead | None = None, num_heads: int = 5,
                  num_layers: int = 1, steps: int = 1000, head_warmup_steps: int | None = None, batch_size: int = 8,
                  seq_len: int = 512, lr: float = 2e-4, heads_lr: float = 1e-3, warmup_steps: int | None = None,
                  weight_decay: float = 0.0, grad_clip: float = 1.0, decay: float = 0.8, labels: str = "data",
                  lm_weight: float = 1.0, heads_weight: float = 0.2, lora_rank: int = 16, lora_alpha: float = 32.0,
                  lora_targets: tuple[str, ...] | None = None, amp: bool = True, out_dir=None, save_every: int = 0,
                  progress: bool = True, seed: int = 0, time_budget: float | None = None) -> Medusa2Result:
    """Train Medusa-2: heads and target jointly, the target distilled from its original self.

    .. math::
        \\mathcal{L} = \\lambda_0\\, \\mathrm{KL}(p_{\\mathrm{orig}} \\,\\|\\, p_{\\theta})
        + w_h \\sum_k 0.8^k\\, \\mathrm{CE}_k(\\theta, \\phi)

    with ``lambda_0 = lm_weight`` and ``w_h = heads_weight``. Phase 1 (``head_warmup_steps``): the heads alone on
    the frozen target (Medusa-1), so that random heads do not push large gradients into the backbone. Phase 2
    (``steps``): a copy of the target (LoRA adapters, or all weights with ``lora_rank=0``) at ``lr`` and the heads at
    ``heads_lr``; the original target stays untouched and is the distillation teacher.

    Args:
        target: the original HF causal LM (not modified).
        data: training data (see :func:`train_medusa1`).
        tokenizer: HF tokenizer for texts.
        head: warm-started heads (e.g. from :func:`train_medusa1`); default fresh heads (``num_heads``,
            ``num_layers``).
        steps: joint steps.
        head_warmup_steps: heads-only steps first (default: ``steps`` for fresh heads, 0 for given ones).
        batch_size, seq_len, warmup_steps, weight_decay, grad_clip, decay, labels, amp, progress, seed: as
            :func:`train_medusa1`.
        lr: peak learning rate of the target's trainable weights (LoRA or all).
        heads_lr: peak learning rate of the heads (larger: differential learning rates).
        lm_weight: ``lambda_0``, the weight of the distillation term.
        heads_weight: the weight of the heads' loss.
        lora_rank, lora_alpha: LoRA rank and scale; ``lora_rank=0`` fine-tunes every weight of the target.
        lora_targets: name suffixes of the adapted linear layers (default: all but ``lm_head``).
        out_dir: checkpoints ``step-N/`` and ``final/``, each with ``target/`` (``save_pretrained``, merged) and
            ``medusa/`` (Medusa authors' layout), and ``history.json``.
        save_every: checkpoint period of the joint phase (0: only the final one).
        time_budget: seconds for the joint phase (``None``: exactly ``steps``).

    Returns:
        :class:`Medusa2Result` ``(target, head, history)``: a new target (plain HF model, LoRA merged).

    References:
        Medusa arXiv 2401.10774 (Sec. 2.3.2 joint training, 2.3.3 self-distillation); LoRA arXiv 2106.09685.
    """
    _check_labels(labels)
    device = _device_of(target)
    dtype = target.get_output_embeddings().weight.dtype
    history: list[FitRecord] = []
    if head_warmup_steps is None:
        head_warmup_steps = steps if head is None else 0
    if head is None:
        head = MedusaHead.from_target(target, num_heads=num_heads, num_layers=num_layers)
    _check_head(head, target)
    stream = _stream(target, data, tokenizer, seq_len)
    if head_warmup_steps > 0:
        history += _fit_heads(target, head, stream, steps=head_warmup_steps, batch_size=batch_size, seq_len=seq_len,
                              lr=heads_lr, warmup_steps=warmup_steps, weight_decay=weight_decay, grad_clip=grad_clip,
                              decay=decay, labels=labels, amp=amp, out_dir=None, save_every=0, progress=progress,
                              seed=seed, time_budget=None, desc="Medusa-2 heads warm-up")

    target.eval()
    student = copy.deepcopy(target).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    if lora_rank > 0:
        trainable = [p for w in apply_lora(student, lora_rank, lora_alpha, generator=generator, targets=lora_targets)
                     for p in (w.lora_a, w.lora_b)]
    else:
        student.float()
        trainable = [p for p in student.parameters()]
        for p in trainable:
            p.requires_grad_(True)
    if head.config.shared_lm_head:  # the heads project with the tuned target's lm_head
        head.lm_head_weight = student.get_output_embeddings().weight.detach()
    for p in head.parameters():
        p.data = p.data.float()
    head.train()
    layer = head.config.feature_layer
    windows = torch.Generator().manual_seed(seed + 2)

    def loss_fn(step: int):
        batch = sample_windows(stream, batch_size, seq_len, generator=windows)
        with torch.no_grad(), _autocast(device, amp):
            teacher = target(input_ids=batch, use_cache=False).logits
        with _autocast(device, amp):
            out = student(input_ids=batch, output_hidden_states=True, use_cache=False)
            heads_loss, metrics = medusa_loss(head, out.hidden_states[layer], batch,
                                              target_logits=teacher if labels == "target" else None, decay=decay)
            kl = distillation_kl(teacher, out.logits)
        metrics["kl"] = kl.detach()
        return lm_weight * kl + heads_weight * heads_loss, metrics

    def snapshot(folder: Path) -> None:
        tuned = merge_lora(copy.deepcopy(student)) if lora_rank > 0 else copy.deepcopy(student)
        tuned.to(dtype).save_pretrained(folder / "target")
        save_medusa_head(head, folder / "medusa")

    def checkpoint(done: int) -> None:
        if out_dir is not None and done < steps:
            snapshot(Path(out_dir) / f"step-{done}")

    groups = [{"params": trainable}, {"params": list(head.parameters()), "lr_scale": heads_lr / lr}]
    warmup = min(steps // 10, 100) if warmup_steps is None else warmup_steps
    history += fit(groups, loss_fn, steps=steps, lr=lr, warmup_steps=warmup, weight_decay=weight_decay,
                   grad_clip=grad_clip, desc="Medusa-2 joint", progress=progress,
                   checkpoint_every=save_every if out_dir else 0, checkpoint_fn=checkpoint if out_dir else None,
                   time_budget=time_budget)

    tuned = merge_lora(student) if lora_rank > 0 else student
    tuned = tuned.to(dtype).eval()
    for p in tuned.parameters():
        p.requires_grad_(False)
    head = head.to(device=device, dtype=dtype).eval()
    if head.config.shared_lm_head:
        head.lm_head_weight = tuned.get_output_embeddings().weight.detach()
    if out_dir is not None:
        folder = Path(out_dir) / "final"
        tuned.save_pretrained(folder / "target")
        save_medusa_head(head, folder / "medusa")
        _write_history(folder, history)
    return Medusa2Result(tuned, head, history)
