"""Every bad input of SPEC section 5 gets an error that names the argument (one test per case)."""

import pytest
import torch

from conftest import make_qkv
from rangeswa_ext import ops, preset

C = 4


def _args(**changes):
    q, k, v = make_qkv(1, 2, 1, C + 40, 64, seed=0)
    args = dict(q=q, k=k, v=v, retrieved=None, method="rangeswa", control_tokens=C, window=16, summary_block=8,
                near_range=16, topk=2, retrieval_block=16, query_block=16, train_length=32, sinks=0,
                far_summaries=True, theta=1e4, rotary_dim=64, rope_style="interleaved", scale=0.125)
    args.update(changes)
    return args


def _attn(**changes):
    return torch.ops.rangeswa.attn.default(**_args(**changes))


BAD_ATTN = {
    "q_rank": (dict(q=torch.randn(2, 44, 64)), r"q must be a 4-D tensor"),
    "k_rank": (dict(k=torch.randn(1, 1, 44, 64, 1)), r"k must be a 4-D tensor"),
    "v_shape": (dict(v=torch.randn(1, 1, 43, 64)), r"v must have the shape of k"),
    "kv_length": (dict(k=torch.randn(1, 1, 40, 64), v=torch.randn(1, 1, 40, 64)),
                  r"q must hold the 4 control rows and the last Lq body rows of k, 1 <= Lq <= L = 36 "
                  r"\(SPEC section 7\), got 44 q rows for 40 k rows"),
    "head_dim": (dict(k=torch.randn(1, 1, 44, 32), v=torch.randn(1, 1, 44, 32)), r"must agree in B and D"),
    "negative_causal_block": (dict(causal_block=-2), r"causal_block must be >= 0 \(0 = bidirectional\)"),
    "gqa_heads": (dict(q=torch.randn(1, 3, 44, 64), k=torch.randn(1, 2, 44, 64), v=torch.randn(1, 2, 44, 64)),
                  r"query heads \(3\) must be a multiple of key/value heads \(2\)"),
    "dtype_mismatch": (dict(k=torch.randn(1, 1, 44, 64, dtype=torch.bfloat16)), r"same dtype"),
    "dtype_unsupported": (dict(q=torch.randn(1, 2, 44, 64, dtype=torch.float64),
                               k=torch.randn(1, 1, 44, 64, dtype=torch.float64),
                               v=torch.randn(1, 1, 44, 64, dtype=torch.float64)), r"q must be float32, bfloat16"),
    "odd_rotary_dim": (dict(rotary_dim=63), r"rotary_dim must be even"),
    "rotary_dim_too_big": (dict(rotary_dim=66), r"rotary_dim must be even and in \[0, head dim = 64\]"),
    "whole_odd_head_dim": (dict(q=torch.randn(1, 2, 44, 63), k=torch.randn(1, 1, 44, 63), v=torch.randn(1, 1, 44, 63),
                                rotary_dim=None), r"rotary_dim None rotates the whole head dim, which must then be "
                                                  r"even, got head dim 63; give an even rotary_dim"),
    "rb_not_multiple_of_g": (dict(retrieval_block=12), r"retrieval_block must be a positive multiple of summary_block"),
    "negative_window": (dict(window=-1), r"window must be >= 1"),
    "zero_summary_block": (dict(summary_block=0), r"summary_block must be >= 1"),
    "negative_topk": (dict(topk=-3), r"topk must be >= 0"),
    "negative_near_range": (dict(near_range=-1), r"near_range must be >= 0"),
    "negative_sinks": (dict(method="swa", sinks=-1), r"sinks must be >= 0"),
    "sinks_not_swa": (dict(sinks=4), r"sinks are only defined for method 'swa'"),
    "zero_train_length": (dict(train_length=0), r"train_length must be >= 1"),
    "zero_query_block": (dict(query_block=0), r"query_block must be >= 1"),
    "control_tokens": (dict(control_tokens=45), r"control_tokens must lie in \[0, N = 44\]"),
    "negative_control_tokens": (dict(control_tokens=-1), r"control_tokens must lie in"),
    "method": (dict(method="rangeswa_lite"), r"method must be one of"),
    "rope_style": (dict(rope_style="neox"), r"rope_style must be 'interleaved' or 'half'"),
    "theta": (dict(theta=-1.0), r"theta must be a finite number > 0"),
    "theta_nan": (dict(theta=float("nan")), r"theta must be a finite number > 0, got nan"),
    "scale": (dict(scale=0.0), r"scale must be a finite number > 0"),
    "scale_inf": (dict(scale=float("inf")), r"scale must be a finite number > 0, got inf"),
    # Sizes past 2^31 - 1 (docs/spec_decisions.md item 20), named before anything is allocated.
    "window_beyond_the_limit": (dict(window=2**40), r"window must be at most 2\^31 - 1 = 2147483647"),
    "summary_block_beyond_the_limit": (dict(summary_block=2**31, retrieval_block=2**31),
                                       r"summary_block must be at most 2\^31 - 1"),
    "topk_beyond_the_limit": (dict(topk=2**40), r"topk must be at most 2\^31 - 1 = 2147483647, got 1099511627776"),
    "near_range_beyond_the_limit": (dict(near_range=2**31), r"near_range must be at most 2\^31 - 1"),
    "causal_block_beyond_the_limit": (dict(causal_block=2**31), r"causal_block must be at most 2\^31 - 1"),
    "retrieved_table_too_big": (dict(topk=2**31 - 1), r"topk = 2147483647 makes the retrieved blocks \[B, H_kv, nQb, K\] "
                                r"= \[1, 1, 3, 2147483647\] hold more than 2\^31 - 1 entries; every candidate is among "
                                r"the first 3"),
    "retrieved_dtype": (dict(retrieved=torch.zeros(1, 1, 3, 2, dtype=torch.int64)), r"retrieved must be int32"),
    "retrieved_shape": (dict(retrieved=torch.zeros(1, 1, 2, 2, dtype=torch.int32)), r"retrieved must be \[B, H_kv, nQb, K\]"),
    "retrieved_range": (dict(retrieved=torch.full((1, 1, 3, 1), 7, dtype=torch.int32)), r"outside \[-1, 3\)"),
    "retrieved_not_candidate": (dict(retrieved=torch.zeros(1, 1, 3, 1, dtype=torch.int32)), r"not a candidate"),
    "retrieved_twice": (dict(retrieved=torch.tensor([[[[-1, -1], [-1, -1], [0, 0]]]], dtype=torch.int32)),
                        r"twice"),
    "retrieved_other_method": (dict(method="swa", retrieved=torch.full((1, 1, 3, 1), -1, dtype=torch.int32)),
                               r"only used by method 'rangeswa'"),
}


