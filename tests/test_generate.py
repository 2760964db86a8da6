"""generate(): greedy identity with plain decoding, exact sampling law, batching, stopping, bad input."""
import copy

import pytest
import torch
import transformers
from tiny_models import noisy_copy as _noisy_copy
from tiny_models import tiny_model

from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.generate import generate
from specdec.sampling import RandomSource
from specdec.verify import verify_greedy

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gpt_neox", "phi3"]
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]


def _prompts(batch: int, seed: int = 0):
    """Left-padded prompts with a repeated motif (so n-gram lookup finds matches)."""
    g = torch.Generator().manual_seed(seed)
    T = 12
    ids = torch.zeros(batch, T, dtype=torch.long)
    mask = torch.zeros(batch, T, dtype=torch.long)
    for b in range(batch):
        n = T - (b % 3) * 2
        motif = torch.randint(1, 97, (4,), generator=g)
        ids[b, T - n:] = torch.cat([motif, motif, motif])[:n]
        mask[b, T - n:] = 1
    return ids, mask


def _drafters(model):
    return {
        "draft_model_chain": DraftModelDrafter(_noisy_copy(model, 0.3), num_drafts=4),
        "draft_model_tree": DraftModelDrafter(_noisy_copy(model, 0.3), num_drafts=4, tree=TREE),
        "self_draft_chain": DraftModelDrafter(copy.deepcopy(model), num_drafts=3),
        "prompt_lookup": PromptLookupDrafter(max_ngram_size=3, num_drafts=5),
    }


def _hf_greedy(model, ids, mask, n):
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculative_output_is_token_identical_to_plain_greedy(arch, batch):
    model = tiny_model(arch, scale=1.0)
    ids, mask = _prompts(batch, seed=batch)
    n = 24
    ref = _hf_greedy(model, ids, mask, n)
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=n)
    assert torch.equal(plain.sequences[:, ids.shape[1]:], ref), "plain loop differs from HF greedy"
    for name, drafter in _drafters(model).items():
        out = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=n)
        assert torch.equal(out.sequences[:, ids.shape[1]:], ref), f"{name} differs from plain greedy"
        assert out.stats.num_new_tokens == batch * n
        if name == "self_draft_chain":  # a draft equal to the target is always accepted
            assert out.stats.tau > 3.0


def test_rows_accept_different_lengths_and_finish_at_different_times():
    model = tiny_model("llama")
    ids, mask = _prompts(4, seed=7)
    eos = int(_hf_greedy(model, ids[:1], mask[:1], 30)[0, 5])  # row 0 meets EOS at its 6th token
    drafter = DraftModelDrafter(_noisy_copy(model, 0.3), num_drafts=4, tree=TREE)
    out = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=30, eos_token_id=eos)
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=eos)
    assert torch.equal(out.sequences, plain.sequences)
    lens = out.num_new_tokens.tolist()
    assert lens[0] == 6 and out.sequences[0, ids.shape[1] + 5] == eos
    for b in range(4):
        row = out.sequences[b, ids.shape[1]:ids.shape[1] + lens[b]].tolist()
        assert eos not in row[:-1]
        assert lens[b] == 30 or row[-1] == eos
    steps = out.stats.num_accepted_per_step
    assert any(len(set(s)) > 1 for s in steps), "rows should accept different numbers of drafts"


def test_eos_defaults_to_the_model_generation_config_like_hf():
    model = tiny_model("llama")
    ids, mask = _prompts(1)
    ref = _hf_greedy(model, ids, mask, 20)[0].tolist()
    model.generation_config.eos_token_id = ref[3]
    out = generate(model, ids, attention_mask=mask, drafter=DraftModelDrafter(copy.deepcopy(model), 4),
                   max_new_tokens=20)
    assert out.sequences[0, ids.shape[1]:].tolist() == ref[: ref.index(ref[3]) + 1]


def test_eos_inside_an_accepted_path_stops_the_row_exactly_there():
    model = tiny_model("qwen3")
    ids, mask = _prompts(1)
    ref = _hf_greedy(model, ids, mask, 20)[0].tolist()
    eos = ref[7]
    cut = ref.index(eos) + 1
    drafter = DraftModelDrafter(copy.deepcopy(model), num_drafts=5)  # accepts everything: EOS lands mid-path
    out = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=20, eos_token_id=eos)
    assert out.sequences[0, ids.shape[1]:].tolist() == ref[:cut]


@pytest.mark.parametrize("n", [1, 2, 7, 13])
def test_max_new_tokens_is_never_exceeded(n):
    model = tiny_model("llama")
    ids, mask = _prompts(3)
    drafter = DraftModelDrafter(copy.deepcopy(model), num_drafts=5)
    out = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=n, eos_token_id=[])
    assert out.num_new_tokens.tolist() == [n] * 3
    assert out.sequences.shape[1] == ids.shape[1] + n


