"""The one training loop of specdec: AdamW, warm-up + cosine schedule, random windows of a token stream.

Every trainer in the project (the EAGLE head trainers of :mod:`specdec.training.eagle`, the demo's target and
draft) is a ``loss_fn(step)`` handed to :func:`fit`; the schedule (:func:`cosine_schedule`) and the batch sampler
(:func:`sample_windows`) exist once, here.

References:
    Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (AdamW), arXiv 1711.05101; Loshchilov & Hutter,
    "SGDR" (cosine decay), arXiv 1608.03983; Radford et al., GPT-2 (packed language-model windows).
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

__all__ = ["FitRecord", "cosine_schedule", "fit", "sample_windows"]


def cosine_schedule(step: int, *, total_steps: int, peak_lr: float, warmup_steps: int,
                    min_lr_ratio: float = 0.1) -> float:
    """Learning rate of step ``step`` (0-based): linear warm-up to ``peak_lr``, then cosine decay to a floor.

    .. math::
        \\eta(s) = \\begin{cases}
            \\eta_{peak}\\,(s + 1) / W & s < W \\\\
            \\eta_{peak}\\,\\bigl(r + (1 - r)\\tfrac12
                \\bigl(1 + \\cos(\\pi\\,\\tfrac{s - W}{\\max(1, S - W)})\\bigr)\\bigr)
                & s \\ge W
        \\end{cases}

    with ``W = warmup_steps``, ``S = total_steps``, ``r = min_lr_ratio``: the first step runs at
    ``peak_lr / W``, step ``W - 1`` and step ``W`` at ``peak_lr``, and step ``S`` (one past the last) at
    ``r * peak_lr``.

    Args:
        step: the 0-based optimiser step.
        total_steps: ``S``, the steps of the run.
        peak_lr: the learning rate at the end of warm-up.
        warmup_steps: ``W >= 0``; 0 starts at ``peak_lr``.
        min_lr_ratio: ``r``, the floor as a fraction of ``peak_lr``.

    Returns:
        The learning rate.

    Example:
        >>> [round(cosine_schedule(s, total_steps=10, peak_lr=1.0, warmup_steps=2), 3) for s in (0, 1, 2, 10)]
        [0.5, 1.0, 1.0, 0.1]
    """
    if warmup_steps < 0 or total_steps < 0:
        raise ValueError(f"warmup_steps and total_steps must be >= 0, got {warmup_steps} and {total_steps}")
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def sample_windows(stream: torch.Tensor, batch_size: int, seq_len: int, *,
                   generator: torch.Generator) -> torch.Tensor:
    """``batch_size`` windows of ``seq_len`` consecutive tokens at uniform random starts of a token stream.

    Starts are drawn on the CPU from ``generator`` (so a seed gives the same batches on any device); the windows
    are gathered on the stream's device in one indexing operation.

    Args:
        stream: a packed token stream. Shape: ``[T]`` int64, ``T >= seq_len``.
        batch_size: ``B``, windows per batch.
        seq_len: tokens per window.
        generator: a CPU ``torch.Generator``, the only randomness used.

    Returns:
        Shape ``[B, seq_len]``, same dtype and device as ``stream``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> sample_windows(torch.arange(10), 2, 3, generator=g).shape
        torch.Size([2, 3])
    """
    if stream.dim() != 1:
        raise ValueError(f"stream must be a 1-D token stream [T], got shape {tuple(stream.shape)}; flatten it first")
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size} and {seq_len}")
    if stream.numel() < seq_len:
        raise ValueError(f"the stream has {stream.numel()} tokens, fewer than one window of {seq_len}: lower seq_len "
                         "or give more text")
    starts = torch.randint(0, stream.numel() - seq_len + 1, (batch_size,), generator=generator)
    span = torch.arange(seq_len)
    return stream[(starts[:, None] + span).to(stream.device)]


class FitRecord(NamedTuple):
    """One optimiser step of :func:`fit`.

    Attributes:
        step: steps completed, counting this one (1-based).
        loss: the loss that was minimised.
        lr: the learning rate used (of the first parameter group; groups may scale it, see :func:`fit`).
        metrics: the ``loss_fn``'s metrics, name -> float.
    """

    step: int
    loss: float
    lr: float
    metrics: dict


def _param_groups(params) -> list[dict]:
    params = list(params)
    if not params:
        raise ValueError("fit() got no parameters: pass model.parameters() or a list of AdamW param groups")
    if isinstance(params[0], dict):
        return [dict(group) for group in params]
    return [{"params": params}]


def _host_values(loss: torch.Tensor, metrics: dict) -> tuple[float, dict]:
    """The loss and metrics as floats; tensor values are stacked so the step costs one host sync."""
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    values = torch.stack([loss.detach().float().reshape(())]
                         + [metrics[k].detach().float().reshape(()).to(loss.device) for k in names]).tolist()
    tensors = dict(zip(names, values[1:]))
    return values[0], {k: tensors[k] if k in tensors else float(v) for k, v in metrics.items()}


def _scheduled_step(step: int, steps: int, warmup_steps: int, elapsed: float, time_budget: float | None) -> int:
    """The step whose :func:`cosine_schedule` rate step ``step`` takes: itself, or further along the decay when
    the time budget is being spent faster than the steps (see :func:`fit`)."""
    if time_budget is None or time_budget <= 0 or step < warmup_steps:
        return step
    by_time = warmup_steps + (steps - warmup_steps) * min(elapsed / time_budget, 1.0)
    return max(step, int(by_time))


#: The SIGTERM a training loop caught in this process (``None``: none). Sticky: once one came, every later
#: :func:`fit` of the process takes no step (a script training several heads in turn ends with the next save
#: instead of training past its ``timeout``).
_TERMINATED: dict = {"signal": None}


@contextlib.contextmanager
def _stop_on_terminate() -> Iterator[None]:
    """Within the block a SIGTERM (e.g. from ``timeout``) sets ``_TERMINATED["signal"]`` instead of killing the
    process, so a training loop can end after its current step and its caller still saves what was learned; the old
    handler is back at once, so a second SIGTERM acts as before. Only in the main thread (elsewhere nothing is
    installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        _TERMINATED["signal"] = signal.Signals(signum).name
        signal.signal(signal.SIGTERM, previous)  # a second one is not caught

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)


