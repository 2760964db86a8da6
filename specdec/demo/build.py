"""Build the demo models from Python's standard library: corpus, tokenizer, target, draft, EAGLE-1 head, prompts.

Used only by ``python -m specdec.demo --train`` (and to make the shipped ``assets/``). Nothing is downloaded.

- **Corpus**: the ``*.py`` sources of the running interpreter's standard library (``sysconfig.get_paths()
  ["stdlib"]``, without ``site-packages``, test suites, codec tables and pydoc data). A file is *held out* when
  the SHA-1 of its bytes, read as a hexadecimal integer, is divisible by 50 (the split of the
  ``pycode-heldout`` fixture); prompts are cut from held-out files at a ``def`` line, so no model trained on
  the code it completes.
- **Tokenizer**: a 2048-token byte-level BPE trained on the training files (``tokenizers``).
- **Target**: a ``LlamaForCausalLM`` trained from scratch with AdamW on random 256-token windows.
- **Draft**: the target's embeddings, first layer and final norm, distilled from the target (KL). At this scale
  a draft cut from the target agrees with it far more often than a small model trained from scratch.
- **EAGLE-1 head**: :func:`specdec.training.train_eagle1` against the target on the same stream.
- **Weights** are rounded to bfloat16 once each model is trained, *before* anything downstream uses it: the
  draft is distilled from, and the head trained against, exactly the target that is shipped, and the reported
  losses are those of the shipped weights.

Every model trains on the one loop of :mod:`specdec.training.loop`.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ._lib import fit, sample_windows, save_eagle_head, train_eagle1
from .models import (
    DemoModels,
    DemoPrompt,
    DemoReport,
    hf_progress_bars_off,
    load_demo_models,
    trim_to_tokens,
)

__all__ = ["DemoSettings", "build_demo_models", "default_build_dir", "heldout_prompts", "is_heldout",
           "stdlib_files"]

_EOS = "<|endoftext|>"
_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "encodings", "pydoc_data"}
)


@dataclass(frozen=True)
class DemoSettings:
    """Sizes and training budget of the demo models. The defaults made the shipped ``assets/``.

    Attributes:
        vocab_size: byte-level BPE vocabulary, special token included.
        seq_len: training window length in tokens.
        batch_size: windows per optimiser step.
        target_layers, target_hidden, target_heads, target_intermediate: the target ``LlamaConfig``.
        target_steps, target_lr: AdamW steps and peak learning rate for the target (cross-entropy on the data).
        draft_layers: decoder layers of the draft, copied from the target's first layers.
        draft_steps, draft_lr: steps and peak learning rate for distilling the draft (KL from the target).
        head_steps, head_lr: steps and peak learning rate of the EAGLE-1 head (``train_eagle1``).
        max_train_files: use only the first this many training files (:func:`stdlib_files` order); ``None``: all.
        eval_windows: held-out windows the reported losses and agreements are averaged over.
        num_prompts: prompts written to ``prompts.jsonl``.
        prompt_tokens: the most tokens a written prompt has (the demo trims further).
        weights_dtype: the dtype the weights are stored in (``"bfloat16"`` or ``"float32"``).
        num_threads: torch CPU threads while building (restored afterwards; results depend on it slightly).
    """

    vocab_size: int = 2048
    seq_len: int = 256
    batch_size: int = 8
    target_layers: int = 4
    target_hidden: int = 192
    target_heads: int = 3
    target_intermediate: int = 512
    target_steps: int = 1600
    target_lr: float = 3e-3
    draft_layers: int = 1
    draft_steps: int = 300
    draft_lr: float = 2e-3
    head_steps: int = 800
    head_lr: float = 2e-3
    max_train_files: int | None = None
    eval_windows: int = 32
    num_prompts: int = 48
    prompt_tokens: int = 512
    weights_dtype: str = "bfloat16"
    num_threads: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.draft_layers <= self.target_layers:
            raise ValueError(
                f"draft_layers={self.draft_layers} must lie in 1..target_layers={self.target_layers}: the draft "
                "is made of the target's first layers"
            )
        if self.target_hidden % self.target_heads:
            raise ValueError(
                f"target_hidden={self.target_hidden} is not divisible by target_heads={self.target_heads}; "
                "pick heads that divide the hidden size"
            )
        if self.weights_dtype not in ("bfloat16", "float32"):
            raise ValueError(f"weights_dtype must be 'bfloat16' or 'float32', got {self.weights_dtype!r}")


def default_build_dir() -> Path:
    """Where ``--train`` writes: ``$SPECDEC_DEMO_DIR``, else ``$XDG_CACHE_HOME/specdec/demo`` (``~/.cache``).

    Returns:
        The folder (not created).
    """
    if os.environ.get("SPECDEC_DEMO_DIR"):
        return Path(os.environ["SPECDEC_DEMO_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specdec" / "demo"


# ----------------------------------------------------------------------------------------------------------
# Corpus


def is_heldout(data: bytes) -> bool:
    """Whether a file is held out: the SHA-1 of its bytes, as a hexadecimal integer, is divisible by 50.

    Args:
        data: the file's raw bytes.

    Returns:
        True for held-out files (about 1 in 50).
    """
    return int(hashlib.sha1(data).hexdigest(), 16) % 50 == 0


def stdlib_files(root: str | os.PathLike | None = None) -> tuple[list[str], list[str]]:
    """The standard library's ``*.py`` files, split into training and held-out files by :func:`is_heldout`.

    Args:
        root: the directory to scan; default ``sysconfig.get_paths()["stdlib"]``. ``site-packages``,
            test suites (``test``, ``tests``, ``idle_test``), ``encodings`` and ``pydoc_data`` are skipped.

    Returns:
        ``(train_files, heldout_files)``, absolute paths in a deterministic walk order (a directory's files
        by name, then its subdirectories by name).
    """
    root = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"no standard library sources at {root}; pass root= a directory of .py files")
    train: list[str] = []
    heldout: list[str] = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                (heldout if is_heldout(Path(path).read_bytes()) else train).append(path)
    if not train or not heldout:
        raise ValueError(
            f"{root} gave {len(train)} training and {len(heldout)} held-out .py files; the demo needs both "
            "(about 1 file in 50 is held out, so point root= at a larger tree)"
        )
    return train, heldout


def _read_text(path: str) -> str:
    return Path(path).read_bytes().decode("utf-8", errors="replace")


_DEF_LINE = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+\w+.*:[ \t]*(?:#.*)?$", re.MULTILINE)


def heldout_prompts(n: int, prompt_tokens: int = 256, *, tokenizer, files: Sequence[str] | None = None,
                    root: str | os.PathLike | None = None, seed: int = 0, reference_chars: int = 1024,
                    min_prompt_tokens: int | None = None) -> list[DemoPrompt]:
    """Code-completion prompts cut from held-out files just after a one-line ``def`` signature.

    Each prompt is the file's text up to the end of a ``def ...:`` line, trimmed from the left at a line start
    to at most ``prompt_tokens`` tokens; the reference is what followed. Prompts are spread over the files
    (round-robin, files and ``def`` lines in a seeded order), so the same arguments give the same prompts.

    Args:
        n: how many prompts; fewer are returned when the files do not have enough ``def`` lines.
        prompt_tokens: the most tokens a prompt may have (as ``tokenizer`` counts them, no special tokens).
        tokenizer: a HF tokenizer; only used to count tokens.
        files: the files to cut from; default the held-out files of :func:`stdlib_files` (of ``root``).
        root: the tree ``source`` paths are made relative to (default: the standard library).
        seed: orders the files and the ``def`` lines within each file.
        reference_chars: the most characters of reference kept.
        min_prompt_tokens: skip ``def`` lines with less context than this; default ``prompt_tokens // 2``.

    Returns:
        A list of :class:`~specdec.demo.DemoPrompt`.
    """
    from .models import _counter

    if n < 1 or prompt_tokens < 1:
        raise ValueError(f"n and prompt_tokens must be >= 1, got n={n}, prompt_tokens={prompt_tokens}")
    if files is None:
        files = stdlib_files(root)[1]
    min_tokens = prompt_tokens // 2 if min_prompt_tokens is None else min_prompt_tokens
    rng = random.Random(seed)
    base = str(root if root is not None else sysconfig.get_paths()["stdlib"])
    count = _counter(tokenizer)

    per_file: list[tuple[str, str, list[re.Match]]] = []
    for path in map(str, files):
        text = _read_text(path)
        matches = [m for m in _DEF_LINE.finditer(text) if len(text) - m.end() > 16]
        rng.shuffle(matches)
        source = os.path.relpath(path, base) if path.startswith(base) else str(path)
        per_file.append((source, text, matches))
    rng.shuffle(per_file)

    prompts: list[DemoPrompt] = []
    while len(prompts) < n and any(matches for _, _, matches in per_file):
        for source, text, matches in per_file:
            if not matches or len(prompts) >= n:
                continue
            match = matches.pop()
            prompt = trim_to_tokens(text[: match.end()], prompt_tokens, count)
            if prompt is None or count(prompt) < min_tokens:
                continue
            prompts.append(DemoPrompt(source, prompt, text[match.end(): match.end() + reference_chars]))
    return prompts


# ----------------------------------------------------------------------------------------------------------
# Tokenizer and models


def _train_tokenizer(texts: Sequence[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=_EOS, bos_token=_EOS, pad_token=_EOS, unk_token=None, model_max_length=2048
    )


def _encode_stream(tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """All texts as one int64 token stream, each text followed by EOS."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(list(texts)):
        ids.extend(encoding.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def _target_model(settings: DemoSettings, vocab_size: int, eos: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=settings.target_hidden,
        intermediate_size=settings.target_intermediate,
        num_hidden_layers=settings.target_layers,
        num_attention_heads=settings.target_heads,
        num_key_value_heads=settings.target_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    # HF initialises weights from the global RNG; fork it so the build neither depends on nor changes it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float()


def _draft_from_target(target, num_layers: int):
    """A copy of the target cut to its first ``num_layers`` decoder layers (embeddings and final norm kept)."""
    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    with torch.random.fork_rng(devices=[]):
        draft = LlamaForCausalLM(config)
    kept = {
        name: value
        for name, value in target.state_dict().items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers
    }
    missing, unexpected = draft.load_state_dict(kept, strict=False)
    # A tied lm_head may be absent from the state dict and is re-tied by HF; anything else is a bug.
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"draft init from the target failed: missing {missing}, unexpected {unexpected}")
    return draft.float()


def _round_weights(module: torch.nn.Module, dtype_name: str) -> None:
    """Round parameters to the storage dtype in place (kept in float32), so what is measured is what ships."""
    if dtype_name == "float32":
        return
    dtype = getattr(torch, dtype_name)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(dtype).float())


