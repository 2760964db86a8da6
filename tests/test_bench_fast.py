"""examples/bench_fast.py: the CPU smoke mode runs every specdec row end to end; the gpt-fast conversion keeps the
HF model's logits (when gpt-fast's files are at hand)."""
from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))


def test_quick_mode_times_every_specdec_row_and_writes_the_results(tmp_path):
    import bench_fast

    out = bench_fast.main(["--quick", "--num-prompts", "2", "--prompt-tokens", "24", "--max-new-tokens", "5",
                           "--batches", "2", "--warmup", "0", "--parallel-tree", "mc_sim_7b_63",
                           "--out", str(tmp_path)])
    assert out["errors"] == {}
    rows = {(r["batch"], r["method"]): r for r in out["rows"]}
    expected = ["HF vanilla", "specdec eager plain", "specdec fast plain", "specdec fast SpS K=4",
                "specdec fast SpS K=4, level by level", "specdec fast SpS K=6", "specdec fast SpS K=6, level by level",
                "specdec fast SpS K=4, eager draft", "specdec fast prompt lookup K=10", "specdec fast EAGLE-2",
                "specdec fast EAGLE-3", "specdec fast Medusa", "specdec fast P-EAGLE",
                "specdec fast P-EAGLE tree mc_sim_7b_63"]
    assert [m for b, m in rows if b == 1] == expected
    assert [m for b, m in rows if b == 2] == ["HF vanilla", "specdec eager plain", "specdec fast plain",
                                              "specdec fast EAGLE-3"]
    for r in out["rows"]:
        assert r["tokens_per_s"] > 0 and r["ratio_vs_gptfast"] is None
        assert len(r["per_input_s"]) == r["inputs"] and isinstance(r["captured_while_timed"], dict)
        assert r["same_as_hf"] == 1.0, r  # float32: every lossless method emits HF's greedy tokens
        if r["method"] != "HF vanilla":
            assert r["tau"] >= 1.0
    assert rows[(1, "HF vanilla")]["speedup_vs_hf"] == 1.0
    for run in ("kernels", "torch references"):  # the same phases with the kernels and with their references
        assert set(out["phases"][run]["phases_ms_per_step"]) >= {"draft", "target", "verify", "commit", "update"}
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["rows"]) == len(out["rows"]) and "gpt-fast" in saved["checks"][0]
    assert (tmp_path / "results.md").read_text().count("| specdec fast EAGLE-3 |") == 2
    pytest.importorskip("matplotlib")
    assert (tmp_path / "results.png").stat().st_size > 0


def test_fp8_and_int4_heads_add_a_lossless_row_per_eagle_head(tmp_path):
    import bench_fast

    out = bench_fast.main(["--quick", "--num-prompts", "2", "--prompt-tokens", "24", "--max-new-tokens", "5",
                           "--batches", "--warmup", "0", "--fp8-heads", "--int4-heads", "32", "--only", "EAGLE",
                           "--out", str(tmp_path)])
    assert out["errors"] == {}
    methods = [r["method"] for r in out["rows"]]
    assert "specdec fast EAGLE-2 float8" in methods and "specdec fast EAGLE-3 float8" in methods
    assert "specdec fast EAGLE-2 int4 g32" in methods and "specdec fast EAGLE-3 int4 g32" in methods
    for r in out["rows"]:
        assert r["same_as_hf"] == 1.0, r  # float32 target: the rounded heads' drafts are verified as any


def test_chain_k_and_prefetch_rows_are_lossless_and_ask_for_their_k(tmp_path):
    import bench_fast

    out = bench_fast.main(["--quick", "--num-prompts", "2", "--prompt-tokens", "24", "--max-new-tokens", "9",
                           "--batches", "--warmup", "0", "--chain-k", "2", "--prefetch-rows", "--only", "P-EAGLE",
                           "--out", str(tmp_path)])
    assert out["errors"] == {}
    rows = {r["method"]: r for r in out["rows"]}
    assert {"specdec fast P-EAGLE chain K=2", "specdec fast P-EAGLE, next draft in the update"} <= set(rows)
    for r in out["rows"]:
        assert r["same_as_hf"] == 1.0, r  # float32: the shorter chain and the prefetched drafts are verified as any
    # a chain of 2 emits at most 3 tokens per target forward (K + 1)
    assert 1.0 <= rows["specdec fast P-EAGLE chain K=2"]["tau"] <= 3.0
    out = bench_fast.main(["--quick", "--num-prompts", "1", "--prompt-tokens", "24", "--max-new-tokens", "3",
                           "--batches", "--warmup", "0", "--chain-k", "2", "--prefetch-rows", "--only", "P-EAGLE",
                           "--skip", "chain", "--out", str(tmp_path / "skip")])
    assert [r["method"] for r in out["rows"] if r["method"].startswith("specdec")] == [
        "specdec fast P-EAGLE", "specdec fast P-EAGLE, next draft in the update"]


