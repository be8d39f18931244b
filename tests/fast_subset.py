"""Which tests make up the fast subset (`python -m pytest -q -m fast`, README "Test"): every test but those
that build the SIMT emulation or the host emulator (tests/cuda_emulator.py), run nvcc (the gates, the build
and package tests), are marked `slow` or `heavy` (a test that costs seconds of CPU or starts processes for
a check the subset makes more cheaply elsewhere, marked where it is defined, with its reason), sit in one of
the few modules of HEAVY_MODULES, or are a large case of tests/attn_cases.py's grids (`heavy_case`: the
grids keep their small cases and the smallest case of each method, regime and dtype). The rule reads the
test modules' own source and the cases' own sizes, so a new test or case lands in the right set without
anyone remembering a marker; tests/test_fast_subset.py holds it."""

import inspect
from functools import lru_cache
from pathlib import Path

from pytest import ParameterSet

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
    """A fixture from conftest.py (`simt`, and `emulator`, which takes it) that builds an emulator or runs nvcc."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in (info.name2fixturedefs.get(name, ()) if info else ()):
            source = inspect.getsource(fixturedef.func)
            for word in HEAVY_WORDS:
                if word in source:
                    return f"its fixture {name} names {word}"
    return None


#: The fields of a case of tests/attn_cases.py's grids (GRID, CAUSAL_GRID and the lists drawn from them).
CASE_FIELDS = {"name", "regime", "C", "L", "Hq"}
#: A grid case whose float64 reference has at most this many logits (query heads x query rows x keys) costs
#: well under a second: every such case stays (the native, SWA, tiny and short Self-Extend cases).
SMALL_LOGITS = 1 << 17
#: Paper-sized cases (more keys than this: L = 2101 at the paper's T = 1024) stay out even when they are the
#: smallest of their stratum: about 23 s of wall each on 2 shared cores (benchmarks/results/fast_tests_2026-12-06.md).
MAX_KEYS = 2048


def case_logits(case) -> int:
    """The size of a grid case's dense reference: query heads x query rows (control rows and the Lq body rows
    a cached call holds, all L without) x keys."""
    keys = case["C"] + case["L"]
    return case["Hq"] * (case["C"] + case.get("Lq", case["L"])) * keys


def case_stratum(case, dtype) -> tuple:
    """What a case stands for in the fast subset: its method, its regime and the inputs' dtype."""
    return case["name"], case["regime"], str(dtype)


def _grid_case(item):
    """(parameter name, case) when `item` runs a case of tests/attn_cases.py's grids, else None."""
    for name, value in getattr(getattr(item, "callspec", None), "params", {}).items():
        if isinstance(value, dict) and CASE_FIELDS <= value.keys():
            return name, value
    return None


def _parametrized_values(item, argname):
    """Every value the test's own parametrize list gives `argname` (the whole grid, whatever was collected)."""
    for mark in item.iter_markers("parametrize"):
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if argname in names:
            index = names.index(argname)
            rows = [v.values if isinstance(v, ParameterSet) else v for v in mark.args[1]]
            return [row[index] if len(names) > 1 else row for row in rows]
    return []


def heavy_case(item):
    """Why a grid case stays out of the fast subset, or None: a case stays when it is small (SMALL_LOGITS) or the
    smallest of its stratum (`case_stratum`) in the test's grid, and never when it is paper-sized (MAX_KEYS).
    So each test over a grid keeps every method, regime and dtype it covers, on its cheapest case."""
    found = _grid_case(item)
    if found is None:
        return None
    argname, case = found
    dtype = item.callspec.params.get("dtype", "torch.float32")
    if case["C"] + case["L"] > MAX_KEYS:
        return f"a paper-sized case ({case['C'] + case['L']} keys)"
    if case_logits(case) <= SMALL_LOGITS:
        return None
    stratum = case_stratum(case, dtype)
    peers = [c for c in _parametrized_values(item, argname)
             if isinstance(c, dict) and case_stratum(c, dtype) == stratum and c["C"] + c["L"] <= MAX_KEYS]
    smallest = min(peers, key=case_logits, default=case)
    if smallest == case:
        return None
    return f"a large case of its grid ({case_logits(case)} logits; {stratum[:2]} runs on a smaller one)"


def heavy_reason(item):
    """Why `item` stays out of the fast subset, or None when it belongs there."""
    if item.get_closest_marker("slow") is not None:
        return "marked slow"
    heavy = item.get_closest_marker("heavy")
    if heavy is not None:
        return "marked heavy: " + " ".join(map(str, heavy.args))
    return _module_reason(Path(item.path)) or _fixture_reason(item) or heavy_case(item)
