"""Every configuration the CPU op takes runs on both CUDA kernels, or is refused before launch in words (issue 50),
checked on the kernels' own source under the host SIMT emulation (csrc/cuda/simt, tests/cuda_emulator.py):

- a top-K past the key blocks (K = 1000, a "retrieve everything" ablation) runs on the mma.sync kernel and on
  the sm_90a one (RANGESWA_CUDA_KERNEL=hopper), given or selected by the device, and equals the CPU op: the
  sort, the plan and the kernels' shared memory are sized by min(K, key blocks) (attn_setup.h retrieved_room),
  so K = 1000 gives exactly K = nKb's output;
- a launch that cannot be made (its shared memory past the device's opt-in limit) is a ValueError that names
  topk and the limit, raised before any kernel runs, never a CUDA error code; where only the sm_90a kernel's
  shared memory is past the limit, the call runs on the mma.sync kernel and a warning says so (api/config.h
  choose_config, the one function that decides);
- control rows with a partial rotary dim that is not a multiple of 8 on the sm_90a path (the preparation read
  a null s_v when the control CTAs took the value means over, prepare.h prepare_unit);
- every small kernel on guarded copies: an array that ends at an inaccessible page.
"""

import re

import pytest
import torch

from attn_cases import sees_a_summary_in_part
from conftest import attn_error_bound, make_qkv
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref

HOPPER = 13  # simt.stats(): whether the last attn call's body ran on the sm_90a kernel
SMEM = 8     # ... its dynamic shared memory per CTA


@pytest.fixture
def limit(simt):
    """Sets the emulated device's opt-in shared memory per CTA; restores it."""
    default = simt.configure()[7]

    def set_limit(bytes_):
        simt.configure(max_shared_bytes=bytes_)
    yield set_limit
    simt.configure(max_shared_bytes=default)


def run(simt, monkeypatch, kernel, q, k, v, retrieved, args):
    monkeypatch.setenv("RANGESWA_CUDA_KERNEL", kernel)
    out, lse = simt.attn(q, k, v, retrieved, **args)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    return out, lse


def assert_matches_cpu(out, lse, q, k, v, cfg, C, stage="late"):
    """Within the attn bound of the float64 reference on the CPU op's blocks, and of the CPU op itself."""
    args = ops.attn_arguments(cfg, C, stage)
    cpu, cpu_lse = torch.ops.rangeswa.attn(q, k, v, None, **args)
    blocks = ref.retrieved_blocks(q.double(), k.double(), C, cfg, cfg.window_for(stage)) if cfg.topk else None
    exact, exact_lse = ref.attention(q.double(), k.double(), v.double(), cfg, C, stage, retrieved=blocks)
    bound, lse_bound = attn_error_bound(q, k, v, cfg.resolved_scale(q.shape[3]), q.dtype)
    assert (out.double() - exact).abs().max().item() <= bound
    assert (lse.double() - exact_lse).abs().max().item() <= lse_bound
    assert (cpu.double() - exact).abs().max().item() <= bound


# ---------------------------------------------------------------------------------- K past the key blocks

K_PAST = [  # (C, L, D): L from 2 to several blocks, with and without control rows, head dims 64 to 128
    (0, 2, 64), (12, 180, 64), (0, 517, 80), (70, 180, 128)]


