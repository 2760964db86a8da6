"""The target adapter: tree forwards over a ragged cache equal plain causal runs of each path."""
import pytest
import torch
from tiny_models import ARCHITECTURES, tiny_model

from specdec.adapter import ModelAdapter


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
            want = _plain_last_logits(model, torch.cat([prompt, toks[b, path]]))
            torch.testing.assert_close(o2.logits[b, node], want, atol=1e-5, rtol=0)
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


# ---------------------------------------------------------------- consumed states, decode, commit layouts
def test_every_call_consumes_its_state_and_a_reused_state_is_refused():
    from specdec.adapter import ConsumedStateError

    model = tiny_model("llama")
    ad = ModelAdapter(model)
    ids, mask = _prompt_batch()
    _, st = ad.prefill(ids, mask)
    _, st_tree = ad.forward(st, torch.tensor([[4, 5], [6, 7]]), torch.tensor([[-1, 0], [-1, 0]]),
                            st.lengths[:, None] + torch.tensor([[0, 1]]))
    with pytest.raises(ConsumedStateError, match="consumed by forward"):
        ad.decode(st, torch.tensor([1, 2]))
    st_kept = ad.commit(st_tree, torch.tensor([[0, 1], [0, -1]]), torch.tensor([2, 1]))
    with pytest.raises(ConsumedStateError, match="consumed by commit"):
        ad.commit(st_tree, torch.tensor([[0, 1], [0, -1]]), torch.tensor([2, 1]))
    _, st_next = ad.decode(st_kept, torch.tensor([8, 9]))
    with pytest.raises(ConsumedStateError, match="consumed by decode"):
        ad.forward(st_kept, torch.tensor([[1], [1]]), torch.tensor([[-1], [-1]]), st_kept.lengths[:, None])
    assert st_next.lengths.tolist() == [7 + 2 + 1, 4 + 1 + 1]


@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "gemma"])
def test_decode_keeps_one_token_and_equals_a_plain_causal_run(arch):
    model = tiny_model(arch)
    ad = ModelAdapter(model, (model.config.num_hidden_layers,))
    ids, mask = _prompt_batch(3)
    _, st = ad.prefill(ids, mask)
    assert not st.all_valid  # a padded row: decode hands HF the 2-D mask
    nxt = torch.tensor([11, 12])
    out, st2 = ad.decode(st, nxt)
    assert st2.num_pending == 0 and st2.lengths.tolist() == [8, 5] and st2.committed_valid.shape[1] == 8
    for b in range(2):
        seq = torch.cat([ids[b][mask[b].bool()], nxt[b:b + 1]])
        torch.testing.assert_close(out.logits[b, 0], _plain_last_logits(model, seq), atol=1e-5, rtol=0)
        hidden = model(input_ids=seq[None], output_hidden_states=True).hidden_states[-1][0, -1]
        torch.testing.assert_close(out.features[0][b, 0], hidden, atol=1e-5, rtol=0)


def test_commit_layout_given_by_the_caller_equals_the_one_found_on_the_device():
    model = tiny_model("qwen3")
    ids, mask = _prompt_batch(4)
    toks = torch.randint(0, 97, (2, 4), generator=torch.Generator().manual_seed(5))
    parents, depths = torch.tensor([[-1, 0, 1, 1]] * 2), torch.tensor([[0, 1, 2, 2]] * 2)
    for keep, counts, prefix, full in [([[0, 1, 2], [0, 1, 2]], [3, 3], True, True),      # a chain's prefix
                                       ([[0, 1, 3], [0, -1, -1]], [3, 1], False, False),  # a tree path + a hole
                                       ([[0, 1, -1], [0, 1, 2]], [2, 3], True, False)]:
        states = []
        for given in [False, True]:
            ad = ModelAdapter(model)
            _, st = ad.prefill(ids, mask)
            _, st = ad.forward(st, toks, parents, st.lengths[:, None] + depths)
            kw = dict(prefix=prefix, full=full) if given else {}
            st = ad.commit(st, torch.tensor(keep), torch.tensor(counts), **kw)
            out, _ = ad.forward(st, torch.tensor([[3], [4]]), torch.tensor([[-1], [-1]]), st.lengths[:, None])
            states.append((st, out.logits))
        (a, la), (b, lb) = states
        assert torch.equal(a.committed_valid, b.committed_valid) and torch.equal(a.lengths, b.lengths)
        assert a.all_valid == b.all_valid is False  # row 1 is left-padded
        torch.testing.assert_close(la, lb, atol=1e-6, rtol=0)


def test_all_valid_tracks_whether_a_mask_is_needed():
    model = tiny_model("llama")
    ad = ModelAdapter(model)
    ids = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(6))
    _, st = ad.prefill(ids, torch.ones_like(ids))
    assert st.all_valid
    _, st = ad.forward(st, torch.tensor([[1, 2], [3, 4]]), torch.tensor([[-1, 0]] * 2),
                       st.lengths[:, None] + torch.tensor([[0, 1]]))
    st = ad.commit(st, torch.tensor([[0, 1], [0, 1]]), torch.tensor([2, 2]))
    assert st.all_valid  # both rows kept everything: no hole
    _, st = ad.forward(st, torch.tensor([[1, 2], [3, 4]]), torch.tensor([[-1, 0]] * 2),
                       st.lengths[:, None] + torch.tensor([[0, 1]]))
    st = ad.commit(st, torch.tensor([[0, 1], [0, -1]]), torch.tensor([2, 1]))
    assert not st.all_valid  # row 1 kept one of two slots: a hole, later decodes pass HF the 2-D mask
