"""Which tests make up the fast subset (`python -m pytest -q -m fast`, README "Test"): every test but those
that build the SIMT emulation or the host emulator (tests/cuda_emulator.py), run nvcc (the gates, the build
and package tests), are marked `slow`, or sit in one of the few modules of HEAVY_MODULES. The rule reads the
test modules' own source, so a new test lands in the right set without anyone remembering a marker;
tests/test_fast_subset.py holds it."""

import inspect
from functools import lru_cache
from pathlib import Path

#: Source that names one of these builds the emulators or runs nvcc.
HEAVY_WORDS = ("cuda_emulator", "nvcc")
#: Modules that build, compile, train or start processes: each took 10 s to a minute and more of the fast run
#: on 2 shared cores (benchmarks/results/fast_tests_2026-12-06.md), more than a developer's loop can afford.
HEAVY_MODULES = {
    "test_package.py": "builds packages (sdist, wheel, fresh venvs)",
    "test_cpp_rules.py": "builds the C++ rule tests with CMake",
    "test_bench.py": "runs the benchmark commands, each instruction set in its own process",
    "test_bench_gpu.py": "runs the GPU benchmark's runner and correctness slice on the CPU",
    "test_compile.py": "compiles models with torch.compile",
    "test_cpu_dispatch.py": "starts a process per instruction set",
    "test_distributed.py": "starts torchrun",
    "test_flex_peer.py": "runs the GPU benchmark's FlexAttention peer eagerly on the CPU",
    "test_generate.py": "runs rangeswa generate end to end in processes of its own",
    "test_judge.py": "runs the judge end to end on tiny causal LMs, also under torchrun",
    "test_mini.py": "trains the miniature and runs rangeswa demo --quick",
}


@lru_cache(maxsize=None)
def _module_reason(path: Path):
    if path.name in HEAVY_MODULES:
        return HEAVY_MODULES[path.name]
    text = path.read_text(encoding="utf-8")
    for word in HEAVY_WORDS:
        if word in text:
            return f"its module names {word}"
    return None


def _fixture_reason(item):
    """A fixture from conftest.py (the `emulator` fixture) that builds an emulator or runs nvcc."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in (info.name2fixturedefs.get(name, ()) if info else ()):
            source = inspect.getsource(fixturedef.func)
            for word in HEAVY_WORDS:
                if word in source:
                    return f"its fixture {name} names {word}"
    return None


def heavy_reason(item):
    """Why `item` stays out of the fast subset, or None when it belongs there."""
    if item.get_closest_marker("slow") is not None:
        return "marked slow"
    return _module_reason(Path(item.path)) or _fixture_reason(item)
