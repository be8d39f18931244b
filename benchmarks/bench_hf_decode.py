"""One KV-cached decode step of a transformers Llama through the integration, against SDPA (issue 31).

A Llama with random weights (hidden 768, 12 heads of 64, MLP 2048, ``--layers`` layers, fp32, T =
``max_position_embeddings`` = 1024) holds a KV cache of L random rotated keys and values per layer (the
step's time does not depend on their values). The steps feed one token each at positions L, L + 1, ...,
as ``generate`` does (every step a new length), are timed one by one, and the cache is then cropped back to
L for the next implementation. Two caches of transformers (``--caches``): ``dynamic`` appends by a ``cat``
of the whole cache at every step, a copy that every implementation pays and that dominates a long step on a
CPU; ``static`` preallocates its rows (``--cache-rows``, default the fewest the steps need) and writes the step's
row in place (SDPA attends over all of them under transformers' mask; the integration, while the cache fits T,
too, masking by position on the device, and past T over the rows up to the query). Implementations: ``sdpa``
(transformers' own), ``rangeswa`` and ``rangeswa_lite`` (`rangeswa_ext.integrations.transformers`, late
stage). The step's time includes the MLPs and the LM head; the integration keeps its decode state (pre-RoPE
keys, prepared context) across the steps, as in ``generate``. Also timed: the attention function alone on
layer 0's cache without that state (every call un-rotates and prepares the whole cache: what a step cost
before the integration kept it).

    python benchmarks/bench_hf_decode.py [--lengths 2048,8192] [--caches dynamic,static] [--layers 2]
                                         [--repeats 5] [--threads N] [--cache-rows N] [--out DIR]

Results: benchmarks/results/hf_decode_<date>.{json,md}. Medians of ``--repeats`` steps after one warm-up step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path
from typing import Optional

import torch

from rangeswa_ext.bench import markdown_table

IMPLEMENTATIONS = ("sdpa", "rangeswa", "rangeswa_lite")
HIDDEN, HEADS, T, VOCAB = 768, 12, 1024, 1000


def model_with_cache(layers: int, length: int, kind: str = "dynamic", steps: int = 0, rows: Optional[int] = None):
    import transformers
    from transformers import DynamicCache, StaticCache

    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2048,
                                      num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                      max_position_embeddings=T)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    cache = DynamicCache(config=config) if kind == "dynamic" else StaticCache(config=config, max_cache_len=rows or length + 1 + steps)
    generator = torch.Generator().manual_seed(1)
    for layer in range(layers):
        k, v = (torch.randn(1, HEADS, length, HIDDEN // HEADS, generator=generator) for _ in "kv")
        cache.update(k, v, layer)
    return model, cache


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def decode_ms(model, cache, length: int, repeats: int) -> float:
    """The median time of ``repeats`` decode steps at lengths L + 1 .. L + repeats, after one at L."""
    times = []
    with torch.no_grad():
        for s in range(repeats + 1):
            start = time.perf_counter()
            model(torch.tensor([[7 + s]]), past_key_values=cache, position_ids=torch.tensor([[length + s]]),
                  use_cache=True)
            times.append((time.perf_counter() - start) * 1e3)
    cache.crop(-(repeats + 1))  # the cache holds its L rows again
    return statistics.median(times[1:])


def measure(length: int, layers: int, repeats: int, kind: str, rows: Optional[int] = None) -> dict:
    from rangeswa_ext.integrations.transformers import attention, enable

    if rows is not None and rows < length + repeats + 2:
        raise ValueError(f"--cache-rows {rows} cannot hold L = {length} and {repeats + 1} steps")
    model, cache = model_with_cache(layers, length, kind, repeats + 1, rows)
    position = torch.tensor([[length]])
    row = {"L": length, "cache": kind}
    for name in IMPLEMENTATIONS:
        if name == "sdpa":
            model.set_attn_implementation("sdpa")
        else:
            enable(model, name)
        row[f"{name}_step_ms"] = decode_ms(model, cache, length, repeats)
    # The attention function alone on layer 0's L cached rows, q the last one (q and k rotated, as
    # transformers hands them over).
    layer = model.model.layers[0].self_attn
    k, v = cache.layers[0].keys[:, :, :length], cache.layers[0].values[:, :, :length]
    q = torch.randn(1, HEADS, 1, HIDDEN // HEADS)
    for name in IMPLEMENTATIONS:
        if name == "sdpa":
            def call():
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            enable(model, name)

            def call(name=name):
                with torch.no_grad():
                    attention(layer, q, k, v, None, scaling=(HIDDEN // HEADS) ** -0.5, method=name,
                              position_ids=position - 1)  # q is the last of the L rows

        row[f"{name}_attention_ms"] = median_ms(call, repeats)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="2048,8192", help="comma-separated cache lengths L (past T = 1024 the "
                        "method runs; within it the model's own attention)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--caches", default="dynamic,static", help="comma-separated KV cache kinds of transformers")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-rows", type=int, default=None,
                        help="a static cache's preallocated rows (default: L + the steps, the fewest)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        for kind in args.caches.split(","):
            row = measure(length, args.layers, args.repeats, kind, args.cache_rows if kind == "static" else None)
            rows.append(row)
            print(json.dumps(row))
    header = ["L", "cache"] + [f"{n} step ms (x SDPA)" for n in IMPLEMENTATIONS] + [f"{n} stateless attention ms" for n in IMPLEMENTATIONS]
    table = [[str(r["L"]), r["cache"]] + [f"{r[f'{n}_step_ms']:.1f} ({r[f'{n}_step_ms'] / r['sdpa_step_ms']:.2f}x)"
                              for n in IMPLEMENTATIONS] + [f"{r[f'{n}_attention_ms']:.2f}" for n in IMPLEMENTATIONS]
             for r in rows]
    date = datetime.date.today().isoformat()
    meta = dict(date=date, threads=torch.get_num_threads(), layers=args.layers, repeats=args.repeats,
                cache_rows=args.cache_rows,
                load_average=os.getloadavg(), torch=torch.__version__)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"hf_decode_{date}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    title = (f"# One cached decode step, Llama {args.layers} layers x 12 heads of 64, fp32, CPU ({meta['threads']} "
             f"threads, load {meta['load_average'][0]:.1f})")
    text = "\n".join(markdown_table(title, header, table)) + "\n"
    (args.out / f"hf_decode_{date}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
