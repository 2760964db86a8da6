"""``python -m specdec.demo``: the command line of the demo (see :func:`main`)."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

__all__ = ["main"]

# EAGLE-2's tree for a CPU: the paper's 60-token tree (depth 6, top-10) is sized for a GPU, where verifying 60
# tokens costs the same as verifying one. On a CPU each level of depth costs a head forward (about a third of a
# target forward for these tiny models), so a shallow tree is fastest. Measured with the shipped head (8 prompts,
# 128 new tokens, 1 thread): tree 8/3/3 tau 2.85 at 0.99x plain; 16/4/4 tau 3.30 at 0.94x; 24/5/6 tau 3.47 at
# 0.81x.
CPU_TREE = (8, 3, 3)  # total tokens (root included), depth, top-k


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specdec.demo",
        description="Speculative decoding on held-out Python code against plain greedy decoding: plain, a draft "
                    "model, prompt lookup and EAGLE-2, with the small models shipped in the package.",
    )
    parser.add_argument("--train", action="store_true",
                        help="rebuild the demo models from this Python's standard library first (minutes), "
                             "then run the table with them")
    parser.add_argument("--out", help="where --train writes (default: $SPECDEC_DEMO_DIR, else "
                                      "$XDG_CACHE_HOME/specdec/demo, i.e. ~/.cache/specdec/demo)")
    parser.add_argument("--seconds-budget", type=float,
                        help="with --train: cap on training the target and draft (results then depend on speed)")
    parser.add_argument("--model", help="your target model (path or hub id) instead of the shipped one")
    parser.add_argument("--draft", help="your draft model (path or hub id; same vocabulary as --model)")
    parser.add_argument("--eagle-head", help="an EAGLE-1/3 head for --model (any format load_eagle_head reads)")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt length cap in tokens")
    parser.add_argument("--num-drafts", type=int, default=4, help="K for the draft model")
    parser.add_argument("--lookup-drafts", type=int, default=10, help="K for prompt lookup")
    parser.add_argument("--tree", type=int, nargs=3, default=CPU_TREE, metavar=("TOTAL", "DEPTH", "TOPK"),
                        help=f"EAGLE-2 dynamic tree (default {' '.join(map(str, CPU_TREE))}: sized for a CPU; "
                             "the paper's GPU tree is 60 6 10)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="float32 (default) is where greedy identity is guaranteed")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: these tiny models are launch-bound, and one thread "
                             "is not slowed by other processes the way several are)")
    parser.add_argument("--seed", type=int, default=0, help="with --train: the build's seed")
    parser.add_argument("--quiet", action="store_true", help="no training progress bars")
    return parser


def _load_user_models(args, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ._lib import load_eagle_head
    from .models import hf_progress_bars_off

    with hf_progress_bars_off():
        target = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
        draft = None
        if args.draft:
            draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).to(args.device).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    head = load_eagle_head(args.eagle_head, target, dtype=dtype) if args.eagle_head else None
    return target, draft, tokenizer, head


def main(argv: Sequence[str] | None = None) -> int:
    """Load (or ``--train``) the demo models, print the table row by row, a sample and timing notes.

    Rows: plain greedy decoding; the draft model (``K = --num-drafts``); prompt lookup (``K = --lookup-drafts``);
    EAGLE-2 with the shipped EAGLE-1 head and a dynamic tree sized for a CPU (``--tree``). Each decodes the same
    held-out prompts greedily at batch 1; columns: tau (tokens emitted per target forward), tokens/s, speedup
    over plain decoding, and whether every output is token-identical to plain greedy decoding.

    Args:
        argv: the arguments (default ``sys.argv[1:]``); ``--help`` lists them.

    Returns:
        The process exit status: 0, 1 when a speculative output differs from plain greedy decoding, 2 when no
        prompt fits ``--prompt-tokens``.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.train and args.model:
        parser.error("--train builds the demo's own models; drop --model (or --train)")
    if (args.draft or args.eagle_head) and not args.model:
        parser.error("--draft / --eagle-head go with --model (the demo ships its own draft and head)")
    if args.out and not args.train:
        parser.error("--out is where --train writes; to run on a trained folder use --model DIR/target "
                     "--draft DIR/draft --eagle-head DIR/eagle1")

    from ._lib import DraftModelDrafter, PromptLookupDrafter, eagle2
    from .app import Method, print_sample, print_timing_notes, run_table
    from .models import demo_prompts, load_demo_models, read_prompts

    def emit(line: str = "") -> None:
        print(line, flush=True)

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    if args.model:
        target, draft, tokenizer, head = _load_user_models(args, dtype)
        shipped = read_prompts()
        what = f"{args.model}" + (f" + draft {args.draft}" if args.draft else "")
    else:
        if args.train:
            from .build import build_demo_models, default_build_dir

            out = args.out or default_build_dir()
            emit(f"[specdec.demo] training the demo models from the standard library into {out} ...")
            build_demo_models(out, seed=args.seed, seconds_budget=args.seconds_budget, progress=not args.quiet)
            models = load_demo_models(args.device, dtype, path=out)
        else:
            models = load_demo_models(args.device, dtype)
        target, draft, tokenizer, head, shipped = (models.target, models.draft, models.tokenizer,
                                                   models.eagle_head, models.prompts)
        r = models.report
        what = (f"the demo's {r.settings['target_layers']}-layer Llama target, its {r.settings['draft_layers']}-layer "
                f"draft and EAGLE-1 head (trained on the Python {r.python_version} standard library)")
    emit(f"Loaded {what} in {time.perf_counter() - t0:.1f} s.")

    prompts = demo_prompts(args.num_prompts, args.prompt_tokens, tokenizer=tokenizer, prompts=shipped)
    if not prompts:
        print("no prompt fits --prompt-tokens; raise it", file=sys.stderr)
        return 2
    prompts_ids = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in prompts]
    eos = tokenizer.eos_token_id

    methods = [Method("plain", None)]
    if draft is not None:
        methods.append(Method(f"draft model (K={args.num_drafts})", DraftModelDrafter(draft, args.num_drafts),
                              args.num_drafts))
    methods.append(Method(f"prompt lookup (K={args.lookup_drafts})", PromptLookupDrafter(num_drafts=args.lookup_drafts),
                          args.lookup_drafts))
    if head is not None:
        total, depth, top_k = args.tree
        methods.append(Method(f"EAGLE-2 (tree {total}/{depth}/{top_k})",
                              eagle2(head, total_tokens=total, depth=depth, top_k=top_k)))

    emit(f"\n{len(prompts)} held-out prompts (<= {args.prompt_tokens} tokens), {args.max_new_tokens} new tokens, "
         f"greedy, batch 1, {args.dtype} on {args.device}:\n")
    rows = run_table(target, prompts_ids, methods, max_new_tokens=args.max_new_tokens, eos_token_id=eos,
                     device=args.device, emit=emit)
    print_sample(tokenizer, prompts[0].prompt, rows, emit=emit)
    print_timing_notes(rows, num_prompts=len(prompts), prompt_tokens=args.prompt_tokens,
                       max_new_tokens=args.max_new_tokens, device=args.device, dtype=dtype,
                       threads=torch.get_num_threads(), target_params=sum(p.numel() for p in target.parameters()),
                       emit=emit)
    return 0 if all(row.identical == len(prompts) for row in rows) else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