@pytest.mark.parametrize("case", list(BAD_ATTN), ids=list(BAD_ATTN))
def test_attn_rejects(case):
    changes, message = BAD_ATTN[case]
    with pytest.raises((ValueError, RuntimeError), match=message):
        _attn(**changes)


def test_attn_rejects_mismatched_devices():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to put one input elsewhere")
    with pytest.raises((ValueError, RuntimeError), match=r"same device"):
        _attn(k=torch.randn(1, 1, 44, 64, device="cuda"))


def test_cuda_inputs_to_a_build_without_cuda_kernels(monkeypatch):
    monkeypatch.setattr(ops, "CUDA_KERNELS", False)
    with pytest.raises(RuntimeError, match=r"this rangeswa build has no CUDA kernels .* RANGESWA_CPU_ONLY"):
        ops.require_kernels(torch.device("cuda", 0))
    ops.require_kernels(torch.device("cpu"))  # CPU kernels are always built
    monkeypatch.setattr(ops, "CUDA_KERNELS", True)
    ops.require_kernels(torch.device("cuda", 0))


def test_rope_rejects_bad_positions_and_dims():
    x = torch.randn(1, 1, 10, 64)
    with pytest.raises(ValueError, match=r"positions must be a 1-D tensor of 10 entries"):
        ops.rope(x, torch.arange(9, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"positions must be a floating tensor"):
        ops.rope(x, torch.arange(10))
    with pytest.raises(ValueError, match=r"rotary_dim must be even"):
        ops.rope(x, torch.arange(10.0), rotary_dim=7)
    with pytest.raises(ValueError, match=r"x must be a 4-D tensor"):
        ops.rope(x[0], torch.arange(10.0))


def test_block_summary_rejects_mismatched_inputs():
    k = torch.randn(1, 1, 10, 64)
    with pytest.raises(ValueError, match=r"k and v must have the same shape"):
        ops.block_summary(k, torch.randn(1, 1, 11, 64))
    with pytest.raises(ValueError, match=r"summary_block must be >= 1"):
        ops.block_summary(k, k, summary_block=0)
    with pytest.raises(ValueError, match=r"positions must be a 1-D tensor of 10 entries"):
        ops.block_summary(k, k, torch.arange(3.0))


def test_topk_blocks_rejects_bad_blocks():
    q, k, _ = make_qkv(1, 2, 1, 20, 64, seed=1)
    with pytest.raises(ValueError, match=r"retrieval_block must be a positive multiple"):
        torch.ops.rangeswa.topk_blocks.default(q, k, 0, 256, 3, 64, 128, 8)
    with pytest.raises(ValueError, match=r"topk must be >= 0"):
        torch.ops.rangeswa.topk_blocks.default(q, k, 0, 256, 16, 64, 128, -1)


@pytest.mark.parametrize("changes,message", [
    (dict(method="lite"), r"method must be one of"),
    (dict(retrieval_block=24), r"retrieval_block \(24\) must be a multiple of summary_block \(16\)"),
    (dict(late_window=0), r"late_window must be >= 1"),
    (dict(topk=-1), r"topk must be >= 0"),
    (dict(sinks=2), r"sinks are a swa baseline feature"),
    (dict(rotary_dim=5), r"rotary_dim must be even"),
    (dict(rope_style="neox"), r"rope_style must be one of"),
    (dict(theta=float("nan")), r"theta must be a finite number > 0, got nan"),
    (dict(scale=-1.0), r"scale must be a finite number > 0 \(or None for 1/sqrt\(head_dim\)\), got -1.0"),
    (dict(switch_time=float("nan")), r"switch_time must be a finite number in \[0, 1\]"),
    (dict(switch_time=1.5), r"switch_time must be a finite number in \[0, 1\]"),
    (dict(summary_block=2**20, retrieval_block=2**40), r"retrieval_block must be >= 1 and at most 2\^31 - 1"),
    (dict(topk=2**40), r"topk must be >= 0 and at most 2\^31 - 1 = 2147483647, got 1099511627776"),
    (dict(late_window=256.0), r"late_window must be an integer, got 256.0"),
    (dict(far_summaries="no"), r"far_summaries must be True or False"),
])
def test_config_rejects(changes, message):
    with pytest.raises(ValueError, match=message):
        preset("rangeswa", **changes)


def test_config_errors_for_unknown_preset_and_stage():
    with pytest.raises(ValueError, match=r"unknown preset 'nope'"):
        preset("nope")
    with pytest.raises(ValueError, match=r"stage must be one of"):
        preset("rangeswa").window_for("middle")
    with pytest.raises(ValueError, match=r"rotary_dim \(80\) must be <= the head dim \(64\)"):
        preset("rangeswa", rotary_dim=80).resolved_rotary_dim(64)
