"""Run the demo's table: each method decodes the same prompts greedily at batch 1; a row prints as it finishes.

A method is a name, a drafter and a ``K`` (:class:`Method`); :func:`run_table` times each with
:func:`specdec.generate`, compares its outputs with plain greedy decoding, and prints a :class:`Row`.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from ._lib import generate

__all__ = ["Method", "Row", "print_sample", "print_timing_notes", "run_method", "run_table"]

HEADER = f"{'method':<28} {'tau':>5} {'tokens/s':>9} {'speedup':>8}  identical to plain"


class Method(NamedTuple):
    """One row of the table.

    Attributes:
        name: the row's label.
        drafter: a :class:`~specdec.drafters.Drafter`, or ``None`` for plain decoding.
        num_drafts: ``K`` passed to ``generate`` (``None``: the drafter's own maximum).
    """

    name: str
    drafter: Any
    num_drafts: int | None = None


class Row(NamedTuple):
    """What one method measured over all prompts.

    Attributes:
        name: the method's label.
        outputs: per prompt, the new token ids.
        new_tokens: new tokens over all prompts.
        seconds: wall-clock seconds of ``generate`` over all prompts (prefill included).
        tau: tokens emitted per verification forward (1.0 for plain decoding).
        speedup: tokens/s over the plain row's (1.0 for the plain row itself).
        identical: prompts whose output equals plain decoding's.
    """

    name: str
    outputs: list
    new_tokens: int
    seconds: float
    tau: float
    speedup: float
    identical: int

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second."""
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def run_method(target, prompts_ids: Sequence[list[int]], method: Method, *, max_new_tokens: int, eos_token_id,
               device="cpu") -> tuple[list[list[int]], float, float, int]:
    """Decode every prompt with one method (greedy, batch 1) after a short warm-up.

    Args:
        target: the HF causal LM.
        prompts_ids: token ids of each prompt.
        method: the :class:`Method`.
        max_new_tokens: new tokens per prompt (fewer when EOS comes first).
        eos_token_id: stops a prompt's decoding.
        device: where the target is.

    Returns:
        ``(outputs, seconds, emitted_by_steps, steps)``: new token ids per prompt, wall-clock seconds summed over
        prompts, tokens emitted by verification steps and the number of those steps (their ratio is tau).
    """
    kwargs = {} if method.drafter is None else {"drafter": method.drafter, "num_drafts": method.num_drafts}

    def one(ids: list[int], budget: int):
        input_ids = torch.tensor([ids], device=device)
        _sync(device)
        t0 = time.perf_counter()
        out = generate(target, input_ids, max_new_tokens=budget, eos_token_id=eos_token_id, **kwargs)
        _sync(device)
        seconds = time.perf_counter() - t0
        new = out.sequences[0, input_ids.shape[1]: input_ids.shape[1] + int(out.num_new_tokens[0])].tolist()
        return new, seconds, out.stats.tau * out.stats.num_steps, out.stats.num_steps

    one(prompts_ids[0], min(8, max_new_tokens))  # warm-up: first-call costs are not timed
    outputs, seconds, emitted, steps = [], 0.0, 0.0, 0
    for ids in prompts_ids:
        new, s, e, n = one(ids, max_new_tokens)
        outputs.append(new)
        seconds, emitted, steps = seconds + s, emitted + e, steps + n
    return outputs, seconds, emitted, steps


def _format(row: Row, is_reference: bool) -> str:
    n = len(row.outputs)
    same = "(reference)" if is_reference else ("yes" if row.identical == n else f"NO ({row.identical}/{n} prompts)")
    return f"{row.name:<28} {row.tau:>5.2f} {row.tokens_per_second:>9.1f} {row.speedup:>7.2f}x  {same}"


def run_table(target, prompts_ids: Sequence[list[int]], methods: Sequence[Method], *, max_new_tokens: int,
              eos_token_id, device="cpu", emit: Callable[[str], None] = print) -> list[Row]:
    """Run each method over all prompts, one after another, and emit its table row as soon as it is done.

    The first method is the reference (plain decoding): speedups are against it, and every other method's
    outputs are compared with it token by token.

    Args:
        target: the HF causal LM.
        prompts_ids: token ids of each prompt.
        methods: the rows; the first one is the reference.
        max_new_tokens: new tokens per prompt.
        eos_token_id: stops a prompt's decoding.
        device: where the target is.
        emit: prints a line (flushing, so rows appear as they finish).

    Returns:
        One :class:`Row` per method.
    """
    if not prompts_ids:
        raise ValueError("no prompts to decode: lower --prompt-tokens or give more prompts")
    emit(HEADER)
    emit("-" * len(HEADER))
    rows: list[Row] = []
    for i, method in enumerate(methods):
        outputs, seconds, emitted, steps = run_method(target, prompts_ids, method, max_new_tokens=max_new_tokens,
                                                      eos_token_id=eos_token_id, device=device)
        new_tokens = sum(map(len, outputs))
        reference = rows[0].outputs if rows else outputs
        rate = new_tokens / seconds if seconds > 0 else float("nan")
        base = rows[0].tokens_per_second if rows else rate
        row = Row(method.name, outputs, new_tokens, seconds, emitted / steps if steps else float("nan"),
                  rate / base, sum(a == b for a, b in zip(outputs, reference)))
        rows.append(row)
        emit(_format(row, i == 0))
    return rows


def print_sample(tokenizer, prompt: str, rows: Sequence[Row], *, prompt_lines: int = 6, max_lines: int = 10,
                 emit: Callable[[str], None] = print) -> None:
    """Print the first prompt's last lines and the plain continuation, and which methods reproduced it exactly.

    Args:
        tokenizer: decodes the continuation.
        prompt: the first prompt's text.
        rows: the table's rows (the first is plain decoding).
        prompt_lines: prompt lines shown.
        max_lines: continuation lines shown at most.
        emit: prints a line.
    """
    plain = rows[0].outputs[0]
    same = [row.name for row in rows[1:] if row.outputs[0] == plain]
    differ = [row.name for row in rows[1:] if row.outputs[0] != plain]
    text = tokenizer.decode(plain, skip_special_tokens=True)
    lines = text.split("\n")
    shown = lines[:max_lines]
    emit("")
    emit(f"Sample: the end of prompt 1, then its {len(plain)} generated tokens"
         + (" (first lines)" if len(lines) > max_lines else "") + ":")
    for line in prompt.split("\n")[-prompt_lines:]:
        emit(f"  prompt | {line}")
    for j, line in enumerate(shown):
        emit(f"  model  | {line}" if j else f"  model  | ...{line}" if line.strip() else "  model  |")
    verdict = f"Token-identical to plain greedy here: {', '.join(same)}." if same else ""
    if differ:
        verdict += f" DIFFERENT: {', '.join(differ)}."
    emit(verdict.strip())


def print_timing_notes(rows: Sequence[Row], *, num_prompts: int, prompt_tokens: int, max_new_tokens: int,
                       device, dtype: torch.dtype, threads: int, target_params: int,
                       emit: Callable[[str], None] = print) -> None:
    """Say what was measured and why tiny CPU models understate the speedups of large GPU targets.

    Args:
        rows: the table's rows (the first is plain decoding).
        num_prompts: prompts decoded per method.
        prompt_tokens: the prompt length cap.
        max_new_tokens: new tokens per prompt.
        device: where the models ran.
        dtype: their dtype.
        threads: torch CPU threads.
        target_params: parameters of the target.
        emit: prints a line.
    """
    plain_ms = 1000.0 / rows[0].tokens_per_second
    dtype_name = str(dtype).replace("torch.", "")
    on = f"{device} ({threads} torch thread{'s' if threads != 1 else ''})" if str(device) == "cpu" else str(device)
    emit("")
    emit("Timing notes:")
    emit(f"- Measured: {num_prompts} held-out prompts (<= {prompt_tokens} tokens each), up to {max_new_tokens} new "
         f"tokens,\n  greedy, batch 1, {dtype_name} on {on}.")
    emit("- Each row is the wall clock of generate() summed over the prompts (prefill included), after one short\n"
         "  warm-up run. Rows run one after another, so other load on the machine can tilt them.")
    emit("- tau: tokens emitted per target forward, bonus token included (the EAGLE/Medusa tables' figure).")
    if hasattr(os, "getloadavg"):
        emit(f"- Machine: {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the end of the run\n"
             "  (this run alone adds about 1; more means other processes shared the cores).")
    if str(device) == "cpu":
        emit(f"- The target is tiny ({target_params / 1e6:.1f}M parameters): plain decoding costs {plain_ms:.1f} ms "
             "per token here,\n"
             "  mostly fixed per-call costs (launch-bound), not arithmetic. So a draft-model or EAGLE-head forward\n"
             "  costs a large fraction of a target forward, while verifying 1 token or a tree of 8 costs about the\n"
             "  same. With a large target on a GPU the drafter is cheap next to the target, and the same tau gives\n"
             "  larger speedups (docs/benchmarks.md: 4.24x for EAGLE-2 on an H200).")
