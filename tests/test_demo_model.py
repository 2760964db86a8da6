"""The demo application (specdec/demo/): shipped models, the table, prompts, and the --train build on a tiny budget."""
from __future__ import annotations

import ast
import configparser
import fnmatch
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

from specdec.demo import (
    DemoModels,
    DemoPrompt,
    DemoSettings,
    build_demo_models,
    demo_prompts,
    load_demo_models,
    main,
)
from specdec.demo.app import Method, run_table
from specdec.demo.build import (
    _draft_from_target,
    heldout_prompts,
    is_heldout,
    stdlib_files,
)
from specdec.demo.models import ASSETS, trim_to_tokens

ROOT = Path(__file__).resolve().parents[1]

TINY = DemoSettings(vocab_size=300, seq_len=32, batch_size=2, target_layers=2, target_hidden=32, target_heads=2,
                    target_intermediate=64, target_steps=3, draft_steps=2, head_steps=3, eval_windows=2,
                    num_prompts=4, prompt_tokens=64, num_threads=1)


@pytest.fixture(scope="module")
def shipped() -> DemoModels:
    return load_demo_models()


@pytest.fixture(scope="module")
def small_stdlib(tmp_path_factory) -> Path:
    """A copy of 24 training and 3 held-out standard-library files: a corpus that builds in about a second."""
    train, heldout = stdlib_files()
    root = tmp_path_factory.mktemp("stdlib")
    for i, path in enumerate(train[:24] + heldout[:3]):
        shutil.copy(path, root / f"{i:02d}_{Path(path).name}")  # same bytes, so the same split
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, small_stdlib) -> DemoModels:
    return build_demo_models(tmp_path_factory.mktemp("demo") / "models", settings=TINY, progress=False,
                             stdlib_root=small_stdlib)


def state_dicts_equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ---------------------------------------------------------------------------------------------------------
# The shipped models


def test_shipped_models_load_fast_and_fit_together(shipped):
    rng_state = torch.random.get_rng_state()
    t0 = time.perf_counter()
    again = load_demo_models()
    assert time.perf_counter() - t0 < 30  # seconds, not minutes (about 1 s on an idle 2-core CPU)
    assert torch.equal(torch.random.get_rng_state(), rng_state)  # the caller's randomness is left alone
    target, draft, tokenizer, head = shipped.target, shipped.draft, shipped.tokenizer, shipped.eagle_head
    assert target.dtype == draft.dtype == head.dtype == torch.float32 and not target.training
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer) == head.config.vocab_size
    assert type(head).__name__ == "Eagle1Head" and head.config.feature_size == target.config.hidden_size
    assert tokenizer.eos_token_id == target.config.eos_token_id
    code = "def f(x):\n    return x + 1\n"
    assert tokenizer.decode(tokenizer(code)["input_ids"]) == code
    assert state_dicts_equal(again.target, target) and state_dicts_equal(again.eagle_head, head)
    report = shipped.report
    assert report.target_steps == report.settings["target_steps"] and report.head_steps == report.settings["head_steps"]
    assert report.draft_agreement > 0.4 and report.head_agreement > report.draft_agreement  # the head drafts better
    assert len(shipped.prompts) == report.settings["num_prompts"]
    size = sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file())
    assert size < 8 * 2**20, f"shipped assets take {size / 2**20:.1f} MB"


def test_shipped_assets_are_package_data():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in config["options.package_data"]["specdec.demo"].split("\n") if p.strip()]
    files = [f.relative_to(ASSETS.parent).as_posix() for f in ASSETS.rglob("*") if f.is_file()]
    assert files and all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in files), (files, patterns)


def test_demo_greedy_rows_are_identical_to_plain(shipped):
    from specdec.drafters import DraftModelDrafter, PromptLookupDrafter
    from specdec.recipes import eagle2

    prompts = shipped.heldout_prompts(2, prompt_tokens=96)
    ids = [shipped.tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in prompts]
    methods = [Method("plain", None), Method("draft", DraftModelDrafter(shipped.draft, 4), 4),
               Method("lookup", PromptLookupDrafter(num_drafts=10), 10),
               Method("eagle-2", eagle2(shipped.eagle_head, total_tokens=8, depth=3, top_k=3))]
    lines: list[str] = []
    rows = run_table(shipped.target, ids, methods, max_new_tokens=24, eos_token_id=shipped.tokenizer.eos_token_id,
                     emit=lines.append)
    assert [r.identical for r in rows] == [2, 2, 2, 2]
    assert all(r.new_tokens > 0 and r.seconds > 0 for r in rows)
    assert rows[0].tau == 1.0 and rows[3].tau > 1.5  # the head's drafts are accepted
    assert len(lines) == 2 + len(methods) and lines[2].startswith("plain") and "(reference)" in lines[2]


