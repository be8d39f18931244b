"""What the CUDA attention kernels compute, bit for bit, against the committed digest
(benchmarks/results/simt_digest.json, written by scripts/simt_digest.py).

The SIMT emulation (tests/cuda_emulator.py) runs both body kernels' own source over the digest's grid (every
dtype, every head dim, the hard regimes, the causal pair, the run-time switches, a packed call) and hashes each
call's out and lse. A reshaping of csrc/cuda must leave every hash as it is; a change meant to change the numbers
rewrites the digest (`python scripts/simt_digest.py`) in the same commit. About 2 minutes on 2 cores.
"""

import importlib.util
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _digest_module():
    spec = importlib.util.spec_from_file_location("simt_digest", ROOT / "scripts" / "simt_digest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_comparison_names_every_difference():
    digest = _digest_module()
    assert digest.compare({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "9", "d": "4"}) == [
        "differs: b: 2 -> 9", "gone: c", "new: d"]
    assert digest.compare({"a": "1"}, {"a": "1"}) == []
    one = (torch.zeros(2, 3), torch.ones(2))
    assert digest.fingerprint(one) == digest.fingerprint(tuple(t.clone() for t in one))
    bumped = one[0].clone()
    bumped[1, 2] = torch.nextafter(torch.tensor(0.0), torch.tensor(1.0))  # one ulp of one element
    assert digest.fingerprint((bumped, one[1])) != digest.fingerprint(one)
    assert digest.fingerprint((one[0].bfloat16(), one[1])) != digest.fingerprint(one)


def test_simt_outputs_match_the_committed_digest():
    """Runs the whole digest (cuda_emulator builds the SIMT from this checkout)."""
    digest = _digest_module()
    expected = json.loads(digest.DIGEST.read_text())["calls"]
    got = digest.compute(progress=False)
    assert not any(v.startswith("error") for v in expected.values()), "the digest's grid should run every call"
    diff = digest.compare(expected, got)
    assert not diff, f"{len(diff)} of {len(expected)} SIMT calls changed:\n" + "\n".join(diff[:20])
