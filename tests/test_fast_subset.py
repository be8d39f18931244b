"""The fast subset (`python -m pytest -q -m fast`, tests/fast_subset.py) collected as a developer runs it, and
held to its rule by other means than the rule's own code: no test from a module that imports
tests/cuda_emulator.py or calls nvcc, none that takes a conftest fixture building an emulator, none marked
`slow`, none from tests/test_package.py; and the checks a developer's loop needs are all in it. This module
names nvcc itself, so it runs with the full suite (CI), not in the subset it guards."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Loaded into the collecting pytest with -p: writes each selected test's module, fixtures and markers.
RECORDER = '''
import json, os

def pytest_collection_finish(session):
    rows = [{"module": item.path.name, "fixtures": list(item.fixturenames),
             "markers": [m.name for m in item.iter_markers()]} for item in session.items]
    with open(os.environ["FAST_SUBSET_RECORD"], "w", encoding="utf-8") as f:
        json.dump(rows, f)
'''


def _imports_emulator(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "cuda_emulator" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "cuda_emulator":
            return True
    return False


def _emulator_fixtures():
    """The conftest fixtures whose body imports tests/cuda_emulator.py."""
    tree = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and any("fixture" in ast.unparse(d) for d in node.decorator_list) and _imports_emulator(node)}


@pytest.fixture(scope="module")
def fast_rows(tmp_path_factory):
    """Each test of the fast subset, collected by a separate pytest as `python -m pytest -q -m fast` does."""
    tmp_path = tmp_path_factory.mktemp("fast_subset")
    (tmp_path / "fast_recorder.py").write_text(RECORDER, encoding="utf-8")
    record = tmp_path / "record.json"
    env = dict(os.environ, FAST_SUBSET_RECORD=str(record),
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "fast",
                           "-p", "fast_recorder", "-p", "no:cacheprovider", str(TESTS)],
                          cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(record.read_text(encoding="utf-8"))


def test_fast_subset_leaves_out_the_emulators_nvcc_packages_and_slow_tests(fast_rows):
    heavy_modules = {path.name for path in TESTS.glob("test_*.py")
                     if _imports_emulator(ast.parse(path.read_text(encoding="utf-8")))
                     or "nvcc" in path.read_text(encoding="utf-8")}
    fixtures = _emulator_fixtures()
    assert {"test_simt.py", "test_cuda_gates.py", "test_cuda_plan.py"} <= heavy_modules  # the rule sees them
    assert fixtures == {"emulator"}
    for row in fast_rows:
        assert row["module"] not in heavy_modules | {"test_package.py"}, row
        assert not fixtures & set(row["fixtures"]), row
        assert "slow" not in row["markers"], row


def test_fast_subset_keeps_the_checks_of_an_edit_test_loop(fast_rows):
    """The reference, the CPU ops against it, the methods, each backbone's parity fixtures, the command
    line's refusals and the docs checks."""
    modules = {row["module"] for row in fast_rows}
    needed = {"test_reference.py", "test_ops_cpu.py", "test_methods.py", "test_elf_parity.py", "test_langflow.py",
              "test_llada.py", "test_dream.py", "test_cola.py", "test_cli.py", "test_bad_inputs.py",
              "test_docs.py", "test_api_doc.py"}
    assert needed <= modules, sorted(needed - modules)
