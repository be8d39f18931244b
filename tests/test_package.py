"""The package as a user gets it: an sdist holding every source whatever the environment that makes it,
a wheel built from that sdist, pinned to the torch it was built with, installed into a fresh virtual
environment, running `rangeswa demo --quick` there; and the build's CUDA targets (PTX for newer GPUs).

The wheel test builds the CPU kernels only (RANGESWA_CPU_ONLY=1, about 2 minutes on 2 cores) and reuses
this interpreter's torch and packages (a venv, a conda environment or a system Python alike) through a fresh
venv whose .pth file names this interpreter's package folders.
"""

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".h", ".cuh", ".hpp", ".cpp", ".cc", ".cu")


def _setup_module():
    """setup.py as a module (its `setup()` call runs only as __main__)."""
    spec = importlib.util.spec_from_file_location("rangeswa_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(**changes) -> dict:
    """This environment without anything that points Python at the checkout, plus ``changes``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(changes)
    return env


def _run(args, cwd, env, timeout=900) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """The sdist, made with RANGESWA_CPU_ONLY=1 set (it must still hold the CUDA sources)."""
    out = tmp_path_factory.mktemp("sdist")
    _run([sys.executable, "setup.py", "-q", "sdist", "-d", out], REPO, _env(RANGESWA_CPU_ONLY="1"))
    (archive,) = out.glob("rangeswa-*.tar.gz")
    return archive


def test_sdist_holds_every_source_header_and_data_file(sdist):
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    root = names[0].split("/")[0]
    inside = {name.removeprefix(root + "/") for name in names}
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "csrc").rglob("*") if p.suffix in SOURCE_SUFFIXES}
    assert any(s.endswith(".cu") for s in sources) and any(s.endswith(".h") for s in sources)
    assert sorted(sources - inside) == []
    package = REPO / "python" / "rangeswa_ext"
    data = {p.relative_to(REPO).as_posix() for folder in ("mini/data", "eval/data")
            for p in (package / folder).rglob("*") if p.is_file()}
    assert data and sorted(data - inside) == []
    assert {"LICENSE", "README.md", "docs/spec.md", "setup.py", "pyproject.toml", "CMakeLists.txt"} <= inside
    assert not [n for n in inside if n.endswith((".so", ".o", ".pyc"))]
    with tarfile.open(sdist) as tar:
        info = tar.extractfile(f"{root}/PKG-INFO").read().decode()
    assert "Requires-Dist: torch>=2.6" in info  # the sdist takes any torch; what is built from it is pinned


def test_wheels_and_installs_require_the_torch_they_were_built_with():
    setup = _setup_module()
    rest = ["numpy", "tqdm", "tomli; python_version < '3.11'"]
    assert setup.dependencies(["bdist_wheel"], "2.14.1+cu130") == ["torch==2.14.1", *rest]
    assert setup.dependencies(["editable_wheel"], "2.15.0.dev20260101") == ["torch==2.15.0.dev20260101", *rest]
    assert setup.dependencies(["sdist", "--formats", "gztar"], "2.14.1") == ["torch>=2.6", *rest]


def test_cuda_targets_embed_ptx_of_the_newest_portable_architecture():
    flags = _setup_module().cuda_gencode_flags
    assert flags("90a;80") == ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=sm_80",
                               "-gencode=arch=compute_80,code=compute_80"]
    assert flags("8.0, 9.0, 12.0")[-1] == "-gencode=arch=compute_120,code=compute_120"
    assert not [f for f in flags("90a") if "code=compute" in f]  # sm_90a's PTX would run on sm_90a only
    for bad in ("", "sm_90", "90b;80"):
        with pytest.raises(ValueError, match="RANGESWA_CUDA_ARCHS"):
            flags(bad)


def test_the_extras_a_command_names_are_those_of_pyproject():
    """`arguments.EXTRAS` (what a missing-package error tells to install) against pyproject.toml's extras."""
    import tomllib

    from rangeswa_ext.arguments import COMMAND_EXTRAS, DISTRIBUTIONS, EXTRAS

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = {re.split(r"[<>=;\[ ]", requirement, maxsplit=1)[0] for requirement in declared[extra]}
        assert {DISTRIBUTIONS.get(m, m) for m in modules} <= names, extra
    assert set(COMMAND_EXTRAS.values()) <= set(declared)


def _imported_modules(folder: Path) -> dict:
    """Top-level module -> the files of ``folder`` that import it (absolute imports, at any depth of the code)."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(path.relative_to(REPO).as_posix())
    return found


def _third_party(found: dict) -> dict:
    """``found`` less the standard library and the project's own modules (the package, and the files of
    tests/, scripts/ and benchmarks/ that tests put on sys.path)."""
    own = {"rangeswa_ext"} | {p.stem for folder in ("tests", "scripts", "benchmarks") for p in (REPO / folder).glob("*.py")}
    return {m: files for m, files in found.items() if m not in sys.stdlib_module_names and m not in own}


def test_every_imported_package_is_a_dependency_or_in_an_extra_that_names_it():
    """A fresh environment with the README's install has every package an import of python/ or tests/ needs:
    the core requirements (setup.py), or an extra of `arguments.EXTRAS` for the package, `[test]` for the tests
    (a package that one machine happens to have once hid a missing `hypothesis`)."""
    from rangeswa_ext.arguments import EXTRAS

    core = {"torch"} | {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0] for r in _setup_module().REQUIREMENTS}
    package = _third_party(_imported_modules(REPO / "python"))
    unprovided = {m: sorted(f) for m, f in package.items() if m not in core and not any(m in v for v in EXTRAS.values())}
    assert unprovided == {}, "imported by the package but in no extra of arguments.EXTRAS"
    tests = _third_party(_imported_modules(REPO / "tests"))
    untested = {m: sorted(f) for m, f in tests.items() if m not in core and m not in EXTRAS["test"]}
    assert untested == {}, "imported by the tests but not in the [test] extra (arguments.EXTRAS['test'])"
    assert "hypothesis" in tests and "transformers" in package  # the scan sees what it must


@pytest.mark.skipif(not (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc").exists(),
                    reason="no nvcc: the CUDA toolkit is not installed")
def test_nvcc_puts_those_targets_in_the_fat_binary(tmp_path):
    """nvcc's own plan (--dryrun) for the default list: SASS for sm_90a and sm_80, PTX for compute_80 only."""
    nvcc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    kernel = tmp_path / "k.cu"
    kernel.write_text("__global__ void twice(float* x) { x[threadIdx.x] *= 2.f; }\n")
    done = _run([nvcc, "-c", kernel, "-o", tmp_path / "k.o", "--dryrun",
                 *_setup_module().cuda_gencode_flags("90a;80")], tmp_path, _env())
    images = sorted(part.split(",file=")[0] for part in (done.stdout + done.stderr).split('"--image3=')[1:])
    assert images == ["kind=elf,sm=80", "kind=elf,sm=90a", "kind=ptx,sm=80"]


