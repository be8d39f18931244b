"""The fast subset (`python -m pytest -q -m fast`, tests/fast_subset.py) collected as a developer runs it, and
held to its rule by other means than the rule's own code: no test from a module that imports
tests/cuda_emulator.py or calls nvcc, none that takes a conftest fixture building an emulator, none marked
`slow`, none from tests/test_package.py; the checks a developer's loop needs are all in it; the attention
grids keep a case of every method, regime and dtype and leave their paper-sized and largest cases out; and
the full run (CI's `python -m pytest -q`) still collects every case. This module names nvcc itself, so it
runs with the full suite (CI), not in the subset it guards."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import attn_cases

TESTS = Path(__file__).resolve().parent

# Loaded into the collecting pytest with -p: writes each test's module, function, fixtures and markers, the
# fields of the attention-grid case it runs (if any), and whether `-m fast` selected it or left it out.
RECORDER = '''
import json, os

DESELECTED = []

def pytest_deselected(items):
    DESELECTED.extend(items)

def row(item, fast):
    params = getattr(getattr(item, "callspec", None), "params", {})
    case = next((dict(v) for v in params.values() if isinstance(v, dict) and "regime" in v), None)
    if case is not None:
        case = {key: case.get(key) for key in ("name", "regime", "C", "L", "Hq", "Lq")}
        case["dtype"] = str(params.get("dtype", "torch.float32"))
    return {"module": item.path.name, "function": item.originalname, "fast": fast, "case": case,
            "fixtures": list(item.fixturenames), "markers": [m.name for m in item.iter_markers()]}

def pytest_collection_finish(session):
    rows = [row(item, True) for item in session.items] + [row(item, False) for item in DESELECTED]
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
def collected_rows(tmp_path_factory):
    """Each test of the suite, collected by a separate pytest as `python -m pytest -q -m fast` does, with
    `fast` true for those it selects."""
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


@pytest.fixture(scope="module")
def fast_rows(collected_rows):
    return [row for row in collected_rows if row["fast"]]


def test_fast_subset_leaves_out_the_emulators_nvcc_packages_slow_and_heavy_tests(collected_rows, fast_rows):
    heavy_modules = {path.name for path in TESTS.glob("test_*.py")
                     if _imports_emulator(ast.parse(path.read_text(encoding="utf-8")))
                     or "nvcc" in path.read_text(encoding="utf-8")}
    fixtures = _emulator_fixtures()
    assert {"test_simt.py", "test_cuda_gates.py", "test_cuda_plan.py"} <= heavy_modules  # the rule sees them
    assert fixtures == {"simt"}  # the session fixture that builds the emulation (`emulator` takes it)
    for row in fast_rows:
        assert row["module"] not in heavy_modules | {"test_package.py"}, row
        assert not fixtures & set(row["fixtures"]), row
        assert not {"slow", "heavy"} & set(row["markers"]), row
    assert any("heavy" in row["markers"] for row in collected_rows)  # still in the full run


def test_fast_subset_keeps_the_checks_of_an_edit_test_loop(fast_rows):
    """The reference, the CPU ops against it, the methods, each backbone's parity fixtures, the command
    line's refusals and the docs checks."""
    modules = {row["module"] for row in fast_rows}
    needed = {"test_reference.py", "test_ops_cpu.py", "test_methods.py", "test_elf_parity.py", "test_langflow.py",
              "test_llada.py", "test_dream.py", "test_cola.py", "test_cli.py", "test_bad_inputs.py",
              "test_docs.py", "test_api_doc.py"}
    assert needed <= modules, sorted(needed - modules)


def _keys(case):
    return case["C"] + case["L"]


def _logits(case):
    """Query heads x query rows x keys of a case's dense reference."""
    return case["Hq"] * (case["C"] + (case["Lq"] or case["L"])) * _keys(case)


def _grid_rows(rows, module, function):
    return [row for row in rows if row["module"] == module and row["function"] == function]


#: The tests that run tests/attn_cases.py's grids on the CPU kernel, and the grid each one runs.
GRID_TESTS = {("test_ops_cpu.py", "test_attn_matches_reference_fp32"): ("GRID", ("torch.float32",)),
              ("test_ops_cpu.py", "test_attn_low_precision_within_twice_the_same_dtype_reference"):
                  ("LOW_PRECISION", ("torch.bfloat16", "torch.float16")),
              ("test_causal.py", "test_attn_matches_reference_under_causal_blocks_and_suffixes"):
                  ("CAUSAL_GRID", ("torch.float32",))}


@pytest.mark.parametrize("module, function", sorted(GRID_TESTS))
def test_the_full_run_still_collects_every_case_of_each_grid(collected_rows, module, function):
    """The fast rule only marks: CI's `python -m pytest -q` collects every case of the grid in every dtype."""
    grid, dtypes = GRID_TESTS[module, function]
    rows = _grid_rows(collected_rows, module, function)
    assert len(rows) == len(getattr(attn_cases, grid)) * len(dtypes)
    assert {row["case"]["dtype"] for row in rows} == set(dtypes)
    ci = (TESTS.parent / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "python -m pytest -q" in ci and not any("-m fast" in line for line in ci)


@pytest.mark.parametrize("module, function", sorted(GRID_TESTS))
def test_the_fast_grids_keep_every_method_regime_and_dtype_on_small_cases(collected_rows, module, function):
    """Each grid keeps, in the fast subset, at least one case of every method x dtype and of every method x
    regime that has a case below the paper's size; it leaves out every paper-sized case (more than 2048 keys)
    and its largest other case."""
    rows = _grid_rows(collected_rows, module, function)
    fast = [row["case"] for row in rows if row["fast"]]
    small = [row["case"] for row in rows if _keys(row["case"]) <= 2048]
    for what in (("name", "dtype"), ("name", "regime"), ("name", "regime", "dtype")):
        strata = {tuple(case[k] for k in what) for case in small}
        kept = {tuple(case[k] for k in what) for case in fast}
        assert strata == kept, (what, sorted(strata - kept))
    assert all(_keys(case) <= 2048 for case in fast)
    assert max(small, key=_logits) not in fast
    assert len(fast) < len(rows)
