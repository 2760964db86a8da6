"""Tests for specdec.masks: fast builders against the predicate references, and an HF model as the oracle."""
from __future__ import annotations

import inspect
import random

import pytest
import torch
from tiny_models import random_forest

from specdec.masks import (
    and_masks,
    causal_mask_mod,
    causal_mask_with_padding,
    causal_mask_with_padding_ref,
    create_mask,
    diagonal_mask_mod,
    or_masks,
    padding_mask_mod,
    prefix_valid_from_lengths,
    to_additive_mask,
    tree_attention_mask,
    tree_attention_mask_ref,
    tree_positions,
)
from specdec.trees import (
    EAGLE_MC_SIM_7B_63,
    chain_tree,
    compile_tree,
    depths_from_parents,
    retrieve_paths,
    validate_parents,
)

DTYPES = [torch.bool, torch.float32, torch.float16, torch.bfloat16]


def random_prefix_valid(gen, batch, length):
    """Left padding of random length per row, plus random holes among the real slots."""
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    valid = prefix_valid_from_lengths(lengths, length)
    holes = torch.rand(batch, length, generator=gen) < 0.2
    return valid & ~holes


# ---- fast builders equal the predicate references ----------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_fast_tree_mask_equals_the_predicate_reference_on_random_batches(seed, dtype):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    batch, num_nodes, length = [(1, 0, 3), (3, 9, 7), (4, 17, 0), (2, 33, 12)][seed]
    parents = random_forest(rng, batch, num_nodes)
    validate_parents(parents)
    prefix_valid = random_prefix_valid(gen, batch, length)
    fast = tree_attention_mask(parents, prefix_valid, dtype=dtype)
    ref = tree_attention_mask_ref(parents, prefix_valid, dtype=dtype)
    assert fast.shape == (batch, 1, num_nodes + 1, length + num_nodes + 1) and fast.dtype == dtype
    assert torch.equal(fast, ref)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_a_tree_object_gives_the_mask_of_its_parents_in_every_row(dtype):
    tree = compile_tree(EAGLE_MC_SIM_7B_63)
    prefix_valid = random_prefix_valid(torch.Generator().manual_seed(0), 3, 6)
    from_tree = tree_attention_mask(tree, prefix_valid, dtype=dtype)
    parents, _ = tree.expand(3)
    assert torch.equal(from_tree, tree_attention_mask(parents, prefix_valid, dtype=dtype))
    assert torch.equal(from_tree, tree_attention_mask_ref(tree, prefix_valid, dtype=dtype))


def test_tree_mask_layout_prefix_then_ancestors():
    tree = compile_tree(EAGLE_MC_SIM_7B_63)
    prefix_valid = torch.tensor([[False, True, True], [True, False, True]])
    mask = tree_attention_mask(tree, prefix_valid)
    assert torch.equal(mask[:, 0, :, :3], prefix_valid[:, None, :].expand(2, 26, 3))
    assert torch.equal(mask[0, 0, :, 3:], tree.ancestor_mask)
    assert bool(mask.any(-1).all())  # no all-masked row, even with an all-False prefix
    empty_prefix = tree_attention_mask(tree, torch.zeros(2, 3, dtype=torch.bool))
    assert bool(empty_prefix.any(-1).all())


