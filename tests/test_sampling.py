"""Tests of specdec.sampling: logits processing and the two random primitives."""
from __future__ import annotations

import math

import pytest
import torch

from specdec.sampling import (
    PerRowSource,
    PredrawnNoise,
    RandomSource,
    TorchSource,
    as_source,
    next_token,
    process_logits,
    sample,
)
from specdec.testing import chi_square_test, detectable_tv, exact_distribution
from specdec.types import SamplingParams

# ----------------------------------------------------------------------------------------------------------------
# process_logits
# ----------------------------------------------------------------------------------------------------------------


def test_greedy_gives_one_hot_of_argmax_with_ties_to_lowest_id():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 3.0, 3.0, 3.0]])
    probs = process_logits(logits, SamplingParams())
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert probs.dtype == torch.float32


def test_temperature_divides_logits_before_softmax():
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    probs = process_logits(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, -1), atol=1e-7)


def test_top_k_keeps_the_k_largest_and_ties_at_the_kth_value():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 3.0])
    probs = process_logits(logits, SamplingParams(1.0, top_k=2))
    assert (probs > 0).tolist() == [False, True, True, False, True]  # 3.0 is tied at the 2nd value
    assert torch.allclose(probs.sum(), torch.tensor(1.0))
    no_filter = process_logits(logits, SamplingParams(1.0))
    assert torch.equal(process_logits(logits, SamplingParams(1.0, top_k=99)), no_filter)


def _top_p_brute_force(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    order = sorted(range(len(probs)), key=lambda i: (-float(probs[i]), i))
    keep, mass = set(), 0.0
    for i in order:
        if mass >= top_p:
            break
        keep.add(i)
        mass += float(probs[i])
    out = torch.tensor([float(probs[i]) if i in keep else 0.0 for i in range(len(probs))], dtype=torch.float64)
    return out / out.sum()


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_p):
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        logits = 2 * torch.randn(9, generator=gen, dtype=torch.float64)
        probs = process_logits(logits, SamplingParams(1.0, top_p=top_p))
        assert torch.allclose(probs, _top_p_brute_force(torch.softmax(logits, -1), top_p), atol=1e-12)


