"""The CUDA op's run-time switches and its choice of kernel each have one home (csrc/cuda/api/config.h):
the switches (RANGESWA_CUDA_*) are read in one function, overrides_from_env, and listed in that header's
comment; the configuration is decided in one function, choose_config, which the op (attn_api.cpp) and both
emulations (emulator/host_call.h, the SIMT emulation through it) call. The SIMT emulation's own switch
(RANGESWA_SIMT_THREADS, csrc/cuda/simt/) is its own. choose_config's decisions against the ones it replaced:
tests/cpp/test_config.cpp (run by test_cpp_rules.py)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CUDA = ROOT / "csrc" / "cuda"
CONFIG = CUDA / "api" / "config.h"


def _sources():
    """Every source of csrc/cuda but the SIMT emulation's, with its text."""
    for path in sorted(CUDA.rglob("*")):
        if path.suffix in (".h", ".cpp", ".cu") and "simt" not in path.relative_to(CUDA).parts:
            yield path, path.read_text()


def _code(text: str) -> str:
    """The text without its line comments (each comment's characters blanked, offsets kept)."""
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)


def _body(text: str, signature: str) -> tuple[int, int]:
    """The span of the braces of the function whose definition starts with `signature`."""
    start = text.index(signature)
    open_at = text.index("{", start)
    depth = 0
    for at in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return open_at, at
    raise AssertionError(f"unbalanced braces after {signature}")


def test_switches_are_read_in_one_function():
    config = CONFIG.read_text()
    lo, hi = _body(config, "inline Overrides overrides_from_env()")
    reads = []
    for path, text in _sources():
        for m in re.finditer(r"\bgetenv\b", text):
            reads.append((path, m.start()))
    assert reads, "no getenv under csrc/cuda: the switches are gone, or the search is wrong"
    for path, at in reads:
        assert path == CONFIG and lo < at < hi, f"{path.relative_to(ROOT)} reads the environment outside overrides_from_env"
    # A switch's name as a whole string literal (what getenv takes) appears in overrides_from_env alone.
    for path, text in _sources():
        for m in re.finditer(r'"(RANGESWA_CUDA_[A-Z_]+)"', text):
            assert path == CONFIG and lo < m.start() < hi, (
                f"{path.relative_to(ROOT)} names the switch {m.group(1)} outside overrides_from_env")


def test_every_switch_is_listed_in_the_header():
    config = CONFIG.read_text()
    lo, hi = _body(config, "inline Overrides overrides_from_env()")
    names = set(re.findall(r'"(RANGESWA_CUDA_[A-Z_]+)"', config[lo:hi]))
    assert len(names) == 7, names
    listing = config[: config.index("#pragma once")]
    for name in names:
        assert re.search(rf"^//\s+{name}=", listing, re.M), f"{name} is read but not listed in config.h's comment"


def test_the_configuration_is_chosen_in_one_function():
    definitions, callers = [], set()
    for path, text in _sources():
        code = _code(text)
        for m in re.finditer(r"\bchoose_config\(", code):
            line = code[code.rfind("\n", 0, m.start()) + 1 : m.start()]
            if "inline Config" in line:
                definitions.append(path)
            else:
                callers.add(path.relative_to(CUDA).as_posix())
    assert definitions == [CONFIG]
    assert callers == {"attn_api.cpp", "emulator/host_call.h"}, callers
    # The SIMT emulation sets its calls up through host_call.h's emulated_setup (the same choose_config).
    simt = {p.name: _code(p.read_text()) for p in (CUDA / "simt").iterdir() if p.suffix in (".cpp", ".h")}
    assert "emulated_setup(" in simt["simt_attn_ops.h"]
    assert not [name for name, code in simt.items() if "choose_config(" in code]
    # The plan's KV tile comes from the configuration alone.
    for path, text in _sources():
        if path not in (CONFIG, CUDA / "kernel_traits.h"):
            assert "body_tile_cols(" not in _code(text), f"{path.relative_to(ROOT)} chooses a KV tile itself"
