"""What generate() accepts and refuses (specdec.inputs, the adapter's model checks, the vocabulary check).

Every trap of "the first hour": padding on any side gives each row the tokens it gets alone; a padded batch
without a mask, a list, a model that is not a causal LM, a draft of another vocabulary are refused with an
error that names the fix; a draft whose embedding is padded past the target's is accepted and never proposes
an id the target does not have.
"""
import copy

import pytest
import torch
import transformers
from tiny_models import VOCAB, noisy_copy, tiny_model

from specdec.adapter import UnsupportedModelError
from specdec.drafters.base import ProposeRequest
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.generate import generate
from specdec.inputs import prepare_prompts
from specdec.sampling import PerRowSource
from specdec.step import prefill
from specdec.types import SamplingParams

ROWS = [[5, 9, 14, 5, 9, 14, 22, 31], [40, 41, 42, 40, 41], [7, 3, 7, 3, 7, 3, 8, 8, 2, 60]]  # ragged prompts
N_NEW = 14


def _batch(rows, layout: str, pad: int = 0):
    """``rows`` padded to one width: ``left``, ``right`` or ``mixed`` (pads on both sides), with the mask."""
    width = max(len(r) for r in rows) + 2
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        spare = width - len(row)
        lo = {"left": spare, "right": 0, "mixed": (b + 1) % (spare + 1)}[layout]
        ids[b, lo:lo + len(row)] = torch.tensor(row)
        mask[b, lo:lo + len(row)] = 1
    return ids, mask


def _new_tokens(out, width):
    return [out.sequences[b, width:width + int(n)].tolist() for b, n in enumerate(out.num_new_tokens)]


def _alone(model, drafter_fn, **kw):
    return [_new_tokens(generate(model, torch.tensor([row]), drafter=drafter_fn(), **kw), len(row))[0] for row in ROWS]


DRAFTERS = {
    "plain": lambda model: (lambda: None),
    "draft_model": lambda model: (lambda d=noisy_copy(model, 0.3): DraftModelDrafter(d, num_drafts=3)),
    "prompt_lookup": lambda model: (lambda: PromptLookupDrafter(max_ngram_size=2, num_drafts=4)),
}


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
@pytest.mark.parametrize("layout", ["left", "right", "mixed"])
def test_greedy_rows_of_any_padding_equal_each_prompt_alone(layout, drafter):
    model = tiny_model("llama")
    make = DRAFTERS[drafter](model)
    ids, mask = _batch(ROWS, layout)
    out = generate(model, ids, attention_mask=mask, drafter=make(), max_new_tokens=N_NEW, eos_token_id=[])
    assert _new_tokens(out, ids.shape[1]) == _alone(model, make, max_new_tokens=N_NEW, eos_token_id=[])
    # sequences starts with the prompts repacked to the left: each row's real tokens end at column T
    for b, row in enumerate(ROWS):
        assert out.sequences[b, ids.shape[1] - len(row):ids.shape[1]].tolist() == row


def test_unpadded_batch_equals_each_prompt_alone():
    model = tiny_model("qwen3")
    rows = [r[:5] for r in ROWS]
    out = generate(model, torch.tensor(rows), drafter=PromptLookupDrafter(num_drafts=3), max_new_tokens=N_NEW)
    alone = [generate(model, torch.tensor([r]), drafter=PromptLookupDrafter(num_drafts=3), max_new_tokens=N_NEW)
             for r in rows]
    assert _new_tokens(out, 5) == [_new_tokens(a, 5)[0] for a in alone]


def _row_source(seed: int, rows: int = len(ROWS)):
    return PerRowSource([torch.Generator().manual_seed(seed + b) for b in range(rows)])