def test_chain_mask_is_causal_over_the_tree_columns():
    mask = tree_attention_mask(chain_tree(4), torch.ones(1, 2, dtype=torch.bool))
    assert torch.equal(mask[0, 0, :, 2:], torch.ones(5, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_additive_form_is_zero_or_finfo_min(dtype):
    mask = tree_attention_mask(compile_tree([(0,), (1,)]), torch.tensor([[False, True]]))
    additive = tree_attention_mask(compile_tree([(0,), (1,)]), torch.tensor([[False, True]]), dtype=dtype)
    assert additive.dtype == dtype
    assert torch.equal(additive == 0, mask)
    assert bool((additive[~mask] == torch.finfo(dtype).min).all())
    assert torch.equal(to_additive_mask(mask, dtype), additive)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_causal_mask_with_padding_equals_the_reference(seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    batch, length = 3, [1, 6, 11][seed]
    valid = random_prefix_valid(gen, batch, length)
    if seed == 2:  # right padding too
        valid[0] = prefix_valid_from_lengths(torch.tensor([4]), length, left_padded=False)[0]
    fast = causal_mask_with_padding(valid, dtype=dtype)
    assert fast.shape == (batch, 1, length, length) and fast.dtype == dtype
    assert torch.equal(fast, causal_mask_with_padding_ref(valid, dtype=dtype))


def test_causal_mask_with_padding_rows():
    mask = causal_mask_with_padding(torch.tensor([[0, 1, 0, 1]]))[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 1, 0, 1]]


def test_and_or_masks_and_create_mask():
    valid = torch.tensor([[True, False, True]])
    both = create_mask(and_masks(causal_mask_mod, padding_mask_mod(valid)), 1, 3, 3)
    assert both.shape == (1, 1, 3, 3)
    assert both[0, 0].int().tolist() == [[1, 0, 0], [0, 0, 0], [1, 0, 1]]
    either = create_mask(or_masks(diagonal_mask_mod, lambda b, q, kv: kv == 2), 2, 2, 3)
    assert either.shape == (2, 1, 2, 3)
    assert either[1, 0].int().tolist() == [[1, 0, 1], [0, 1, 1]]
    batch_dependent = create_mask(lambda b, q, kv: kv == b, 2, 1, 2)
    assert batch_dependent[:, 0, 0].int().tolist() == [[1, 0], [0, 1]]
    with pytest.raises(ValueError):
        and_masks()
    with pytest.raises(ValueError):
        or_masks()


def test_prefix_valid_from_lengths_left_and_right():
    lengths = torch.tensor([0, 2, 4])
    left = prefix_valid_from_lengths(lengths, 4)
    right = prefix_valid_from_lengths(lengths, 4, left_padded=False)
    assert left.int().tolist() == [[0, 0, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]]
    assert right.int().tolist() == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert prefix_valid_from_lengths(lengths, 0).shape == (3, 0)
    with pytest.raises(ValueError, match="L must be"):
        prefix_valid_from_lengths(lengths, -1)


def test_tree_positions_are_root_position_plus_depth():
    tree = compile_tree(EAGLE_MC_SIM_7B_63)
    roots = torch.tensor([7, 0])
    positions = tree_positions(tree, roots)
    assert torch.equal(positions, roots[:, None] + tree.depths[None])
    parents = torch.tensor([[-1, 0, 1, -1], [-1, 0, 0, 2]])
    assert tree_positions(depths_from_parents(parents), roots).tolist() == [[7, 8, 9, 7], [0, 1, 1, 2]]


def test_bad_mask_inputs_raise_with_the_fix():
    tree = chain_tree(2)
    with pytest.raises(ValueError, match="torch.bool"):
        tree_attention_mask(tree, torch.ones(1, 2, dtype=torch.bool), dtype=torch.int64)
    with pytest.raises(ValueError, match="one tree per row"):
        tree_attention_mask(torch.tensor([[-1, 0]]), torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="prefix_valid"):
        tree_attention_mask(tree, torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="prefix_valid"):
        tree_attention_mask(tree, torch.ones(1, 2))
    with pytest.raises(ValueError, match="root_positions"):
        tree_positions(tree, torch.tensor(3))
    # HF's 0/1 integer attention_mask is accepted as prefix_valid.
    ints = tree_attention_mask(tree, torch.tensor([[0, 1]]))
    assert torch.equal(ints, tree_attention_mask(tree, torch.tensor([[False, True]])))


def test_fast_builders_need_no_host_sync():
    # Meta tensors have no values: any .item(), bool() or data-dependent shape would raise.
    parents = torch.empty(3, 20, dtype=torch.long, device="meta")
    prefix_valid = torch.empty(3, 9, dtype=torch.bool, device="meta")
    assert tree_attention_mask(parents, prefix_valid).shape == (3, 1, 20, 29)
    assert tree_attention_mask(parents, prefix_valid, dtype=torch.bfloat16).dtype == torch.bfloat16
    tree = compile_tree(EAGLE_MC_SIM_7B_63).to("meta")
    assert tree_attention_mask(tree, prefix_valid).shape == (3, 1, 26, 35)
    assert causal_mask_with_padding(prefix_valid, dtype=torch.float32).shape == (3, 1, 9, 9)
    roots = torch.empty(3, dtype=torch.long, device="meta")
    assert tree_positions(tree, roots).shape == (3, 26)
    assert prefix_valid_from_lengths(roots, 9).shape == (3, 9)


# ---- oracle: a tiny HF Llama, all tree nodes in one forward vs each path run as a plain continuation ------

transformers = pytest.importorskip("transformers")


def cache_kwargs(model, cache):
    """The cache keyword of ``model.forward``: ``cache`` in transformers 5.24, ``past_key_values`` in 5.17."""
    params = inspect.signature(model.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}


@pytest.fixture(scope="module")
def tiny_llama(request):
    """A tiny random LlamaForCausalLM in float32 with the attention implementation given as the param."""
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=97,
        max_position_embeddings=128,
        attn_implementation=request.param,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
    assert model.config._attn_implementation == request.param
    # A model this small gains nothing from threads, and on a shared CPU they only wait on each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield model
    torch.set_num_threads(threads)


def prefill(model, prompt_ids, prompt_valid):
    """Run left-padded prompts into a fresh DynamicCache with the 2-D mask; positions count real tokens."""
    cache = transformers.DynamicCache(config=model.config)
    positions = (prompt_valid.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(
            input_ids=prompt_ids,
            attention_mask=prompt_valid.long(),
            position_ids=positions,
            use_cache=True,
            **cache_kwargs(model, cache),
        )
    return out.logits, cache


def make_prompts(gen, lengths, width):
    valid = prefix_valid_from_lengths(lengths, width)
    ids = torch.where(valid, torch.randint(1, 97, (len(lengths), width), generator=gen), 0)
    return ids, valid


SHARED_TREE = compile_tree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)])
# Each row its own tree (EAGLE-2 style); row 1 has absent nodes interleaved.
PER_ROW_PARENTS = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 5, 6], [-1, 0, -1, 1, 0, -1, 3, 4, -1]])


