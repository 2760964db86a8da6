"""The target adapter: tree forwards over a ragged cache equal plain causal runs of each path."""
import pytest
import torch

from specdec.adapter import ModelAdapter
from tiny_models import ARCHITECTURES, tiny_model


def _plain_last_logits(model, tokens):
    return model(input_ids=tokens[None]).logits[0, -1]


def _prompt_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_forward_and_ragged_commit_match_plain_causal_runs(arch, attn):
    model = tiny_model(arch, attn=attn)
    ad = ModelAdapter(model, (0, model.config.num_hidden_layers))
    ids, mask = _prompt_batch()
    out, st = ad.prefill(ids, mask)
    ref = model(input_ids=ids, attention_mask=mask).logits[:, -1]
    torch.testing.assert_close(out.logits[:, -1], ref, atol=1e-5, rtol=0)
    # root, two children, a grandchild under child 1; one row of the batch left-padded
    toks = torch.randint(0, 97, (2, 4), generator=torch.Generator().manual_seed(1))
    parents = torch.tensor([[-1, 0, 0, 1]] * 2)
    depths = torch.tensor([[0, 1, 1, 2]] * 2)
    o2, st2 = ad.forward(st, toks, parents, st.lengths[:, None] + depths)
    for b in range(2):
        prompt = ids[b][mask[b].bool()]
        for node, path in [(3, [0, 1, 3]), (2, [0, 2])]:
            torch.testing.assert_close(o2.logits[b, node], _plain_last_logits(model, torch.cat([prompt, toks[b, path]])),
                                       atol=1e-5, rtol=0)
    # rows keep different paths and lengths, then decoding continues on the compacted cache
    keep = torch.tensor([[0, 2, -1], [0, 1, 3]])
    st3 = ad.commit(st2, keep, torch.tensor([2, 3]))
    assert st3.lengths.tolist() == [7 + 2, 4 + 3]
    nxt = torch.tensor([[5], [6]])
    o3, _ = ad.forward(st3, nxt, torch.tensor([[-1], [-1]]), st3.lengths[:, None])
    for b, path in enumerate([[0, 2], [0, 1, 3]]):
        seq = torch.cat([ids[b][mask[b].bool()], toks[b, path], nxt[b]])
        torch.testing.assert_close(o3.logits[b, 0], _plain_last_logits(model, seq), atol=1e-5, rtol=0)


def test_features_are_hf_hidden_states_at_requested_layers():
    model = tiny_model("llama")
    ad = ModelAdapter(model, (1, 2))
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(0))
    out, _ = ad.prefill(ids, None)
    ref = model(input_ids=ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(out.features[0], ref[1])
    torch.testing.assert_close(out.features[1], ref[2])


def test_pending_nodes_across_several_forwards_see_their_ancestors():
    model = tiny_model("qwen3")
    ad = ModelAdapter(model)
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(2))
    _, st = ad.prefill(ids, None)
    a = torch.tensor([[11, 12]])  # two siblings on the prefix
    _, st = ad.forward(st, a, torch.tensor([[-1, -1]]), st.lengths[:, None] + torch.tensor([[0, 0]]))
    b = torch.tensor([[13]])  # a child of the second sibling, run in a later call
    o, st = ad.forward(st, b, torch.tensor([[1]]), st.lengths[:, None] + 1)
    torch.testing.assert_close(o.logits[0, 0], _plain_last_logits(model, torch.cat([ids[0], torch.tensor([12, 13])])),
                               atol=1e-5, rtol=0)


def test_flash_attention_models_are_refused_with_a_fix():
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        ModelAdapter(model)


def test_prompt_longer_than_the_position_table_is_refused():
    model = tiny_model("llama")
    ad = ModelAdapter(model)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ad.prefill(torch.zeros(1, 600, dtype=torch.long), None)
