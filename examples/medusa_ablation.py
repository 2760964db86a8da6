"""The Medusa paper's cumulative ablation, in one process: heads alone -> + tree attention -> + an optimised tree ->
+ Medusa-2 training, with HF vanilla, HF assisted generation and EAGLE-2 in the same run.

Rows (all greedy, batch 1; speedups against HF vanilla ``generate`` of the original target, measured in the same
run with ``specdec.bench.run_benchmark``)::

    HF vanilla                                  the baseline
    HF assisted generation (draft model)        --draft
    Medusa-1, chain of top-1s (no tree)         --medusa1 heads, every head's top-1 (vLLM's Medusa)
    Medusa-1, mc_sim_7b_63                      the authors' 63-node tree
    Medusa-1, optimised tree                    --medusa1/tree.json (same node budget), from calibration
    Medusa-2, optimised tree (own target)       --medusa2/target with --medusa2/medusa and its tree.json
    EAGLE-2                                     --eagle2 head (dynamic tree)
    HF vanilla, Medusa-2 target                 the Medusa-2 target's own plain decoding (reference only)

A Medusa-2 target is a new model: its row is compared, for output identity, with *its own* plain decoding; every
other row with the original target's. In bf16 the tree forward and the one-token forward may round differently, so
the table reports the identity rate (float32 identity is what the tests check).

Example (GPU, after examples/train_medusa.py and examples/train_eagle.py)::

    python examples/medusa_ablation.py --target ../shared/models/pycoder-18m --medusa1 runs/medusa1 \\
        --medusa2 runs/medusa2 --draft ../shared/models/pycoder-draft-4m --eagle2 runs/eagle/eagle1/final \\
        --data ../shared/data/pycode-heldout.jsonl --num-prompts 30 --out runs/medusa_ablation

Writes ``results.json``, ``results.md`` and ``results.png`` to ``--out``. ``--quick``: tiny models built from
configs and random heads written in the real formats, seconds on a CPU (the smoke test).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import specdec as sd  # noqa: E402
from specdec import bench  # noqa: E402


def _read_tree(folder: Path) -> list:
    path = folder / "tree.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run examples/train_medusa.py (it writes the optimised tree)")
    return [tuple(p) for p in json.loads(path.read_text())["choices"]]


def _recording(run, store: dict):
    """Wrap a runner so its outputs are kept per prompt (the timed call overwrites the warm-up's)."""

    def wrapped(ids):
        out = run(ids)
        store[id(ids)] = out.new_tokens
        return out

    return wrapped


def _quick_inputs(folder: Path) -> dict:
    """Tiny target, draft, Medusa-1 / Medusa-2 heads, EAGLE head and prompts, written in the real formats."""
    from train_medusa import ByteTokenizer, tiny_target

    from specdec.formats import save_eagle_head
    from specdec.formats.medusa import save_medusa_head
    from specdec.heads import Eagle1Head
    from specdec.heads.medusa import MedusaHead
    from specdec.trees import compile_tree
    from specdec.trees.optimize import optimal_tree

    folder.mkdir(parents=True, exist_ok=True)
    target, draft = tiny_target(0), tiny_target(1, hidden=32, layers=1)
    target.save_pretrained(folder / "target")
    draft.save_pretrained(folder / "draft")
    g = torch.Generator().manual_seed(0)
    table = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.15, 0.05], [0.2, 0.1, 0.05]])
    for name, model in (("medusa1", target), ("medusa2", tiny_target(2))):
        head = MedusaHead.from_target(model, num_heads=3)
        with torch.no_grad():
            head.block_weight.add_(torch.randn(head.block_weight.shape, generator=g) * 0.05)
        save_medusa_head(head, folder / name / "medusa")
        if name == "medusa2":
            model.save_pretrained(folder / name / "target")
        tree = optimal_tree(table, 8)
        compile_tree(tree)
        (folder / name / "tree.json").write_text(json.dumps({"choices": [list(p) for p in tree]}))
    torch.manual_seed(3)  # the EAGLE head's fresh weights (smoke test only)
    save_eagle_head(Eagle1Head.from_target(target), folder / "eagle")
    text = Path(__file__).read_text()
    with open(folder / "prompts.jsonl", "w") as f:
        for i in range(3):
            f.write(json.dumps({"prompt": text[200 * i: 200 * i + 60]}) + "\n")
    return {"target": folder / "target", "draft": folder / "draft", "medusa1": folder / "medusa1",
            "medusa2": folder / "medusa2", "eagle2": folder / "eagle", "data": folder / "prompts.jsonl",
            "tokenizer": ByteTokenizer()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--medusa1", help="output folder of train_medusa.py --method medusa1 (medusa/, tree.json)")
    ap.add_argument("--medusa2", help="output folder of train_medusa.py --method medusa2 (target/, medusa/, tree.json)")
    ap.add_argument("--draft", help="draft model for HF assisted generation")
    ap.add_argument("--eagle2", help="an EAGLE-1 head folder (specdec.formats.load_eagle_head), drafted as EAGLE-2")
    ap.add_argument("--data", help="JSONL with a 'prompt' field (held-out prompts)")
    ap.add_argument("--num-prompts", type=int, default=30)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--warmup", type=int, default=2, help="prompts run untimed first")
    ap.add_argument("--max-seconds", type=float, default=None, help="time budget of the timed loop")
    ap.add_argument("--no-cudnn-sdpa", action="store_true",
                    help="disable cuDNN SDPA process-wide (every method, HF peers included): with a custom mask it "
                         "re-plans for every new shape")
    ap.add_argument("--out", default="runs/medusa_ablation")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test on tiny models (seconds)")
    args = ap.parse_args(argv)
    if args.no_cudnn_sdpa:
        torch.backends.cuda.enable_cudnn_sdp(False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = None
    if args.quick:
        inputs = _quick_inputs(out / "quick_inputs")
        for key in ("target", "draft", "medusa1", "medusa2", "eagle2", "data"):
            setattr(args, key, str(inputs[key]))
        tokenizer = inputs["tokenizer"]
        args.device, args.dtype, args.num_prompts, args.prompt_tokens, args.max_new_tokens = "cpu", "float32", 2, 48, 8
        args.warmup = 0
    for key in ("target", "medusa1", "data"):
        if not getattr(args, key):
            ap.error(f"--{key} is required (or --quick)")

    import transformers

    from specdec.formats.medusa import load_medusa_head

    dtype = getattr(torch, args.dtype)
    load = dict(dtype=dtype, attn_implementation="sdpa")
    if tokenizer is None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.target)
    target = transformers.AutoModelForCausalLM.from_pretrained(args.target, **load).to(args.device).eval()
    prompts = bench.load_prompts(args.data, tokenizer, args.num_prompts, args.prompt_tokens)
    prompts = [p.to(args.device) for p in prompts]
    n = args.max_new_tokens
    m1 = Path(args.medusa1)
    head1 = load_medusa_head(m1 / "medusa", target)
    tree1 = _read_tree(m1)

    methods: dict = {}
    reference_of: dict = {}  # method -> the method whose outputs are its target's plain decoding
    methods["HF vanilla"] = bench.hf_method(target, n)
    if args.draft:
        draft = transformers.AutoModelForCausalLM.from_pretrained(args.draft, **load).to(args.device).eval()
        methods["HF assisted generation (draft model)"] = bench.hf_method(target, n, assistant_model=draft)
    ladder = {
        "Medusa-1, chain of top-1s (no tree)": lambda: sd.recipes.medusa(head1, "chain"),
        "Medusa-1, mc_sim_7b_63 tree": lambda: sd.recipes.medusa(
            head1, [p for p in sd.trees.MEDUSA_MC_SIM_7B_63 if len(p) <= head1.num_levels]),
        f"Medusa-1, optimised tree ({len(tree1)} nodes)": lambda: sd.recipes.medusa(head1, tree1),
    }
    for name, make in ladder.items():
        methods[name] = bench.specdec_method(target, make, n)
        reference_of[name] = "HF vanilla"
    if args.medusa2:
        m2 = Path(args.medusa2)
        target2 = transformers.AutoModelForCausalLM.from_pretrained(m2 / "target", **load).to(args.device).eval()
        head2 = load_medusa_head(m2 / "medusa", target2)
        tree2 = _read_tree(m2)
        name = f"Medusa-2, optimised tree ({len(tree2)} nodes, own target)"
        methods[name] = bench.specdec_method(target2, lambda: sd.recipes.medusa2(head2, tree2), n)
        reference_of[name] = "HF vanilla, Medusa-2 target"
    if args.eagle2:
        eagle_head = sd.formats.load_eagle_head(args.eagle2, target, dtype=dtype, device=args.device)
        methods["EAGLE-2"] = bench.specdec_method(target, lambda: sd.recipes.eagle2(eagle_head), n)
        reference_of["EAGLE-2"] = "HF vanilla"
    if args.medusa2:
        methods["HF vanilla, Medusa-2 target"] = bench.hf_method(target2, n)
        reference_of["HF vanilla, Medusa-2 target"] = "HF vanilla, Medusa-2 target"
    outputs = {name: {} for name in methods}
    methods = {name: _recording(run, outputs[name]) for name, run in methods.items()}

    with open(out / "log.txt", "w") as log:
        results = bench.run_benchmark(methods, prompts, warmup=args.warmup, baseline="HF vanilla",
                                      max_seconds=args.max_seconds, log=log)
    for r in results:  # identity against the plain decoding of the method's own target
        reference = reference_of.get(r.name, "HF vanilla")
        ref, mine = outputs[reference], outputs[r.name]
        shared = [k for k in mine if k in ref]
        r.greedy_match = sum(mine[k] == ref[k] for k in shared) / max(1, len(shared))
        r.extra["identity_reference"] = reference

    measured = results[0].extra["prompts"]
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    title = (f"Medusa ablation: {os.path.basename(str(args.target).rstrip('/'))}, {args.dtype}, greedy, batch 1, "
             f"{measured} prompts, last {args.prompt_tokens} prompt tokens, {n} new tokens, {device_name}")
    md = bench.to_markdown(results, title)
    md += ("\n\nSpeedups are against HF vanilla `generate` of the original target, in the same run. The last column "
           "is the share of prompts whose output equals the plain decoding of the row's own target (the Medusa-2 "
           "row: its fine-tuned target's).\n")
    bench.save_results(results, str(out / "results.json"), title=title, torch=torch.__version__,
                       transformers=transformers.__version__, trees={"medusa1": [list(p) for p in tree1]},
                       command=" ".join(sys.argv))
    (out / "results.md").write_text(md)
    try:
        bench.plot_results(results, str(out / "results.png"), title)
    except ImportError as e:  # matplotlib is optional (the `plot` extra)
        print(f"no plot: {e}")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
