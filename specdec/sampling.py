"""Logits processing and the two random primitives every stochastic block of ``specdec`` uses.

Randomness is always an argument. A block that samples takes a :class:`RandomSource` (or a
``torch.Generator``, wrapped by :func:`as_source`) and asks it for exactly two things:

- ``bernoulli(probs)``: one coin per element, ``True`` with probability ``probs``;
- ``categorical(weights)``: one index per row, drawn proportionally to non-negative, unnormalised weights.

:class:`TorchSource` answers from a ``torch.Generator``; :class:`PredrawnNoise` answers from noise drawn
beforehand (so a kernel and its torch reference can be fed the same noise); :class:`PerRowSource` gives every
batch row its own source (a row's tokens then do not depend on the other rows of the batch);
``specdec.testing`` has a source that branches over every answer to compute exact output laws.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from .types import SamplingParams

__all__ = [
    "process_logits",
    "RandomSource",
    "NoiseSource",
    "TorchSource",
    "PredrawnNoise",
    "PerRowSource",
    "as_source",
    "sample",
    "next_token",
]


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits into the sampling distribution: temperature, then top-k, then top-p.

    The same function processes the target's and the draft's logits, so both sides of a verifier see the
    distributions the plain sampler would use (lossless means lossless with respect to *this* law).

    Math (``z`` the logits of one row, ``T`` the temperature)::

        greedy (T == 0):  probs = one_hot(argmax z)            (ties go to the lowest id)
        otherwise:        z' = z / T
                          top-k:  z'_i = -inf unless z'_i >= (k-th largest z')   (ties at the k-th value are kept)
                          pi = softmax(z')
                          top-p:  sort pi descending; keep token i iff the mass strictly before it is < top_p,
                                  i.e. the smallest prefix whose mass reaches top_p; renormalise.

    Removed tokens get probability exactly 0.

    Args:
        logits: the scores to process. Each row needs at least one finite entry (``-inf`` marks banned
            tokens, e.g. from an HF logits processor applied earlier).
            Shape: ``[..., V]``, any float dtype.
        params: temperature / top-k / top-p. ``top_k >= V`` and ``top_p == 1`` disable the filters.

    Returns:
        Probabilities, shape ``[..., V]``: float32, or float64 when ``logits`` is float64 (the toy models of
        ``specdec.testing`` use float64 so that exact-enumeration tests reach 1e-12).

    Example:
        >>> process_logits(torch.tensor([1.0, 3.0, 3.0]), SamplingParams()).tolist()
        [0.0, 1.0, 0.0]

    References:
        Holtzman et al., "The Curious Case of Neural Text Degeneration" (top-p), arXiv 1904.09751.
        HF ``TemperatureLogitsWarper`` / ``TopKLogitsWarper`` / ``TopPLogitsWarper`` (same order).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a specdec.SamplingParams, got {type(params).__name__}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a float tensor, got {logits.dtype}; cast with logits.float()")
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    vocab = logits.shape[-1]
    z = logits.to(out_dtype)
    if params.is_greedy:
        return torch.nn.functional.one_hot(z.argmax(-1), vocab).to(out_dtype)
    z = z / params.temperature
    if 0 < params.top_k < vocab:
        kth = z.topk(params.top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, -math.inf)
    probs = torch.softmax(z, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        # The first token always has mass_before == 0 < top_p, so at least one token survives.
        keep_sorted = mass_before < params.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@runtime_checkable
class RandomSource(Protocol):
    """The randomness a stochastic block consumes: two primitives, nothing else.

    Every sampler, drafter and verifier of ``specdec`` draws through these two methods, which is what lets
    ``specdec.testing.EnumeratingSource`` replace them by exhaustive branching. Implement both to plug in your
    own randomness (a counter-based RNG, noise shared with a kernel, ...).

    Math: ``bernoulli(p)_i ~ Bernoulli(p_i)`` independently; ``categorical(w)_r ~ w_r / sum(w_r)`` independently
    per row.

    References:
        Randomness is an argument: the library never seeds or reads the global RNG. vLLM v1 rejection sampler
        (``vllm/v1/sample/rejection_sampler.py``): noise is drawn outside the kernel, so the kernel is deterministic
        given its inputs.
    """

    def bernoulli(self, probs: torch.Tensor) -> torch.Tensor:
        """Independent coins: ``out[i]`` is ``True`` with probability ``probs[i]``.

        Args:
            probs: success probabilities in ``[0, 1]`` (``0`` is never ``True``, ``1`` always).
                Shape: ``[...]``, any.

        Returns:
            Bool tensor of the same shape.
        """
        ...

    def categorical(self, weights: torch.Tensor) -> torch.Tensor:
        """One index per row, ``P(out == i) = weights[i] / sum(weights)``.

        Args:
            weights: unnormalised non-negative weights; an index with weight 0 is never chosen. A row whose
                weights are all 0 returns index 0 (callers only use such rows when they are irrelevant).
                Shape: ``[..., V]``.

        Returns:
            Int64 tensor of shape ``[...]``.
        """
        ...


def _bernoulli_from_uniforms(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    # u in [0, 1): u < p is True with probability exactly p, never for p == 0, always for p == 1.
    return uniforms < probs.to(torch.float64)


def _categorical_from_exponentials(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    # Exponential race: argmax_i w_i / E_i with E_i ~ Exp(1) picks i with probability w_i / sum(w), since
    # E_i / w_i ~ Exp(rate w_i) and the smallest of independent exponentials is i w.p. rate_i / sum(rates).
    # Zero-weight lanes score -inf so they can never win (not even against padding or a tie at 0).
    w = weights.to(torch.float64)
    positive = w > 0
    scores = torch.where(positive, w.log() - exponentials.log(), torch.full_like(w, -math.inf))
    index = scores.argmax(-1)
    return torch.where(positive.any(-1), index, torch.zeros_like(index))


class NoiseSource:
    """Base of the sources that turn raw noise into answers; subclasses only say where noise comes from.

    Math: ``bernoulli`` compares float64 uniforms ``u ~ U[0, 1)`` with the probabilities (``u < p``, true with
    probability exactly ``p``); ``categorical`` runs an exponential race ``argmax_i log w_i - log E_i`` with
    ``E_i ~ Exp(1)``: ``E_i / w_i ~ Exp(w_i)`` and the smallest of independent exponentials is ``i`` with
    probability ``w_i / sum(w)``; lanes with ``w_i == 0`` score ``-inf`` and never win. Both use exactly
    ``probs.numel()`` / ``weights.numel()`` noise values, in row-major order, so two sources fed the same noise
    give the same answers, and a kernel fed that noise can be compared bit for bit.

    References:
        vLLM v1 rejection sampler (float64 uniforms, exponential race, ``-inf`` for masked lanes).
    """

    def uniforms(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """Float64 uniforms in ``[0, 1)``; subclasses say where they come from.

        Args:
            shape: the shape to return.
            device: the device to return them on.

        Returns:
            Float64 tensor of ``shape``.
        """
        raise NotImplementedError

    def exponentials(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """Float64 ``Exp(1)`` noise; subclasses say where it comes from.

        Args:
            shape: the shape to return.
            device: the device to return it on.

        Returns:
            Float64 tensor of ``shape``.
        """
        raise NotImplementedError

    def bernoulli(self, probs: torch.Tensor) -> torch.Tensor:
        """See :meth:`RandomSource.bernoulli`."""
        return _bernoulli_from_uniforms(probs, self.uniforms(probs.shape, probs.device))

    def categorical(self, weights: torch.Tensor) -> torch.Tensor:
        """See :meth:`RandomSource.categorical`."""
        if weights.dim() < 1 or weights.shape[-1] == 0:
            raise ValueError(f"categorical needs weights of shape [..., V] with V >= 1, got {tuple(weights.shape)}")
        return _categorical_from_exponentials(weights, self.exponentials(weights.shape, weights.device))


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class TorchSource(NoiseSource):
    """A :class:`RandomSource` drawing from a ``torch.Generator`` (float64 uniforms and exponentials).

    Args:
        generator: the generator to draw from; it must live on the device of the tensors it will serve. Seed it
            (``torch.Generator(device).manual_seed(seed)``) for reproducible runs.

    Example:
        >>> src = TorchSource(torch.Generator().manual_seed(0))
        >>> src.categorical(torch.tensor([[0.0, 1.0, 0.0]])).tolist()
        [1]

    References:
        vLLM v1 rejection sampler (float64 uniforms; exponential-race recovered sampling).
    """

    def __init__(self, generator: torch.Generator) -> None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"TorchSource needs a torch.Generator, got {type(generator).__name__}")
        self.generator = generator

    def _check(self, device: torch.device) -> None:
        if not _same_device(self.generator.device, device):
            raise ValueError(
                f"the generator lives on {self.generator.device} but the tensors are on {device}: create it there, "
                f"e.g. torch.Generator(device='{device}').manual_seed(seed)"
            )

    def uniforms(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """Float64 uniforms in ``[0, 1)`` drawn from the generator."""
        self._check(device)
        return torch.rand(shape, generator=self.generator, dtype=torch.float64, device=device)

    def exponentials(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """Float64 ``Exp(1)`` noise drawn from the generator."""
        self._check(device)
        return torch.empty(shape, dtype=torch.float64, device=device).exponential_(generator=self.generator)


class PredrawnNoise(NoiseSource):
    """A :class:`RandomSource` that consumes noise drawn beforehand, in order.

    Each ``bernoulli(probs)`` takes the next ``probs.numel()`` uniforms, each ``categorical(weights)`` the
    next ``weights.numel()`` exponentials (row-major). Running out is an error, never a silent refill.

    Args:
        uniforms: float values in ``[0, 1)``, cast to float64.
            Shape: any (flattened).
        exponentials: positive ``Exp(1)`` values, cast to float64.
            Shape: any (flattened).

    Example:
        >>> src = PredrawnNoise(torch.tensor([0.3, 0.9]), torch.tensor([1.0, 0.5]))
        >>> src.bernoulli(torch.tensor([0.5, 0.5])).tolist()
        [True, False]
        >>> src.categorical(torch.tensor([1.0, 1.0])).item()
        1

    References:
        vLLM ``test_sample_recovered_tokens`` (kernel vs reference under the same injected noise).
    """

    def __init__(self, uniforms: torch.Tensor, exponentials: torch.Tensor) -> None:
        self._uniforms = uniforms.detach().reshape(-1).to(torch.float64)
        self._exponentials = exponentials.detach().reshape(-1).to(torch.float64)
        self.uniforms_used = 0
        self.exponentials_used = 0

    @staticmethod
    def _take(pool: torch.Tensor, used: int, shape: torch.Size, device: torch.device, what: str) -> torch.Tensor:
        count = math.prod(shape)
        if used + count > pool.numel():
            raise ValueError(
                f"PredrawnNoise ran out of {what}: this call needs {count}, {pool.numel() - used} are left; "
                f"draw more {what} when building it"
            )
        return pool[used : used + count].reshape(shape).to(device)

    def uniforms(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """The next uniforms, reshaped."""
        out = self._take(self._uniforms, self.uniforms_used, shape, device, "uniforms")
        self.uniforms_used += out.numel()
        return out

    def exponentials(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """The next exponentials, reshaped."""
        out = self._take(self._exponentials, self.exponentials_used, shape, device, "exponentials")
        self.exponentials_used += out.numel()
        return out


class PerRowSource:
    """A :class:`RandomSource` that gives every batch row its own source.

    Every draw of ``specdec`` (drafting, verification, plain sampling) is batched with the rows first, so
    ``bernoulli(probs)`` / ``categorical(weights)`` split their input along dimension 0 and ask row ``b``'s
    source for row ``b``'s answers. Row ``b``'s randomness then does not depend on the other rows: decoding a
    prompt in a batch gives the same tokens as decoding it alone with the same row source, as long as the draws
    have the same shapes (plain decoding and fixed-shape drafters such as a draft-model chain do; a drafter
    whose draft width depends on the batch, like prompt lookup, does not).

    Args:
        sources: one :class:`RandomSource` or ``torch.Generator`` per row (generators are wrapped by
            :func:`as_source`).

    Example:
        >>> rows = PerRowSource([torch.Generator().manual_seed(s) for s in (0, 1)])
        >>> rows.categorical(torch.tensor([[0.0, 1.0], [1.0, 0.0]])).tolist()
        [1, 0]

    References:
        Randomness is an argument (one generator per row here); the library never reads the global RNG.
    """

    def __init__(self, sources: Sequence[RandomSource | torch.Generator]) -> None:
        if len(sources) == 0:
            raise ValueError("PerRowSource needs one source per batch row, got none")
        self.sources = [as_source(s) for s in sources]

    def _rows(self, tensor: torch.Tensor, what: str) -> None:
        if tensor.dim() < 1 or tensor.shape[0] != len(self.sources):
            raise ValueError(
                f"PerRowSource has {len(self.sources)} row sources but {what} has shape {tuple(tensor.shape)}: the "
                f"first dimension must be the batch ({len(self.sources)} rows)"
            )

    def bernoulli(self, probs: torch.Tensor) -> torch.Tensor:
        """See :meth:`RandomSource.bernoulli`; row ``b`` from source ``b``."""
        self._rows(probs, "probs")
        return torch.stack([src.bernoulli(p) for src, p in zip(self.sources, probs)])

    def categorical(self, weights: torch.Tensor) -> torch.Tensor:
        """See :meth:`RandomSource.categorical`; row ``b`` from source ``b``."""
        self._rows(weights, "weights")
        if weights.dim() < 2:
            raise ValueError(f"PerRowSource.categorical needs weights [B, ..., V], got {tuple(weights.shape)}")
        return torch.stack([src.categorical(w) for src, w in zip(self.sources, weights)])


class _NoRandomness:
    """Stands in for a missing generator on greedy calls; asking it for noise is a clear error."""

    def _fail(self, *_: object) -> torch.Tensor:
        raise ValueError(
            "this call samples but got no randomness: pass generator=torch.Generator(device).manual_seed(seed) "
            "or a RandomSource (specdec never uses the global RNG)"
        )

    bernoulli = _fail
    categorical = _fail


def as_source(source: RandomSource | torch.Generator | None, *, greedy: bool = False) -> RandomSource:
    """Normalise the ``source`` argument of a stochastic block into a :class:`RandomSource`.

    Args:
        source: a :class:`RandomSource` (returned as is), a ``torch.Generator`` (wrapped in
            :class:`TorchSource`) or ``None``. ``None`` is only accepted for greedy calls: a fresh unseeded
            generator would make results irreproducible, so the library refuses to invent one.
        greedy: whether the caller draws no randomness (temperature 0). Then ``None`` yields a placeholder
            source that raises if it is ever asked for noise.

    Returns:
        A :class:`RandomSource`.

    Raises:
        ValueError: ``source`` is ``None`` for a call that samples.
        TypeError: ``source`` is of another type.

    References:
        Randomness is an argument: the library never seeds or reads the global RNG.
    """
    if source is None:
        if greedy:
            return _NoRandomness()
        raise ValueError(
            "this call samples, so it needs randomness: pass generator=torch.Generator(device).manual_seed(seed) "
            "or a RandomSource (specdec never uses the global RNG)"
        )
    if isinstance(source, torch.Generator):
        return TorchSource(source)
    if isinstance(source, RandomSource):
        return source
    raise TypeError(
        f"expected a torch.Generator, a RandomSource (bernoulli + categorical) or None, got {type(source).__name__}"
    )


def sample(probs: torch.Tensor, source: RandomSource | torch.Generator) -> torch.Tensor:
    """Draw one token per row from (possibly unnormalised) probabilities.

    Math: ``P(out[b] = i) = probs[b, i] / sum_j probs[b, j]``; tokens with probability 0 are never drawn.

    Args:
        probs: non-negative weights. Shape: ``[..., V]``.
        source: a :class:`RandomSource` or a ``torch.Generator``.

    Returns:
        Int64 token ids, shape ``[...]``.

    Example:
        >>> sample(torch.tensor([[0.0, 2.0]]), torch.Generator().manual_seed(0)).tolist()
        [1]

    References:
        The exponential race (equivalent to the Gumbel-max trick): vLLM v1 ``sample_recovered_tokens``.
    """
    return as_source(source).categorical(probs)


def next_token(logits: torch.Tensor, params: SamplingParams, source: RandomSource | None) -> torch.Tensor:
    """The token plain decoding emits after each row: the argmax when greedy, else a draw from the processed law.

    Math: ``argmax_v logits[b, v]`` (ties to the lowest id) at temperature 0; otherwise
    ``x_b ~ process_logits(logits[b], params)``.

    Args:
        logits: the target's logits at each row's last token, any float dtype (greedy takes the argmax as is,
            exactly as HF's ``generate`` after its float32 cast: the cast does not change the argmax).
            Shape: ``[B, V]``.
        params: the run's sampling parameters.
        source: the randomness (ignored when greedy; required otherwise).

    Returns:
        Int64 token ids, shape ``[B]``.

    Example:
        >>> next_token(torch.tensor([[0.0, 2.0, 1.0]]), SamplingParams(), None).tolist()
        [1]

    References:
        HF ``GenerationMixin._sample`` (argmax or multinomial of the processed scores).
    """
    if params.is_greedy:
        return logits.argmax(-1)
    return as_source(source).categorical(process_logits(logits, params))
