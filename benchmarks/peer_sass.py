"""The peers' SASS counts the CUDA time model is calibrated on (issue 49), recorded as data with what produced
them: FlashAttention-2 as PyTorch's SDPA-flash runs it (its forward kernels read out of torch's own
libtorch_cuda.so, which anyone with the wheel can reproduce) and FlashAttention-3's forward kernel (compiled
for sm_90a from its public source, outside this repository, by the command recorded with its object files).

    python benchmarks/peer_sass.py --fa3-object 64=/tmp/fa3/fwd64.o --fa3-object 128=/tmp/fa3/fwd128.o \\
        --fa3-command "..." --fa3-commit <sha> [--out benchmarks/results/peer_sass_<date>.json]

Per kernel: its static SASS, and the cheapest trip around its tile loop that issues a whole tile's MMAs
(scripts/cuda_gates.py tile_path, the count the gates take of this project's kernels) with that trip's
histogram of opcodes (its MUFU, the exponentials' pipe, among them). FlashAttention-2: a 32-row warp's trip of a
tile (hdim 64: 128 x 128 tiles, hdim 128: 128 x 64, four warps a CTA); FlashAttention-3: a 16-row consumer
warp's trip of a tile (hdim 64: 192 x 192, three consumer warpgroups; hdim 128: 128 x 176, two) and its
producer warp's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import cuda_gates  # noqa: E402

# torch's FlashAttention-2 forward kernels (namespace pytorch_flash): Flash_fwd_kernel_traits<D, kBlockM,
# kBlockN, warps>, then <Is_dropout, Is_causal, Is_local, Has_alibi, Is_even_MN, Is_even_K, Is_softcap,
# Return_softmax> = no dropout, not causal, even sizes (what a bf16 call of B x H x L x D with L a multiple of
# the tiles takes).
FA2_KERNELS = {
    64: dict(name="Flash_kernel_traitsILi64ELi128ELi128ELi4ES3_EELb0ELb0ELb0ELb0ELb1ELb1ELb0ELb0E",
             block_m=128, block_n=128, warps=4),
    128: dict(name="Flash_kernel_traitsILi128ELi128ELi64ELi4ES3_EELb0ELb0ELb0ELb0ELb1ELb1ELb0ELb0E",
              block_m=128, block_n=64, warps=4),
}
# FlashAttention-3's forward tiles at bf16, not causal (hopper/tile_size.h tile_size_fwd_sm90): kBlockM x
# kBlockN, and its consumer warpgroups (kBlockM / 64) beside one producer warpgroup. Its instantiation holds the
# causal kernel too (192 x 128 at hdim 64, 128 x 128 at 128): `name` picks the other by its tile shape
# (CollectiveMainloopFwdSm90's cute::tuple<C<kBlockM>, C<kBlockN>, C<kHeadDim>> as mangled).
FA3_TILES = {64: dict(block_m=192, block_n=192, name="ILi192EEESA_NS7_ILi64EEEEEE"),
             128: dict(block_m=128, block_n=176, name="ILi128EEENS7_ILi176EEESA_EEE")}


def hmma_per_warp_tile(rows: int, keys: int, head_dim: int) -> int:
    """m16n8k16 MMAs of a warp's tile: Q K^T (rows x keys over head_dim) and P V (rows x head_dim over keys)."""
    return rows // 16 * keys // 8 * head_dim // 16 + rows // 16 * head_dim // 8 * keys // 16


def trip_record(sass: list, mma: int, **kw) -> dict:
    path = cuda_gates.tile_path(sass, mma, **kw)
    return dict(instructions=path["instructions"], mma=path["mma"], ops=path["ops"])


def fa2_counts(library: Path) -> dict:
    """FlashAttention-2's forward kernels at head dims 64 and 128 out of torch's library (its sm_90 cubins)."""
    out = {}
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([cuda_gates.cuobjdump_path(), "-arch", "sm_90", "-xelf", "all", str(library)], cwd=work,
                       check=True, capture_output=True)
        cubins = sorted(Path(work).glob("*.cubin"))
        for d, k in FA2_KERNELS.items():
            found = [c for c in cubins if k["name"].encode() in c.read_bytes()]
            if not found:
                raise RuntimeError(f"no sm_90 cubin of {library.name} holds FlashAttention-2's hdim {d} kernel")
            sass = cuda_gates.function_sass(str(found[0]), k["name"])
            rows = k["block_m"] // k["warps"]
            out[str(d)] = dict(k, static=len(sass), cubin=found[0].name,
                               trip=trip_record(sass, hmma_per_warp_tile(rows, k["block_n"], d)))
    return out


def fa3_counts(objects: dict[int, str]) -> dict:
    """FlashAttention-3's forward kernel of each compiled object: a consumer warp's trip (HGMMA m64nNk16 a warpgroup
    product: Q K^T head_dim / 16 of n = kBlockN, P V kBlockN / 16 of n = head_dim, so head_dim / 16 + kBlockN / 16
    HGMMA a tile), passing the pipeline's mbarriers (SYNCS), and the producer's trip (its TMA copies, UTMALDG)."""
    out = {}
    for d, obj in objects.items():
        t = FA3_TILES[d]
        sass = cuda_gates.function_sass(obj, ("FlashAttnFwdSm90", t["name"]))
        if not sass:
            raise RuntimeError(f"{obj}: no FlashAttnFwdSm90 kernel of a {t['block_m']} x {t['block_n']} tile in its SASS")
        hgmma = d // 16 + t["block_n"] // 16
        out[str(d)] = dict(t, object=Path(obj).name, static=len(sass), consumer_warpgroups=t["block_m"] // 64,
                           consumer=trip_record(sass, hgmma, copy_ops=("SYNCS",)),
                           producer=trip_record(sass, 2, copy_ops=("SYNCS",), count_ops=("UTMALDG",)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch-lib", default=None, help="libtorch_cuda.so (default: the imported torch's)")
    p.add_argument("--fa3-object", action="append", default=[], help="HEAD_DIM=PATH of a compiled FA3 object")
    p.add_argument("--fa3-command", default="", help="the command that compiled the FA3 objects (recorded)")
    p.add_argument("--fa3-commit", default="", help="the flash-attention commit compiled (recorded)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"
                                        / f"peer_sass_{datetime.date.today().isoformat()}.json"))
    args = p.parse_args(argv)
    if cuda_gates.cuobjdump_path() is None:
        print("peer_sass: no cuobjdump (CUDA toolkit or the triton package)", file=sys.stderr)
        return 2
    import torch

    library = Path(args.torch_lib or Path(torch.__file__).parent / "lib" / "libtorch_cuda.so")
    try:
        objects = {int(k): v for k, v in (s.split("=", 1) for s in args.fa3_object)}
    except ValueError:
        print("peer_sass: --fa3-object takes HEAD_DIM=PATH", file=sys.stderr)
        return 2
    record = dict(date=datetime.date.today().isoformat(),
                  fa2=dict(source=f"torch {torch.__version__}: {library.name}, sm_90 cubins (cuobjdump -xelf)",
                           kernels=fa2_counts(library)),
                  fa3=dict(commit=args.fa3_commit, command=args.fa3_command, kernels=fa3_counts(objects)))
    Path(args.out).write_text(json.dumps(record, indent=1))
    for name in ("fa2", "fa3"):
        for d, k in record[name]["kernels"].items():
            trip = k.get("trip") or k.get("consumer")
            print(f"{name} D={d}: static {k['static']}, a warp's trip {trip['instructions']} ({trip['mma']} MMA, "
                  f"{trip['ops'].get('MUFU', 0)} MUFU)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
