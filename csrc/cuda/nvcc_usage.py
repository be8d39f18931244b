"""nvcc with ptxas's resource usage kept: ``python nvcc_usage.py NVCC ARGS...`` runs ``NVCC ARGS... -Xptxas=-v``,
writes one line per kernel instantiation and architecture (registers, spill stores and loads) to
``$RANGESWA_PTXAS_DIR/<object file name>.txt`` and passes nvcc's other output through, so the build log stays as it
was. setup.py points torch's PYTORCH_NVCC at this script and gathers the files into the package's
kernel_usage.txt, which `rangeswa check` prints."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '([^']+)'")
SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"ptxas info\s*: Used (\d+) registers")
PROPERTIES = re.compile(r"ptxas info\s*: Function properties for (\S+)")


def summarize(stderr: str) -> tuple[list[str], str]:
    """(one line per entry function: ``arch function: N registers, S bytes spill stores, L bytes spill loads``,
    the rest of nvcc's output without ptxas's info lines)."""
    usage, rest = [], []
    entry = arch = None
    spills = ("0", "0", "0")
    properties_of = None
    for line in stderr.splitlines(keepends=True):
        if m := ENTRY.search(line):
            entry, arch, spills = m.group(1), m.group(2), ("0", "0", "0")
        elif m := PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := SPILLS.search(line)) and properties_of == entry:
            spills = m.groups()
        elif (m := USED.search(line)) and entry is not None:
            usage.append(f"{arch} {entry}: {m.group(1)} registers, {spills[1]} bytes spill stores, "
                         f"{spills[2]} bytes spill loads, {spills[0]} bytes stack")
            entry = None
        elif not line.startswith("ptxas info") and not SPILLS.search(line):
            rest.append(line)
    return demangled(usage), "".join(rest)


def demangled(lines: list[str]) -> list[str]:
    """The lines with their C++ names demangled by c++filt where it is on PATH."""
    if not lines or shutil.which("c++filt") is None:
        return lines
    done = subprocess.run(["c++filt"], input="\n".join(lines), capture_output=True, text=True)
    return done.stdout.splitlines() if done.returncode == 0 else lines


def main(argv: list[str]) -> int:
    nvcc, args = argv[0], argv[1:]
    done = subprocess.run([nvcc, *args, "-Xptxas=-v"], stderr=subprocess.PIPE, text=True)
    usage, rest = summarize(done.stderr)
    sys.stderr.write(rest)
    folder = os.environ.get("RANGESWA_PTXAS_DIR")
    if folder and usage and "-o" in args:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, os.path.basename(args[args.index("-o") + 1]) + ".txt"), "w") as f:
            f.write("\n".join(usage) + "\n")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