@pytest.mark.parametrize("layout", ["left", "right", "mixed"])
def test_sampled_rows_equal_each_prompt_alone_with_per_row_randomness(layout):
    """What "the same under a fixed seed" can mean for a batch. A shared generator draws one block of noise for
    the whole batch, so a row's tokens depend on its neighbours (same seed, same batch: same tokens; that is
    test_generate's reproducibility test). With one source per row (PerRowSource) a row's draws are its own:

    - plain sampling: every row equals the prompt decoded alone with that row's source, token for token;
    - a sampled draft-model chain: equal to the end too, as each row's draft is cut at its own budget (before
      session 34 the batch's longest remaining row set the cut of the last steps, and only the first
      max_new_tokens - K tokens were equal).
    """
    model = tiny_model("llama")
    ids, mask = _batch(ROWS, layout)
    params = dict(temperature=1.0, top_p=0.9, max_new_tokens=N_NEW, eos_token_id=[])
    out = generate(model, ids, attention_mask=mask, source=_row_source(3), **params)
    alone = [_new_tokens(generate(model, torch.tensor([r]), source=_row_source(3 + b, 1), **params), len(r))[0]
             for b, r in enumerate(ROWS)]
    assert _new_tokens(out, ids.shape[1]) == alone

    K = 3
    draft = noisy_copy(model, 0.3)
    for seed in (0, 1, 7):  # seeds 0 and 1 differed in the last tokens before session 34
        out = generate(model, ids, attention_mask=mask, drafter=DraftModelDrafter(draft, K, mode="sample"),
                       source=_row_source(seed), **params)
        alone = [_new_tokens(generate(model, torch.tensor([r]), drafter=DraftModelDrafter(draft, K, mode="sample"),
                                      source=_row_source(seed + b, 1), **params), len(r))[0]
                 for b, r in enumerate(ROWS)]
        assert out.stats.tau > 1.2  # drafts were accepted: the speculative path ran
        assert _new_tokens(out, ids.shape[1]) == alone, seed


def test_batch_encoding_and_dict_inputs_are_accepted_like_tensors():
    model = tiny_model("llama")
    ids, mask = _batch(ROWS, "right")
    ref = generate(model, ids, attention_mask=mask, max_new_tokens=6).sequences
    enc = transformers.BatchEncoding({"input_ids": ids, "attention_mask": mask})
    assert torch.equal(generate(model, enc, max_new_tokens=6).sequences, ref)
    assert torch.equal(generate(model, {"input_ids": ids, "attention_mask": mask}, max_new_tokens=6).sequences, ref)
    with pytest.raises(ValueError, match="given twice"):
        generate(model, enc, attention_mask=mask, max_new_tokens=6)


@pytest.mark.parametrize("bad, error, match", [
    ([[1, 2, 3]], TypeError, "return_tensors='pt'"),
    ([1, 2, 3], TypeError, "return_tensors='pt'"),
    ({"input_ids": [[1, 2, 3]]}, TypeError, "return_tensors='pt'"),
    ("def f(x):", TypeError, "LongTensor"),
    (torch.ones(1, 3), TypeError, "integer token ids"),
    ({"ids": torch.ones(1, 3, dtype=torch.long)}, TypeError, "'input_ids' entry"),
    (torch.ones(3, dtype=torch.long), ValueError, r"input_ids\[None\]"),
])
def test_inputs_of_the_wrong_type_or_shape_are_refused_naming_what_is_expected(bad, error, match):
    with pytest.raises(error, match=match):
        generate(tiny_model("llama"), bad, max_new_tokens=2)


@pytest.mark.parametrize("bad", [97, 500, -1])
def test_token_ids_outside_the_embedding_are_refused_naming_the_id(bad):
    """Before session 34 an id past the embedding failed inside it ("index out of range in self" on CPU, a
    device-side assert on CUDA)."""
    model = tiny_model("llama")  # 97 embedding rows
    with pytest.raises(ValueError, match=rf"token id {bad}, outside the target's embedding \[0, 97\)"):
        generate(model, torch.tensor([[3, bad, 5]]), max_new_tokens=2)


