"""benchmarks/ncu_attn_body.py summarize: Nsight Compute's raw CSV page (as `ncu --import R --csv --page raw`
prints it) read into the body kernel's headline figures and its stall reasons by share. The GPU script runs
ncu where the machine has it; this checks the reading on a page laid out like ncu's, with no GPU."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ncu_attn_body  # noqa: E402

PAGE = '''==PROF== Disconnected from process 4242
"ID","Process ID","Kernel Name","gpu__time_duration.sum","smsp__issue_active.avg.pct_of_peak_sustained_active","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"
"","","","msecond","%","%","ratio","ratio","ratio"
"0","4242","void rangeswa::cuda::attn_kernel<Traits>(AttnKernelParams)","2.50","61.5","23.9","0.50","1.50","0.00"
'''


def test_the_summary_reads_units_headlines_and_stall_shares(tmp_path):
    path = tmp_path / "body.csv"
    path.write_text(PAGE)
    kernels, units = ncu_attn_body.read_raw(str(path))
    assert len(kernels) == 1 and units["gpu__time_duration.sum"] == "msecond"
    text = ncu_attn_body.summarize(kernels, units)
    assert "| duration (us) | 2,500.00 |" in text  # 2.50 ms in microseconds
    assert "| issue slots busy (%) | 61.50 |" in text and "| achieved occupancy (%) | 23.90 |" in text
    assert "| long_scoreboard | 1.50 | 75% |" in text and "| barrier | 0.50 | 25% |" in text
    assert "math_pipe_throttle" not in text  # a reason with no stalls is left out
    assert text.index("long_scoreboard") < text.index("| barrier |")  # by share, largest first


def test_a_report_without_kernels_says_so(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters\n")
    assert ncu_attn_body.summarize(*ncu_attn_body.read_raw(str(path))).startswith("ncu: no kernel in the report")
