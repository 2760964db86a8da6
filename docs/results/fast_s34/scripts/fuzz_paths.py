"""Session 34: a differential fuzz of generate() on CPU, float32. Each trial draws an architecture, a drafter (SpS
chain / tree, prompt lookup, EAGLE-1/2/3, Medusa, P-EAGLE, DFlash, DSpark; graphed by the reference capture or
not, reading in place or not), a ragged batch of 1-4 prompts (left or right padded), a budget, EOS ids and a
Dynamic SD schedule; greedy runs (eager and fast path) must equal plain greedy decoding, and sampled runs must give
the same tokens on the eager and the fast path under the same seed.

    python docs/results/fast_s34/scripts/fuzz_paths.py FIRST_SEED COUNT
    FUZZ_KERNELS=1 python ...   # on CPU: the drafted runs on the Triton kernels under the interpreter
    FUZZ_DEVICE=cuda python ... # on a GPU: the fast path's CUDA graphs and kernels
    FUZZ_METHODS=eagle2,dflash python ...  # session 41: only these drafters
    FUZZ_HEADS=1 python ...     # session 41: EAGLE / DFlash / DSpark heads also with a draft vocabulary (FR-Spec's
                                # restrict_vocab, EAGLE-3's d2t) and / or float8 weights (quantize_fp8_); since
                                # session 46 half the rounded heads are 4-bit (quantize_int4_, 32-128 per scale)
    FUZZ_GC=50 python ...       # session 42: the cyclic collector's first threshold at 50 (default 700-2000), so
                                # that collections also fall inside captures (dead graphs freed under capture)
"""
import os
import random
import sys
import time
import traceback
import warnings

DEVICE = os.environ.get("FUZZ_DEVICE", "cpu")  # "cuda": the fast path's real graphs and kernels
KERNELS = os.environ.get("FUZZ_KERNELS") == "1"  # the drafted runs on the Triton kernels (interpreted on CPU)
HEADS = os.environ.get("FUZZ_HEADS") == "1"  # head variants: draft vocabularies, float8 weights
if KERNELS:
    os.environ["TRITON_INTERPRET"] = "1"
if os.environ.get("FUZZ_GC"):
    import gc
    gc.set_threshold(int(os.environ["FUZZ_GC"]))
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
warnings.filterwarnings("ignore")
import torch  # noqa: E402
from tiny_models import VOCAB, noisy_copy, tiny_model  # noqa: E402

import specdec as sd  # noqa: E402
from specdec import recipes  # noqa: E402
from specdec.graphs import GraphedDrafter, capture_graph_ref  # noqa: E402
from specdec.heads import DFlashHead, Eagle1Head, Eagle3Head, MedusaHead, PEagleHead  # noqa: E402
from specdec.kernels import kernel_mode  # noqa: E402
from specdec.sampling import PerRowSource  # noqa: E402

METHODS = ["sps", "sps_tree", "lookup", "lookup_fixed", "eagle1", "eagle2", "eagle3", "medusa_chain", "medusa_tree",
           "peagle", "peagle_tree", "dflash", "dflash_tree", "dspark"]
if os.environ.get("FUZZ_METHODS"):  # session 41: a comma-separated subset, e.g. eagle1,eagle2,eagle3,dflash,dspark
    METHODS = os.environ["FUZZ_METHODS"].split(",")
ARCHS = ["llama", "qwen2", "gpt_neox", "gemma", "qwen3", "phi3", "mistral"]


def vocab(rng):
    """A random draft vocabulary of 8 to VOCAB - 1 target ids (sorted), as restrict_vocab takes it."""
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(rng.randrange(99)))[
        :rng.randint(8, VOCAB - 1)].sort().values


def variant(head, rng):
    """Session 41 (FUZZ_HEADS=1): the head with a restricted vocabulary and / or float8 weights, each half the
    time; lossless either way, so the greedy runs must still equal plain decoding."""
    if not HEADS:
        return head
    if isinstance(head, Eagle1Head) and not isinstance(head, Eagle3Head) and rng.random() < 0.5:
        head.restrict_vocab(vocab(rng))
    if rng.random() < 0.5:
        from specdec.nn import quantize_fp8_, quantize_int4_
        if rng.random() < 0.5:
            quantize_fp8_(head.eval().requires_grad_(False))
        else:  # session 46: 4-bit weights (the tiny heads' widths padded at 64 and 128 per scale)
            quantize_int4_(head.eval().requires_grad_(False), group=rng.choice((32, 64, 128)))
    return head