@pytest.mark.parametrize("kernel", ["mma", "hopper"])
@pytest.mark.parametrize("C,L,D", K_PAST, ids=[f"C{c}-L{n}-D{d}" for c, n, d in K_PAST])
def test_topk_past_the_key_blocks_runs_on_both_kernels(simt, monkeypatch, kernel, C, L, D):
    """K = 1000 (issue 50: 'the attn launcher refused the launch (cudaError 1)') runs, equals the CPU op, and
    gives exactly K = nKb's output, selected by the device (retrieved=None) or given."""
    cfg = preset("rangeswa", topk=1000)
    q, k, v = make_qkv(1, 2, 1, C + L, D, seed=L + D, dtype=torch.bfloat16)
    args = ops.attn_arguments(cfg, C)
    out, lse = run(simt, monkeypatch, kernel, q, k, v, None, args)
    assert simt.stats()[HOPPER] == (kernel == "hopper")
    assert_matches_cpu(out, lse, q, k, v, cfg, C)
    nKb = -(-L // cfg.retrieval_block)
    same, same_lse = run(simt, monkeypatch, kernel, q, k, v, None, ops.attn_arguments(cfg.replace(topk=nKb), C))
    assert torch.equal(out, same) and torch.equal(lse, same_lse)
    # The CPU op's blocks given with all 1000 columns (the sort reads them all, keeps nKb).
    given = torch.ops.rangeswa.topk_blocks(q, k, **ops.topk_arguments(cfg, C))
    assert given.shape[3] == 1000
    out_given, lse_given = run(simt, monkeypatch, kernel, q, k, v, given, args)
    assert torch.equal(out_given, out) and torch.equal(lse_given, lse)


def test_topk_past_the_key_blocks_in_fp32_and_fp16(simt, monkeypatch):
    for dtype in (torch.float32, torch.float16):
        cfg = preset("rangeswa", topk=10**6)
        q, k, v = make_qkv(1, 1, 1, 12 + 100, 64, seed=5, dtype=dtype)
        out, lse = run(simt, monkeypatch, "hopper", q, k, v, None, ops.attn_arguments(cfg, 12))
        assert simt.stats()[HOPPER] == (dtype != torch.float32)
        assert_matches_cpu(out, lse, q, k, v, cfg, 12)


def test_a_given_block_past_the_kept_ones_is_still_refused(simt, monkeypatch):
    """The sort reads every given column: a block given twice among 1000 columns is the sort's error."""
    cfg = preset("rangeswa", topk=1000)
    q, k, v = make_qkv(1, 1, 1, 600, 64, seed=2, dtype=torch.bfloat16)
    given = torch.ops.rangeswa.topk_blocks(q, k, **ops.topk_arguments(cfg, 0))
    qb = int((given[0, 0, :, 0] >= 0).nonzero()[0])  # a query block with candidates
    given[0, 0, qb, 999] = given[0, 0, qb, 0]
    for kernel in ("mma", "hopper"):  # the sort kernel's device-side assertion (docs/cuda.md, step 1)
        with pytest.raises(RuntimeError, match="given twice"):
            run(simt, monkeypatch, kernel, q, k, v, given, ops.attn_arguments(cfg, 0))


# ------------------------------------------------------------------------ refusals in words, the fallback


def test_a_launch_past_the_shared_memory_limit_is_refused_naming_topk(simt, monkeypatch, limit):
    cfg = preset("rangeswa", topk=8)
    q, k, v = make_qkv(1, 1, 1, 12 + 300, 64, seed=3, dtype=torch.bfloat16)
    args = ops.attn_arguments(cfg, 12)
    run(simt, monkeypatch, "mma", q, k, v, None, args)
    mma_smem = simt.stats()[SMEM]
    limit(mma_smem - 16)
    for kernel in ("mma", "hopper"):
        monkeypatch.setenv("RANGESWA_CUDA_KERNEL", kernel)
        with pytest.raises(ValueError, match=rf"topk.*{mma_smem} bytes of shared memory.*limit of {mma_smem - 16}"):
            simt.attn(q, k, v, None, **args)


def test_the_sm90a_kernel_falls_back_to_the_mma_kernel_and_says_so(simt, monkeypatch, limit, capfd):
    """choose_config: where the sm_90a kernel's shared memory is past the limit and the mma.sync kernel's
    is not, RANGESWA_CUDA_KERNEL=hopper runs the body on the mma.sync kernel, with a warning naming why (c10's
    TORCH_WARN, on stderr from a torch.ops call)."""
    cfg = preset("rangeswa", topk=4)
    q, k, v = make_qkv(1, 1, 1, 12 + 200, 128, seed=4, dtype=torch.bfloat16)
    args = ops.attn_arguments(cfg, 12)
    mma_out, mma_lse = run(simt, monkeypatch, "mma", q, k, v, None, args)
    mma_smem = simt.stats()[SMEM]
    run(simt, monkeypatch, "hopper", q, k, v, None, args)
    hopper_smem = simt.stats()[SMEM]
    assert simt.stats()[HOPPER] == 1
    if hopper_smem <= mma_smem:
        pytest.skip(f"the sm_90a kernel needs no more shared memory than the mma.sync one here ({hopper_smem} "
                    f"<= {mma_smem}): no limit keeps it out alone")
    between = (mma_smem + hopper_smem) // 2  # (the emulated limit holds static shared memory too)
    limit(between)
    capfd.readouterr()
    out, lse = run(simt, monkeypatch, "hopper", q, k, v, None, args)
    assert re.search(rf"RANGESWA_CUDA_KERNEL=hopper: the sm_90a body kernel needs {hopper_smem} bytes .* more than "
                     rf"the device's {between}; its body tiles run on the mma.sync kernel", capfd.readouterr().err)
    assert simt.stats()[HOPPER] == 0
    assert torch.equal(out, mma_out) and torch.equal(lse, mma_lse)
    run(simt, monkeypatch, "mma", q, k, v, None, args)  # the mma.sync kernel asked for: no warning
    assert "RANGESWA_CUDA_KERNEL" not in capfd.readouterr().err


# --------------------------------------------------------- the null read: partial rotary dims, control rows

ROTARY = [(62, 70, "late"), (2, 12, "late"), (58, 70, "early"), (60, 12, "decode"), (30, 70, "late")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rotary,C,stage", ROTARY, ids=[f"r{r}-C{c}-{s}" for r, c, s in ROTARY])
def test_partial_rotary_with_control_rows_on_the_sm90a_kernel(simt, monkeypatch, dtype, rotary, C, stage):
    """Issue 50: rotary 62 with 70 control rows, L = 180, head dim 64 stopped in prepare_unit at address 0 on
    the sm_90a path (its control CTAs took the value means over, s_v null, and the preparation's scalar path
    wrote them anyway). Both RoPE styles, with and without retrieval; equal to the mma.sync kernel's blocks'
    answer within the bound."""
    for style, topk in (("interleaved", 0), ("half", 3)):
        cfg = preset("rangeswa", rotary_dim=rotary, rope_style=style, topk=topk)
        q, k, v = make_qkv(1, 2, 1, C + 180, 64, seed=rotary + C, dtype=dtype)
        args = ops.attn_arguments(cfg, C, stage)
        out, lse = run(simt, monkeypatch, "hopper", q, k, v, None, args)
        assert simt.stats()[HOPPER] == 1
        assert_matches_cpu(out, lse, q, k, v, cfg, C, stage)


# ------------------------------------------------------------------------------------- guarded small kernels


def test_the_small_kernels_run_on_guarded_copies(simt):
    """The rope, block_summary and topk_blocks ops (and attn's preparation, selection, sort, plan) read and
    write guarded copies: the same answers with the guard on and off."""
    q, k, v = make_qkv(1, 2, 1, 12 + 150, 64, seed=9, dtype=torch.bfloat16)
    cfg = preset("rangeswa", topk=3, rotary_dim=62)
    positions = torch.arange(150, dtype=torch.float64)
    results = []
    try:
        for guard in (True, False):
            simt.configure(guard_global=guard)
            results.append((simt.rope(k[:, :, 12:], positions, 10000.0, 62, "half", None),
                            *simt.block_summary(k[:, :, 12:], v[:, :, 12:], positions, 16, 10000.0, 62, "half", None),
                            simt.topk_blocks(q, k, **ops.topk_arguments(cfg, 12)),
                            *simt.attn(q, k, v, None, **ops.attn_arguments(cfg, 12))))
    finally:
        simt.configure(guard_global=True)
    for a, b in zip(*results):
        assert torch.equal(a, b)


# ----------------------------------------------------- section 7: a summary block seen in part, and no more


def test_causal_pairings_run_unless_a_row_sees_a_summary_block_in_part(simt, monkeypatch):
    """attn_setup.h sees_a_summary_in_part against the row-by-row definition: a call
    is refused, naming the condition, exactly when some row's visible end falls inside a G-block outside its
    window that rule 4 summarises for it (attn_cases.sees_a_summary_in_part); every other causal block / summary block pairing runs and is held
    to the reference (among them pairings the earlier rule refused: cb and G dividing neither one another with
    a radius below cb - 1)."""
    ran = refused = formerly_refused = 0
    for name, G, cb, window, near in [
            ("rangeswa", 16, 24, 32, 40), ("rangeswa", 16, 24, 8, 40), ("rangeswa", 16, 12, 3, 40),
            ("rangeswa", 4, 6, 2, 40), ("rangeswa", 4, 6, 5, 40), ("rangeswa", 6, 4, 1, 40), ("rangeswa", 5, 7, 3, 2),
            ("rangeswa_lite", 16, 12, 5, 0), ("rangeswa_lite", 16, 12, 5, 64), ("rangeswa_lite", 4, 6, 1, 1),
            ("rangeswa_lite", 4, 6, 1, 4), ("rangeswa_lite", 6, 9, 2, 8), ("rangeswa", 16, 8, 3, 40),
            ("rangeswa", 4, 6, 12, 40)]:
        cfg = preset(name, summary_block=G, retrieval_block=G, query_block=16, late_window=window, near_range=near,
                     train_length=4096)
        L, C = 70, 3
        q, k, v = make_qkv(1, 1, 1, C + L, 16, seed=G + cb, dtype=torch.float32)
        args = ops.attn_arguments(cfg, C, "late", cb)
        old_rule = cb % G != 0 and G % cb != 0 and window // 2 < cb - 1
        if sees_a_summary_in_part(cfg, "late", L, cb):
            for kernel in ("mma", "hopper"):
                monkeypatch.setenv("RANGESWA_CUDA_KERNEL", kernel)
                with pytest.raises(ValueError, match="a summary block that a row sees in part"):
                    simt.attn(q, k, v, None, **args)
            refused += 1
            continue
        out, lse = run(simt, monkeypatch, "mma", q, k, v, None, args)
        exact, exact_lse = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late", causal_block=cb)
        bound, lse_bound = attn_error_bound(q, k, v, cfg.resolved_scale(16))
        assert (out.double() - exact).abs().max().item() <= bound, (name, G, cb, window, near)
        assert (lse.double() - exact_lse).abs().max().item() <= lse_bound
        # bf16 on the sm_90a kernel too
        qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
        out, lse = run(simt, monkeypatch, "hopper", qb, kb, vb, None, args)
        bound, _ = attn_error_bound(qb, kb, vb, cfg.resolved_scale(16), torch.bfloat16)
        assert (out.double() - exact).abs().max().item() <= 2 * bound, (name, G, cb, window, near)
        ran += 1
        formerly_refused += old_rule
    assert ran >= 5 and refused >= 3 and formerly_refused >= 3, (ran, refused, formerly_refused)


def test_the_refusal_of_a_summary_seen_in_part_is_exact(simt):
    """attn_setup.h sees_a_summary_in_part (the first and last G / gcd(cb, G) causal blocks) equals the row-by-row
    definition on every small pairing: L 1-48, G 1-9, cb 1-L, windows 1-17, near ranges 0-9, far summaries or not.
    A call of batch 0 is checked and returns at once, so the sweep costs no kernel."""
    k = torch.zeros(0, 1, 48, 16)
    mismatches, refused, old_rule_runs = [], 0, 0
    for L in (1, 7, 13, 29, 48):
        for G in range(1, 10):
            for cb in range(1, L + 1):
                for window, near, name in ((1, 0, "rangeswa"), (4, 3, "rangeswa"), (9, 9, "rangeswa"),
                                           (17, 2, "rangeswa"), (3, 0, "rangeswa_lite"), (5, 4, "rangeswa_lite"),
                                           (2, 9, "rangeswa_lite")):
                    cfg = preset(name, summary_block=G, retrieval_block=G, late_window=window, near_range=near,
                                 train_length=4096)
                    args = ops.attn_arguments(cfg, 0, "late", cb)
                    expect = sees_a_summary_in_part(cfg, "late", L, cb)
                    try:
                        simt.attn(k[:, :, :L], k[:, :, :L], k[:, :, :L], None, **args)
                        got = False
                    except ValueError as e:
                        assert "a summary block that a row sees in part" in str(e)
                        got = True
                    if got != expect:
                        mismatches.append((name, L, G, cb, window, near, got))
                    refused += got
                    old_rule_runs += not got and cb < L and cb % G != 0 and G % cb != 0 and window // 2 < cb - 1
    assert not mismatches, mismatches[:10]
    assert refused > 100 and old_rule_runs > 100, (refused, old_rule_runs)  # both sides of the line, and between
