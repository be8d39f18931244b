"""docs/cuda.md is the CUDA side's current design, not its diary: at most 400 lines, no dated entries (dated
results and predictions live in benchmarks/results/), and every file it names exists in the checkout."""

import glob
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "cuda.md"
MAX_LINES = 400
# Where a bare file name of the doc is looked for: the design names the CUDA files by their name under
# csrc/cuda/ and the reference's by theirs, as its tables say.
ROOTS = ["", "csrc", "csrc/cuda", "python/rangeswa_ext/reference", "benchmarks", "benchmarks/results", "scripts",
         "tests"]
EXTENSIONS = ("h", "cu", "cpp", "py", "md", "json", "sh", "toml", "txt")
SUFFIX = "(?:" + "|".join(EXTENSIONS) + ")"
# A file (name.h, name.{h,cu}, name_*.json) or a folder (name/).
PATH = re.compile(r"^[\w./{},*-]+(?:\." + SUFFIX + r"|\.\{" + SUFFIX + r"(?:," + SUFFIX + r")*\}|/)$")
# A path written out in running text (outside backticks): it starts at one of the checkout's top folders.
PLAIN_PATH = re.compile(r"(?<![\w/.])(?:csrc|docs|tests|benchmarks|scripts|python)/[\w./{},*-]*[\w/}*]")


def expand_braces(word: str) -> list[str]:
    """["attn_hdim64_bf16.cu", ...] of "attn_hdim{64,80}_{bf16,fp16}.cu"."""
    match = re.search(r"\{([^{}]*)\}", word)
    if match is None:
        return [word]
    head, tail = word[:match.start()], word[match.end():]
    return [w for part in match.group(1).split(",") for w in expand_braces(head + part + tail)]


def named_paths(text: str) -> set[str]:
    """Every file or folder name the doc writes: the path-like words of its code spans, and the paths in its
    running text that start at a top folder of the checkout."""
    found = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        found.update(word.rstrip(",;:)") for word in span.split() if PATH.match(word.rstrip(",;:)")))
    found.update(m.group(0).rstrip(".") for m in PLAIN_PATH.finditer(re.sub(r"`[^`\n]+`", " ", text)))
    return found


def exists(name: str) -> bool:
    """Whether some root holds the name (every expansion of its braces; a glob matches at least one file)."""
    for root in ROOTS:
        base = REPO / root
        if all(glob.glob(str(base / w)) if "*" in w else (base / w).exists() for w in expand_braces(name)):
            return True
    return False


def test_the_cuda_doc_is_short():
    lines = DOC.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"docs/cuda.md has {lines} lines; the design fits in {MAX_LINES}"


def test_the_cuda_doc_holds_no_dated_entries():
    text = DOC.read_text(encoding="utf-8")
    dated = [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for m in re.finditer(r"\b(?:19|20)\d\d-\d\d(?:-\d\d)?\b", text)]
    assert dated == [], "dated entries belong in benchmarks/results/ (a cuda_log_*.md): " + ", ".join(dated)


def test_every_file_the_cuda_doc_names_exists():
    names = named_paths(DOC.read_text(encoding="utf-8"))
    assert len(names) > 40  # the doc names dozens of files; fewer means the scan went wrong
    assert sorted(n for n in names if not exists(n)) == []


def test_the_scan_sees_paths_and_braces():
    """The helpers above, on text they must read right (so the checks above cannot pass by seeing nothing)."""
    assert expand_braces("a{1,2}_{x,y}.h") == ["a1_x.h", "a1_y.h", "a2_x.h", "a2_y.h"]
    text = ("run `tile.h plan_spans` and `cp.async`; see docs/spec_decisions.md, `sm90/body_{gemm,kernel}.h` and "
            "`topk_blocks.{h,cu}`.")
    assert named_paths(text) == {"tile.h", "docs/spec_decisions.md", "sm90/body_{gemm,kernel}.h", "topk_blocks.{h,cu}"}
    assert exists("tile.h") and exists("sm90/body_{gemm,kernel}.h") and exists("cuda_gates_*.json")
    assert not exists("no_such_file.h") and not exists("sm90/body_{gemm,nothing}.h")