# gpt-fast's files are not part of the project: the test runs only where SPECDEC_ANCHORS names a folder holding them.
ANCHORS = os.environ.get("SPECDEC_ANCHORS", "")


@pytest.mark.skipif(not os.path.isfile(os.path.join(ANCHORS, "gptfast", "model.py")),
                    reason="gpt-fast's files are not at hand (set SPECDEC_ANCHORS to the anchors folder)")
def test_conversion_to_gptfast_keeps_the_logits():
    import importlib.util

    import bench_fast

    # gpt-fast's model.py alone, under its own name (its generate.py sets inductor options process-wide).
    spec = importlib.util.spec_from_file_location("gptfast_model_under_test",
                                                  os.path.join(ANCHORS, "gptfast", "model.py"))
    gptfast_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gptfast_model)
    target, draft, _ = bench_fast.quick_models("cpu")
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(0))
    for hf in (target, draft):
        converted = bench_fast.to_gptfast(hf, gptfast_model, "cpu", torch.float32)
        converted.setup_caches(max_batch_size=1, max_seq_length=32)
        with torch.no_grad():
            torch.testing.assert_close(converted(ids, torch.arange(20)), hf(ids).logits, atol=2e-5, rtol=1e-4)


def test_summary_rates_and_the_issue_checks():
    from bench_fast import Run, checks, summarise

    same, other = [[1, 2, 3, 4]], [[1, 2, 3, 5]]
    timed = {"HF vanilla": ([Run(same, None, 0)] * 2, 2.0),
             "gpt-fast vanilla": ([Run(same, 3, 3)] * 2, 0.2),
             "gpt-fast SpS K=4": ([Run(same, 1, 3)] * 2, 0.4),
             "specdec fast plain": ([Run(same, 3, 3)] * 2, 0.25),
             "specdec fast SpS K=4": ([Run(other, 1, 3)] * 2, 0.5),
             "specdec fast EAGLE-3": ([Run(same, 1, 3), Run(other, 1, 3)], 0.1)}
    rows = {r["method"]: r for r in summarise(timed, batch=1)}
    assert rows["HF vanilla"]["tokens_per_s"] == 4.0 and rows["HF vanilla"]["tau"] is None
    assert rows["gpt-fast vanilla"]["speedup_vs_hf"] == 10.0 and rows["gpt-fast vanilla"]["ratio_vs_gptfast"] == 1.0
    assert rows["specdec fast EAGLE-3"]["ratio_vs_gptfast"] == 2.0 and rows["specdec fast EAGLE-3"]["tau"] == 3.0
    assert rows["specdec fast EAGLE-3"]["same_as_gptfast"] == 0.5 and rows["specdec fast SpS K=4"]["same_as_hf"] == 0
    lines = checks(list(rows.values()))
    assert lines[0].startswith("fast plain time / gpt-fast vanilla time = 1.25") and lines[0].endswith("MISS")
    assert lines[1].startswith("fast EAGLE-3 / gpt-fast vanilla tokens/s = 2.00") and lines[1].endswith("ok")
    assert lines[2].startswith("fast SpS K=4 / gpt-fast SpS K=4 tokens/s = 0.80") and lines[2].endswith("MISS")
    assert lines[3].endswith("MISS (specdec fast SpS K=4)")
    assert rows["specdec fast plain"]["ms_per_step"] == pytest.approx(1e3 * 0.25 / 6)  # 2 calls x 3 steps
    assert rows["HF vanilla"]["ms_per_step"] is None  # no steps counted


def test_each_row_is_checked_against_gpt_fast_sps_at_its_own_k():
    from bench_fast import checks

    def row(method, tps):
        return {"method": method, "batch": 1, "tokens_per_s": tps, "ratio_vs_gptfast": None, "speedup_vs_hf": 1.0}

    base = [row("gpt-fast vanilla", 1700.0), row("gpt-fast SpS K=4", 1000.0), row("gpt-fast SpS K=8", 1250.0),
            row("specdec fast SpS K=8", 1900.0), row("specdec fast prompt lookup K=10", 2100.0)]
    # a chain of 4 between gpt-fast's K=4 and K=8 is ahead at its K; the default chain is held to the best row
    lines = checks(base + [row("specdec fast DFlash chain K=4", 1100.0), row("specdec fast DFlash", 1200.0)])
    assert "fast SpS K=8 / gpt-fast SpS K=8 tokens/s = 1.52 (target > 1): ok" in lines
    assert lines[-1].endswith("MISS (specdec fast DFlash)")
    assert checks(base + [row("specdec fast DFlash", 1300.0)])[-1].endswith(": ok")