def test_pads_outside_the_embedding_and_an_empty_batch_are_refused():
    model = tiny_model("llama")
    ids, mask = torch.tensor([[-100, 4, 5], [3, 4, 5]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match="token id -100.*pad with an id of its vocabulary"):
        generate(model, ids, attention_mask=mask, max_new_tokens=2)  # HF's generate fails inside the embedding
    with pytest.raises(ValueError, match="no rows"):
        generate(model, torch.zeros(0, 3, dtype=torch.long), max_new_tokens=2)


def test_a_batch_with_pad_ids_and_no_mask_is_refused():
    model = tiny_model("llama")
    ids, _ = _batch(ROWS, "left", pad=0)
    with pytest.raises(ValueError, match="pass attention_mask"):
        generate(model, ids, pad_token_id=0, max_new_tokens=2)
    model.generation_config.pad_token_id = 0  # the model's own pad id is checked too
    with pytest.raises(ValueError, match="pad token id 0"):
        generate(model, ids, max_new_tokens=2)
    generate(model, ids, attention_mask=torch.ones_like(ids), max_new_tokens=2)  # the named way out works


@pytest.mark.parametrize("mask, match", [
    (torch.full((1, 4), 2), "only 0 and 1"),
    (torch.tensor([[0, 0, 0, 0]]), "no real token"),
    (torch.ones(1, 3, dtype=torch.long), "differs from input_ids"),
])
def test_bad_masks_are_refused(mask, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny_model("llama"), torch.ones(1, 4, dtype=torch.long), attention_mask=mask, max_new_tokens=2)


def test_prepare_prompts_repacks_right_and_mixed_padding_to_the_left():
    ids = torch.tensor([[4, 5, 0, 0], [0, 6, 7, 0], [8, 9, 1, 2]])
    mask = (ids != 0).long()
    got = prepare_prompts(ids, mask, pad_token_id=0)
    assert got.input_ids.tolist() == [[0, 0, 4, 5], [0, 0, 6, 7], [8, 9, 1, 2]]
    assert got.attention_mask.tolist() == [[False, False, True, True], [False, False, True, True], [True] * 4]
    assert got.lengths == [2, 2, 4]
    unpadded = prepare_prompts(ids[2:], mask[2:])
    assert unpadded.attention_mask is None and torch.equal(unpadded.input_ids, ids[2:])


# ---------------------------------------------------------------- models that are not causal LMs
def _bert(cls, **kw):
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, **kw)
    return cls(cfg).eval()


NOT_CAUSAL_LMS = {
    "t5": (lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)).eval(), "encoder-decoder"),
    "bert_masked_lm": (lambda: _bert(transformers.BertForMaskedLM), "bidirectionally"),
    "bert_lm_head_without_is_decoder": (lambda: _bert(transformers.BertLMHeadModel), "bidirectionally"),
    "auto_model_without_head": (lambda: transformers.AutoModel.from_config(tiny_model("llama").config), "no LM head"),
}


