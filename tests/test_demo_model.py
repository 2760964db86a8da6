import dataclasses
import math
import re

import pytest
import torch

from specdec.demo import (
    DemoModels,
    DemoPrompt,
    DemoSettings,
    build_demo_models,
    heldout_prompts,
    is_heldout,
    main,
    stdlib_files,
)

TINY = DemoSettings(
    vocab_size=300,
    seq_len=32,
    batch_size=2,
    target_layers=2,
    target_hidden=32,
    target_heads=2,
    target_intermediate=64,
    target_steps=3,
    draft_layers=1,
    draft_steps=2,
    max_train_files=12,
    eval_windows=2,
    num_threads=1,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> DemoModels:
    return build_demo_models(tmp_path_factory.mktemp("demo") / "models", settings=TINY, progress=False)


def state_dicts_equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_split_is_by_sha1_and_disjoint():
    train, heldout = stdlib_files()
    assert train and heldout and not set(train) & set(heldout)
    assert all(is_heldout(open(f, "rb").read()) for f in heldout)
    assert not any(is_heldout(open(f, "rb").read()) for f in train[:50])
    assert all("site-packages" not in f and f.endswith(".py") for f in train + heldout)
    assert is_heldout(b"") == (int("da39a3ee5e6b4b0d3255bfef95601890afd80709", 16) % 50 == 0)


def test_build_tiny_models(tiny):
    target, draft, tokenizer = tiny.target, tiny.draft, tiny.tokenizer
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer) == TINY.vocab_size
    assert target.dtype == draft.dtype == torch.float32 and not target.training
    assert (target.config.num_hidden_layers, target.config.hidden_size) == (2, 32)
    assert (draft.config.num_hidden_layers, draft.config.hidden_size) == (1, 32)
    code = "def f(x):\n    return x + 1\n"
    assert tokenizer.decode(tokenizer(code)["input_ids"]) == code
    assert tokenizer.eos_token_id == target.config.eos_token_id
    assert len(tiny.train_files) == TINY.max_train_files and not set(tiny.train_files) & set(tiny.heldout_files)
    report = tiny.report
    assert (report.target_steps, report.draft_steps) == (3, 2) and not report.from_cache
    assert all(math.isfinite(x) for x in (report.target_loss, report.draft_loss, report.target_train_loss))
    assert 0.0 <= report.agreement <= 1.0 and report.num_train_tokens > TINY.seq_len


def test_cache_reload_and_determinism(tiny, tmp_path):
    rng_state = torch.random.get_rng_state()
    threads = torch.get_num_threads()
    again = build_demo_models(tiny.report.cache_dir, settings=TINY, progress=False)
    assert again.report.from_cache and again.report._replace(from_cache=False) == tiny.report
    assert state_dicts_equal(again.target, tiny.target) and state_dicts_equal(again.draft, tiny.draft)
    fresh = build_demo_models(tmp_path / "other", settings=TINY, progress=False)
    assert not fresh.report.from_cache
    assert state_dicts_equal(fresh.target, tiny.target) and state_dicts_equal(fresh.draft, tiny.draft)
    assert fresh.tokenizer.get_vocab() == tiny.tokenizer.get_vocab()
    assert torch.equal(torch.random.get_rng_state(), rng_state) and torch.get_num_threads() == threads
    with pytest.raises(ValueError, match="holds demo models built with other settings"):
        build_demo_models(tiny.report.cache_dir, settings=TINY, seed=1, progress=False)


def test_draft_is_cut_from_the_target(tmp_path):
    models = build_demo_models(tmp_path / "m", settings=TINY, progress=False)
    # Before distillation (0 steps) the draft equals the target's first layer, embeddings and norm.
    untrained = build_demo_models(tmp_path / "u", settings=dataclasses.replace(TINY, draft_steps=0), progress=False)
    target_sd, draft_sd = untrained.target.state_dict(), untrained.draft.state_dict()
    assert all(torch.equal(draft_sd[k], target_sd[k]) for k in draft_sd)
    assert models.draft.model.embed_tokens.weight.data_ptr() == models.draft.lm_head.weight.data_ptr()
    with pytest.raises(ValueError, match="draft_layers=3 must lie in 1..target_layers=2"):
        dataclasses.replace(TINY, draft_layers=3)