def test_a_run_with_a_compile_capture_or_one_timed_prompt_is_void():
    """Session 48's fixture run timed one prompt, gpt-fast's compile inside it: such a run must not read as ok or
    MISS. A row timed on fewer than two prompts, or holding a capture, kernel load or compile inside a timed call,
    makes every verdict void and names itself; a drafter's eager steps (paid by every call by design) do not."""
    from bench_fast import checks, void_rows

    def row(method, tps, inputs=4, moved=None):
        return {"method": method, "batch": 1, "tokens_per_s": tps, "ratio_vs_gptfast": tps / 1700.0,
                "speedup_vs_hf": 20.0, "inputs": inputs, "captured_while_timed": moved or {}}

    good = [row("gpt-fast vanilla", 1700.0), row("gpt-fast SpS K=4", 1000.0),
            row("specdec fast plain", 3000.0, moved={"drafter eager": 4}), row("specdec fast SpS K=4", 1200.0),
            {"method": "HF vanilla", "batch": 4, "inputs": 1, "tokens_per_s": 60.0}]  # batch 4: not checked
    assert void_rows(good) == [] and all(line.endswith(("ok", "MISS")) or "MISS (" in line for line in checks(good))
    bad = [dict(good[0], inputs=1, captured_while_timed={"compiled frames": 3})] + good[1:]
    lines = checks(bad)
    assert lines[0].startswith("VOID, not a measurement: gpt-fast vanilla (1 timed, compiled frames moved)")
    assert all(": void (" in line for line in lines[1:]) and len(lines) == len(checks(good)) + 1
    assert "fast plain time / gpt-fast vanilla time = 0.57 (target <= 1.2): void (ok)" in lines
    assert void_rows([dict(good[3], captured_while_timed={"target captures": 1})]) == [
        "specdec fast SpS K=4 (4 timed, target captures moved)"]


def test_the_title_counts_the_prompts_that_were_timed():
    from bench_fast import prompt_count

    rows = [{"method": "HF vanilla", "batch": 1, "inputs": 4},
            {"method": "specdec fast plain", "batch": 1, "inputs": 4},
            {"method": "HF vanilla", "batch": 4, "inputs": 2}]
    assert prompt_count(rows, 8) == "4 of 8 prompts timed"  # --max-seconds stopped every batch-1 row at 4
    assert prompt_count(rows[:1] + [{"method": "x", "batch": 1, "inputs": 3}], 8) == "3-4 of 8 prompts timed"
    assert prompt_count([{"method": "x", "batch": 1, "inputs": 8}], 8) == "8 prompts"
    assert prompt_count([], 8) == "8 prompts"


def test_captures_inside_timed_calls_are_reported():
    """A call that captured or rebuilt holds time a longer run would not pay per call: time_methods counts what
    moved (the drafter's GraphedDrafter counters, the fast path's held buffers) and the short table names it."""
    from bench_fast import Run, capture_tally, short_table, summarise, time_methods

    class Counted:
        counts = {"captures": 0, "replays": 0, "eager": 0, "buffer_changes": 0, "prefetched": 0, "folded": 0}

    def method(ids):
        Counted.counts["captures"] += 1 if ids == "new shape" else 0
        for per_step in ("replays", "prefetched", "folded"):  # moved by every step: not reported
            Counted.counts[per_step] += 1
        return Run([[1, 2]], 2, 2)

    method.drafter = Counted
    tally = capture_tally(method)
    assert tally.pop("triton kernels") >= 0  # Triton kernels loaded so far in this process (0 without a GPU)
    tally.pop("compiled frames", None)  # there once torch.compile has run in this process
    assert tally == {"drafter captures": 0, "drafter eager": 0, "drafter buffer_changes": 0}
    timing = {}
    timed = time_methods({"m": method}, ["a", "new shape", "b"], warmup=1, max_seconds=None, device="cpu",
                         errors={}, label="t", timing=timing)
    assert timing["m"]["captured_while_timed"] == {"drafter captures": 1}  # the per-step counters are not reported
    assert len(timing["m"]["per_input_s"]) == 3 and all(t >= 0 for t in timing["m"]["per_input_s"])
    rows = summarise(timed, batch=1, timing=timing)
    assert rows[0]["captured_while_timed"] == {"drafter captures": 1}
    table = short_table(rows)
    assert "captured or rebuilt inside timed calls:" in table and "m (batch 1): {'drafter captures': 1}" in table


def test_eager_drafter_steps_are_listed_apart_from_captures():
    """A drafter step with no captured shape (P-EAGLE's prompt-wide update: one per call) is paid by every call, not
    once: the short table lists it apart from captures and rebuilds, with the number of calls."""
    from bench_fast import short_table

    row = dict(batch=1, method="P", tokens_per_s=1.0, speedup_vs_hf=None, ratio_vs_gptfast=None, tau=None, inputs=8,
               captured_while_timed={"drafter eager": 8})
    table = short_table([row])
    assert "captured or rebuilt" not in table
    assert "run eagerly inside timed calls" in table and "P (batch 1): 8 in 8 calls" in table
    table = short_table([dict(row, captured_while_timed={"drafter eager": 8, "target captures": 1})])
    assert "P (batch 1): {'target captures': 1}" in table and "P (batch 1): 8 in 8 calls" in table


