"""CPU benchmark of the fused RangeSWA op against SDPA; same as `rangeswa bench`.

    python benchmarks/bench_cpu_attention.py [--lengths 1024,2048,4096,8192,16384] [--repeats 5]
    python benchmarks/bench_cpu_attention.py --lengths 4096,8192,16384 --cpu-capabilities avx512,avx2
"""

import sys

from rangeswa_ext.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