def _decay_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices only (not on norms and biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def _train_lm(model, stream: torch.Tensor, *, steps: int, lr: float, settings: DemoSettings, seed: int,
              time_budget: float | None, desc: str, progress: bool, teacher=None) -> tuple[int, float]:
    """Train on random windows with :func:`~specdec.training.loop.fit`; returns (steps, mean loss of last 10%).

    The loss is next-token cross-entropy on the data, or with a ``teacher`` the KL divergence from the
    teacher's next-token distribution to the model's (distillation), averaged over positions.
    """
    generator = torch.Generator().manual_seed(seed)

    def loss_fn(step: int):
        batch = sample_windows(stream, settings.batch_size, settings.seq_len, generator=generator)
        if teacher is None:
            return model(input_ids=batch, labels=batch).loss, {}
        with torch.no_grad():
            teacher_logp = torch.log_softmax(teacher(input_ids=batch).logits, dim=-1)
        logp = torch.log_softmax(model(input_ids=batch).logits, dim=-1)
        return (teacher_logp.exp() * (teacher_logp - logp)).sum(-1).mean(), {}

    model.train()
    history = fit(_decay_groups(model, 0.1), loss_fn, steps=steps, lr=lr, warmup_steps=max(1, steps // 20),
                  betas=(0.9, 0.95), grad_clip=1.0, desc=desc, progress=progress, time_budget=time_budget)
    model.eval()
    tail = [r.loss for r in history[-max(1, len(history) // 10):]]
    return len(history), (sum(tail) / len(tail) if tail else float("nan"))


def _eval_windows(stream: torch.Tensor, settings: DemoSettings) -> torch.Tensor:
    """Evenly spaced held-out windows of ``seq_len + 1`` tokens. Shape ``[W, seq_len + 1]``."""
    seq_len = min(settings.seq_len, len(stream) - 1)
    count = max(1, min(settings.eval_windows, (len(stream) - 1) // seq_len))
    starts = torch.linspace(0, len(stream) - seq_len - 1, count).long()
    return stream[starts[:, None] + torch.arange(seq_len + 1)]


@torch.no_grad()
def _evaluate(target, draft, head, windows: torch.Tensor) -> tuple[float, float, float, float]:
    """Held-out (target loss, draft loss, draft argmax agreement, head top-1 agreement)."""
    layer = head.feature_layers[0]
    sums = [0.0, 0.0, 0.0, 0.0]
    for chunk in windows.split(8):
        inputs, labels = chunk[:, :-1], chunk[:, 1:]
        out = target(input_ids=inputs, output_hidden_states=True)
        target_logits = out.logits
        draft_logits = draft(input_ids=inputs).logits
        for i, logits in enumerate((target_logits, draft_logits)):
            sums[i] += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                               reduction="sum"))
        sums[2] += float((target_logits.argmax(-1) == draft_logits.argmax(-1)).sum())
        # The head pairs the target feature at t with token t+1 and predicts the target's choice at t+2.
        B, T = inputs.shape
        feats = head.features_to_hidden((out.hidden_states[layer],))
        pred = head(inputs[:, 1:], feats[:, :-1], torch.arange(T - 1)[None].expand(B, -1))
        sums[3] += float((head.logits(pred).argmax(-1) == target_logits[:, 1:].argmax(-1)).sum())
    n = windows.shape[0] * (windows.shape[1] - 1)
    return sums[0] / n, sums[1] / n, sums[2] / n, sums[3] / (windows.shape[0] * (windows.shape[1] - 2))


def build_demo_models(out_dir: str | os.PathLike | None = None, *, settings: DemoSettings = DemoSettings(),
                      seed: int = 0, seconds_budget: float | None = None, progress: bool = True,
                      stdlib_root: str | os.PathLike | None = None) -> DemoModels:
    """Train the demo's tokenizer, target, draft and EAGLE-1 head on the standard library; write and load them.

    Steps: split the ``*.py`` files (:func:`stdlib_files`); train a byte-level BPE on the training files;
    train the target on random windows of the concatenated files; cut the draft out of the target and distil
    it; train an EAGLE-1 head against the target (:func:`specdec.training.train_eagle1`); measure held-out
    losses and agreements; cut prompts from the held-out files; write everything to ``out_dir`` in the layout
    :func:`~specdec.demo.load_demo_models` reads (replacing what was there). The same settings, seed and
    standard library give the same models (CPU, same thread count).

    Args:
        out_dir: where to write (default :func:`default_build_dir`).
        settings: sizes and budget, see :class:`DemoSettings`.
        seed: seeds weight initialisation and window sampling (the global RNG is neither read nor changed).
        seconds_budget: optional wall-clock cap on training the target and the draft (spent in that order);
            the EAGLE head always takes ``settings.head_steps``. With a budget, the models depend on the
            machine's speed.
        progress: show tqdm bars and summary lines.
        stdlib_root: scan this directory instead of the interpreter's standard library.

    Returns:
        :class:`~specdec.demo.DemoModels` loaded back from ``out_dir`` (float32, CPU).
    """
    if seconds_budget is not None and seconds_budget <= 0:
        raise ValueError(f"seconds_budget must be > 0 (or None for the fixed step budget), got {seconds_budget}")
    out = Path(out_dir) if out_dir is not None else default_build_dir()
    t_start = time.perf_counter()
    deadline = None if seconds_budget is None else t_start + float(seconds_budget)

    def remaining() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.perf_counter())

    def say(message: str) -> None:
        if progress:
            print(f"[specdec.demo] {message}", flush=True)

    train_files, heldout_files = stdlib_files(stdlib_root)
    if settings.max_train_files is not None:
        train_files = train_files[: settings.max_train_files]
    threads = torch.get_num_threads()
    torch.set_num_threads(settings.num_threads)
    try:
        t0 = time.perf_counter()
        texts = [_read_text(f) for f in train_files]
        tokenizer = _train_tokenizer(texts, settings.vocab_size)
        stream = _encode_stream(tokenizer, texts)
        heldout = _eval_windows(_encode_stream(tokenizer, [_read_text(f) for f in heldout_files]), settings)
        if len(stream) <= settings.seq_len + 1:
            raise ValueError(f"the training files give only {len(stream)} tokens, fewer than one window of "
                             f"{settings.seq_len + 1}; raise max_train_files or lower seq_len")
        tokenizer_seconds = time.perf_counter() - t0
        say(f"{len(train_files)} training files ({len(stream):,} tokens), {len(heldout_files)} held out; "
            f"BPE vocab {len(tokenizer)} in {tokenizer_seconds:.1f} s")

        t0 = time.perf_counter()
        target = _target_model(settings, len(tokenizer), tokenizer.eos_token_id, seed)
        target_steps, _ = _train_lm(target, stream, steps=settings.target_steps, lr=settings.target_lr,
                                    settings=settings, seed=seed, time_budget=remaining(), desc="train target",
                                    progress=progress)
        _round_weights(target, settings.weights_dtype)
        target.requires_grad_(False)
        target_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        draft = _draft_from_target(target, settings.draft_layers)
        draft.requires_grad_(True)
        draft_steps, _ = _train_lm(draft, stream, steps=settings.draft_steps, lr=settings.draft_lr,
                                   settings=settings, seed=seed + 1, time_budget=remaining(), desc="distil draft",
                                   progress=progress, teacher=target)
        _round_weights(draft, settings.weights_dtype)
        draft_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        result = train_eagle1(target, stream, steps=settings.head_steps, batch_size=settings.batch_size,
                              seq_len=settings.seq_len, lr=settings.head_lr, progress=progress, seed=seed + 2)
        head = result.head
        _round_weights(head, settings.weights_dtype)
        head_seconds = time.perf_counter() - t0

        target_loss, draft_loss, draft_agreement, head_agreement = _evaluate(target, draft, head, heldout)
        prompts = heldout_prompts(settings.num_prompts, settings.prompt_tokens, tokenizer=tokenizer,
                                  files=heldout_files, root=stdlib_root, seed=seed,
                                  min_prompt_tokens=settings.prompt_tokens // 4, reference_chars=512)
    finally:
        torch.set_num_threads(threads)

    report = DemoReport(
        python_version=".".join(map(str, sys.version_info[:3])),
        num_train_files=len(train_files),
        num_heldout_files=len(heldout_files),
        num_train_tokens=len(stream),
        target_loss=target_loss,
        draft_loss=draft_loss,
        draft_agreement=draft_agreement,
        head_agreement=head_agreement,
        target_steps=target_steps,
        draft_steps=draft_steps,
        head_steps=len(result.history),
        tokenizer_seconds=tokenizer_seconds,
        target_seconds=target_seconds,
        draft_seconds=draft_seconds,
        head_seconds=head_seconds,
        total_seconds=time.perf_counter() - t_start,
        weights_dtype=settings.weights_dtype,
        settings=dataclasses.asdict(settings),
    )
    _save(out, target, draft, head, tokenizer, prompts, report)
    say(f"held-out loss: target {target_loss:.3f}, draft {draft_loss:.3f} nats/token; draft agrees with the "
        f"target on {draft_agreement:.1%} of tokens, the EAGLE head on {head_agreement:.1%}; built in "
        f"{report.total_seconds:.0f} s, written to {out}")
    return load_demo_models(path=out)


def _save(path: Path, target, draft, head, tokenizer, prompts: list[DemoPrompt], report: DemoReport) -> None:
    """Write into a temporary sibling and rename, so an interrupted save never looks like a finished build."""
    dtype = getattr(torch, report.weights_dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with hf_progress_bars_off():
        copy.deepcopy(target).to(dtype).save_pretrained(tmp / "target")
        tokenizer.save_pretrained(tmp / "target")
        copy.deepcopy(draft).to(dtype).save_pretrained(tmp / "draft")
    head_dtype = head.dtype
    head.to(dtype)  # the frozen target tensors it holds are not saved
    try:
        save_eagle_head(head, tmp / "eagle1")
    finally:
        head.to(head_dtype)
    with open(tmp / "prompts.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p._asdict(), ensure_ascii=False) + "\n" for p in prompts)
    (tmp / "build.json").write_text(json.dumps(report._asdict(), indent=2) + "\n")
    for file in tmp.rglob("*"):
        if file.is_file():
            file.chmod(0o644)  # some writers create 0600 files; package data must be readable by every user
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
