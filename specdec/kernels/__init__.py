"""Triton kernels for the hot paths of a decoding step, each beside its torch reference.

Every op has a kernel (or two), a launcher, a torch reference ``<op>_ref`` with the identical signature, and the
public ``<op>`` that dispatches: the kernel when its tensors are on CUDA and ``triton`` imports, the reference
otherwise. :func:`kernel_mode` forces either (tests, benchmarks). ``import specdec.kernels`` works without
triton: the references are used. On Hopper GPUs every kernel uses programmatic dependent launch
(:func:`pdl_enabled`; :func:`set_pdl` or ``SPECDEC_PDL=0`` turns it off), in the early order (each kernel lets
the next be scheduled before its own wait; ``SPECDEC_PDL_EARLY=0``: after it), and the draft heads' products ask
L2 for their first weight bytes before their wait (``SPECDEC_PREFETCH``, bytes per row).

=========================================== ======================================== ===================================
op                                          replaces                                 launches
=========================================== ======================================== ===================================
:func:`tree_mask`                           ``ModelAdapter.forward``'s mask building  1
:func:`head_tree_mask`                      the EAGLE drafter's head-cache mask       1
:func:`head_update_mask`                    the EAGLE update's mask, slots, lengths   1
:func:`verify_greedy`                       :func:`specdec.verify.verify_greedy`      2
:func:`verify_chain_noise`                  chain rejection sampling under noise      2
:func:`verify_tree_deterministic_noise`     target-only tree rejection under noise    2
:func:`emitted_tokens`                      :func:`specdec.verify.emitted_tokens`'s ops 1
:func:`accepted_feedback`                   the drafter feedback in ``step()``        1 (per 4 equal feature tensors)
:func:`sanitised_ids`                       ``step()``'s clamp of draft ids            1 (4 torch launches)
:func:`packed_tokens`                       ``step()``'s tokens for the host           1 (2 torch launches)
:func:`compact_kv`                          ``ModelAdapter.commit``'s per-layer loop  1 (per group of equal layers)
:func:`kept_at_ends`                        a late commit's ``valid`` / ``ends`` update  1 (5 torch launches)
:func:`parallel_draft_inputs`               P-EAGLE input preparation                 1
:func:`ngram_chain`                         prompt lookup's search and chain (~65)    1
:func:`linear_rows`                         ``F.linear`` of a decode step (<= 16 rows) 1
:func:`linear_skinny`                       ``F.linear`` of 2-64 rows on tensor cores   1 (2 with ``K`` split)
:func:`linear_fp8`                          a draft head's linear on float8 weights   2 (3 with ``K`` split)
:func:`quantize_fp8_rows`                   rows rounded to float8, one scale each    1
:func:`linear_fp8_rows`                     ``linear_fp8`` on rows rounded already    1 (2 with ``K`` split)
:func:`linear_int4`                         a draft head's linear on 4-bit weights    2 (3 with ``K`` split)
:func:`linear_int4_rows`                    ``linear_int4`` on rows rounded already   1 (2 with ``K`` split)
:func:`decode_attention`                    SDPA of one query per row (decode step)   2
:func:`add_rms_norm`                        residual add + RMSNorm (fused decoder)    1
:func:`rope_store`                          RoPE + KV-cache writes (fused decoder)    1
:func:`silu_mul`                            SwiGLU's ``silu(gate) * up``             1
:func:`embed_concat`                        a draft head's ``cat([embedding, hidden])`` 1
:func:`table_rows`                          the EAGLE drafter's RoPE rows (clamp, gather) 1
:func:`last_rows`                           the EAGLE update's last real entries (4 ops)  1
:func:`decoder_inputs`                      a forward's embeddings, RoPE rows, key end    1 (was 6)
:func:`topk_rows`                           ``torch.topk`` of a dynamic tree's levels 1 (2-3 past 4,096 entries;
                                                                                     past 1,024 for <= 16 rows)
:func:`log_softmax_topk`                    ``log_softmax`` + ``torch.topk`` (same)   1 (2-3, as above)
:func:`tree_attention`                      SDPA of a few queries (tree verification) 2
:func:`dynamic_tree_level`                  a dynamic tree's per-level bookkeeping     1 (per level)
:func:`rerank_candidates`                   the dynamic tree's rerank (sorts, search)  2
=========================================== ======================================== ===================================

On CPU the kernels run under the Triton interpreter when ``TRITON_INTERPRET=1`` is set before this package is
imported (the test suite does so when no GPU is present). See ``docs/kernels.md``.
"""
from ._dispatch import (
                        KERNEL_MODES,
                        get_kernel_mode,
                        interpreter_enabled,
                        kernel_mode,
                        set_kernel_mode,
                        triton_available,
)
from ._triton import pdl_enabled, set_pdl
from .decode_attention import decode_attention, decode_attention_ref, decode_split
from .decoder_ops import (
                        add_rms_norm,
                        add_rms_norm_ref,
                        decoder_inputs,
                        decoder_inputs_ref,
                        embed_concat,
                        embed_concat_ref,
                        last_rows,
                        last_rows_ref,
                        rope_store,
                        rope_store_ref,
                        silu_mul,
                        silu_mul_ref,
                        table_rows,
                        table_rows_ref,
)
from .dynamic_tree import (
                        TreeCandidates,
                        TreeFrontier,
                        dynamic_tree_level,
                        dynamic_tree_level_ref,
                        new_candidates,
                        rerank_candidates,
                        rerank_candidates_ref,
)
from .emit import (
                        FeedbackRows,
                        accepted_feedback,
                        accepted_feedback_ref,
                        emitted_tokens,
                        emitted_tokens_ref,
                        packed_tokens,
                        packed_tokens_ref,
                        sanitised_ids,
                        sanitised_ids_ref,
)
from .fp8 import (
                        FP8_DTYPE,
                        FP8_MAX,
                        Fp8Rows,
                        dequantize_fp8,
                        fp8_linear_config,
                        linear_fp8,
                        linear_fp8_ref,
                        linear_fp8_rows,
                        linear_fp8_rows_ref,
                        quantize_fp8_rows,
                        quantize_fp8_rows_ref,
)
from .gemv import DECODER_GEMV_ROWS, GEMV_MAX_ROWS, gemv_config, linear_rows, linear_rows_ref
from .int4 import (
                        INT4_GROUPS,
                        Int4Weight,
                        int4_linear_config,
                        linear_int4,
                        linear_int4_ref,
                        linear_int4_rows,
                        linear_int4_rows_ref,
                        pack_int4,
                        unpack_int4,
)
from .kv_compact import KVCompactPlan, compact_kv, compact_kv_ref, kept_at_ends, kept_at_ends_ref
from .ngram import (
                        NGRAM_BLOCK,
                        NgramChain,
                        chain_layout,
                        find_ngram_continuations,
                        find_ngram_continuations_ref,
                        ngram_chain,
                        ngram_chain_ref,
)
from .parallel_inputs import ParallelDraftInputs, parallel_draft_inputs, parallel_draft_inputs_ref
from .skinny import (
                        SKINNY_DEFAULT_ROWS,
                        SKINNY_MAX_ROWS,
                        linear_skinny,
                        linear_skinny_ref,
                        skinny_config,
                        use_split_fixup,
)
from .topk import TOPK_CHUNK, TOPK_MAX_K, TOPK_MAX_N, log_softmax_topk, log_softmax_topk_ref, topk_rows, topk_rows_ref
from .tree_attention import (
                        TREE_ATTENTION_MAX_M,
                        TREE_ATTENTION_PREFIX_MIN_ROWS_HEADS,
                        tree_attention,
                        tree_attention_launch,
                        tree_attention_plan,
                        tree_attention_ref,
                        tree_attention_shares_prefix,
                        tree_attention_split,
                        use_fused_tree_merge,
)
from .tree_mask import (
                        HeadUpdate,
                        TreeMask,
                        head_tree_mask,
                        head_tree_mask_ref,
                        head_update_mask,
                        head_update_mask_ref,
                        tree_mask,
                        tree_mask_at,
                        tree_mask_at_ref,
                        tree_mask_ref,
)
from .tuning import clear_linear_picks, linear_picks, tuned_linear_config
from .verify import (
                        VerifyNoise,
                        draw_verify_noise,
                        verify_chain_noise,
                        verify_chain_noise_ref,
                        verify_greedy,
                        verify_greedy_ref,
                        verify_tree_deterministic_noise,
                        verify_tree_deterministic_noise_ref,
)