def _venv_seeing_this_environment(venv: Path, cwd: Path) -> Path:
    """A fresh venv at ``venv`` that also sees, after its own, the packages of this interpreter (torch, pip,
    setuptools, the extras), whatever this interpreter is: a virtual environment, a conda environment or a
    system Python. A .pth file in the venv's site-packages names this interpreter's package folders
    (`venv --system-site-packages` would see the base interpreter's, not those of an active venv). Plain
    folders, not the .pth files inside them: an editable install of the checkout stays invisible."""
    # --without-pip: the venv uses this interpreter's pip and setuptools (the bundled ones are older).
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd, _env())
    python = venv / "bin" / "python"
    own = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd, _env()).stdout.strip()
    outer = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    assert outer, f"no package folder on this interpreter's sys.path: {sys.path}"
    (Path(own) / "outer_environment.pth").write_text("".join(f"{p}\n" for p in outer))
    return python


@pytest.mark.slow
def test_a_wheel_built_from_the_sdist_installs_and_runs_the_demo(sdist, tmp_path):
    """sdist -> wheel (CPU kernels) -> a fresh venv -> `rangeswa --version` and `rangeswa demo --quick`,
    run outside the checkout so that only the installed package can be imported."""
    venv = tmp_path / "venv"
    python = _venv_seeing_this_environment(venv, tmp_path)
    build_env = _env(RANGESWA_CPU_ONLY="1", MAX_JOBS=str(min(4, os.cpu_count() or 1)))
    _run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-cache-dir", "-q", "-w",
          tmp_path / "wheels", sdist], tmp_path, build_env, timeout=1500)
    (wheel,) = (tmp_path / "wheels").glob("rangeswa-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
                   for n in archive.namelist())
    assert f"Requires-Dist: torch=={torch.__version__.split('+')[0]}\n" in metadata
    # --no-index: the [demo] extra must be satisfied by what is installed, the torch pin by this torch.
    _run([python, "-m", "pip", "install", "--no-index", "-q", f"{wheel}[demo]"], tmp_path, _env())
    where = _run([python, "-c", "import rangeswa_ext; print(rangeswa_ext.__file__)"], tmp_path, _env()).stdout
    assert Path(where.strip()).is_relative_to(venv)
    rangeswa = venv / "bin" / "rangeswa"
    version = _run([rangeswa, "--version"], tmp_path, _env()).stdout
    assert version.startswith("rangeswa 0.1.0") and "CPU kernels" in version
    _run([rangeswa, "demo", "--quick", "--out", tmp_path / "demo", "--no-progress"], tmp_path, _env())
    report = (tmp_path / "demo" / "demo.md").read_text()
    assert "| RangeSWA-Lite |" in report and (tmp_path / "demo" / "figures" / "elf-mini.png").is_file()
    shutil.rmtree(venv)