def eagle3_head(target, rng):
    """An EAGLE-3 head; with FUZZ_HEADS=1, half the time over a draft vocabulary (``d2t``) of 8 to VOCAB - 1 ids."""
    draft_vocab = None
    if HEADS and rng.random() < 0.5:
        from specdec.training import build_draft_vocab
        counts = torch.rand(VOCAB, generator=torch.Generator().manual_seed(rng.randrange(99)))
        draft_vocab = build_draft_vocab(counts, rng.randint(8, VOCAB - 1))
    return Eagle3Head.from_target(target, feature_layers=(0, 1, 1), draft_vocab=draft_vocab)


def make(method, target, rng):
    torch.manual_seed(rng.randrange(1000))
    if method == "sps":
        return recipes.sps(noisy_copy(target, rng.choice([0.0, 0.05, 0.3]), seed=rng.randrange(99)), rng.randint(1, 6))
    if method == "sps_tree":
        return recipes.sps(noisy_copy(target, 0.05), tree=[(0,), (1,), (0, 0), (0, 1), (1, 0)])
    if method == "lookup":
        return recipes.prompt_lookup(rng.randint(1, 8))
    if method == "lookup_fixed":
        return recipes.prompt_lookup(rng.randint(1, 8), fixed_width=True)
    if method == "eagle1":
        return recipes.eagle1(variant(Eagle1Head.from_target(target), rng), [(0,), (1,), (0, 0), (0, 0, 0)],
                              cuda_graphs=False)
    if method == "eagle2":
        return recipes.eagle2(variant(Eagle1Head.from_target(target), rng), total_tokens=rng.randint(3, 14),
                              depth=rng.randint(1, 4), top_k=rng.randint(1, 4), cuda_graphs=False)
    if method == "eagle3":
        head = variant(eagle3_head(target, rng), rng)
        return recipes.eagle3(head, total_tokens=rng.randint(3, 14), depth=rng.randint(1, 5), top_k=rng.randint(1, 4),
                              cuda_graphs=False)
    if method == "medusa_chain":
        return recipes.medusa(MedusaHead.from_target(target, num_heads=3), tree="chain", cuda_graphs=False)
    if method == "medusa_tree":
        return recipes.medusa(MedusaHead.from_target(target, num_heads=3), tree=[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)],
                              cuda_graphs=False)
    if method == "peagle":
        return recipes.peagle(PEagleHead.from_target(target, num_layers=1, max_drafts=4), num_drafts=rng.randint(1, 4),
                              cuda_graphs=False)
    if method == "peagle_tree":
        return recipes.peagle(PEagleHead.from_target(target, num_layers=1, max_drafts=3),
                              tree=[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)], cuda_graphs=False)
    if method == "dflash":
        return recipes.dflash(variant(DFlashHead.from_target(target, block_size=rng.randint(2, 6)), rng),
                              cuda_graphs=False)
    if method == "dflash_tree":
        return recipes.dflash(DFlashHead.from_target(target, block_size=4), tree=[(0,), (1,), (0, 0), (0, 0, 0)],
                              cuda_graphs=False)
    if method == "dspark":
        from specdec.heads import DSparkHead
        return recipes.dspark(variant(DSparkHead.from_target(target, block_size=rng.randint(2, 6)), rng),
                              cuda_graphs=False)
    raise ValueError(method)


def prompts(rng, B):
    T = rng.randint(2, 14)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    side = rng.choice(["left", "right"])
    for b in range(B):
        n = rng.randint(1, T)
        motif = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 4))]
        row = (motif * T)[:n]
        if side == "left":
            ids[b, T - n:], mask[b, T - n:] = torch.tensor(row), 1
        else:
            ids[b, :n], mask[b, :n] = torch.tensor(row), 1
    return ids, mask


class Decode:
    """A "tokenizer" whose text is the ids joined by spaces (stop strings name token pairs)."""

    def decode(self, tokens, skip_special_tokens=False):
        return " ".join(map(str, tokens)) + " "