def test_kernel_flags_set_the_capture_blas_library_for_the_run_only():
    """--blas reaches specdec.graphs.capture_blas() inside the run's context and is restored after it; without the
    flag the library's default stays."""
    import argparse

    import bench_fast

    from specdec.graphs import capture_blas

    ap = argparse.ArgumentParser()
    bench_fast.add_kernel_args(ap)
    with bench_fast.kernels_for(ap.parse_args(["--blas", "cublas", "--tree-attention", "off"])):
        assert capture_blas() == "cublas"
    assert capture_blas() == "cublaslt"
    with bench_fast.kernels_for(ap.parse_args([])):
        assert capture_blas() == "cublaslt"
    with pytest.raises(SystemExit):
        ap.parse_args(["--blas", "mkl"])


def test_the_skinny_rows_flag_sets_the_kernels_rows_for_the_run_only():
    """--skinny-rows reaches decode_settings() and the draft heads' switch inside the run's context only; a bad
    value is refused with the valid range."""
    import argparse

    import bench_fast

    import specdec.nn.inference as inference
    from specdec.fused import decode_settings
    from specdec.kernels import SKINNY_DEFAULT_ROWS

    ap = argparse.ArgumentParser()
    bench_fast.add_kernel_args(ap)
    with bench_fast.kernels_for(ap.parse_args(["--skinny-rows", "0"])):
        assert decode_settings()["skinny_rows"] == 0 == inference._SKINNY_ROWS[0]
    assert decode_settings()["skinny_rows"] == SKINNY_DEFAULT_ROWS == inference._SKINNY_ROWS[0]
    with pytest.raises(ValueError, match=r"skinny_rows must be an int in \[0, 64\]"):
        with bench_fast.kernels_for(ap.parse_args(["--skinny-rows", "65"])):
            pass


def test_capture_tally_counts_triton_kernels_loaded_inside_a_timed_call(monkeypatch):
    """A Triton kernel compiled (or read from the disk cache) inside a timed call shows in the call's tally: the
    count is the compiled specialisations the @triton.jit functions of specdec's modules hold."""
    pytest.importorskip("triton")
    import types

    import bench_fast
    from triton.runtime.jit import JITFunction  # triton.jit gives an interpreted function under TRITON_INTERPRET

    import specdec.bench as bench

    def kernel(x_ptr):
        pass
    probe = JITFunction(kernel)

    module = types.ModuleType("specdec._probe_kernels")
    module.probe = probe
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cache = {}
    monkeypatch.setattr(probe, "device_caches", {0: (cache, None, None, None)}, raising=False)
    before = bench.triton_kernels_loaded()
    cache["one specialisation"] = object()  # what triton's launcher stores after a compile
    assert bench.triton_kernels_loaded() == before + 1
    assert bench.triton_kernels_loaded(prefix="not_a_module.") == 0

    def method(ids):
        cache[ids] = object()
        return bench_fast.Run([[1]], 1, 1)

    timing = {}
    bench_fast.time_methods({"m": method}, ["warm", "a", "b"], warmup=1, max_seconds=None, device="cpu",
                            errors={}, label="t", timing=timing)
    assert timing["m"]["captured_while_timed"] == {"triton kernels": 2}  # "warm" loaded in the warm-up


def test_capture_tally_reads_the_wrapper_generate_keeps_on_a_plain_drafter(monkeypatch):
    """A row's drafter given unwrapped (prompt lookup) is graphed inside generate(); the tally reads the wrapper kept
    on it, so a capture inside a timed call shows in ``captured_while_timed``."""
    import bench_fast

    import specdec.static as static
    from specdec.drafters import PromptLookupDrafter
    from specdec.static import fast_drafter, graphed_wrappers

    monkeypatch.setattr(static, "_SHARED", collections.OrderedDict())  # equal lookups of other tests share theirs
    drafter = PromptLookupDrafter(num_drafts=4, fixed_width=True)
    run = lambda ids: None  # noqa: E731 (a stand-in for specdec_run's closure)
    run.drafter = drafter
    assert graphed_wrappers(drafter) == [] and set(bench_fast.capture_tally(run)) - {"compiled frames"} == {
        "triton kernels"}
    wrapper = fast_drafter(drafter)
    assert graphed_wrappers(drafter) == [wrapper]
    wrapper.counts["captures"] += 2
    assert bench_fast.capture_tally(run)["drafter captures"] == 2
