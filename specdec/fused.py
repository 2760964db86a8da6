"""A gpt-fast-style forward over an HF Llama-family model's own weights, for the fast path's captured steps.

Compiled or not, HF's module code runs one kernel per projection: per layer three for ``q``/``k``/``v`` and two for
``gate``/``up``, RoPE recomputed from the positions at every forward, and the hidden states recorded through hooks.
:class:`FusedDecoder` runs the same arithmetic with the projections fused (one ``[q; k; v]`` and one ``[gate; up]``
matrix per layer, as gpt-fast's ``wqkv``), RoPE read from a table made once, and the new keys/values written
straight into :class:`~specdec.static.StaticAdapter`'s preallocated slots. It is what the static adapter calls on
the fast path when the model is one it covers (:func:`fused_support`); any other model runs HF's modules there.

Covered: ``llama``, ``mistral`` (no sliding window), ``qwen2`` and ``qwen3`` (per-head ``q_norm`` / ``k_norm``)
with SiLU MLPs, plain ``nn.Linear`` projections (with or without biases) and a RoPE whose frequencies do not
depend on the positions (default, linear, llama3, yarn...: HF's ``rotary_emb.inv_freq`` and
``attention_scaling`` are read as they are). Attention is :func:`torch.nn.functional.scaled_dot_product_attention`
under the adapter's additive mask, on :func:`~specdec.nn.masked_sdpa_backends` on CUDA, as HF's ``sdpa``.

**Weights.** The fused matrices are copies (the model is never modified): per layer
``(n_q + 2 n_kv) * head_dim * hidden + 2 * intermediate * hidden`` more elements, i.e. about the model's size again
for a Llama (``fused=False`` on :class:`~specdec.static.StaticAdapter` avoids it). Every other tensor (embeddings,
norms, ``o_proj``, ``down_proj``, ``lm_head``) is the model's own. :meth:`FusedDecoder.sync` re-copies the fused
matrices in place when a source weight was updated in place since (its version counter moved); the static adapter
calls it at every prefill, and builds a new decoder (and new graphs) when a parameter was replaced.

**Decode steps.** A forward of at most ``gemv_rows`` rows (default one: the plain decode step at batch 1) runs its
projections with :func:`specdec.kernels.linear_rows`, a Triton kernel that streams each weight once on CUDA. The
residual adds + norms, RoPE + cache writes and SiLU-mul run as the one-launch kernels of
:mod:`specdec.kernels.decoder_ops` (``fused_ops``, on by default since session 11: on the H200 they took the
Llama-2-7B-shape plain step from 5.19 to 4.23 ms and the EAGLE-2 step from 9.38 to 8.14 ms). Opt-in
(:func:`decode_kernels`): a forward of one token per row attends with :func:`specdec.kernels.decode_attention`
(the keys split across programs, flash-decoding; measured no faster than SDPA at batch 1 and slower at batch 4 and
16, so off). All are their torch references (``F.linear``, SDPA, torch ops) elsewhere and inside ``torch.compile``.

The result equals HF's forward up to floating-point summation order (float32 greedy decoding is token-identical in
the tests; the features are HF's ``hidden_states`` indices: 0 the embeddings, ``i`` the output of layer ``i - 1``,
``L`` the final normed state).

References:
    gpt-fast (PyTorch Labs): fused ``wqkv``, a RoPE table, a static cache; Touvron et al., "Llama 2",
    arXiv 2307.09288; Su et al., "RoFormer" (RoPE), arXiv 2104.09864.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .adapter import UnsupportedModelError
from .graphs import CAPTURE_BLAS_CHOICES, capture_blas, use_capture_blas
from .kernels.decode_attention import decode_attention
from .kernels.decoder_ops import (
    add_rms_norm,
    add_rms_norm_ref,
    decoder_inputs,
    decoder_inputs_ref,
    rope_store,
    rope_store_ref,
    silu_mul,
    silu_mul_ref,
)
from .kernels.gemv import DECODER_GEMV_ROWS, linear_rows
from .kernels.skinny import SKINNY_DEFAULT_ROWS, SKINNY_MAX_ROWS, linear_skinny
from .kernels.tree_attention import TREE_ATTENTION_MAX_M, tree_attention, tree_attention_shares_prefix
from .kernels.tuning import tuned_linear_config
from .nn.attention import masked_sdpa_kernel, use_tree_attention
from .nn.inference import cat_linears, linear_versions, use_fused_layers, use_skinny_linear

__all__ = ["FusedDecoder", "fused_support", "FUSED_MODEL_TYPES", "decode_kernels", "decode_settings"]

#: HF ``model_type`` s whose decoder :class:`FusedDecoder` reproduces.
FUSED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def fused_support(model: nn.Module) -> str | None:
    """Why :class:`FusedDecoder` cannot run ``model``, or ``None`` when it can.

    Args:
        model: an HF causal LM.

    Returns:
        A short reason, or ``None``.
    """
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FUSED_MODEL_TYPES:
        return f"model_type {kind!r} is not one of {FUSED_MODEL_TYPES}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"its MLP activation is {getattr(config, 'hidden_act', None)!r}, not 'silu'"
    if getattr(config, "pretraining_tp", 1) not in (1, None):
        return "it splits its projections (pretraining_tp > 1)"
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    head = getattr(model, "lm_head", None)
    rotary = getattr(body, "rotary_emb", None)
    if layers is None or type(head) is not nn.Linear or not hasattr(rotary, "inv_freq"):
        return "it does not have the Llama layout (model.layers, model.rotary_emb.inv_freq, lm_head)"
    if getattr(config, "num_hidden_layers", len(layers)) != len(layers):
        return "it runs a subset of its layers"
    for i, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = [(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
        for owner, name in names:
            lin = getattr(owner, name, None)
            if type(lin) is not nn.Linear or hasattr(lin, "_hf_hook"):
                return f"layer {i}'s {name} is not a plain nn.Linear (quantized, offloaded or replaced)"
        if hasattr(layer, "_hf_hook") or hasattr(attn, "_hf_hook"):
            return f"layer {i} carries an accelerate hook (offloaded)"
    if hasattr(model, "_hf_hook") or hasattr(body, "_hf_hook"):
        return "it carries an accelerate hook (offloaded)"
    return None


# Measured on the H200 (session 11, Llama-2-7B shape): the fused element-wise ops 5.19 -> 4.23 ms per plain step,
# the split-key attention 5.19 -> 5.24 (batch 1), 7.30 -> 8.12 (batch 16): fused_ops on, decode_attention off.
# tree_attention: the split-key kernel for forwards of 2..128 tokens under a mask (verify buckets; EAGLE heads).
# Session 12 (H200, CUDA-graph replays): 5.4 us against cuDNN's 12.0 for the fixture's 64-node verify attention,
# 17.7 against 34.3 for Llama-2-7B's; the fixture's compiled EAGLE-3 step 1.24 -> 1.09 ms of GPU time: on.
# The BLAS library captures pick GEMMs from is held by specdec.graphs (use_capture_blas; measured there).
# tune_linears: forwards of skinny_rows + 1 to 64 rows (the verify of a tree) pick F.linear or the skinny kernel by
# timing both on the card (specdec.kernels.tuning; session 39: an H100 wants the skinny kernel, the H200 cuBLASLt).
_DECODE_DEFAULTS = {"gemv_rows": DECODER_GEMV_ROWS, "skinny_rows": SKINNY_DEFAULT_ROWS, "decode_attention": False,
                    "fused_ops": True, "tree_attention": True, "tune_linears": True}


@contextlib.contextmanager
def decode_kernels(*, gemv_rows: int | None = None, skinny_rows: int | None = None, attention: bool | None = None,
                   fused_ops: bool | None = None, tree_attention: bool | None = None, blas: str | None = None,
                   tune_linears: bool | None = None):
    """Within the block, fused decoders built without their own settings (as the fast path builds them) take these:
    ``gemv_rows``, the most rows a forward may have for :func:`specdec.kernels.linear_rows` (``0``: ``F.linear``
    always; default :data:`~specdec.kernels.gemv.DECODER_GEMV_ROWS`, one), ``skinny_rows``, the most rows a forward
    may have for :func:`specdec.kernels.linear_skinny` (bfloat16 / float16 forwards of 2 or more rows, past
    ``gemv_rows``; the draft heads' blocks too: :func:`specdec.nn.inference.use_skinny_linear`; ``0``: never;
    default :data:`~specdec.kernels.skinny.SKINNY_DEFAULT_ROWS`), and ``attention``, whether one-token
    forwards attend with :func:`specdec.kernels.decode_attention` or SDPA, and ``fused_ops``, whether the residual
    adds + norms, RoPE + cache writes and SiLU-mul run as the fused kernels of :mod:`specdec.kernels.decoder_ops`
    or as torch ops (the draft heads' blocks too: :func:`specdec.nn.inference.use_fused_layers`),
    and ``tree_attention``, whether forwards of 2 to
    :data:`~specdec.kernels.TREE_ATTENTION_MAX_M` tokens under a mask (tree verification, the EAGLE heads'
    levels through :func:`specdec.nn.masked_attention`) attend with :func:`specdec.kernels.tree_attention` or SDPA,
    and ``blas``, the BLAS library captured steps pick their GEMMs from (:func:`specdec.graphs.use_capture_blas`:
    ``"cublaslt"``, ``"cublas"`` or ``"torch"``, the process's preference), and ``tune_linears``, whether forwards
    of ``skinny_rows + 1`` to :data:`~specdec.kernels.skinny.SKINNY_MAX_ROWS` rows (a tree's verify) time ``F.linear``
    against the skinny kernel once per card and shape and keep the faster
    (:func:`specdec.kernels.tuning.tuned_linear_config`; ``False``: ``F.linear`` always)
    (defaults: ``attention=False``, ``fused_ops=True``, ``tree_attention=True``, ``blas="cublaslt"``,
    ``tune_linears=True``, as measured on the H200 and an H100). ``None`` keeps the setting in force. For
    ablations of the kernels. Graphs a drafter captured before the change keep the kernels they were captured with;
    the static adapter of a fused decoder captures its own again.

    Args:
        gemv_rows: ``0 <= gemv_rows`` or ``None``.
        skinny_rows: ``0 <= skinny_rows <= SKINNY_MAX_ROWS`` or ``None``.
        attention: ``True``, ``False`` or ``None``.
        fused_ops: ``True``, ``False`` or ``None``.
        tree_attention: ``True``, ``False`` or ``None``.
        blas: one of :data:`specdec.graphs.CAPTURE_BLAS_CHOICES` or ``None``.
        tune_linears: ``True``, ``False`` or ``None``.

    Example:
        >>> with decode_kernels(attention=True, fused_ops=True):     # doctest: +SKIP
        ...     out = generate(model, ids, fast=True)                # every decode kernel
    """
    if gemv_rows is not None and (not isinstance(gemv_rows, int) or gemv_rows < 0):
        raise ValueError(f"decode_kernels: gemv_rows must be an int >= 0 (0 turns the kernel off), got {gemv_rows!r}")
    if skinny_rows is not None and (not isinstance(skinny_rows, int) or isinstance(skinny_rows, bool)
                                    or not 0 <= skinny_rows <= SKINNY_MAX_ROWS):
        raise ValueError(f"decode_kernels: skinny_rows must be an int in [0, {SKINNY_MAX_ROWS}] (0 turns the kernel "
                         f"off), got {skinny_rows!r}")
    for name, value in (("attention", attention), ("fused_ops", fused_ops), ("tree_attention", tree_attention),
                        ("tune_linears", tune_linears)):
        if value not in (None, True, False):
            raise ValueError(f"decode_kernels: {name} must be True, False or None, got {value!r}")
    if blas is not None and blas not in CAPTURE_BLAS_CHOICES:
        raise ValueError(f"decode_kernels: blas must be one of {CAPTURE_BLAS_CHOICES} or None, got {blas!r}")
    before, before_blas = dict(_DECODE_DEFAULTS), capture_blas()
    for key, value in (("gemv_rows", gemv_rows), ("skinny_rows", skinny_rows), ("decode_attention", attention),
                       ("fused_ops", fused_ops), ("tree_attention", tree_attention), ("tune_linears", tune_linears)):
        if value is not None:
            _DECODE_DEFAULTS[key] = value
    _apply_decode_defaults(before_blas if blas is None else blas)
    try:
        yield
    finally:
        _DECODE_DEFAULTS.update(before)
        _apply_decode_defaults(before_blas)


def _apply_decode_defaults(blas: str) -> None:
    """Hand the settings to the modules that hold their own switches."""
    use_tree_attention(_DECODE_DEFAULTS["tree_attention"])
    use_fused_layers(_DECODE_DEFAULTS["fused_ops"])
    use_skinny_linear(_DECODE_DEFAULTS["skinny_rows"])
    use_capture_blas(blas)


def decode_settings() -> dict:
    """The settings fused decoders built now take (``gemv_rows``, ``skinny_rows``, ``decode_attention``, ``fused_ops``,
    ``tree_attention``, ``tune_linears``, ``blas``; see :func:`decode_kernels`)."""
    return dict(_DECODE_DEFAULTS, blas=capture_blas())


class _Layer(NamedTuple):
    """One decoder layer's tensors (``None``: absent bias or norm)."""

    ln1: torch.Tensor
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    ln2: torch.Tensor
    wgu: torch.Tensor
    bgu: torch.Tensor | None
    wd: torch.Tensor
    bd: torch.Tensor | None


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's ``LlamaRMSNorm``: normalise in float32, cast back, then scale (``F.rms_norm``: one kernel where torch
    has a fused one)."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class FusedDecoder:
    """A Llama-family HF causal LM's forward with fused projections, over preallocated key/value slots.

    Args:
        model: a model :func:`fused_support` accepts (float weights on one device).
        max_positions: rows of the RoPE table (every position id must be below it).

    Raises:
        UnsupportedModelError: :func:`fused_support` names why.

    Example:
        >>> dec = FusedDecoder(model, max_positions=1024)                                  # doctest: +SKIP
        >>> logits, feats = dec(tokens, positions, mask, slots, cache.layers, (2, 6))      # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, max_positions: int, *, gemv_rows: int | None = None,
                 skinny_rows: int | None = None, decode_attention: bool | None = None, fused_ops: bool | None = None,
                 tree_attention: bool | None = None):
        reason = fused_support(model)
        if reason is not None:
            raise UnsupportedModelError(f"{type(model).__name__} cannot run on the fused decoder: {reason}; "
                                        f"use StaticAdapter(..., fused=False) (HF's own modules)")
        body, config = model.model, model.config
        attn0 = body.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = attn0.head_dim
        self.scaling = getattr(attn0, "scaling", self.head_dim ** -0.5)
        self._sources: list[tuple[tuple[nn.Module, str], ...]] = []  # per fused matrix: its source weights
        self._fused: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._seen: list[tuple[int, ...]] = []  # versions of the sources when last copied
        layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            wqkv, bqkv = self._fuse((attn.q_proj, attn.k_proj, attn.v_proj))
            wgu, bgu = self._fuse((mlp.gate_proj, mlp.up_proj))
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            layers.append(_Layer(
                ln1=layer.input_layernorm.weight, wqkv=wqkv, bqkv=bqkv,
                q_norm=None if q_norm is None else q_norm.weight, k_norm=None if k_norm is None else k_norm.weight,
                wo=attn.o_proj.weight, bo=attn.o_proj.bias, ln2=layer.post_attention_layernorm.weight,
                wgu=wgu, bgu=bgu, wd=mlp.down_proj.weight, bd=mlp.down_proj.bias))
        self.layers = layers
        self.eps = [(layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon)
                    for layer in body.layers]
        q_norm = getattr(attn0, "q_norm", None)
        self.qk_eps = getattr(q_norm, "variance_epsilon", 1e-6)
        self.embed = body.embed_tokens.weight
        self.norm, self.norm_eps = body.norm.weight, body.norm.variance_epsilon
        self.head_w, self.head_b = model.lm_head.weight, model.lm_head.bias
        self.cos, self.sin = self._rope_table(body.rotary_emb, max_positions)
        self.gemv_rows = _DECODE_DEFAULTS["gemv_rows"] if gemv_rows is None else int(gemv_rows)
        self.skinny_rows = _DECODE_DEFAULTS["skinny_rows"] if skinny_rows is None else int(skinny_rows)
        self.decode_attention = (_DECODE_DEFAULTS["decode_attention"] if decode_attention is None
                                 else bool(decode_attention))
        self.fused_ops = _DECODE_DEFAULTS["fused_ops"] if fused_ops is None else bool(fused_ops)
        self.tree_attention = (_DECODE_DEFAULTS["tree_attention"] if tree_attention is None
                               else bool(tree_attention))
        self.tune_linears = _DECODE_DEFAULTS["tune_linears"]
        self.blas = capture_blas()  # the BLAS library its graphs are captured under (a change: capture again)

    def clamps_ids(self, vocab: int) -> bool:
        """Whether a forward reads ids clamped into ``[0, vocab)`` by itself: its embedding gather clamps into the
        table (:func:`~specdec.kernels.decoder_inputs`), which has exactly ``vocab`` rows."""
        return self.embed.shape[0] == vocab

    @property
    def settings(self) -> dict:
        """This decoder's kernel choices: ``gemv_rows``, ``skinny_rows``, ``decode_attention``, ``fused_ops``,
        ``tree_attention``, ``tune_linears``, ``blas``."""
        return {key: getattr(self, key) for key in (*_DECODE_DEFAULTS, "blas")}

    def use_settings(self, settings: dict) -> None:
        """Take other kernel choices (keys of :attr:`settings`); graphs captured on this decoder keep the old
        ones, so capture again (the static adapter does when :func:`decode_settings` changed)."""
        for key, value in settings.items():
            if key not in _DECODE_DEFAULTS and key != "blas":
                raise KeyError(f"unknown decode setting {key!r}; known: {sorted((*_DECODE_DEFAULTS, 'blas'))}")
            setattr(self, key, value)

    def _add_norm(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h + delta, rms_norm(h + delta))`` (``delta`` ``None``: no add): one launch on CUDA with
        :attr:`fused_ops`, HF's arithmetic either way."""
        if self.fused_ops:
            return add_rms_norm(h, delta, weight, eps)
        return add_rms_norm_ref(h, delta, weight, eps)

    def _rope_store_unfused(self, qkv: torch.Tensor, lay: _Layer, cos: torch.Tensor, sin: torch.Tensor, kv,
                            slots: torch.Tensor) -> torch.Tensor:
        """RoPE and the cache writes in torch ops (and Qwen3's per-head q/k norms before RoPE); returns q."""
        nh = self.heads
        if lay.q_norm is not None:
            nk = self.kv_heads
            qk = torch.cat((_rms(qkv[:, :, :nh], lay.q_norm, self.qk_eps),
                            _rms(qkv[:, :, nh:nh + nk], lay.k_norm, self.qk_eps)), dim=2)
            qkv = torch.cat((qk, qkv[:, :, nh + nk:]), dim=2)
        return rope_store_ref(qkv, cos, sin, kv.keys, kv.values, slots, nh)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                kv_len: int | None, kv_end: torch.Tensor | None = None,
                prefix_end: torch.Tensor | None = None, visible_end: torch.Tensor | None = None,
                kv_start: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of ``q [B, nh, M, d]`` over the cache's ``[B, nk, S, d]`` (the first ``kv_len`` slots, causally,
        when ``mask`` is ``None``): :func:`specdec.kernels.decode_attention` for one query per row,
        :func:`specdec.kernels.tree_attention` for a few (reading no key at or past ``kv_end``, a device tensor),
        SDPA otherwise (as the settings say)."""
        B, _, M, d = q.shape
        if kv_len is not None:
            keys, values = keys[:, :, :kv_len], values[:, :, :kv_len]
        if M == 1 and mask is not None and self.decode_attention:
            return decode_attention(q, keys, values, mask, self.scaling)
        if 1 < M <= TREE_ATTENTION_MAX_M and mask is not None and self.tree_attention:
            return tree_attention(q, keys, values, mask, self.scaling, kv_end=kv_end, prefix_end=prefix_end,
                                  visible_end=visible_end, kv_start=kv_start)
        nh, nk = self.heads, self.kv_heads
        if nk != nh:  # grouped-query attention: repeat each key/value head (as HF's repeat_kv)
            S = keys.shape[2]
            keys = keys[:, :, None].expand(B, nk, nh // nk, S, d).reshape(B, nh, S, d)
            values = values[:, :, None].expand(B, nk, nh // nk, S, d).reshape(B, nh, S, d)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None,
                                              scale=self.scaling)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                kind: str | None = None) -> torch.Tensor:
        """``F.linear``; for at most :attr:`gemv_rows` rows :func:`specdec.kernels.linear_rows` (one streaming
        pass over ``weight`` on CUDA), else for at most :attr:`skinny_rows` rows :func:`specdec.kernels.linear_skinny`
        (on tensor cores; bfloat16 / float16), else, with :attr:`tune_linears`, whichever of the two
        :func:`~specdec.kernels.tuning.tuned_linear_config` timed faster on this card for the projection ``kind``
        (``"qkv"``, ``"o"``, ``"gate_up"``, ``"down"``, ``"head"``); ``F.linear`` itself elsewhere and inside
        ``torch.compile``."""
        rows = x.numel() // max(x.shape[-1], 1)
        if rows <= self.gemv_rows:
            return linear_rows(x, weight, bias)
        if rows <= self.skinny_rows:
            return linear_skinny(x, weight, bias)
        if (kind is not None and self.tune_linears and rows <= SKINNY_MAX_ROWS and x.is_cuda
                and not torch.compiler.is_compiling()):
            config = tuned_linear_config(*self._projection(kind), rows)
            if config is not None:
                return linear_skinny(x, weight, bias, config=config)
        return F.linear(x, weight, bias)

    def _projection(self, kind: str) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Every layer's weight and bias of one projection (``"head"``: the ``lm_head``, once)."""
        if kind == "head":
            return [self.head_w], [self.head_b]
        names = {"qkv": ("wqkv", "bqkv"), "o": ("wo", "bo"), "gate_up": ("wgu", "bgu"), "down": ("wd", "bd")}[kind]
        return [getattr(lay, names[0]) for lay in self.layers], [getattr(lay, names[1]) for lay in self.layers]

    # ------------------------------------------------------------------ weights
    def _fuse(self, linears: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[W_1; W_2; ...]`` (and the biases) as one new tensor; remembered for :meth:`sync`."""
        linears = tuple(linears)
        with torch.no_grad():
            weight, bias = cat_linears(linears)
        self._sources.append(linears)
        self._fused.append((weight, bias))
        self._seen.append(linear_versions(linears))
        return weight, bias

    def sync(self) -> None:
        """Bring the fused copies up to date with the model's weights, in place.

        Weights updated in place (their version counters moved: optimizer steps, ``load_state_dict``, ``copy_``)
        are copied again into the same fused tensors, so graphs captured on them stay valid. Writes through
        ``.data`` bypass the version counter and are not seen. A parameter *replaced* by another tensor is not
        this method's business: the decoder keeps reading the old one, so build a new decoder (the static adapter
        does, comparing the parameters' ids).
        """
        with torch.no_grad():
            for i, (linears, fused) in enumerate(zip(self._sources, self._fused)):
                if linear_versions(linears) == self._seen[i]:
                    continue
                cat_linears(linears, out=fused)
                self._seen[i] = linear_versions(linears)

    def _rope_table(self, rotary: nn.Module, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``/``sin`` ``[length, head_dim]`` in the model's dtype, computed as HF's rotary embedding does; the
        first half of ``sin`` negated (see :func:`specdec.kernels.rope_store`)."""
        inv_freq = rotary.inv_freq.to(device=self.embed.device, dtype=torch.float32)
        positions = torch.arange(length, device=self.embed.device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rotary, "attention_scaling", 1.0)
        dtype = self.embed.dtype
        sin = (emb.sin() * scale).to(dtype)
        half = sin.shape[-1] // 2
        return (emb.cos() * scale).to(dtype), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    @staticmethod
    def cache_shapes(model: nn.Module, batch: int, capacity: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """``((batch, kv_heads, capacity, head_dim), dtype)`` per layer: the key/value tensors this decoder
        writes (as :func:`specdec.static.slot_cache` takes them)."""
        config, attn = model.config, model.model.layers[0].self_attn
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dtype = attn.k_proj.weight.dtype
        return [((batch, kv_heads, capacity, attn.head_dim), dtype)] * len(model.model.layers)

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, valid: torch.Tensor, cache: Sequence, feature_layers: Sequence[int] = (),
                *, all_valid: bool = False, last_only: bool = True) -> tuple[torch.Tensor, tuple]:
        """The prompt's pass: causal attention among its ``T`` tokens, keys/values written at slots ``0..T-1``.

        Args:
            tokens: Shape ``[B, T]`` int64, left-padded prompts.
            valid: Shape ``[B, T]`` bool, real tokens (positions count them: ``cumsum - 1``).
            cache: as in :meth:`__call__` (``S >= T`` slots).
            feature_layers: HF ``hidden_states`` indices to return (every position).
            all_valid: no padding (plain causal attention, no mask tensor).
            last_only: logits of the last position only.

        Returns:
            ``(logits [B, 1 or T, V], features)``, features ``[B, T, H]`` each (padding positions hold values that
            must not be read).
        """
        T = tokens.shape[1]
        positions = (valid.long().cumsum(1) - 1).clamp_(min=0)
        mask = None
        if not all_valid:  # a query sees the valid keys up to itself, and itself (padding rows stay finite)
            causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril_()
            seen = (causal[None] & valid[:, None, :]) | torch.eye(T, dtype=torch.bool, device=tokens.device)
            dtype = self.embed.dtype
            mask = torch.zeros(seen.shape, dtype=dtype, device=tokens.device).masked_fill_(
                ~seen, torch.finfo(dtype).min)[:, None]
        slots = torch.arange(T, device=tokens.device)
        return self._forward(tokens, positions, mask, slots, cache, feature_layers, kv_len=T, last_only=last_only)

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor,
                 cache: Sequence, feature_layers: Sequence[int] = (), *,
                 prefix_end: torch.Tensor | None = None, visible_end: torch.Tensor | None = None,
                 kv_start: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple]:
        """One forward of ``M`` tokens per row, their keys/values written at ``slots`` of every layer's cache.

        Args:
            tokens: Shape ``[B, M]`` int64.
            positions: Shape ``[B, M]`` int64, RoPE positions (below ``max_positions``).
            mask: Shape ``[B, 1, M, S]``, additive (0 = may attend, dtype min = hidden), in the model's dtype. It
                must hide every slot past ``slots.max()`` (a cache filled in slot order, as the static adapter's
                and the drafters' are): with :attr:`tree_attention` on CUDA those slots are not read.
            slots: Shape ``[M]`` int64, where the ``M`` new keys/values go (the same for every row).
            cache: one object per layer with ``keys`` / ``values`` ``[B, kv_heads, S, head_dim]`` (written in
                place), e.g. :func:`specdec.static.slot_cache`'s ``layers``.
            feature_layers: HF ``hidden_states`` indices to return.
            prefix_end: Shape ``[1]`` or ``[B]`` int64 on the device (optional): the keys below it are masked for
                every query as for query 0 (the committed slots, which every tree node sees alike); tree attention
                then reads one mask row for them where that pays
                (:func:`~specdec.kernels.tree_attention.tree_attention_shares_prefix`).
            visible_end: Shape ``[1]`` or ``[B]`` int64 on the device (optional; not with ``prefix_end``): the keys
                below it are seen by every query (a dense row's committed slots: no padding, no holes); tree
                attention then reads no mask for them, where ``prefix_end`` would be passed.
            kv_start: Shape ``[1]`` or ``[B]`` int64 on the device (optional, with ``visible_end``): the keys below
                it are hidden from every query and not read (a left-padded prompt's padding slots).

        Returns:
            ``(logits [B, M, V], features)``: one ``[B, M, H]`` tensor per feature layer, in order.
        """
        return self._forward(tokens, positions, mask, slots, cache, feature_layers, prefix_end=prefix_end,
                             visible_end=visible_end, kv_start=kv_start)

    def reads_prefix_end(self, batch: int, tokens: int, masked: bool = True) -> bool:
        """Whether a forward of ``tokens`` per row over ``batch`` rows (under a mask) hands ``prefix_end`` (or
        ``visible_end``) to its tree attention (:func:`~specdec.kernels.tree_attention.tree_attention_shares_prefix`):
        the static adapter writes the bound only then."""
        return (masked and 1 < tokens <= TREE_ATTENTION_MAX_M and self.tree_attention
                and tree_attention_shares_prefix(batch * self.heads, tokens))

    def _forward(self, tokens, *args, **kwargs):
        """:meth:`_layers`, on CUDA with masked attention on :func:`~specdec.nn.masked_sdpa_backends`."""
        if tokens.is_cuda:
            with masked_sdpa_kernel():
                return self._layers(tokens, *args, **kwargs)
        return self._layers(tokens, *args, **kwargs)

    def _layers(self, tokens, positions, mask, slots, cache, feature_layers, *, kv_len: int | None = None,
                last_only: bool = False, prefix_end: torch.Tensor | None = None,
                visible_end: torch.Tensor | None = None, kv_start: torch.Tensor | None = None):
        """The layers; ``kv_len``: attend to the first ``kv_len`` slots only (``mask=None``: causally)."""
        B, M = tokens.shape
        nh, nk, d = self.heads, self.kv_heads, self.head_dim
        # A cache's keys are written in slot order: nothing past this forward's last write slot is visible, so the
        # tree kernel reads (and splits) only the slots below it: about half of a 7B verify's static cache.
        ends = mask is not None and 1 < M <= TREE_ATTENTION_MAX_M and self.tree_attention and slots.dim() == 1
        # the embeddings (ids clamped into the table), the RoPE rows and that bound: one launch on CUDA
        inputs = decoder_inputs if self.fused_ops else decoder_inputs_ref
        h, cos, sin, kv_end = inputs(tokens, positions, self.embed, self.cos, self.sin, slots if ends else None)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, M, 1, d]
        n = len(self.layers)
        if not self.reads_prefix_end(B, M, mask is not None):
            prefix_end = visible_end = kv_start = None
        want = set(feature_layers)
        found = {0: h} if 0 in want else {}
        delta = None  # the last MLP's output, added to h by the next norm (one fused launch)
        for i, (lay, (eps1, eps2), kv) in enumerate(zip(self.layers, self.eps, cache)):
            h, x = self._add_norm(h, delta, lay.ln1, eps1)
            qkv = self._linear(x, lay.wqkv, lay.bqkv, "qkv").view(B, M, nh + 2 * nk, d)
            if lay.q_norm is None and self.fused_ops:
                q = rope_store(qkv, cos, sin, kv.keys, kv.values, slots, nh)
            else:
                q = self._rope_store_unfused(qkv, lay, cos, sin, kv, slots)
            o = self._attend(q, kv.keys, kv.values, mask, kv_len, kv_end, prefix_end, visible_end, kv_start)
            h, x = self._add_norm(h, self._linear(o.transpose(1, 2).reshape(B, M, nh * d), lay.wo, lay.bo, "o"),
                                  lay.ln2, eps2)
            gate_up = self._linear(x, lay.wgu, lay.bgu, "gate_up")
            act = silu_mul(gate_up) if self.fused_ops else silu_mul_ref(gate_up)
            delta = self._linear(act, lay.wd, lay.bd, "down")
            if i + 1 in want and i + 1 < n:
                h, delta = h + delta, None
                found[i + 1] = h
        h, h_normed = self._add_norm(h, delta, self.norm, self.norm_eps)
        if n in want:
            found[n] = h_normed
        h = h_normed
        logits = self._linear(h[:, -1:] if last_only else h, self.head_w, self.head_b, "head")
        return logits, tuple(found[i] for i in feature_layers)
