"""RangeSWA inside other libraries' models. `transformers`: ``attn_implementation="rangeswa"`` (or
``"rangeswa_lite"``) for Hugging Face models (the ``[hf]`` extra)."""
