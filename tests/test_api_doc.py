"""docs/api.md: every Python block runs as written (each in a fresh namespace), and every backbone's row
of its table names entries that exist."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_page_has_an_example_per_entry():
    headings = re.findall(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.M)
    assert headings == ["Attention methods and the op", "Hugging Face transformers", "LLaDA", "Dream", "LangFlow",
                        "CoLa", "ELF", "Traces and runs"]
    assert len(BLOCKS) == 12
    for entry in ("token_logits", "parts", "embed", "trace=calls.append", "return_all=True", "attention_mask",
                  "prompt_mask", "official_max_new_tokens", "decode_logits", "mask_id", "prepared=", "PreparedCache",
                  "cu_seqlens_q", "inv_freq=", 'rope_type="llama3"', "pad_token_id=0"):
        assert any(entry in block for block in BLOCKS), entry


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index, capsys):
    exec(compile(BLOCKS[index], f"docs/api.md block {index}", "exec"), {"__name__": "api_doc"})
    capsys.readouterr()
