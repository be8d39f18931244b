"""The shape of csrc/cuda (issue 51, docs/cuda.md "Layers and data flow"): common/ holds what both body kernels
use, sm80/ and sm90/ each one body kernel and include nothing of each other, and no file is over 700 lines."""

import re
from pathlib import Path

CUDA = Path(__file__).resolve().parents[1] / "csrc" / "cuda"
MAX_LINES = 700
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(folder: Path):
    return sorted(p for p in folder.rglob("*") if p.suffix in (".h", ".cu", ".cpp"))


def included(path: Path) -> set[Path]:
    """The files csrc/cuda/`path` includes by a quoted name, resolved as the compiler does (its own folder,
    then csrc/)."""
    out = set()
    for name in INCLUDE.findall(path.read_text(encoding="utf-8")):
        for base in (path.parent, CUDA.parent):
            if (base / name).exists():
                out.add((base / name).resolve())
                break
    return out


def test_no_file_over_700_lines():
    """Every source of csrc/cuda: the kernels, the op, both emulations (simt/, emulator/)."""
    assert len(sources(CUDA / "simt")) > 10 and sources(CUDA / "emulator")
    long = {str(p.relative_to(CUDA)): n for p in sources(CUDA) for n in [p.read_text(encoding="utf-8").count("\n")]
            if n > MAX_LINES}
    assert long == {}


def test_each_body_kernel_includes_nothing_of_the_other():
    folders = {name: (CUDA / name).resolve() for name in ("common", "sm80", "sm90")}
    assert all(f.is_dir() and sources(f) for f in folders.values())
    forbidden = {"common": ("sm80", "sm90"), "sm80": ("sm90",), "sm90": ("sm80",)}
    for name, folder in folders.items():
        for path in sources(folder):
            for dep in included(path):
                for other in forbidden[name]:
                    assert folders[other] not in dep.parents, f"{path.relative_to(CUDA)} includes {dep}"


def test_the_include_scan_resolves():
    """included() on a file it must read right (so the check above cannot pass by seeing nothing)."""
    deps = included(CUDA / "sm90" / "body_kernel.h")
    assert (CUDA / "sm90" / "consumer.h").resolve() in deps and (CUDA / "plan.h").resolve() in deps
    assert (CUDA / "sm80" / "mainloop.h").resolve() in included(CUDA / "sm80" / "attn_launch.h")
