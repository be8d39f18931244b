"""The Hopper primitives (csrc/cuda/sm90/hopper.h) and their SIMT emulation (csrc/cuda/simt/simt_hopper.h).

Hand-worked cases from the PTX ISA's wgmma layout figures and descriptor format, TMA's tensor-map semantics
(cuTensorMapEncodeTiled), mbarrier phases, and the sm_90a kernels of tests/cpp/hopper_tile.cu run through the
emulation (the same source scripts/hopper_gate.py compiles for sm_90a and reads the SASS of):

- (a) the accumulator fragment of wgmma m64nNk16: which thread / register holds D[row][col] (A identity-like,
  B index-coded; random operands), A from shared memory and from registers;
- (b) the descriptor's encoding, and the byte address of element (row, k) under each swizzle mode against a
  formula written here, independently of the emulation; TMA's swizzled writes and out-of-bounds fill;
- (c) S = Q K^T, 64 x 64 x 64, Q and K by TMA, four k16 steps of wgmma, mbarrier waits: bf16 and fp16, every
  swizzle mode, A from shared memory and from registers, against torch; O = P V the same way with V row-major
  read as an N-major B;
- (d) a two-stage producer / consumer ring over 8 tiles, and its deliberate bugs (wrong parity, missing
  expect_tx, a stage released before wgmma.wait_group) reported as errors; wgmma misuse (no fence, accumulator
  read or written before the wait, no wait, half a warpgroup, A registers changed in flight);
- the sm_90a compile gate (HGMMA / UTMALDG / SYNCS in the SASS, no local memory), skipped without nvcc.
"""

import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_BASE = 0x80  # simt_hopper.h kSharedBase: where the emulation's dynamic shared memory starts


# ------------------------------------------------------------------------------ layouts, written independently