class Collector:
    """An HF-style streamer: the prompt ``put`` first, then every token put after it; ``end`` calls counted."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        if self.puts:
            self.puts += value.reshape(-1).tolist()
        else:
            self.puts = [value.tolist()]

    def end(self):
        self.ended += 1


def trial(seed):
    rng = random.Random(seed)
    arch = rng.choice(ARCHS)
    target = tiny_model(arch, seed=rng.randrange(5), scale=rng.choice([1.0, 4.0]) if arch not in ("gemma",) else 1.0)
    target = target.to(DEVICE)
    method = rng.choice(METHODS)
    B = rng.choice([1, 1, 2, 3, 4])
    ids, mask = (t.to(DEVICE) for t in prompts(rng, B))
    max_new = rng.randint(1, 20)
    eos = rng.choice([[], [], None, [rng.randrange(VOCAB)], [rng.randrange(VOCAB), rng.randrange(VOCAB)]])
    kw = dict(attention_mask=mask, max_new_tokens=max_new, eos_token_id=eos)
    ref = sd.generate(target, ids, **kw)
    width = ref.sequences.shape[1]  # the prompts and the longest row's new tokens
    if rng.random() < 0.25 and width - ids.shape[1] >= 3:  # a stop string: two tokens the plain run emits, as text
        j = rng.randrange(ids.shape[1], width - 1)
        row = rng.randrange(B)
        kw.update(stop_strings=f"{int(ref.sequences[row, j])} {int(ref.sequences[row, j + 1])} ", tokenizer=Decode())
        ref = sd.generate(target, ids, **kw)
    sched = rng.choice([None, None, [[1, 1, 3], [2, 8, 1]], [[1, 2, 0], [3, 8, 2]]])
    drafter = make(method, target, rng)
    if hasattr(drafter, "head"):
        drafter.head.to(DEVICE)
    graph = DEVICE == "cpu" and rng.random() < 0.6 and hasattr(drafter, "draft_step")  # CUDA: the real capture
    if graph:
        drafter = GraphedDrafter(drafter, capture=capture_graph_ref, device_types=("cpu",),
                                 in_place=rng.random() < 0.7)
    desc = (f"sched={sched} seed={seed} arch={arch} method={method} B={B} T={ids.shape[1]} max_new={max_new} "
            f"eos={eos} graphed={graph} stop={kw.get('stop_strings')!r}")
    extra = {} if sched is None else dict(schedule=[[a, b, min(k, drafter.max_num_drafts)] for a, b, k in sched])
    if sched is None and rng.random() < 0.3:
        extra["num_drafts"] = rng.randint(0, drafter.max_num_drafts)
    desc += f" extra={extra}" if extra else ""
    stream = B == 1 and rng.random() < 0.5
    for fast in (False, True):
        got = Collector() if stream else None
        cache = dict(max_cache_len=rng.choice([None, ids.shape[1] + max_new + rng.randint(0, 40)])) if fast else {}
        out = sd.generate(target, ids, drafter=drafter, **kw, fast=fast, streamer=got, **extra, **cache)
        if not torch.equal(out.sequences, ref.sequences):
            return f"MISMATCH greedy fast={fast} {desc}\n ref={ref.sequences.tolist()}\n got={out.sequences.tolist()}"
        new = out.sequences[0, ids.shape[1]:][:int(out.num_new_tokens[0])].tolist() if stream else None
        if stream and (got.puts[1:] != new or got.ended != 1):
            return f"STREAM fast={fast} {desc}\n streamed={got.puts} ended={got.ended}\n new={new}"
    # sampled: fast and eager under the same seed
    if rng.random() < 0.5 and method != "lookup":  # the fast path's lookup is fixed-width: other shapes
        temp = rng.choice([0.5, 1.0, 2.0])
        per_row = rng.random() < 0.5

        def source():
            gens = [torch.Generator(device=DEVICE).manual_seed(seed + b) for b in range(B)]
            return dict(source=PerRowSource(gens)) if per_row else dict(generator=gens[0])
        outs = [sd.generate(target, ids, drafter=drafter, **kw, **extra, fast=fast, temperature=temp, **source())
                for fast in (False, True)]
        if not torch.equal(outs[0].sequences, outs[1].sequences):
            kind = "KNOWN (a batch-size schedule)" if sched is not None else "MISMATCH"
            return (f"{kind} sampled T={temp} {desc}\n eager={outs[0].sequences.tolist()}\n "
                    f"fast={outs[1].sequences.tolist()}")
    return None


if KERNELS:  # references for the plain runs, kernels for the drafted ones
    _generate = sd.generate

    def generate_on_kernels(*args, **kwargs):
        with kernel_mode("triton" if kwargs.get("drafter") is not None else "torch"):
            return _generate(*args, **kwargs)
    sd.generate = generate_on_kernels

start, n = int(sys.argv[1]), int(sys.argv[2])
bad = 0
t0 = time.time()
limit = float(os.environ.get("FUZZ_SECONDS", "inf"))  # stop starting trials after this long
done = 0
for s in range(start, start + n):
    if time.time() - t0 > limit:
        break
    done += 1
    try:
        msg = trial(s)
    except Exception as e:
        msg = f"ERROR seed={s}: {type(e).__name__}: {e}\n" + traceback.format_exc()[-1500:]
    if msg:
        bad += not msg.startswith("KNOWN")
        print(msg, flush=True)
print(f"done {done} trials from {start}, {bad} bad, {time.time()-t0:.0f}s", flush=True)