@pytest.mark.parametrize("name", sorted(NOT_CAUSAL_LMS))
def test_models_that_are_not_causal_lms_are_refused_up_front(name):
    make, problem = NOT_CAUSAL_LMS[name]
    with pytest.raises(UnsupportedModelError, match=f"(?s){problem}.*AutoModelForCausalLM"):
        generate(make(), torch.ones(1, 4, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(UnsupportedModelError, match="draft model"):
        DraftModelDrafter(make())


def test_a_bert_decoder_with_is_decoder_true_is_a_causal_lm():
    model = _bert(transformers.BertLMHeadModel, is_decoder=True)
    ids = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    ref = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(generate(model, ids, max_new_tokens=6, eos_token_id=[]).sequences, ref)


# ---------------------------------------------------------------- vocabularies
def _padded_draft(model, rows: int):
    """The target with its embedding padded to ``rows`` (same tokenizer; random extra rows, untied head)."""
    draft = copy.deepcopy(model)
    draft.resize_token_embeddings(rows, mean_resizing=False)
    with torch.no_grad():  # make the padded rows win the argmax often, as an untrained row easily can
        draft.get_output_embeddings().weight[VOCAB:].mul_(8.0)
    return draft


def test_a_draft_padded_past_the_target_vocabulary_is_accepted_and_masked():
    model = tiny_model("llama")
    draft = _padded_draft(model, 128)
    ids, mask = _batch(ROWS, "left")
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=N_NEW)
    out = generate(model, ids, attention_mask=mask, drafter=DraftModelDrafter(draft, 4), max_new_tokens=N_NEW)
    assert torch.equal(out.sequences, plain.sequences)
    assert out.stats.tau > 3.0  # the draft is the target on the real rows: masking its padded rows keeps it exact


def test_the_draft_model_never_proposes_an_id_past_the_target_vocabulary():
    model = tiny_model("llama")
    drafter = DraftModelDrafter(_padded_draft(model, 128), tree=[(0,), (1,), (2,), (0, 0), (0, 0, 0)])
    ids = torch.tensor([ROWS[0]])

    def proposals(vocab_size):
        first = prefill(drafter.adapter, ids)  # the draft model as its own target: only propose() is tested
        state = drafter.start(_feedback(ids, first))
        request = ProposeRequest(roots=first.state.roots, root_positions=first.state.cache.lengths, num_drafts=3,
                                 sampling=SamplingParams(), source=None, active=torch.ones(1, dtype=torch.bool),
                                 vocab_size=vocab_size)
        return drafter.propose(state, request)[0].tokens

    assert int(proposals(VOCAB).max()) < VOCAB
    assert int(proposals(None).max()) >= VOCAB  # negative control: unmasked, the padded rows are proposed


def _feedback(ids, first):
    from specdec.drafters.base import Feedback

    return Feedback(tokens=ids, next_tokens=torch.cat([ids[:, 1:], first.state.roots[:, None]], 1),
                    positions=torch.arange(ids.shape[1])[None], valid=torch.ones_like(ids, dtype=torch.bool),
                    features=(), roots=first.state.roots)


def test_a_draft_with_a_smaller_vocabulary_is_refused_with_both_sizes():
    model = tiny_model("llama")
    small = tiny_model("llama")
    small.resize_token_embeddings(50)
    with pytest.raises(ValueError, match=r"(?s)vocabulary \(50 ids\).*target's \(97\).*tokenizer="):
        generate(model, torch.ones(1, 4, dtype=torch.long), drafter=DraftModelDrafter(small), max_new_tokens=4)


def test_a_target_padded_past_the_tokenizer_is_accepted_when_the_tokenizer_says_so():
    target = tiny_model("llama")
    target.resize_token_embeddings(128, mean_resizing=False)  # the target is the padded one this time
    draft = copy.deepcopy(target)
    draft.resize_token_embeddings(VOCAB)

    class Tokenizer:  # what the check reads of a tokenizer: how many ids it produces
        def __len__(self):
            return VOCAB

    ids = torch.tensor([ROWS[1]])
    plain = generate(target, ids, max_new_tokens=8)
    out = generate(target, ids, drafter=DraftModelDrafter(draft, 3), tokenizer=Tokenizer(), max_new_tokens=8)
    assert torch.equal(out.sequences, plain.sequences)

    class Larger:
        def __len__(self):
            return 120

    with pytest.raises(ValueError, match=r"produces 120 ids.*97.*128"):
        generate(target, ids, drafter=DraftModelDrafter(draft, 3), tokenizer=Larger(), max_new_tokens=8)


def test_a_k_deeper_than_the_draft_tree_is_refused_not_clamped():
    model = tiny_model("llama")
    depth2 = [(0,), (1,), (0, 0)]
    with pytest.raises(ValueError, match=r"num_drafts=10 is deeper than the tree.*2 levels"):
        DraftModelDrafter(model, 10, tree=depth2)
    assert DraftModelDrafter(model, tree=depth2).max_num_drafts == 2  # left out: the tree's depth
