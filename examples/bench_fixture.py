"""Benchmark specdec recipes against HF ``generate`` peers on a target + draft pair (DESIGN.md protocol).

Example (GPU, the fixture of ../shared/models)::

    python examples/bench_fixture.py --target ../shared/models/pycoder-18m \
        --draft ../shared/models/pycoder-draft-4m --data ../shared/data/pycode-heldout.jsonl --out runs/bench

Prints a Markdown table (tokens/s, speedup against HF vanilla, tau, acceptance per depth, greedy match),
and writes ``results.json``, ``results.md`` and ``results.png`` to ``--out``. ``--eagle NAME=PATH`` adds
EAGLE heads (see examples/train_eagle.py) as further methods.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specdec as sd  # noqa: E402
from specdec import bench  # noqa: E402


def _forward_ms(model, ids: torch.Tensor, repeats: int = 50) -> float:
    """Wall time of one plain HF forward of 1 token on a cache holding the prompt (the loop-free floor)."""
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        tok = ids[:, -1:]
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        for _ in range(5):
            model(input_ids=tok, **{kw: cache}, use_cache=True)
            cache.crop(-1)  # negative counts: accepted by transformers 5.17 and 5.24+
        bench._sync()
        t0 = time.perf_counter()
        for _ in range(repeats):
            model(input_ids=tok, **{kw: cache}, use_cache=True)
            cache.crop(-1)  # negative counts: accepted by transformers 5.17 and 5.24+
        bench._sync()
    return 1e3 * (time.perf_counter() - t0) / repeats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--data", required=True)
    ap.add_argument("--num-prompts", type=int, default=30)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--draft-k", type=int, nargs="+", default=[4, 6])
    ap.add_argument("--lookup-k", type=int, default=10)
    ap.add_argument("--eagle", action="append", default=[],
                    help="RECIPE=PATH of a trained EAGLE head, RECIPE one of eagle1 (static tree), eagle2 "
                         "(dynamic tree), eagle3 (EAGLE-3 head, dynamic tree)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--only", nargs="+", default=None,
                    help="keep only the methods whose name contains one of these strings (e.g. 'HF vanilla' EAGLE)")
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--max-seconds", type=float, default=None, help="time budget of the timed loop")
    ap.add_argument("--no-cudnn-sdpa", action="store_true",
                    help="disable cuDNN SDPA process-wide (every method, HF peers included): with a custom mask it "
                         "re-plans for every new shape")
    args = ap.parse_args(argv)
    if args.no_cudnn_sdpa:
        torch.backends.cuda.enable_cudnn_sdp(False)
    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    tok = transformers.AutoTokenizer.from_pretrained(args.target)
    load = dict(dtype=dtype, attn_implementation="sdpa")
    target = transformers.AutoModelForCausalLM.from_pretrained(args.target, **load).to(args.device).eval()
    draft = (transformers.AutoModelForCausalLM.from_pretrained(args.draft, **load).to(args.device).eval()
             if args.draft else None)
    prompts = [p.to(args.device) for p in bench.load_prompts(args.data, tok, args.num_prompts, args.prompt_tokens)]
    n = args.max_new_tokens
    methods = {}
    if not args.skip_hf:
        methods["HF vanilla"] = bench.hf_method(target, n)
        if draft is not None:
            methods["HF assisted (draft model)"] = bench.hf_method(target, n, assistant_model=draft)
        methods[f"HF prompt lookup ({args.lookup_k})"] = bench.hf_method(target, n,
                                                                          prompt_lookup_num_tokens=args.lookup_k)
    makers = {"plain": None}  # specdec methods: name -> drafter factory (None: plain decoding)
    for k in args.draft_k if draft is not None else []:
        makers[f"draft model K={k}"] = lambda k=k: sd.recipes.sps(draft, num_drafts=k)
    makers[f"prompt lookup K={args.lookup_k}"] = lambda: sd.recipes.prompt_lookup(args.lookup_k)

    for spec in args.eagle:
        recipe, path = spec.split("=", 1)
        make = {"eagle1": sd.recipes.eagle1, "eagle2": sd.recipes.eagle2, "eagle3": sd.recipes.eagle3}[recipe]
        head = sd.formats.load_eagle_head(path, target, dtype=dtype, device=args.device)
        makers[recipe.upper()] = lambda make=make, head=head: make(head)
    for name, make in makers.items():
        methods[f"specdec {name}"] = bench.specdec_method(target, make, n)
    if args.only:
        keep = lambda name: any(part in name for part in args.only)  # noqa: E731
        methods = {name: run for name, run in methods.items() if keep(name)}
        makers = {name: make for name, make in makers.items() if keep(f"specdec {name}")}
    with open(os.path.join(args.out, "log.txt"), "w") as log:
        results = bench.run_benchmark(methods, prompts, baseline=next(iter(methods)), max_seconds=args.max_seconds,
                                      log=log)

    # Per-step overhead of the loops: step time minus one plain HF forward of 1 token.
    fwd = _forward_ms(target, prompts[0])
    # Each method twice: with the Triton kernels dispatched (the default) and with their torch references, so the
    # per-step phases show what the kernels change (verify: greedy kernel; target: mask fill; commit: KV compaction).
    prof = {}
    for name, make in makers.items():
        drafter = make() if make is not None else None
        prof[name] = {}
        for mode in ("auto", "torch"):
            with sd.kernels.kernel_mode(mode):
                sd.generate(target, prompts[0], drafter=drafter, max_new_tokens=n)  # warm (graphs, autotune)
                o = sd.generate(target, prompts[0], drafter=drafter, max_new_tokens=n, profile=True)
                o2 = sd.generate(target, prompts[0], drafter=drafter, max_new_tokens=n)
            prof[name]["kernels" if mode == "auto" else "torch_reference"] = {
                "ms_per_step": 1e3 * (o2.stats.wall_time - o2.stats.prefill_time) / o2.stats.num_steps,
                "phases_ms_per_step": {k: 1e3 * v / o.stats.num_steps for k, v in o.stats.phase_times.items()}}
    hf_vanilla = next((r for r in results if r.name == "HF vanilla"), None)
    overhead = {"hf_forward_ms_1_token": fwd, "specdec": prof}
    if hf_vanilla is not None:
        overhead["hf_generate_ms_per_token"] = 1e3 / hf_vanilla.tokens_per_second
    measured = results[0].extra["prompts"]
    title = (f"{os.path.basename(args.target.rstrip('/'))}, {args.dtype}, greedy, batch 1, {measured} prompts, "
             f"last {args.prompt_tokens} prompt tokens, {n} new tokens, "
             f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}")
    md = bench.to_markdown(results, title)
    md += "\n\nPer-step overhead:\n```\n" + json.dumps(overhead, indent=1) + "\n```\n"
    bench.save_results(results, os.path.join(args.out, "results.json"), title=title, overhead=overhead,
                       torch=torch.__version__, transformers=transformers.__version__)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    try:
        bench.plot_results(results, os.path.join(args.out, "results.png"), title)
    except ImportError as e:  # matplotlib is optional (the `plot` extra)
        print(f"no plot: {e}")
    print(md)


if __name__ == "__main__":
    main()