def test_cli_on_the_shipped_models(capsys):
    status = main(["--num-prompts", "2", "--max-new-tokens", "12", "--prompt-tokens", "96"])
    out = capsys.readouterr().out
    assert status == 0
    for label in ("plain", "draft model (K=4)", "prompt lookup (K=10)", "EAGLE-2 (tree"):
        assert re.search(rf"^{re.escape(label)}.*\d+\.\d\dx", out, re.MULTILINE), label
    assert "  prompt | " in out and "  model  | " in out and "Timing notes:" in out and "launch-bound" in out


def test_demo_prompts_trim_at_line_starts(shipped):
    prompts = demo_prompts(6, 80, tokenizer=shipped.tokenizer)
    assert prompts == shipped.heldout_prompts(6, 80) and len(prompts) == 6
    for p in prompts:
        n = len(shipped.tokenizer(p.prompt, add_special_tokens=False)["input_ids"])
        assert 40 <= n <= 80 and "def " in p.prompt.rsplit("\n", 1)[-1]
        full = next(q.prompt for q in shipped.prompts if q.reference == p.reference and q.source == p.source)
        assert full.endswith(p.prompt) and (full == p.prompt or full[-len(p.prompt) - 1] == "\n")
    with pytest.raises(ValueError, match="n and prompt_tokens must be >= 1"):
        demo_prompts(0)


def test_trim_to_tokens_keeps_the_longest_fitting_suffix():
    count = lambda s: len(s.split())
    text = "a b\nc d e\nf\ng h i j"
    assert trim_to_tokens(text, 100, count) == text
    assert trim_to_tokens(text, 5, count) == "f\ng h i j"
    assert trim_to_tokens(text, 4, count) == "g h i j"
    assert trim_to_tokens(text, 3, count) is None


def test_the_library_does_not_import_the_demo():
    for path in (ROOT / "specdec").rglob("*.py"):
        if "demo" in path.relative_to(ROOT / "specdec").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")] + [a.name for a in node.names]
            assert not any(n == "demo" or n.endswith(".demo") or ".demo." in n for n in names), (path, names)


# ---------------------------------------------------------------------------------------------------------
# --train, on a tiny budget


def test_split_is_by_sha1_and_disjoint():
    train, heldout = stdlib_files()
    assert train and heldout and not set(train) & set(heldout)
    assert all(is_heldout(Path(f).read_bytes()) for f in heldout)
    assert not any(is_heldout(Path(f).read_bytes()) for f in train[:50])
    assert all("site-packages" not in f and f.endswith(".py") for f in train + heldout)
    assert is_heldout(b"") == (int("da39a3ee5e6b4b0d3255bfef95601890afd80709", 16) % 50 == 0)


def test_build_writes_the_shipped_layout_and_is_deterministic(tiny, small_stdlib, tmp_path):
    target, draft, head, tokenizer = tiny.target, tiny.draft, tiny.eagle_head, tiny.tokenizer
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer) == TINY.vocab_size
    assert (target.config.num_hidden_layers, draft.config.num_hidden_layers) == (2, 1)
    assert type(head).__name__ == "Eagle1Head" and target.dtype == torch.float32
    assert {p.name for p in tiny.path.iterdir()} == {p.name for p in ASSETS.iterdir()}
    report = tiny.report
    assert (report.target_steps, report.draft_steps, report.head_steps) == (3, 2, 3)
    assert report.num_train_files == 24 and report.num_heldout_files == 3 and report.weights_dtype == "bfloat16"
    assert 0 < len(tiny.prompts) <= TINY.num_prompts
    # Stored in bfloat16: every weight is exactly representable there.
    assert all(torch.equal(p, p.bfloat16().float()) for p in target.parameters())
    rng_state, threads = torch.random.get_rng_state(), torch.get_num_threads()
    again = build_demo_models(tmp_path / "again", settings=TINY, progress=False, stdlib_root=small_stdlib)
    assert torch.equal(torch.random.get_rng_state(), rng_state) and torch.get_num_threads() == threads
    assert state_dicts_equal(again.target, target) and state_dicts_equal(again.draft, draft)
    assert state_dicts_equal(again.eagle_head, head) and again.prompts == tiny.prompts