def test_top_k_then_top_p_order():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64))
    # top-k 2 renormalises to [4/7, 3/7]; top-p 0.5 then keeps only the first token.
    probs = process_logits(logits, SamplingParams(1.0, top_k=2, top_p=0.5))
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_output_dtype_and_batch_shapes():
    logits = torch.randn(2, 3, 5)
    for dtype, want in [(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                        (torch.float64, torch.float64)]:
        out = process_logits(logits.to(dtype), SamplingParams(0.7, top_k=3, top_p=0.9))
        assert out.dtype == want and out.shape == (2, 3, 5)
        assert torch.allclose(out.sum(-1), torch.ones(2, 3, dtype=want), atol=1e-5)


def test_banned_tokens_stay_at_zero():
    logits = torch.tensor([0.0, -math.inf, 1.0])
    assert process_logits(logits, SamplingParams(1.0))[1] == 0.0


def test_process_logits_rejects_bad_input():
    with pytest.raises(TypeError, match="SamplingParams"):
        process_logits(torch.zeros(3), {"temperature": 1.0})
    with pytest.raises(TypeError, match="float"):
        process_logits(torch.zeros(3, dtype=torch.long), SamplingParams())
    with pytest.raises(ValueError, match=r"\[\.\.\., V\]"):
        process_logits(torch.zeros(2, 0), SamplingParams())


# ----------------------------------------------------------------------------------------------------------------
# Random sources
# ----------------------------------------------------------------------------------------------------------------


def test_bernoulli_edges_zero_never_one_always():
    source = TorchSource(torch.Generator().manual_seed(0))
    probs = torch.tensor([0.0, 1.0]).repeat(50_000)
    out = source.bernoulli(probs)
    assert out.dtype == torch.bool and out.shape == probs.shape
    assert not out[0::2].any() and out[1::2].all()


def test_bernoulli_frequency_matches_probability():
    # n = 400,000 coins per probability; 6 standard deviations is at most 0.0047.
    source = TorchSource(torch.Generator().manual_seed(1))
    for p in (1e-3, 0.3, 0.999):
        rate = source.bernoulli(torch.full((400_000,), p)).double().mean().item()
        assert abs(rate - p) < 6 * math.sqrt(p * (1 - p) / 400_000)


def test_categorical_never_picks_zero_weight_lanes():
    source = TorchSource(torch.Generator().manual_seed(2))
    weights = torch.zeros(20_000, 1000)
    weights[:, 999] = 1e-30  # a tiny weight in the last lane still beats every zero lane
    weights[::2, 3] = 5.0
    out = source.categorical(weights)
    assert bool(((out == 3) | (out == 999)).all())
    assert bool((out[1::2] == 999).all())


def test_categorical_all_zero_row_returns_index_zero():
    source = TorchSource(torch.Generator().manual_seed(3))
    out = source.categorical(torch.tensor([[0.0, 0.0, 0.0], [0.0, 2.0, 0.0]]))
    assert out.tolist() == [0, 1]


def test_categorical_law_passes_chi_square_with_stated_power():
    # n = 200,000 draws over 10 bins: at alpha = 1e-3 any TV error >= 0.0078 is caught with power 0.99.
    n = 200_000
    weights = torch.tensor([5.0, 0.0, 1.0, 0.5, 3.0, 0.0, 0.25, 2.0, 1.0, 0.25])
    out = sample(weights.expand(n, -1), torch.Generator().manual_seed(4))
    fit = chi_square_test(torch.bincount(out, minlength=10), weights / weights.sum())
    assert detectable_tv(n, fit.num_bins) < 0.01
    assert fit.p_value > 1e-3
    # negative control: the same test rejects a sampler whose law is off by TV 0.01
    skewed = weights / weights.sum()
    skewed = skewed + 0.01 * (torch.nn.functional.one_hot(torch.tensor(0), 10) - torch.nn.functional.one_hot(
        torch.tensor(4), 10))
    bad = sample(skewed.expand(n, -1), torch.Generator().manual_seed(4))
    assert chi_square_test(torch.bincount(bad, minlength=10), weights / weights.sum()).p_value < 1e-3


def test_categorical_is_an_exponential_race_with_exact_law():
    # Enumeration runs the same primitive contract: law = w / sum(w).
    weights = torch.tensor([[1.0, 0.0, 3.0]])
    law = exact_distribution(lambda s: int(s.categorical(weights)[0]))
    assert law == {0: 0.25, 2: 0.75}


def test_predrawn_noise_consumes_noise_in_order_and_reports_exhaustion():
    source = PredrawnNoise(torch.tensor([0.2, 0.8, 0.5]), torch.tensor([1.0, 0.1, 2.0, 3.0]))
    assert source.bernoulli(torch.tensor([0.5, 0.5])).tolist() == [True, False]
    assert source.categorical(torch.tensor([[1.0, 1.0], [1.0, 1.0]])).tolist() == [1, 0]
    assert (source.uniforms_used, source.exponentials_used) == (2, 4)
    with pytest.raises(ValueError, match="ran out of uniforms.*needs 2, 1 are left"):
        source.bernoulli(torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="ran out of exponentials"):
        source.categorical(torch.tensor([1.0]))


def test_predrawn_noise_matches_torch_source_on_the_same_noise():
    # TorchSource draws float64 uniforms, then exponentials, from its generator; pre-drawing the same values from
    # an identically seeded generator and replaying them must give identical answers (kernel-parity pattern).
    probs = torch.rand(64, generator=torch.Generator().manual_seed(5))
    weights = torch.rand(64, 10, generator=torch.Generator().manual_seed(6))
    live = TorchSource(torch.Generator().manual_seed(7))
    coins, picks = live.bernoulli(probs), live.categorical(weights)
    gen = torch.Generator().manual_seed(7)
    uniforms = torch.rand(64, generator=gen, dtype=torch.float64)
    exponentials = torch.empty(64, 10, dtype=torch.float64).exponential_(generator=gen)
    replay = PredrawnNoise(uniforms, exponentials)
    assert torch.equal(replay.bernoulli(probs), coins) and torch.equal(replay.categorical(weights), picks)
    assert torch.equal(coins, uniforms < probs.double())
    assert torch.equal(picks, (weights.double().log() - exponentials.log()).argmax(-1))


def test_seeded_torch_source_is_reproducible_across_20_repetitions():
    weights = torch.rand(8, 1000, generator=torch.Generator().manual_seed(6))
    runs = [TorchSource(torch.Generator().manual_seed(9)).categorical(weights) for _ in range(20)]
    assert all(torch.equal(runs[0], r) for r in runs)


def test_as_source_accepts_generators_and_sources_and_refuses_none():
    gen = torch.Generator().manual_seed(0)
    assert isinstance(as_source(gen), TorchSource)
    source = PredrawnNoise(torch.zeros(1), torch.ones(1))
    assert as_source(source) is source
    assert isinstance(source, RandomSource) and isinstance(TorchSource(gen), RandomSource)
    with pytest.raises(ValueError, match="needs randomness.*manual_seed"):
        as_source(None)
    placeholder = as_source(None, greedy=True)
    with pytest.raises(ValueError, match="no randomness"):
        placeholder.categorical(torch.ones(3))
    with pytest.raises(TypeError, match="torch.Generator"):
        as_source(1234)
    with pytest.raises(TypeError, match="torch.Generator"):
        TorchSource(1234)


def test_sample_draws_one_token_per_row():
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    assert sample(probs, torch.Generator().manual_seed(0)).tolist() == [1, 2]


# ---------------------------------------------------------------- per-row sources, the plain step's pick
def test_per_row_source_answers_each_row_from_its_own_source():
    weights = torch.rand(3, 4, 9, generator=torch.Generator().manual_seed(0))
    probs = torch.rand(3, 5, generator=torch.Generator().manual_seed(1))
    rows = PerRowSource([torch.Generator().manual_seed(10 + b) for b in range(3)])
    got_c, got_b = rows.categorical(weights), rows.bernoulli(probs)
    for b in range(3):
        alone = TorchSource(torch.Generator().manual_seed(10 + b))
        assert torch.equal(got_c[b], alone.categorical(weights[b]))
        assert torch.equal(got_b[b], alone.bernoulli(probs[b]))
    with pytest.raises(ValueError, match="first dimension must be the batch"):
        rows.categorical(weights[:2])


def test_next_token_is_the_argmax_when_greedy_and_a_draw_from_the_processed_law_otherwise():
    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    assert torch.equal(next_token(logits, SamplingParams(), None), logits.float().argmax(-1))
    params = SamplingParams(temperature=0.5, top_k=3)
    drawn = next_token(logits, params, torch.Generator().manual_seed(4))
    expected = TorchSource(torch.Generator().manual_seed(4)).categorical(process_logits(logits, params))
    assert torch.equal(drawn, expected)
    with pytest.raises(ValueError, match="generator"):
        next_token(logits, params, None)