def test_seconds_budget_stops_training_early(tmp_path):
    models = build_demo_models(tmp_path / "m", settings=TINY, seconds_budget=1e-6, progress=False)
    assert models.report.target_steps == 0 and models.report.draft_steps == 0
    with pytest.raises(ValueError, match="seconds_budget must be > 0"):
        build_demo_models(tmp_path / "n", settings=TINY, seconds_budget=0, progress=False)


class WordTokenizer:
    """Counts whitespace-separated words as tokens."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


SOURCE = """import os


class A:
    x = 1

    def first(self, a):
        return a + 1

    def second(self, b):
        # a comment
        return b * 2


async def third(c) -> int:
    return c


def multi(
    a, b):
    return a
"""


def test_prompt_cutter_ends_at_a_def_line(tmp_path):
    files = []
    for i in range(3):
        path = tmp_path / f"f{i}.py"
        path.write_text(SOURCE.replace("first", f"first{i}"))
        files.append(str(path))
    tokenizer = WordTokenizer()
    prompts = heldout_prompts(20, 12, tokenizer=tokenizer, files=files, min_prompt_tokens=1, reference_chars=40)
    assert prompts == heldout_prompts(20, 12, tokenizer=tokenizer, files=files, min_prompt_tokens=1, reference_chars=40)
    # Three one-line defs per file (the multi-line signature is skipped), spread round-robin over the files.
    assert len(prompts) == 9 and len({p.source for p in prompts[:3]}) == 3
    for p in prompts:
        assert isinstance(p, DemoPrompt)
        text = open(p.source).read()
        assert p.prompt + p.reference in text and len(p.reference) <= 40
        last_line = p.prompt.rsplit("\n", 1)[-1]
        assert re.match(r"\s*(async\s+)?def \w+\(.*\).*:$", last_line)
        assert p.reference.startswith("\n")
        assert len(tokenizer(p.prompt)["input_ids"]) <= 12
        start = text.index(p.prompt + p.reference)
        assert start == 0 or text[start - 1] == "\n"
    assert len(heldout_prompts(2, 12, tokenizer=tokenizer, files=files, min_prompt_tokens=1)) == 2
    # A def line longer than prompt_tokens cannot be a prompt.
    assert heldout_prompts(5, 2, tokenizer=tokenizer, files=files) == []
    # A prompt keeps at least min_prompt_tokens tokens.
    short = heldout_prompts(9, 12, tokenizer=tokenizer, files=files, min_prompt_tokens=10)
    assert short and all(10 <= len(p.prompt.split()) <= 12 for p in short)
    with pytest.raises(ValueError, match="n and prompt_tokens must be >= 1"):
        heldout_prompts(0, 12, tokenizer=tokenizer, files=files)


def test_heldout_prompts_from_the_demo(tiny):
    prompts = tiny.heldout_prompts(4, prompt_tokens=64)
    assert len(prompts) == 4
    for p in prompts:
        n = len(tiny.tokenizer(p.prompt, add_special_tokens=False)["input_ids"])
        assert 32 <= n <= 64 and "def " in p.prompt.rsplit("\n", 1)[-1]


def test_main_runs_on_given_models(tiny, tmp_path, capsys):
    target_dir, draft_dir = tmp_path / "target", tmp_path / "draft"
    tiny.target.save_pretrained(target_dir)
    tiny.tokenizer.save_pretrained(target_dir)
    tiny.draft.save_pretrained(draft_dir)
    argv = ["--model", str(target_dir), "--draft", str(draft_dir), "--max-new-tokens", "6", "--num-prompts", "2",
            "--prompt-tokens", "48", "--threads", "1", "--quiet"]
    status = main(argv)
    out = capsys.readouterr().out
    # Near-tied logits of a 3-step model may legitimately flip an argmax; the table must be there either way.
    assert status in (0, 1)
    assert "plain" in out and "draft model (K=4)" in out and "prompt lookup (K=10)" in out and "tau" in out
