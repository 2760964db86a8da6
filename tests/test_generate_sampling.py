"""End to end at T > 0: the law of the first generated tokens of a tiny HF model, sampled through
``generate()`` with each drafter, equals the model's exactly enumerated law (chi-square test with a stated
power); a mutant verifier fails the same test at the same sample count."""
import itertools
import zlib

import pytest
import torch
import transformers
from tiny_models import noisy_copy

from specdec import drafters, heads, recipes, trees
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.generate import generate
from specdec.sampling import process_logits
from specdec.testing import chi_square_test, detectable_tv
from specdec.training import build_draft_vocab
from specdec.types import SamplingParams
from specdec.verify import verify_chain

V = 6  # vocabulary
NUM_TOKENS = 3  # the law of (x1, x2, x3): 216 outcomes; x2, x3 come out of one speculative step
N = 40_000  # samples (batch rows)
ALPHA = 1e-3
# At this n the test detects, with power 0.99, any error of total variation >= DETECTABLE (computed below).
DETECTABLE = detectable_tv(N, V ** NUM_TOKENS, alpha=ALPHA, power=0.99)
PROMPT = torch.tensor([[1, 4, 2, 1, 4]])
TREE = [(0,), (1,), (0, 0), (1, 0), (0, 1)]


def _model(seed: int, base=None, noise: float = 0.0):
    if base is not None:
        return noisy_copy(base, noise, seed)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(15.0)  # non-uniform laws with partial acceptance at every depth (tau 1.1-2.9)
    return m


TARGET = _model(0)


def _exact_law(model, params: SamplingParams) -> dict:
    law = {}
    for seq in itertools.product(range(V), repeat=NUM_TOKENS):
        prob = 1.0
        for i in range(NUM_TOKENS):
            ctx = torch.cat([PROMPT[0], torch.tensor(seq[:i], dtype=torch.long)])[None]
            with torch.no_grad():
                p = process_logits(model(input_ids=ctx).logits[0, -1].double(), params)
            prob *= float(p[seq[i]])
        law[seq] = prob
    return law


def _sampled_counts(drafter, params: SamplingParams, seed: int, verifier=None) -> dict:
    ids = PROMPT.expand(N, -1).contiguous()
    # Two tokens past the measured ones, so that the first speculative step drafts to full depth (the loop never
    # drafts past the token budget); the law of the first NUM_TOKENS tokens is the same.
    out = generate(TARGET, ids, drafter=drafter, max_new_tokens=NUM_TOKENS + 2, temperature=params.temperature,
                   top_k=params.top_k, top_p=params.top_p, generator=torch.Generator().manual_seed(seed),
                   verifier=verifier, eos_token_id=[])  # the enumerated law has no EOS stop
    new = out.sequences[:, PROMPT.shape[1]:PROMPT.shape[1] + NUM_TOKENS]
    counts = {}
    for row in map(tuple, new.tolist()):
        counts[row] = counts.get(row, 0) + 1
    return counts


PARAMS = {"T1": SamplingParams(1.0), "T0.7_top_p0.9": SamplingParams(0.7, top_p=0.9)}
DRAFTERS = {
    "plain_decoding": lambda: None,
    "draft_model_chain_sampled": lambda: DraftModelDrafter(_model(1, TARGET, 0.5), num_drafts=3, mode="sample"),
    "draft_model_tree_without_replacement": lambda: DraftModelDrafter(_model(2, TARGET, 0.5), num_drafts=2,
                                                                      tree=TREE, mode="sample"),
    "draft_model_tree_iid": lambda: DraftModelDrafter(_model(3, TARGET, 0.5), num_drafts=2, tree=TREE,
                                                      mode="sample_iid"),
    "draft_model_tree_topk": lambda: DraftModelDrafter(_model(4, TARGET, 0.5), num_drafts=2, tree=TREE,
                                                       mode="topk"),
    "prompt_lookup": lambda: PromptLookupDrafter(max_ngram_size=2, num_drafts=3),
    "eagle1_static_topk_tree": lambda: recipes.eagle1(_eagle1_head(), tree=TREE),
    "eagle1_sampled_tree": lambda: drafters.EagleDrafter(_eagle1_head(), trees.SampledTree(TREE)),
    "eagle2_dynamic_tree": lambda: recipes.eagle2(_eagle1_head(), total_tokens=8, depth=2, top_k=3),
    "eagle3_reduced_vocab": lambda: recipes.eagle3(_eagle3_head(), total_tokens=8, depth=2, top_k=2),
}


def _eagle1_head():
    torch.manual_seed(5)
    return heads.Eagle1Head.from_target(TARGET)


def _eagle3_head():
    torch.manual_seed(6)
    # a reduced draft vocabulary: 4 of the 6 target tokens (d2t / t2d map it back)
    d2t_t2d = build_draft_vocab(torch.tensor([5.0, 9.0, 1.0, 7.0, 3.0, 8.0]), 4)
    return heads.Eagle3Head.from_target(TARGET, draft_vocab=d2t_t2d, feature_layers=(0, 1, 2))


def test_stated_power_detects_total_variation_of_three_hundredths():
    assert DETECTABLE <= 0.03


@pytest.mark.parametrize("params_name", sorted(PARAMS))
@pytest.mark.parametrize("drafter_name", sorted(DRAFTERS))
def test_sampled_law_of_first_tokens_equals_enumerated_target_law(drafter_name, params_name):
    params = PARAMS[params_name]
    law = _exact_law(TARGET, params)
    # A stable seed per case (hash() of a str is salted per process, which made every CI run draw new samples).
    seed = zlib.crc32(f"{drafter_name}/{params_name}".encode()) % 1000
    counts = _sampled_counts(DRAFTERS[drafter_name](), params, seed=seed)
    fit = chi_square_test(counts, law)
    assert fit.p_value > ALPHA, f"{drafter_name} at {params_name}: {fit}"


def _resample_from_p_instead_of_residual(target_probs, draft, source, *, max_depth=None):
    """A known-wrong chain verifier: the next token is drawn from the target law at the last accepted node,
    also after a rejection (where the residual max(p - q, 0) is the right law)."""
    result = verify_chain(target_probs, draft, source, max_depth=max_depth)
    last = result.accepted_nodes.gather(1, result.num_accepted[:, None])[:, 0]
    p_last = target_probs[torch.arange(target_probs.shape[0]), last]
    return result._replace(next_tokens=source.categorical(p_last))


def test_mutant_verifier_that_resamples_from_p_fails_the_same_test():
    params = PARAMS["T1"]
    law = _exact_law(TARGET, params)
    drafter = DraftModelDrafter(_model(1, TARGET, 0.5), num_drafts=3, mode="sample")
    counts = _sampled_counts(drafter, params, seed=11, verifier=_resample_from_p_instead_of_residual)
    fit = chi_square_test(counts, law)
    assert fit.p_value < ALPHA, f"the mutant went undetected: {fit}"