__all__ = [
    # dispatch
    "KERNEL_MODES", "kernel_mode", "set_kernel_mode", "get_kernel_mode", "triton_available", "interpreter_enabled",
    "pdl_enabled", "set_pdl",
    # ops and their references
    "TreeMask", "tree_mask", "tree_mask_ref", "tree_mask_at", "tree_mask_at_ref",
    "head_tree_mask", "head_tree_mask_ref",
    "HeadUpdate", "head_update_mask", "head_update_mask_ref",
    "verify_greedy", "verify_greedy_ref",
    "VerifyNoise", "draw_verify_noise", "verify_chain_noise", "verify_chain_noise_ref",
    "verify_tree_deterministic_noise", "verify_tree_deterministic_noise_ref",
    "emitted_tokens", "emitted_tokens_ref", "accepted_feedback", "accepted_feedback_ref", "sanitised_ids",
    "sanitised_ids_ref", "packed_tokens", "packed_tokens_ref",
    "FeedbackRows",
    "compact_kv", "compact_kv_ref", "KVCompactPlan", "kept_at_ends", "kept_at_ends_ref",
    "ngram_chain", "ngram_chain_ref", "NgramChain", "chain_layout", "find_ngram_continuations",
    "find_ngram_continuations_ref", "NGRAM_BLOCK",
    "ParallelDraftInputs", "parallel_draft_inputs", "parallel_draft_inputs_ref",
    "decode_attention", "decode_attention_ref", "decode_split",
    "add_rms_norm", "add_rms_norm_ref", "rope_store", "rope_store_ref", "silu_mul", "silu_mul_ref",
    "embed_concat", "embed_concat_ref", "table_rows", "table_rows_ref", "last_rows", "last_rows_ref",
    "decoder_inputs", "decoder_inputs_ref",
    "GEMV_MAX_ROWS", "DECODER_GEMV_ROWS", "gemv_config", "linear_rows", "linear_rows_ref",
    "SKINNY_MAX_ROWS", "SKINNY_DEFAULT_ROWS", "skinny_config", "linear_skinny", "linear_skinny_ref", "use_split_fixup",
    "tuned_linear_config", "linear_picks", "clear_linear_picks",
    "FP8_DTYPE", "FP8_MAX", "quantize_fp8_rows", "quantize_fp8_rows_ref", "dequantize_fp8", "linear_fp8",
    "linear_fp8_ref", "fp8_linear_config", "Fp8Rows", "linear_fp8_rows", "linear_fp8_rows_ref",
    "INT4_GROUPS", "Int4Weight", "pack_int4", "unpack_int4", "int4_linear_config", "linear_int4", "linear_int4_ref",
    "linear_int4_rows", "linear_int4_rows_ref",
    "TREE_ATTENTION_MAX_M", "TREE_ATTENTION_PREFIX_MIN_ROWS_HEADS", "tree_attention", "tree_attention_launch",
    "tree_attention_plan", "tree_attention_ref", "tree_attention_shares_prefix", "tree_attention_split",
    "use_fused_tree_merge",
    "TOPK_CHUNK", "TOPK_MAX_N", "TOPK_MAX_K", "topk_rows", "topk_rows_ref", "log_softmax_topk", "log_softmax_topk_ref",
    "TreeCandidates", "TreeFrontier", "new_candidates", "dynamic_tree_level", "dynamic_tree_level_ref",
    "rerank_candidates", "rerank_candidates_ref",
]