def test_stop_strings_end_the_row_after_the_completing_token():
    model = tiny_model("llama")
    ids, mask = _prompts(1)
    ref = _hf_greedy(model, ids, mask, 16)[0].tolist()

    class Tok:  # a toy tokenizer: token t decodes to "<t>"
        def decode(self, tokens, skip_special_tokens=False):
            return "".join(f"<{t}>" for t in tokens)

    stop = f"<{ref[4]}><{ref[5]}>"
    out = generate(model, ids, attention_mask=mask, drafter=PromptLookupDrafter(), max_new_tokens=16,
                   stop_strings=stop, tokenizer=Tok())
    got = out.sequences[0, ids.shape[1]:].tolist()
    assert got[: out.num_new_tokens[0]] == ref[: ref.index(ref[5], 5) + 1] or stop in Tok().decode(got)
    assert stop in Tok().decode(got[: out.num_new_tokens[0]])
    assert stop not in Tok().decode(got[: out.num_new_tokens[0] - 1])


def test_stats_count_target_forwards_and_tau():
    model = tiny_model("llama")
    ids, mask = _prompts(1)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=10)
    assert out.stats.num_target_forwards == 10  # prefill gives the first token, then one token per forward
    assert out.stats.tau == 1.0
    spec = generate(model, ids, attention_mask=mask, drafter=DraftModelDrafter(copy.deepcopy(model), 4),
                    max_new_tokens=21)
    assert spec.stats.num_steps == 4 and spec.stats.tau == 5.0
    assert spec.stats.acceptance_per_depth == (1.0, 1.0, 1.0, 1.0)
    assert spec.stats.num_draft_forwards > 0


def test_dynamic_schedule_turns_drafting_off_for_large_batches():
    model = tiny_model("llama")
    ids, mask = _prompts(4)
    drafter = DraftModelDrafter(copy.deepcopy(model), num_drafts=3)
    out = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=9,
                   schedule=[[1, 2, 3], [3, 8, 0]])
    # four active rows: K = 0, one token per step, identical output
    assert out.stats.tau == 1.0
    assert torch.equal(out.sequences, generate(model, ids, attention_mask=mask, max_new_tokens=9).sequences)
    small = generate(model, ids[:2], attention_mask=mask[:2], drafter=drafter, max_new_tokens=9,
                     schedule=[[1, 2, 3], [3, 8, 0]])
    assert small.stats.tau > 3.0


# ---------------------------------------------------------------- bad input
def test_draft_target_vocabulary_mismatch_is_refused():
    model = tiny_model("llama")
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2)
    other = transformers.LlamaForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="vocabulary"):
        generate(model, torch.ones(1, 4, dtype=torch.long), drafter=DraftModelDrafter(other), max_new_tokens=4)


def test_prompt_longer_than_the_model_positions_is_refused():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate(model, torch.ones(1, 500, dtype=torch.long), max_new_tokens=20)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_max_new_tokens_below_one_is_refused(bad):
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(tiny_model("llama"), torch.ones(1, 4, dtype=torch.long), max_new_tokens=bad)


@pytest.mark.parametrize("schedule", [[[2, 4, 1]], [[1, 4, 1], [3, 8, 1]], [[1, 4, 9]], [[1, 4]]])
def test_schedule_errors_are_refused_before_any_work(schedule):
    model = tiny_model("llama")
    with pytest.raises(ValueError):
        generate(model, torch.ones(1, 4, dtype=torch.long), drafter=DraftModelDrafter(copy.deepcopy(model), 3),
                 schedule=schedule, max_new_tokens=4)


def test_drafter_k_over_its_maximum_is_refused():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="3"):
        generate(model, torch.ones(1, 4, dtype=torch.long), drafter=DraftModelDrafter(copy.deepcopy(model), 3),
                 num_drafts=5, max_new_tokens=4)


def test_sampling_without_a_generator_is_refused():
    with pytest.raises(ValueError, match="generator"):
        generate(tiny_model("llama"), torch.ones(1, 4, dtype=torch.long), temperature=1.0, max_new_tokens=2)


def test_seeded_sampling_is_reproducible():
    model = tiny_model("llama")
    ids, mask = _prompts(2)
    runs = [generate(model, ids, attention_mask=mask, drafter=DraftModelDrafter(_noisy_copy(model, 0.3), 3),
                     temperature=1.0, max_new_tokens=12, generator=torch.Generator().manual_seed(5)).sequences
            for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])