def test_build_budget_stops_training_early(tmp_path, small_stdlib):
    models = build_demo_models(tmp_path / "m", settings=TINY, seconds_budget=1e-9, progress=False,
                               stdlib_root=small_stdlib)
    assert models.report.target_steps == 0 and models.report.draft_steps == 0 and models.report.head_steps == 3
    with pytest.raises(ValueError, match="seconds_budget must be > 0"):
        build_demo_models(tmp_path / "n", settings=TINY, seconds_budget=0, progress=False)


def test_draft_is_cut_from_the_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        target = LlamaForCausalLM(config)
    draft = _draft_from_target(target, 1)
    target_sd, draft_sd = target.state_dict(), draft.state_dict()
    assert draft.config.num_hidden_layers == 1 and target.config.num_hidden_layers == 3
    assert all(torch.equal(draft_sd[k], target_sd[k]) for k in draft_sd)
    assert draft.model.embed_tokens.weight.data_ptr() == draft.lm_head.weight.data_ptr()
    with pytest.raises(ValueError, match="draft_layers=3 must lie in 1..target_layers=2"):
        DemoSettings(target_layers=2, draft_layers=3)


def test_cli_runs_on_given_models(tiny, capsys):
    folder = tiny.path
    argv = ["--model", str(folder / "target"), "--draft", str(folder / "draft"), "--eagle-head",
            str(folder / "eagle1"), "--max-new-tokens", "6", "--num-prompts", "2", "--prompt-tokens", "64"]
    status = main(argv)
    out = capsys.readouterr().out
    # Near-tied logits of a 3-step model may legitimately flip an argmax; the table must be there either way.
    assert status in (0, 1)
    assert "plain" in out and "draft model (K=4)" in out and "prompt lookup (K=10)" in out and "EAGLE-2" in out


def test_cli_train_builds_then_runs_the_table(monkeypatch, tmp_path, small_stdlib, capsys):
    from specdec.demo import build

    real = build.build_demo_models
    calls = []

    def tiny_build(out_dir, **kwargs):  # the CLI's own arguments, on a tiny budget and corpus
        calls.append((out_dir, kwargs))
        return real(out_dir, **kwargs, settings=TINY, stdlib_root=small_stdlib)

    monkeypatch.setattr(build, "build_demo_models", tiny_build)
    out = tmp_path / "built"
    status = main(["--train", "--out", str(out), "--quiet", "--num-prompts", "1", "--max-new-tokens", "4",
                   "--prompt-tokens", "64"])
    text = capsys.readouterr().out
    assert status in (0, 1) and calls and calls[0][0] == str(out) and (out / "build.json").is_file()
    assert "training the demo models" in text and "EAGLE-2" in text
    with pytest.raises(SystemExit):
        main(["--train", "--model", "x"])


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
    kw = {"tokenizer": tokenizer, "files": files, "root": tmp_path, "min_prompt_tokens": 1, "reference_chars": 40}
    prompts = heldout_prompts(20, 12, **kw)
    assert prompts == heldout_prompts(20, 12, **kw)
    # Three one-line defs per file (the multi-line signature is skipped), spread round-robin over the files.
    assert len(prompts) == 9 and len({p.source for p in prompts[:3]}) == 3
    for p in prompts:
        assert isinstance(p, DemoPrompt)
        text = (tmp_path / p.source).read_text()
        assert p.prompt + p.reference in text and len(p.reference) <= 40
        last_line = p.prompt.rsplit("\n", 1)[-1]
        assert re.match(r"\s*(async\s+)?def \w+\(.*\).*:$", last_line)
        assert p.reference.startswith("\n")
        assert len(tokenizer(p.prompt)["input_ids"]) <= 12
        start = text.index(p.prompt + p.reference)
        assert start == 0 or text[start - 1] == "\n"
    assert len(heldout_prompts(2, 12, **kw)) == 2
    # A def line longer than prompt_tokens cannot be a prompt.
    assert heldout_prompts(5, 2, tokenizer=tokenizer, files=files) == []
    # A prompt keeps at least min_prompt_tokens tokens.
    short = heldout_prompts(9, 12, **{**kw, "min_prompt_tokens": 10})
    assert short and all(10 <= len(p.prompt.split()) <= 12 for p in short)
    with pytest.raises(ValueError, match="n and prompt_tokens must be >= 1"):
        heldout_prompts(0, 12, tokenizer=tokenizer, files=files)