def fit(params, loss_fn: Callable[[int], tuple[torch.Tensor, dict]], *, steps: int, lr: float,
        warmup_steps: int = 0, weight_decay: float = 0.0, betas=(0.9, 0.95), grad_clip: float | None = 1.0,
        min_lr_ratio: float = 0.1, desc: str = "train", progress: bool = True, checkpoint_every: int = 0,
        checkpoint_fn: Callable[[int], None] | None = None,
        time_budget: float | None = None) -> list[FitRecord]:
    """Minimise ``loss_fn`` with AdamW on the :func:`cosine_schedule`, gradient clipping and a tqdm bar.

    Each step ``s = 0..steps-1``: set the learning rate ``cosine_schedule(s, ...)``, call ``loss_fn(s)``,
    back-propagate, clip the global gradient norm, take an AdamW step. Parameter groups keep their own
    ``weight_decay``; a group's ``lr_scale`` (default 1) multiplies the scheduled rate.

    Args:
        params: parameters, or AdamW param groups (dicts with ``"params"``).
        loss_fn: ``loss_fn(step) -> (loss, metrics)``: a scalar loss tensor with a graph, and ``{name: value}``
            with floats or 0-d tensors (tensors are read together with the loss: one host sync per step).
            It draws its own batch (e.g. :func:`sample_windows` with its own generator).
        steps: optimiser steps.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps of the schedule.
        weight_decay: AdamW decoupled weight decay (for groups that do not set their own).
        betas: AdamW betas.
        grad_clip: maximum global gradient norm, ``None`` or 0 for none.
        min_lr_ratio: the schedule's floor as a fraction of ``lr``.
        desc: the progress bar's label.
        progress: show the tqdm bar (loss and metrics in its postfix).
        checkpoint_every: call ``checkpoint_fn`` every this many steps (0: only at the end).
        checkpoint_fn: ``checkpoint_fn(steps_done)``, called every ``checkpoint_every`` steps and once after the
            last step taken (not twice for the same step).
        time_budget: wall-clock seconds; when spent, training stops before the next step and the bar says so.
            The cosine decay then follows whichever budget runs out first: after warm-up, step ``s`` takes the
            rate of step ``max(s, W + (S - W) * elapsed / time_budget)``, so a run cut by its time budget still
            ends at the floor instead of near ``peak_lr``. ``None``: exactly ``steps`` steps on the step schedule
            (what makes a run reproducible). The budget counts from the first step (data loading is not in it).

    A SIGTERM while training (e.g. ``timeout`` running out, in the main thread) ends the loop after the step under
    way, as a spent time budget does: the caller's checkpoint and save still run (a second SIGTERM kills). Later
    ``fit`` calls of the same process then take no step.

    Returns:
        One :class:`FitRecord` per step taken (fewer than ``steps`` when the time budget ran out or a SIGTERM
        came).

    Example:
        >>> w = torch.nn.Parameter(torch.tensor([3.0]))
        >>> history = fit([w], lambda s: ((w ** 2).sum(), {}), steps=50, lr=0.3, progress=False)
        >>> history[-1].loss < history[0].loss
        True
    """
    from tqdm.auto import tqdm

    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0 (0: only at the end), got {checkpoint_every}")
    if checkpoint_every and checkpoint_fn is None:
        raise ValueError("checkpoint_every > 0 needs a checkpoint_fn(step) to call")
    groups = _param_groups(params)
    scales = [float(group.pop("lr_scale", 1.0)) for group in groups]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    history: list[FitRecord] = []
    last_saved = 0
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=desc, disable=not progress, dynamic_ncols=True)
    with _stop_on_terminate():
        for step in bar:
            if time_budget is not None and time.perf_counter() - start >= time_budget:
                bar.set_description_str(f"{desc} (stopped: time budget {time_budget:g} s spent after {step} steps)")
                break
            if _TERMINATED["signal"] is not None:  # e.g. timeout's SIGTERM: end here, the caller still saves
                bar.set_description_str(f"{desc} (stopped: {_TERMINATED['signal']} after {step} steps)")
                break
            rate = cosine_schedule(_scheduled_step(step, steps, warmup_steps, time.perf_counter() - start,
                                                   time_budget),
                                   total_steps=steps, peak_lr=lr, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio)
            for group, scale in zip(optimizer.param_groups, scales):
                group["lr"] = rate * scale
            loss, metrics = loss_fn(step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(trained, grad_clip)
            optimizer.step()
            value, metrics = _host_values(loss, metrics)
            history.append(FitRecord(step + 1, value, rate, metrics))
            bar.set_postfix({"loss": f"{value:.3f}", **{k: f"{v:.3f}" for k, v in metrics.items()}}, refresh=False)
            if checkpoint_every and (step + 1) % checkpoint_every == 0:
                checkpoint_fn(step + 1)
                last_saved = step + 1
    bar.close()
    if checkpoint_fn is not None and history and last_saved != len(history):
        checkpoint_fn(len(history))
    return history
