"""P-EAGLE (specdec/heads/peagle.py, formats/peagle.py, training/peagle.py, recipes.peagle): the head's one-forward
drafting against an uncached full-sequence reference (over steps, ragged rows, left padding, finished rows), float32
greedy identity with plain decoding (batch 1 and a left-padded batch; chain and a level-wise tree), the sampling law
at T > 0, the speculators ``peagle`` format (round trip, aliases, named errors), the training objective (mask
predicate, COD nesting, loss falls, determinism) and the runner."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_generate_sampling import ALPHA, PARAMS, TARGET, TREE, _exact_law, _sampled_counts
from tiny_models import VOCAB, tiny_model

from specdec import recipes
from specdec.drafters.base import Feedback, ProposeRequest
from specdec.drafters.parallel import ParallelDrafter, ParallelHead
from specdec.formats import PEagleFormatError, load_peagle_head, save_peagle_head
from specdec.generate import generate
from specdec.graphs import GraphedDrafter
from specdec.heads import PEagleHead
from specdec.testing import chi_square_test
from specdec.training import cod_counts, evaluate_peagle, peagle_block, train_peagle
from specdec.trees.level import LevelTree
from specdec.types import SamplingParams
from specdec.verify import check_draft

LAYERS = (0, 1, 2)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, scale=4.0)


def _perturbed(head: PEagleHead, seed: int = 3, scale: float = 0.2) -> PEagleHead:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return head.eval()


@pytest.fixture(scope="module")
def random_head(target):
    return _perturbed(PEagleHead.from_target(target, max_drafts=4, feature_layers=LAYERS))


@pytest.fixture(scope="module")
def trained(target):
    prompts = torch.randint(1, VOCAB, (32, 3), generator=torch.Generator().manual_seed(5))
    data = generate(target, prompts, max_new_tokens=40, eos_token_id=[]).sequences  # the target's own text
    return train_peagle(target, data, steps=120, batch_size=8, seq_len=24, lr=1e-2, max_drafts=4,
                        feature_layers=LAYERS, progress=False).head


def _features(target, ids):
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    return tuple(hs[i] for i in LAYERS)


def _request(B, K):
    return ProposeRequest(roots=torch.zeros(B, dtype=torch.long), root_positions=torch.zeros(B, dtype=torch.long),
                          num_drafts=K, sampling=SamplingParams(), source=None, active=torch.ones(B, dtype=torch.bool))


# --------------------------------------------------------------------------------------------------------
# The head
# --------------------------------------------------------------------------------------------------------


def test_head_shapes_and_protocol(target, random_head):
    head = random_head
    assert isinstance(head, ParallelHead)
    assert head.num_levels == 4 and head.vocab_size == VOCAB and head.feature_layers == LAYERS
    assert head.mask_token_id == VOCAB  # no spare id in the tiny vocabulary: the head owns row V
    assert head.mask_hidden.shape == (len(LAYERS) * 64,) and head.mask_slot_hidden().shape == (64,)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    feats = _features(target, ids)
    valid = torch.ones(2, 7, dtype=torch.bool)
    state = head.start(Feedback(tokens=ids, next_tokens=ids, positions=torch.arange(7).expand(2, -1), valid=valid,
                                features=feats, roots=ids[:, -1]))
    logits = head.level_logits(state, _request(2, 3))
    assert logits.shape == (2, 3, VOCAB) and torch.isfinite(logits).all()
    assert torch.equal(head.embed(torch.tensor([[VOCAB]]))[0, 0], head.mask_embedding)
    with pytest.raises(ValueError, match="mask_token_id"):
        PEagleHead.from_target(target, feature_layers=LAYERS, mask_token_id=VOCAB + 1)


def _walk(head, target, seqs, prompt_lens, steps, *, pad_left=0, atol=2e-5):
    """Drive a head over ragged rows (prompts, then per-step commit counts; 0 = finished row) and compare each
    step's drafts with the uncached reference on the row's whole committed prefix."""
    B = len(seqs)
    dev = seqs[0].device
    K = head.num_levels
    P = max(prompt_lens) + pad_left
    tokens = torch.zeros(B, P, dtype=torch.long, device=dev)
    valid = torch.zeros(B, P, dtype=torch.bool, device=dev)
    feats = [torch.zeros(B, P, f.shape[-1], device=dev) for f in _features(target, seqs[0][None, :1])]
    for b, (seq, n) in enumerate(zip(seqs, prompt_lens)):
        tokens[b, P - n:] = seq[:n]
        valid[b, P - n:] = True
        for f, g in zip(feats, _features(target, seq[None, :n])):
            f[b, P - n:] = g[0]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    roots = torch.stack([seq[n] for seq, n in zip(seqs, prompt_lens)])
    state = head.start(Feedback(tokens=tokens, next_tokens=tokens, positions=positions, valid=valid,
                                features=tuple(feats), roots=roots))
    lengths = list(prompt_lens)
    done = [False] * B
    for counts in [*steps, None]:
        logits = head.level_logits(state, _request(B, K))
        for b, seq in enumerate(seqs):
            if done[b]:
                continue
            L = lengths[b]
            ref = head.chain_logits_ref(seq[None, :L], _features(target, seq[None, :L]), seq[L][None], K)
            torch.testing.assert_close(logits[b], ref[0], atol=atol, rtol=1e-4)
        if counts is None:
            break
        M = max(max(counts), 1)
        ar = torch.arange(M, device=dev)
        tok = torch.zeros(B, M, dtype=torch.long, device=dev)
        fb_feats = [torch.zeros(B, M, f.shape[-1], device=dev) for f in feats]
        new_roots = torch.zeros(B, dtype=torch.long, device=dev)
        for b, (seq, n) in enumerate(zip(seqs, counts)):
            L = lengths[b]
            if n == 0:
                done[b] = True
                continue
            tok[b, :n] = seq[L:L + n]
            for f, g in zip(fb_feats, _features(target, seq[None, :L + n])):
                f[b, :n] = g[0, L:L + n]
            new_roots[b] = seq[L + n]
            lengths[b] = L + n
        fb_valid = ar[None] < torch.tensor(counts, device=dev)[:, None]
        fb_pos = torch.tensor([lengths[b] - counts[b] for b in range(B)], device=dev)[:, None] + ar
        state = head.update(state, Feedback(tokens=tok, next_tokens=tok, positions=fb_pos, valid=fb_valid,
                                            features=tuple(fb_feats), roots=new_roots))


def test_one_forward_drafting_equals_the_uncached_reference_at_batch_one(target, random_head):
    seq = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(1))
    _walk(random_head, target, [seq], [6], [[3], [1], [5], [2]])


def test_ragged_rows_left_padding_and_finished_rows(target, random_head):
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, VOCAB, (30,), generator=g) for _ in range(3)]
    # row 0: long prompt; row 1: short prompt (left padding); row 2 finishes after the second step
    _walk(random_head, target, seqs, [8, 3, 5], [[3, 1, 2], [1, 4, 5], [5, 2, 0], [2, 2, 0]], pad_left=1)


def test_a_plain_step_between_drafting_steps_is_absorbed(target, random_head):
    """update() twice in a row (a K = 0 step proposes nothing): the first entries must still reach the cache."""
    seq = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(3))
    head = random_head
    feats = _features(target, seq[None, :5])
    state = head.start(Feedback(tokens=seq[None, :5], next_tokens=seq[None, 1:6], positions=torch.arange(5)[None],
                                valid=torch.ones(1, 5, dtype=torch.bool), features=feats, roots=seq[5:6]))
    for L in (5, 6):  # two single-token updates without drafting
        f = _features(target, seq[None, :L + 1])
        state = head.update(state, Feedback(tokens=seq[None, L:L + 1], next_tokens=seq[None, L + 1:L + 2],
                                            positions=torch.tensor([[L]]), valid=torch.ones(1, 1, dtype=torch.bool),
                                            features=tuple(x[:, L:L + 1] for x in f), roots=seq[L + 1:L + 2]))
    ref = head.chain_logits_ref(seq[None, :7], _features(target, seq[None, :7]), seq[7:8], 4)
    torch.testing.assert_close(head.level_logits(state, _request(1, 4)), ref, atol=2e-5, rtol=1e-4)


def test_fewer_levels_use_fewer_mask_slots_and_give_the_same_leading_levels(target, random_head):
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
    feats = _features(target, ids)
    fb = Feedback(tokens=ids, next_tokens=ids, positions=torch.arange(6)[None],
                  valid=torch.ones(1, 6, dtype=torch.bool), features=feats, roots=ids[:, -1])
    full = random_head.level_logits(random_head.start(fb), _request(1, 4))
    two = random_head.level_logits(random_head.start(fb), _request(1, 2))
    assert two.shape == (1, 2, VOCAB)
    torch.testing.assert_close(two, full[:, :2], atol=2e-5, rtol=1e-4)  # causal: later slots never change earlier


# --------------------------------------------------------------------------------------------------------
# Greedy identity (float32) and the T > 0 law
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", [None, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)]])
@pytest.mark.parametrize("batch", [1, 3])
def test_generate_greedy_is_token_identical_to_plain_greedy(target, trained, tree, batch):
    ids = torch.randint(1, VOCAB, (batch, 6), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :2] = 0  # left padding, ragged rows
        mask[2, :4] = 0
    plain = generate(target, ids, attention_mask=mask, max_new_tokens=24)
    drafter = recipes.peagle(trained, tree)
    assert isinstance(drafter, GraphedDrafter) and isinstance(drafter.drafter, ParallelDrafter)  # eager on CPU
    spec = generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=24)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.tau > 1.0 and spec.stats.num_target_forwards < plain.stats.num_target_forwards


@pytest.mark.parametrize("arch", ["qwen3", "gpt_neox"])
def test_greedy_identity_on_other_architectures_with_default_feature_layers(arch):
    model = tiny_model(arch, seed=2, scale=4.0)
    head = _perturbed(PEagleHead.from_target(model, max_drafts=3), seed=4, scale=0.1)
    assert head.feature_layers == (1, 2)  # a 2-layer target: every decoder layer's output
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(9))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=16)
    for tree in (None, TREE):
        spec = generate(model, ids, attention_mask=mask, drafter=recipes.peagle(head, tree), max_new_tokens=16)
        assert torch.equal(spec.sequences, plain.sequences)


def test_recipe_chain_length_and_errors(trained):
    assert recipes.peagle(trained, num_drafts=2).max_num_drafts == 2
    assert recipes.peagle(trained).max_num_drafts == 4
    with pytest.raises(ValueError, match="max_drafts"):
        recipes.peagle(trained, num_drafts=5)
    assert isinstance(recipes.peagle(trained, LevelTree.chain(3), cuda_graphs=False).policy, LevelTree)


def _law_head():
    head = PEagleHead.from_target(TARGET, num_layers=1, max_drafts=2, feature_layers=(1, 2))
    return _perturbed(head, seed=21, scale=0.6)


@pytest.mark.parametrize("tree,params_name", [(TREE, "T1"), (None, "T0.7_top_p0.9")])
def test_sampled_law_of_first_tokens_equals_enumerated_target_law(tree, params_name):
    params = PARAMS[params_name]
    counts = _sampled_counts(recipes.peagle(_law_head(), tree), params, seed=41)
    fit = chi_square_test(counts, _exact_law(TARGET, params))
    assert fit.p_value > ALPHA, f"peagle {tree} at {params_name}: {fit}"


def test_drafts_are_valid_deterministic_trees(target, random_head):
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(6))
    fb = Feedback(tokens=ids, next_tokens=ids, positions=torch.arange(5).expand(2, -1),
                  valid=torch.ones(2, 5, dtype=torch.bool), features=_features(target, ids), roots=ids[:, -1])
    drafter = recipes.peagle(random_head, TREE)
    draft, state = drafter.propose(drafter.start(fb), _request(2, 2))
    check_draft(draft, VOCAB)
    assert state.num_forwards == 1 and draft.max_depth == 2


def test_reduced_draft_vocabulary_maps_to_target_ids_trains_and_round_trips(target, tmp_path):
    from specdec.training import build_draft_vocab

    counts = torch.arange(VOCAB, 0, -1)
    d2t, t2d = build_draft_vocab(counts, 50)
    head = _perturbed(PEagleHead.from_target(target, max_drafts=3, feature_layers=LAYERS, draft_vocab=(d2t, t2d)))
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(9))
    fb = Feedback(tokens=ids, next_tokens=ids, positions=torch.arange(6).expand(2, -1),
                  valid=torch.ones(2, 6, dtype=torch.bool), features=_features(target, ids), roots=ids[:, -1])
    logits = head.level_logits(head.start(fb), _request(2, 3))
    assert logits.shape == (2, 3, VOCAB)
    assert torch.equal(torch.isfinite(logits), t2d.expand(2, 3, -1))  # only draft-vocabulary ids can be drafted
    window = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(10))
    result = train_peagle(target, window, head=head, steps=2, batch_size=2, seq_len=16, max_drafts=3, progress=False)
    assert all(torch.isfinite(torch.tensor(r.loss)) for r in result.history)
    _same_head(result.head, load_peagle_head(save_peagle_head(result.head, tmp_path / "pe"), target))


# --------------------------------------------------------------------------------------------------------
# Format
# --------------------------------------------------------------------------------------------------------


def _same_head(a: PEagleHead, b: PEagleHead) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a.config == b.config and torch.equal(a.embed_weight, b.embed_weight)


def test_format_round_trip_in_the_speculators_layout(target, random_head, tmp_path):
    folder = save_peagle_head(random_head, tmp_path / "pe", verifier_name_or_path="tiny/llama")
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "peagle" and config["architectures"] == ["PEagleSpeculator"]
    assert config["mask_token_id"] == config["pard_token"] == config["ptd_token_id"] == VOCAB
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert config["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    assert config["transformer_layer_config"]["vocab_size"] == VOCAB
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    assert weights["mask_hidden"].shape == (1, 1, 3 * 64) and weights["embed_tokens.weight"].shape == (VOCAB + 1, 64)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "layers.0.hidden_norm.weight",
            "layers.1.self_attn.q_proj.weight"} <= weights.keys()
    _same_head(random_head, load_peagle_head(folder, target))


def test_format_with_an_in_vocabulary_mask_token_and_vllm_alias(target, tmp_path):
    head = _perturbed(PEagleHead.from_target(target, max_drafts=3, feature_layers=LAYERS, mask_token_id=5))
    folder = save_peagle_head(head, tmp_path / "pe")
    config = json.loads((folder / "config.json").read_text())
    for name in ("mask_token_id", "ptd_token_id"):
        del config[name]  # only vLLM's pard_token left
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_peagle_head(folder, target)
    assert loaded.mask_token_id == 5 and torch.equal(loaded.mask_embedding, head.mask_embedding)
    torch.testing.assert_close(loaded.embed_weight[:5], head.embed_weight[:5])


def test_missing_fields_give_named_errors(target, random_head, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_peagle_head(random_head, tmp_path / "pe")
    config = json.loads((folder / "config.json").read_text())
    no_id = {k: v for k, v in config.items() if k not in ("mask_token_id", "pard_token", "ptd_token_id")}
    (folder / "config.json").write_text(json.dumps(no_id))
    with pytest.raises(PEagleFormatError, match="mask_token_id.*pard_token"):
        load_peagle_head(folder, target)
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(str(folder / "model.safetensors"))
    del weights["mask_hidden"]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(PEagleFormatError, match="mask_hidden.*load_eagle_head"):
        load_peagle_head(folder, target)
    (folder / "config.json").write_text(json.dumps(dict(config, speculators_model_type="eagle3")))
    with pytest.raises(PEagleFormatError, match="not 'peagle'"):
        load_peagle_head(folder, target)


# --------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------


def test_block_mask_is_the_predicate_and_cod_anchors_are_nested():
    g = torch.Generator().manual_seed(0)
    block = peagle_block(2, 10, 4, ratio=0.7, floor=0.2, generator=g)
    assert cod_counts(10, 4, 0.7, 0.2) == [10, 7, 5, 4] and block.anchors.shape[1] == 26
    for b in range(2):
        a, d = block.anchors[b].tolist(), block.depths[b].tolist()
        by_depth = [set(x for x, y in zip(a, d) if y == k) for k in range(4)]
        assert all(by_depth[k + 1] <= by_depth[k] for k in range(3))  # A_d within A_{d-1}
        for q in range(len(a)):
            for k in range(len(a)):
                expect = (d[k] == 0 and a[k] <= a[q]) or (a[k] == a[q] and 1 <= d[k] <= d[q])
                assert bool(block.mask[b, 0, q, k]) == expect
    with pytest.raises(ValueError, match="generator"):
        peagle_block(1, 10, 3)


def test_training_loss_finite_falls_on_a_repeated_batch_and_is_deterministic(target):
    window = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(7))  # one window, always
    kw = dict(steps=3, batch_size=2, seq_len=20, lr=1e-2, max_drafts=3, segment_len=8, feature_layers=LAYERS,
              progress=False)
    a = train_peagle(target, window, **kw)
    b = train_peagle(target, window, **kw)
    assert all(torch.isfinite(torch.tensor(r.loss)) for r in a.history)
    assert [r.loss for r in a.history] == [r.loss for r in b.history]
    long = train_peagle(target, window, **dict(kw, steps=40))
    # soft CE against a high-entropy random target (entropy ~4.4 nats) cannot fall far; its excess (the KL) does
    assert long.history[-1].loss < long.history[0].loss - 0.1
    assert long.history[-1].accuracy > long.history[0].accuracy + 0.3
    scores = evaluate_peagle(target, long.head, window)
    assert len(scores.accuracy) == 3 and scores.accuracy[0] > 0.5


def test_decay_gamma_weights_the_per_depth_losses(target):
    from specdec.training.eagle import _target_forward
    from specdec.training.peagle import peagle_loss

    head = PEagleHead.from_target(target, max_drafts=3, feature_layers=LAYERS)
    window = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(9))
    features, logits = _target_forward(target, window, head.feature_layers)
    kw = dict(num_depths=3, segment_len=16, ratio=1.0, floor=1.0)
    uniform, per_depth, _ = peagle_loss(head, window, features, logits, **kw)
    decayed, same, _ = peagle_loss(head, window, features, logits, decay_gamma=1.5, **kw)
    w = torch.exp(-torch.arange(3.0) / 1.5)
    assert torch.allclose(per_depth, same)
    assert torch.allclose(uniform, per_depth.mean()) and torch.allclose(decayed, (w * per_depth).sum() / w.sum())
    with pytest.raises(ValueError, match="decay_gamma must be > 0"):
        peagle_loss(head, window, features, logits, decay_gamma=0.0, **kw)


def test_training_saves_loadable_checkpoints(target, tmp_path):
    window = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(8))
    result = train_peagle(target, window, steps=4, batch_size=2, seq_len=20, max_drafts=2, feature_layers=LAYERS,
                          out_dir=tmp_path, save_every=2, progress=False)
    assert (tmp_path / "step-2" / "config.json").exists()
    history = json.loads((tmp_path / "final" / "history.json").read_text())
    assert len(history) == 4 and len(history[0]["per_depth_accuracy"]) == 2
    _same_head(result.head, load_peagle_head(tmp_path / "final", target))


def test_runner_smoke(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_peagle.py"), "--target",
                          str(ROOT / "specdec" / "demo" / "assets" / "target"), "--data-dir", str(ROOT / "specdec"),
                          "--max-files", "3", "--steps", "2", "--batch-size", "2", "--seq-len", "32",
                          "--max-drafts", "2", "--num-layers", "1", "--val-rows", "2", "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "level 2: loss" in out.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_done"] == 2 and len(summary["validation"]["accuracy"]) == 2
    assert (tmp_path / "peagle" / "final" / "model.safetensors").exists()


# --------------------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU): the Triton input kernel inside the head, greedy identity, training with autocast
# --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_greedy_identity_and_reference(trained):
    model = tiny_model("llama", seed=0, scale=4.0).cuda()
    head = PEagleHead.from_target(model, max_drafts=4, feature_layers=LAYERS)
    head.load_state_dict(trained.state_dict())
    head = head.cuda().eval()
    seq = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(1)).cuda()
    _walk(head, model, [seq], [6], [[3], [1], [5]], atol=1e-3)  # GPU attention kernels differ by path
    ids = torch.randint(1, VOCAB, (3, 6), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=24)
    for tree in (None, TREE):
        spec = generate(model, ids, attention_mask=mask, drafter=recipes.peagle(head, tree), max_new_tokens=24)
        assert torch.equal(spec.sequences, plain.sequences)
    window = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(7)).cuda()
    result = train_peagle(model, window, steps=3, batch_size=2, seq_len=20, max_drafts=2, feature_layers=LAYERS,
                          progress=False)
    assert all(torch.isfinite(torch.tensor(r.loss)) for r in result.history)