def tree_step_error(model, layout, mask_dtype, build_mask=tree_attention_mask):
    """Prefill 2 left-padded prompts, run every tree node in ONE forward on the cache with the 4-D mask, and
    return the largest |difference| between a node's logits and those of its root-to-node path run as a
    plain causal continuation of the unpadded prompt (batch 1, no mask, default positions)."""
    gen = torch.Generator().manual_seed(1)
    lengths, width = torch.tensor([5, 9]), 9
    prompt_ids, prompt_valid = make_prompts(gen, lengths, width)
    prompt_logits, cache = prefill(model, prompt_ids, prompt_valid)
    if layout == "shared_tree":
        parents, depths = SHARED_TREE.expand(2)
        mask_parents = SHARED_TREE
    else:
        parents = PER_ROW_PARENTS
        validate_parents(parents)
        depths = depths_from_parents(parents)
        mask_parents = parents
    num_nodes = parents.shape[1] - 1
    tokens = torch.randint(1, 97, (2, num_nodes + 1), generator=gen)
    tokens[:, 0] = prompt_logits[:, -1].argmax(-1)  # the root: the target's own next token

    mask = build_mask(mask_parents, prompt_valid, dtype=mask_dtype)
    positions = tree_positions(depths, root_positions=prompt_valid.sum(-1))
    assert mask.shape == (2, 1, num_nodes + 1, cache.get_seq_length() + num_nodes + 1)
    with torch.no_grad():
        tree_logits = model(
            input_ids=tokens, attention_mask=mask, position_ids=positions, **cache_kwargs(model, cache)
        ).logits

    paths, is_leaf = retrieve_paths(parents)
    error, checked = 0.0, 0
    for b in range(2):
        prompt = prompt_ids[b, prompt_valid[b]]
        for leaf in is_leaf[b].nonzero().flatten().tolist():
            path = [n for n in paths[b, leaf].tolist() if n >= 0]
            sequence = torch.cat([prompt, tokens[b, path]])[None]
            with torch.no_grad():
                plain = model(input_ids=sequence).logits[0, len(prompt) - 1 :]
            # plain[0] is the prompt's last position (= the prefill's), plain[1 + d] follows node path[d].
            torch.testing.assert_close(plain[0], prompt_logits[b, -1], atol=1e-5, rtol=0)
            error = max(error, float((tree_logits[b, path] - plain[1:]).abs().max()))
            checked += len(path)
    assert checked >= 10
    return error


@pytest.mark.parametrize("layout", ["per_row_trees", "shared_tree"])
@pytest.mark.parametrize(
    "tiny_llama, mask_dtype",
    [("sdpa", torch.bool), ("sdpa", torch.float32), ("eager", torch.float32)],
    indirect=["tiny_llama"],
)
def test_tree_forward_logits_equal_each_path_run_as_a_plain_continuation(tiny_llama, mask_dtype, layout):
    assert tree_step_error(tiny_llama, layout, mask_dtype) < 1e-5


@pytest.mark.parametrize("tiny_llama", ["eager"], indirect=True)
def test_oracle_catches_a_bool_mask_under_eager_attention(tiny_llama):
    # Negative control: eager adds the mask to the scores, so a bool mask is silently wrong.
    assert tree_step_error(tiny_llama, "per_row_trees", torch.bool) > 1e-3


@pytest.mark.parametrize("tiny_llama", ["sdpa"], indirect=True)
def test_oracle_catches_a_causal_mask_over_a_branching_tree(tiny_llama):
    # Negative control: letting every node see all earlier nodes (a chain's mask) must fail the oracle.
    def causal_tree_mask(parents, prefix_valid, *, dtype):
        width = SHARED_TREE.num_nodes + 1
        chain_parents = torch.arange(-1, width - 1).expand(prefix_valid.shape[0], width)
        return tree_attention_mask(chain_parents, prefix_valid, dtype=dtype)

    assert tree_step_error(tiny_llama, "shared_tree", torch.bool, build_mask=causal_tree_mask) > 1e-3


@pytest.mark.parametrize("tiny_llama", ["sdpa", "eager"], indirect=True)
def test_prefill_with_the_4d_padding_mask_equals_the_2d_mask(tiny_llama):
    model = tiny_llama
    gen = torch.Generator().manual_seed(2)
    prompt_ids, prompt_valid = make_prompts(gen, torch.tensor([3, 7]), 7)
    logits_2d, _ = prefill(model, prompt_ids, prompt_valid)
    dtype = torch.bool if model.config._attn_implementation == "sdpa" else torch.float32
    mask = causal_mask_with_padding(prompt_valid, dtype=dtype)
    positions = (prompt_valid.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits_4d = model(input_ids=prompt_ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(logits_4d[prompt_valid], logits_2d[prompt_valid], atol=1e-5, rtol=0)
