"""The docs hold in a clone: every "SPEC section N" cited anywhere names a section of docs/spec.md (the
project's SPEC), nothing points outside the repository for it, docs/spec.md keeps in step with the SPEC
it was brought in from (where that source sits beside the checkout), the README's install and test
commands are the ones CI runs, and every `rangeswa ...` command quoted in the README and docs/ parses."""

import os
import re
import shlex
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "spec.md"
TEXT_SUFFIXES = {".py", ".md", ".h", ".cpp", ".cu", ".cuh", ".sh", ".toml", ".txt", ".in", ""}
SKIPPED_DIRS = {".git", "build", "dist", "runs", "__pycache__", "fixtures", "data", "results", "images"}
# "SPEC section 7", "SPEC sections 1-4 and 7", "SPEC (docs/spec.md) section 6", "SPEC rule 3", across a line break.
CITATION = re.compile(r"SPEC(?:\s+\(docs/spec\.md\))?\s+(sections?|rules?)\s+(\d+(?:\s*(?:-|,|and)\s*\d+)*)")


def repository_texts():
    """(path relative to the checkout, text) of every source and document of the checkout."""
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder) / name
            if path.suffix in TEXT_SUFFIXES and path.stat().st_size < 2_000_000:
                try:
                    yield path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    continue


def numbers(listed: str) -> set[int]:
    """{1, 2, 3, 4, 7} of "1-4 and 7"."""
    found = set()
    for part in re.split(r"\s*(?:,|and)\s*", listed):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def spec_sections() -> tuple[set[int], set[int]]:
    """The section numbers of docs/spec.md and the rule numbers of its section 2."""
    text = SPEC.read_text(encoding="utf-8")
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", text, flags=re.M)}
    section2 = text.split("\n## 2. ")[1].split("\n## ")[0]
    rules = {int(n) for n in re.findall(r"^(\d+)\. \*\*", section2, flags=re.M)}
    return sections, rules


def test_every_spec_citation_names_a_section_of_docs_spec_md():
    sections, rules = spec_sections()
    assert sections == set(range(1, 8)) and rules == set(range(1, 6))
    cited, unknown = 0, []
    for path, text in repository_texts():
        for match in CITATION.finditer(text):
            cited += 1
            known = rules if match.group(1).startswith("rule") else sections
            missing = sorted(numbers(match.group(2)) - known)
            if missing:
                line = text.count("\n", 0, match.start()) + 1
                unknown.append(f"{path}:{line}: {' '.join(match.group(0).split())} (no {missing})")
    assert cited > 40  # the tree cites SPEC sections in dozens of places; fewer means the scan went wrong
    assert unknown == []


def test_nothing_points_outside_the_repository_for_the_spec():
    outside = "SPEC" + ".md"  # spelled apart so this file does not match itself
    found = [f"{path}:{text.count(chr(10), 0, m.start()) + 1}" for path, text in repository_texts()
             for m in re.finditer(re.escape(outside) + "|" + re.escape("../" + "shared/"), text)]
    assert found == []
    assert "[SPEC](docs/spec.md)" in (REPO / "README.md").read_text(encoding="utf-8")


def spec_source() -> Path | None:
    """The SPEC that docs/spec.md was brought in from: RANGESWA_SPEC_SOURCE, else the one in shared/ beside the
    checkout (where the project keeps it; CI lays a copy there)."""
    given = os.environ.get("RANGESWA_SPEC_SOURCE")
    candidate = Path(given) if given else REPO.parent / "shared" / ("SPEC" + ".md")
    return candidate if candidate.is_file() else None


@pytest.mark.skipif(spec_source() is None, reason="no SPEC source beside this checkout (a clone without shared/)")
def test_docs_spec_md_keeps_in_step_with_its_source():
    """Sections 1-7 word for word; only the opening paragraph is the project's own (it names this file)."""
    def sections(text: str) -> str:
        return text[text.index("## 1. "):]

    assert sections(SPEC.read_text(encoding="utf-8")) == sections(spec_source().read_text(encoding="utf-8"))


def fenced(text: str, heading: str) -> str:
    """The first ```bash block after the line ``heading``."""
    after = text.split(f"\n{heading}\n", 1)[1]
    return after.split("```bash\n", 1)[1].split("```", 1)[0].strip()


def test_the_readme_install_and_test_commands_are_what_ci_runs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    install, test = fenced(readme, "## Install"), fenced(readme, "## Test")
    assert run.split("# README: install\n", 1)[1].split("\n", 1)[0] == install
    assert run.split("# README: test\n", 1)[1].split("\n", 1)[0] == test == "python -m pytest -q"
    assert "cutlass" not in install  # nothing includes CUTLASS
    # A stranger's machine: a fresh virtual environment of its own (no system site packages), active before
    # the install, so that a package this machine happens to have cannot stand in for a missing dependency.
    before_install = run.split("# README: install\n", 1)[0]
    assert re.search(r"^python3? -m venv \"\$venv\"$", before_install, re.M), "CI makes no fresh venv"
    assert "--system-site-packages" not in run
    assert re.search(r'^\. "\$venv/bin/activate"$', before_install, re.M), "CI does not activate its venv"


def quoted_commands():
    """Every `rangeswa ...` (or `... -m rangeswa_ext.cli ...`) line of a bash block in the README and docs/,
    continuation lines joined and comments cut; lines with placeholders (``...``, ``[``) left out."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if "rangeswa_ext.cli" in words:
                    argv = words[words.index("rangeswa_ext.cli") + 1:]
                elif words[:1] == ["rangeswa"]:
                    argv = words[1:]
                else:
                    continue
                if not any("..." in w or w.startswith("[") for w in argv):
                    yield pytest.param(argv, id=f"{doc.name}:{' '.join(argv[:2])}")


@pytest.mark.parametrize("argv", list(quoted_commands()))
def test_every_quoted_command_parses(argv, tmp_path, monkeypatch):
    """Each quoted command is accepted by today's parser (as on a machine with GPUs and CUDA kernels)."""
    from rangeswa_ext import ops
    from rangeswa_ext.cli import build_parser

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(ops, "CUDA_KERNELS", True)
    args = build_parser().parse_args(argv)
    assert args.command == argv[0]