def accumulator_position(t, i):
    """PTX ISA 9.7.15.5.1.1, 'WGMMA .m64nNk16 register fragment layout for accumulator matrix D': thread t of the
    warpgroup (warp t // 32 owns rows 16 w .. 16 w + 15), register d[i]: row = 16 w + groupID (+ 8 for the second
    pair of every four), column = 8 (i // 4) + 2 threadID_in_group + (i % 2)."""
    warp, lane = divmod(t, 32)
    group, in_group = divmod(lane, 4)
    row = 16 * warp + group + (8 if i % 4 >= 2 else 0)
    col = 8 * (i // 4) + 2 * in_group + i % 2
    return row, col


def swizzled(offset, W):
    """Where TMA and wgmma put byte `offset` (from a 1024-byte aligned start) under a swizzle of W bytes: the
    figures show 16-byte chunks permuted within each 128-byte line of an 8-line (1024-byte) pattern. A line holds
    128 / W rows of W bytes; the chunk index within its W-byte row is XORed with the line's index in the pattern,
    modulo the W / 16 chunks of a row."""
    if W == 16:
        return offset
    line = (offset // 128) % 8
    row_start = offset - offset % W
    chunk = (offset % W) // 16
    return row_start + 16 * (chunk ^ (line % (W // 16))) + offset % 16


def operand_address(start, lbo, sbo, W, mn, k, mn_major=False):
    """The byte of element (mn, k) (16-bit) of a wgmma operand, from the canonical layouts of PTX 9.7.15.5.1.2.1.3
    in CuTe notation (T = 8 elements = 16 bytes; strides in elements, LBO / SBO in bytes here):
    K-major  none ((8,m),(T,2k)):((1T,SBO),(1,LBO)),  swizzled ((8,m),(T,2k)):((W/16 T,SBO),(1,T));
    MN-major none ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)), swizzled ((T,W/16,m),(8,k)):((1,T,LBO),(W/16 T,SBO));
    then the swizzle of the resulting byte address."""
    T = 8
    if not mn_major:
        i, m = mn % 8, mn // 8
        t, kk = k % T, k // T
        if W == 16:
            return start + 2 * (i * T) + m * sbo + 2 * t + kk * lbo
        plain = start + 2 * (i * (W // 16) * T) + m * sbo + 2 * t + 2 * kk * T
    else:
        t, rest = mn % T, mn // T
        k8, kk = k % 8, k // 8
        if W == 16:
            return start + 2 * t + rest * sbo + 2 * k8 * T + kk * lbo
        j, m = rest % (W // 16), rest // (W // 16)
        plain = start + 2 * t + 2 * j * T + m * lbo + 2 * k8 * (W // 16) * T + kk * sbo
    base = plain - plain % 1024
    return base + swizzled(plain - base, W)


MODES = {16: 0, 128: 1, 64: 2, 32: 3}  # swizzle bytes -> descriptor bits 62-63


def encode(addr, lbo, sbo, W, base_offset=0):
    return (((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16) | (((sbo & 0x3FFFF) >> 4) << 32)
            | (base_offset << 49) | (MODES[W] << 62))


# ------------------------------------------------------------------------------------------------ (b) descriptors


@pytest.mark.parametrize("W", [16, 32, 64, 128])
def test_descriptor_encoding(simt, W):
    for addr, lbo, sbo in ((0x400, 128, 256), (0x2C20, 16, 1024), (0x3FFF0, 0x3FF0, 0x10)):
        got = simt.hopper_make_desc(addr, lbo, sbo, MODES[W]) & (2**64 - 1)
        assert got == encode(addr, lbo, sbo, W), (hex(got), hex(encode(addr, lbo, sbo, W)))


@pytest.mark.parametrize("W", [16, 32, 64, 128])
def test_descriptor_addresses_follow_the_swizzle_modes(simt, W):
    """For each swizzle mode, the emulated byte address of element (row, k) of 64 rows (8 core-matrix groups) and
    the 16 k of one wgmma step, at the first k16 steps of a tile as hopper_tile.cu lays them out, against
    operand_address above."""
    lbo, sbo = 64 * W, 8 * W
    for tile in (0x400, 0x2000):
        for ks in range(4):
            start = tile + (32 * ks // W) * 64 * W + 32 * ks % W
            desc = encode(start, lbo, sbo, W)
            got = simt.hopper_desc_address(desc - (1 << 64) if desc >= 1 << 63 else desc, 64)
            expect = torch.tensor([[operand_address(start, lbo, sbo, W, r, k) for k in range(16)] for r in range(64)])
            assert torch.equal(got, expect), (W, tile, ks)
    # N-major (imm-trans 1), as P V reads V: the key step ks at 16 ks rows of W bytes.
    lbo_t, sbo_t = (8 * W, 64 * W) if W == 16 else (64 * W, 8 * W)
    for ks in range(4):
        start = 0x800 + 16 * ks * W
        desc = encode(start, lbo_t, sbo_t, W)
        got = simt.hopper_desc_address(desc - (1 << 64) if desc >= 1 << 63 else desc, 64, mn_major=True)
        expect = torch.tensor([[operand_address(start, lbo_t, sbo_t, W, n, k, mn_major=True) for k in range(16)]
                               for n in range(64)])
        assert torch.equal(got, expect), (W, ks, "mn-major")
    if W != 16:
        # The first row of a W = 128 pattern moved by 16 bytes: chunk 0 of row 1 is then chunk 1 ^ 1 = 0.
        assert swizzled(128 + 16, 128) == 128 and swizzled(16, 128) == 16
        bad = encode(0x400 + 2 * W, lbo, sbo, W)  # starts in the pattern's third row: needs the base offset
        with pytest.raises(RuntimeError, match="swizzle pattern"):
            simt.hopper_desc_address(bad - (1 << 64) if bad >= 1 << 63 else bad, 8)


@pytest.mark.parametrize("W", [16, 32, 64, 128])
@pytest.mark.parametrize("c0,c1", [(0, 0), (8, 3), (-8, -2), (56, 36)], ids=["origin", "inside", "before", "past"])
def test_tma_box_lands_swizzled_with_zero_fill(simt, W, c0, c1):
    """TMA's 2D tiled copy of a [40, 64] array of fp16 bit patterns 0, 1, 2, ... (row-major index): the box's
    element (r, e) is global (c1 + r, c0 + e), zero outside the array, at shared byte swizzled(2 (r box0 + e), W)."""
    dim0, dim1, box1 = 64, 40, 8
    box0 = W // 2 if W > 16 else 8
    got = simt.hopper_tma(0 if W == 16 else W, c0, c1, box0, box1, dim0, dim1)
    assert got.numel() == box0 * box1
    for r in range(box1):
        for e in range(box0):
            y, x = c1 + r, c0 + e
            value = y * dim0 + x if 0 <= x < dim0 and 0 <= y < dim1 else 0
            assert got[swizzled(2 * (r * box0 + e), W) // 2].item() == value, (r, e)


def test_tma_out_of_bounds_nan_fill_and_refused_maps(simt):
    got = simt.hopper_tma(128, -8, 0, 64, 2, 64, 40, oob_nan=True)
    assert got[swizzled(0, 128) // 2].item() == 0x7E00  # fp16 NaN for x = -8
    with pytest.raises(RuntimeError, match="refuse"):
        simt.hopper_tma(64, 0, 0, 64, 8, 64, 40)  # 128-byte box rows under a 64-byte swizzle
    with pytest.raises(RuntimeError, match="refuse"):
        simt.hopper_tma(0, 0, 0, 4, 8, 64, 40)  # 8-byte box rows (not a multiple of 16)


# ------------------------------------------------------------------------------------------ (a) fragment layouts


def _run_layout(simt, name, a, b, mode=0):
    out = simt.hopper_probe(f"{name}:{mode}", torch.cat([a.flatten(), b.flatten()]))
    return out


def _check_layout(out, d, N):
    got = out[:128 * (N // 2)].view(128, N // 2)
    for t in range(128):
        for i in range(N // 2):
            row, col = accumulator_position(t, i)
            assert got[t, i].item() == d[row, col].item(), (t, i, row, col)


@pytest.mark.parametrize("name,N", [("layout_ss_f16_16", 16), ("layout_ss_f16_64", 64), ("layout_ss_f16_128", 128),
                                    ("layout_rs_f16_64", 64)])
def test_wgmma_accumulator_fragment_index_coded(simt, name, N):
    """A identity-like (row m has (m // 16 + 1) at k = m % 16), B index-coded (B[k][n] = k N + n): D[m][n] =
    (m // 16 + 1) ((m % 16) N + n), exact in fp16 x fp16 -> fp32; every register of every thread against the
    layout figure."""
    m = torch.arange(64)
    a = torch.zeros(64, 16)
    a[m, m % 16] = (m // 16 + 1).float()
    b = torch.arange(16 * N).float().view(16, N)
    d = a @ b
    _check_layout(_run_layout(simt, name, a, b), d, N)


@pytest.mark.parametrize("name,N,dtype", [("layout_ss_bf16_32", 32, torch.bfloat16),
                                          ("layout_rs_bf16_16", 16, torch.bfloat16),
                                          ("layout_rs_f16_64", 64, torch.float16),
                                          ("layout_ss_f16_128", 128, torch.float16)])
def test_wgmma_accumulator_fragment_random(simt, name, N, dtype):
    g = torch.Generator().manual_seed(N)
    a = torch.randint(-8, 9, (64, 16), generator=g).float()
    b = torch.randint(-8, 9, (16, N), generator=g).float()
    _check_layout(_run_layout(simt, name, a.to(dtype).float(), b.to(dtype).float()), a @ b, N)


def test_wgmma_chain_accumulates_in_order(simt):
    """Two mma_async on one accumulator with no wait between them (scale-d 0 then 1): D = 2 A B."""
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-4, 5, (64, 16), generator=g).float()
    b = torch.randint(-4, 5, (16, 16), generator=g).float()
    _check_layout(simt.hopper_probe("chain", torch.cat([a.flatten(), b.flatten()])), 2 * (a @ b), 16)


# ------------------------------------------------------------------------------------------- (c) the tile kernel


@pytest.mark.parametrize("a_regs", [False, True], ids=["A-smem", "A-registers"])
@pytest.mark.parametrize("W", [128, 64, 32, 0], ids=["sw128", "sw64", "sw32", "noswizzle"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_tile_kernel_q_kt_matches_torch(simt, dtype, W, a_regs):
    """hopper_tile.cu tile_kernel (Q K^T): Q and K by TMA (swizzle W), wgmma m64n64k16 x 4 from the descriptors (or A
    from registers read through the swizzle), one mbarrier: S = Q K^T against torch in float32."""
    g = torch.Generator().manual_seed(W + 7 * a_regs)
    q = torch.randn(64, 64, generator=g).to(dtype)
    k = torch.randn(64, 64, generator=g).to(dtype)
    s = simt.hopper_tile(q, k, 0, W, a_regs)
    expect = q.float() @ k.float().T
    assert ((s - expect).abs().max() / expect.abs().max()).item() < 1e-5


@pytest.mark.parametrize("a_regs", [False, True], ids=["P-smem", "P-registers"])
@pytest.mark.parametrize("W", [128, 64, 32, 0], ids=["sw128", "sw64", "sw32", "noswizzle"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_tile_kernel_p_v_matches_torch(simt, dtype, W, a_regs):
    """hopper_tile.cu tile_kernel (P V): P and V by TMA, V row-major read as an N-major B (imm-trans-b 1), P from
    shared memory or registers: O = P V against torch in float32."""
    g = torch.Generator().manual_seed(100 + W + 7 * a_regs)
    p = torch.rand(64, 64, generator=g).to(dtype)
    v = torch.randn(64, 64, generator=g).to(dtype)
    o = simt.hopper_tile(p, v, 1, W, a_regs)
    expect = p.float() @ v.float()
    assert ((o - expect).abs().max() / expect.abs().max()).item() < 1e-5


def test_tile_kernel_statistics(simt):
    simt.hopper_stats()
    q = torch.randn(64, 64).bfloat16()
    simt.hopper_tile(q, q, 0, 128, False)
    wgmma, groups, tma, tma_bytes, arrivals, phases, blocked, fences = simt.hopper_stats()
    assert (wgmma, groups, tma, tma_bytes, arrivals, phases) == (4, 1, 2, 2 * 8192, 1, 1)


# ------------------------------------------------------------------------------------------------- (d) the ring


def _ring_inputs(tiles=8, seed=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 64, generator=g).bfloat16(), torch.randn(tiles * 64, 64, generator=g).bfloat16()


def test_ring_runs_to_the_right_answer(simt):
    q, k = _ring_inputs()
    simt.hopper_stats()
    s = simt.hopper_ring(q, k, 0)
    expect = (q.float() @ k.float().T).view(64, 8, 64).permute(1, 0, 2)
    assert ((s - expect).abs().max() / expect.abs().max()).item() < 1e-5
    wgmma, groups, tma, tma_bytes, arrivals, phases, blocked, fences = simt.hopper_stats()
    # Q once and 8 K tiles; arrivals: Q, 8 full (expect_tx), 8 x 128 empty; phases: 1 + 8 + 8.
    assert (wgmma, groups, tma, tma_bytes) == (32, 8, 9, 9 * 8192)
    assert (arrivals, phases) == (1 + 8 + 8 * 128, 1 + 8 + 8) and blocked > 0


def test_ring_is_schedule_independent(simt):
    q, k = _ring_inputs(seed=12)
    base = simt.hopper_ring(q, k, 0)
    try:
        for seed, eager in ((1, False), (2, True), (3, False)):
            simt.configure(schedule_seed=seed, eager_copies=eager)
            assert torch.equal(simt.hopper_ring(q, k, 0), base), (seed, eager)
    finally:
        simt.configure(schedule_seed=0, eager_copies=False)


RING_BUGS = [
    (1, r"reads shared address .* which a TMA copy issued by thread 0 .* has not written yet"),
    (2, r"reads shared address .* which a TMA copy issued by thread 0 .* has not written yet"),
    (3, r"overwrites shared memory that the wgmma.mma_async at hopper_tile.cu:\d+ \(warpgroup 1\) reads, which was "
        r"still in flight when its threads arrived"),
]


@pytest.mark.parametrize("mode,message", RING_BUGS, ids=["wrong-parity", "missing-expect-tx", "early-release"])
def test_ring_bugs_are_reported(simt, mode, message):
    q, k = _ring_inputs()
    with pytest.raises(RuntimeError, match=message):
        simt.hopper_ring(q, k, mode)


# ------------------------------------------------------------------------------------------------ wgmma misuse


def test_reading_the_accumulator_before_the_wait_sees_nan(simt):
    a = torch.eye(64, 16)
    b = torch.ones(16, 64)
    out = _run_layout(simt, "layout_ss_f16_64", a, b, mode=1)
    assert out[4096:4096 + 128].isnan().all()  # d[0] read between commit and wait
    _check_layout(out, a @ b, 64)  # after the wait: the product
    clean = _run_layout(simt, "layout_ss_f16_64", a, b, mode=0)
    assert not clean[:4096].isnan().any()


MISUSE = [
    ("layout_ss_f16_64:2", r"without a wgmma.fence"),
    ("layout_ss_f16_64:3", r"wrote its accumulator registers before the wgmma.wait_group"),
    ("layout_ss_f16_64:4", r"warpgroup 0 exited with 1 wgmma.mma_async in flight"),
    ("layout_ss_f16_64:5", r"deadlock: no thread can run; threads 0-63 wait at wgmma.mma_async m64n64k16.f16"),
    ("layout_rs_f16_64:6", r"changed its A fragment register a\[1\]"),
    ("mbarrier:0", r"no mbarrier.init at shared address"),
    ("mbarrier:1", r"deadlock: no thread can run; threads 0-31 wait at mbarrier.try_wait.parity 0"),
    # the sm_90a body kernel's primitives (issue 30): named barriers, cp.async against wgmma operands
    ("named:1", r"bar.sync 1, 128 at .* while 128 threads wait at bar.sync 1, 256 at .*one barrier, two thread counts"),
    ("named:2", r"deadlock: no thread can run; threads 0-127 wait at bar.sync 1, 256"),
    ("overwrite:1", r"cp.async at .* overwrites shared memory that the wgmma.mma_async at .* reads and has not finished"),
    # as strict as PTX (issue 49): no register write between wgmma.fence and the mma_async, no wgmma on a
    # cp.async in flight, setmaxnreg's register pool
    ("layout_ss_f16_64:7", r"its accumulator registers were written after its wgmma.fence"),
    ("layout_rs_f16_64:8", r"its A fragment registers were written after its wgmma.fence"),
    ("overwrite:2", r"at issue\) reads shared address 0x880, which a cp.async issued by thread 0 .* has not landed"),
    ("setmaxnreg:1", r"deadlock: no thread can run;.*setmaxnreg.inc 232 \(warpgroup 2, holding 160 a thread\), waiting "
                     r"for 9216 registers of the CTA's pool, which has 6144"),
    ("setmaxnreg:2", r"deadlock: no thread can run;.*setmaxnreg.inc 232 \(warpgroup \d, holding 168 a thread\), waiting"),
]


def test_a_registers_read_in_flight_show_nan(simt):
    """A fragment registers of a wgmma in flight (the rs form) read as a NaN pair until the wait_group that
    retires it gives them back; the product is unchanged."""
    a = torch.eye(64, 16)
    b = torch.ones(16, 64)
    out = _run_layout(simt, "layout_rs_f16_64", a, b, mode=9)
    bits = out[4096:4096 + 128].view(torch.int32)
    assert bits.eq(0x7fff7fff).all(), bits[:4]
    _check_layout(out, a @ b, 64)


def test_the_register_pool_feeds_the_split_and_landed_copies_pass(simt):
    """The body kernel's split at 168 registers at entry (producer 40, two consumers 232) runs; a cp.async that
    its thread waited for, then a barrier, is data a wgmma may read."""
    out = simt.hopper_probe("setmaxnreg:0", torch.zeros(4096))
    assert out[:384].eq(1).all()
    out = simt.hopper_probe("overwrite:3", torch.zeros(4096))
    assert out[:128].eq(1).all()


def test_named_barriers_reduce_per_id_and_count(simt):
    """bar.red.or per warpgroup (ids 2 and 3, 128 threads each) gives each warpgroup its own OR, then bar.sync
    1, 256 meets all of them; a cp.async onto a wgmma's operand after its wait_group is allowed."""
    out = simt.hopper_probe("named:0", torch.zeros(4096))
    assert out[:128].eq(1).all() and out[128:256].eq(0).all()
    out = simt.hopper_probe("overwrite:0", torch.zeros(4096))
    assert out[:128].eq(1).all()


@pytest.mark.parametrize("name,message", MISUSE, ids=[m[0] for m in MISUSE])
def test_misuse_raises(simt, name, message):
    with pytest.raises(RuntimeError, match=message):
        simt.hopper_probe(name, torch.zeros(4096))


# ---------------------------------------------------------------------------------------------- the sm_90a gate


def test_hopper_gate_sass():
    """scripts/hopper_gate.py: hopper_tile.cu compiled for sm_90a has HGMMA, UTMALDG and SYNCS instructions and no
    local memory or spills (skips without nvcc or cuobjdump)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import hopper_gate

    if hopper_gate.nvcc_path() is None or hopper_gate.cuobjdump_path() is None:
        pytest.skip("needs nvcc (CUDA_HOME) and cuobjdump")
    report = hopper_gate.gate()
    assert hopper_gate.failures(report) == [], report
    tile = report["kernels"]["tile_kernel<bf16, 128, ss, QK>"]
    assert tile["HGMMA"] == 4 and tile["UTMALDG"] == 2 and tile["spill_bytes"] == 0


def test_the_tile_kernels_live_with_the_tests():
    """The early tile kernels are test code: tests/cpp/hopper_tile.cu, which the SIMT build and the sm_90a gate
    read; no source under csrc/ (the extension's source tree, setup.py's and the sdist's) holds them."""
    assert os.path.exists(os.path.join(ROOT, "tests", "cpp", "hopper_tile.cu"))
    for folder, _, files in os.walk(os.path.join(ROOT, "csrc")):
        for name in files:
            if name.endswith((".cu", ".h", ".cpp")):
                text = open(os.path.join(folder, name)).read()
                assert "namespace rangeswa::cuda::hopper_tile {" not in text, os.path.join(folder, name)