def test_streamer_receives_the_prompt_then_exactly_the_emitted_tokens():
    model = tiny_model("llama")
    ids, mask = _prompts(1)

    class Recorder:  # the HF streamer interface: put(tensor) then end()
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    rec = Recorder()
    out = generate(model, ids, attention_mask=mask, drafter=DraftModelDrafter(copy.deepcopy(model), 4),
                   max_new_tokens=11, streamer=rec)
    assert rec.chunks[0] == ids[0].tolist() and rec.ended
    assert sum(rec.chunks[1:], []) == out.sequences[0, ids.shape[1]:].tolist()
    assert len(rec.chunks) - 1 < 11, "speculative steps stream several tokens at once"


def test_a_user_verifier_is_called_like_every_verifier_and_only_on_steps_with_drafts():
    model = tiny_model("llama")
    ids, mask = _prompts(3)
    calls = []

    def recording(target_probs, draft, source, *, max_depth=None):
        calls.append((target_probs, draft.num_nodes, max_depth, isinstance(source, RandomSource)))
        return verify_greedy(target_probs, draft, source, max_depth=max_depth)

    drafter = DraftModelDrafter(_noisy_copy(model, 0.3), num_drafts=3)
    out = generate(model, ids, attention_mask=mask, drafter=drafter, verifier=recording, max_new_tokens=14,
                   schedule=[[1, 2, 3], [3, 8, 0]], eos_token_id=[])  # 3 active rows: K = 0, no verifier call
    assert not calls and out.stats.tau == 1.0
    out = generate(model, ids, attention_mask=mask, drafter=drafter, verifier=recording, max_new_tokens=14)
    assert torch.equal(out.sequences, generate(model, ids, attention_mask=mask, max_new_tokens=14).sequences)
    assert 0 < len(calls) <= out.stats.num_steps  # the last step may be plain: K is cut by the budget
    for probs, nodes, max_depth, has_source in calls:
        # an unmarked verifier gets processed probabilities (one-hot when greedy), the step's K, a RandomSource
        assert probs.shape[1] == nodes + 1 and torch.allclose(probs.sum(-1), torch.ones(()))
        assert 1 <= max_depth <= 3 and has_source


def test_profile_reports_the_phases_of_both_kinds_of_step():
    model = tiny_model("llama")
    ids, mask = _prompts(2)
    out = generate(model, ids, attention_mask=mask, drafter=DraftModelDrafter(copy.deepcopy(model), 3),
                   max_new_tokens=10, eos_token_id=[], profile=True)  # 1 + 4 + 4 tokens, then K = 0 for the last
    assert min(map(min, out.stats.num_accepted_per_step)) == 0 and max(map(max, out.stats.num_accepted_per_step)) == 3
    assert set(out.stats.phase_times) == {"draft", "target", "verify", "commit", "update"}
    assert generate(model, ids, attention_mask=mask, max_new_tokens=4).stats.phase_times is None


def test_the_per_depth_tries_are_counted_in_batches_over_shapes_and_active_rows():
    """StatsRecorder holds the drafted depths and counts them 64 steps at a time (per draft shape): the counts are
    what counting each step would give, with inactive rows and absent nodes left out."""
    from specdec.stats import StatsRecorder
    from specdec.types import Draft, DraftScheme

    rec = StatsRecorder(4, "cpu")
    g = torch.Generator().manual_seed(0)
    want = [0] * 5
    for step in range(150):
        n = 3 if step % 3 else 5  # two draft shapes
        parents = torch.randint(-1, 1, (2, n + 1), generator=g)
        parents[:, 0] = -1
        depths = torch.randint(0, 6, (2, n + 1), generator=g)
        active = torch.tensor([True, step % 4 != 0])
        draft = Draft(torch.zeros(2, n, dtype=torch.long), parents, depths, None, DraftScheme.DETERMINISTIC)
        rec.record([[1], [1]], active.tolist(), draft, None, active)
        for b in range(2):
            if active[b]:
                want[min(int(depths[b].masked_fill(parents[b] < 0, 0).max()), 4)] += 1
    stats = rec.finish(0, None)
    assert list(stats.depth_tries) == [sum(want[d:]) for d in range(1, 5)]


def test_a_prompt_on_another_device_than_the_target_is_named_with_the_fix():
    """Before, a prompt on the CPU and a target on CUDA failed deep in HF's embedding with a bare torch error."""
    model = tiny_model("llama", seed=0)
    ids = torch.ones(1, 3, dtype=torch.long, device="meta")  # another device than the weights' (cpu)
    with pytest.raises(ValueError, match=r"input_ids are on meta but the target's weights are on cpu: move the "
                                         r"prompt \(input_ids.to\('cpu'\)"):
        generate(model, ids, max_new_tokens=2)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="weights are on cuda"):
            generate(copy.deepcopy(model).cuda(), torch.ones(1, 3, dtype=torch.long), max_new_tokens=2)
