"""Draft time per step against K: P-EAGLE (one forward for K drafts) vs an EAGLE-3 chain (one forward per level).

A step's drafting cost is the drafter's ``update`` (absorb the committed entries) plus ``propose`` (draft K tokens);
P-EAGLE absorbs lazily inside its one ``propose`` forward. Both drafters are CUDA-graphed as the recipes build them
(``--no-cuda-graphs``: eager). Heads are untrained (the time does not depend on the
weights); both read the same target layers, with the same number of decoder layers.

Example::

    python examples/bench_peagle.py --target PATH/TO/pycoder-18m --device cuda --num-layers 1
    python examples/bench_peagle.py --target specdec/demo/assets/target        # CPU

Prints a table (median ms per step over ``--reps``) and writes ``--out`` as JSON when given.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--num-layers", type=int, default=1, help="decoder layers of both heads")
    parser.add_argument("--ks", default="1,2,4,6,8")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--accepted", type=int, default=2, help="entries committed per step (root + accepted)")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="time the eager drafters (default: CUDA-graphed, as the recipes build them)")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM

    from specdec.drafters.base import Feedback, ProposeRequest
    from specdec.drafters.eagle import EagleDrafter
    from specdec.drafters.parallel import ParallelDrafter
    from specdec.graphs import cuda_graphed
    from specdec.heads import Eagle3Head, PEagleHead, peagle_feature_layers, target_dims
    from specdec.trees.level import LevelTree
    from specdec.types import SamplingParams

    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    _, n_layers, vocab = target_dims(target)
    layers = peagle_feature_layers(n_layers)
    ks = [int(k) for k in args.ks.split(",")]
    B, P, A = args.batch_size, args.prompt_len, args.accepted
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (B, P + A + 1), generator=g).to(device)
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
    feats = tuple(hidden[i] for i in layers)
    ones = torch.ones(B, P, dtype=torch.bool, device=device)
    prompt = Feedback(tokens=ids[:, :P], next_tokens=ids[:, 1:P + 1], positions=torch.arange(P, device=device)
                      .expand(B, -1), valid=ones, features=tuple(f[:, :P] for f in feats), roots=ids[:, P])
    step = Feedback(tokens=ids[:, P:P + A], next_tokens=ids[:, P + 1:P + A + 1],
                    positions=(P + torch.arange(A, device=device)).expand(B, -1),
                    valid=torch.ones(B, A, dtype=torch.bool, device=device),
                    features=tuple(f[:, P:P + A] for f in feats), roots=ids[:, P + A])
    peagle = PEagleHead.from_target(target, num_layers=args.num_layers, max_drafts=max(ks),
                                    feature_layers=layers).eval()
    eagle3 = Eagle3Head.from_target(target, num_layers=args.num_layers, feature_layers=layers).eval()
    # Both drafters CUDA-graphed as the recipes build them (on a CPU the wrapper runs the drafter eagerly).
    wrap = cuda_graphed if args.cuda_graphs else (lambda drafter: drafter)
    rows = []
    for K in ks:
        request = ProposeRequest(roots=ids[:, P], root_positions=torch.full((B,), P, device=device), num_drafts=K,
                                 sampling=SamplingParams(), source=None,
                                 active=torch.ones(B, dtype=torch.bool, device=device))
        drafters = {"peagle": wrap(ParallelDrafter(peagle, LevelTree.chain(K))),
                    "eagle3_chain": wrap(EagleDrafter(eagle3, [(0,) * i for i in range(1, K + 1)]))}
        row = {"K": K}
        for name, drafter in drafters.items():
            times = []
            for _ in range(args.reps):
                state = drafter.propose(drafter.start(prompt), request)[1]
                _sync(device)
                t0 = time.perf_counter()
                drafter.propose(drafter.update(state, step), request)
                _sync(device)
                times.append(time.perf_counter() - t0)
            row[name] = sorted(times)[len(times) // 2] * 1e3
        rows.append(row)
        print(f"K={K}: P-EAGLE {row['peagle']:.2f} ms   EAGLE-3 chain {row['eagle3_chain']:.2f} ms  (per step, "
              f"update + propose, median of {args.reps})")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "device": str(device), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
