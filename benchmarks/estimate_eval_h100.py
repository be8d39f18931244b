"""The time `rangeswa ppl` and `rangeswa ruler` would take on one H100 for LLaDA-8B and Dream-v0 7B: an estimate
from FLOPs.

No GPU measured these numbers. The work of a run is what its protocol fixes (the calls and their token
counts, which the CPU runs of tests/test_ppl.py and tests/test_ruler.py check on tiny models): `ppl`
scores chunk j with ``draws`` rows of (j + 1) x chunk tokens; `ruler` answers each sample with
``steps`` full network calls of about ``length`` tokens (LLaDA and Dream have no KV cache). A call of L
tokens costs 2 x (the linear layers' weights; Dream's k and v are 4 heads wide) FLOPs a token plus
4 L^2 d a layer for full attention; the LM
head is only asked for the chunk or the block and is left out. The time is those FLOPs over an
assumed sustained throughput (``--tflops``, default 400: about 40 % of the H100 SXM's dense bf16 peak).
RangeSWA methods do less attention than ``full``, which therefore bounds them.

    python benchmarks/estimate_eval_h100.py            # prints a markdown table
"""

from __future__ import annotations

import argparse

from rangeswa_ext.eval import ppl, ruler
from rangeswa_ext.eval.ruler_tasks import SYNTHETIC
from rangeswa_ext.models.dream import DreamConfig
from rangeswa_ext.models.llada import LLaDAConfig


def call_flops(config, tokens: int) -> float:
    """FLOPs of one call of ``tokens`` tokens with full attention (the LM head left out); ``config`` a
    LLaDAConfig or DreamConfig (q and o d x d, k and v d x (key/value heads x head dim), a gated MLP)."""
    kv = getattr(config, "n_kv_head", config.n_head) * config.head_dim
    linear = 2 * config.n_layer * (2 * config.dim ** 2 + 2 * config.dim * kv + 3 * config.dim * config.mlp_dim)
    return linear * tokens + 4 * config.n_layer * config.dim * tokens ** 2


def ppl_flops(config, longest: int = ppl.LENGTHS[-1], chunk: int = ppl.CHUNK_SIZE,
              draws: int = ppl.DRAWS) -> float:
    return sum(draws * call_flops(config, (j + 1) * chunk) for j in range(1, longest // chunk))


def ruler_flops(config, lengths=ruler.LENGTHS, tasks: int = len(SYNTHETIC), samples: int = ruler.SAMPLES,
                steps: int = ruler.RULER_SAMPLERS["llada"]["steps"]) -> float:
    return sum(tasks * samples * steps * call_flops(config, L) for L in lengths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tflops", type=float, default=400.0, help="sustained bf16 TFLOP/s assumed (default 400)")
    args = parser.parse_args()
    rate = args.tflops * 1e12
    print(f"| run (full attention) | model | FLOPs | estimated hours at {args.tflops:g} TFLOP/s |")
    print("| --- | --- | ---: | ---: |")
    models = (("LLaDA-8B", LLaDAConfig.from_name("llada-8b")), ("Dream-v0 7B", DreamConfig.from_name("dream-base")))
    for model, config in models:
        rows = [("rangeswa ppl, one method, chunks of 64 to 16384, 8 draws", ppl_flops(config)),
                ("rangeswa ruler, one method, 11 tasks x 100 samples at 4k + 8k + 16k", ruler_flops(config)),
                ("rangeswa ruler, one method, 11 tasks x 20 samples at 4k + 8k + 16k", ruler_flops(config, samples=20))]
        for name, flops in rows:
            print(f"| {name} | {model} | {flops:.3g} | {flops / rate / 3600:.2f} |")


if __name__ == "__main__":
    main()
