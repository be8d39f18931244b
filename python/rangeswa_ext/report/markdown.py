"""The markdown the project writes (tables.md, demo.md, judge.md, niah_summary.md) as HTML.

Only what those files use: ``#`` headings, pipe tables (with ``---:`` right alignment), ``- `` lists and
paragraphs; inline ``**bold**``, ``~~struck~~``, ``<ins>underlined</ins>`` and ``code``. Everything
else is escaped, so the HTML holds no markup the files did not mean.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

INLINE = ((re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"), (re.compile(r"~~(.+?)~~"), r"<s>\1</s>"),
          (re.compile(r"&lt;ins&gt;(.+?)&lt;/ins&gt;"), r"<ins>\1</ins>"), (re.compile(r"`([^`]+)`"), r"<code>\1</code>"))


def inline(text: str) -> str:
    """One line of markdown text as escaped HTML with its inline markers."""
    out = html.escape(text, quote=False)
    for pattern, replacement in INLINE:
        out = pattern.sub(replacement, out)
    return out


def to_html(text: str, skip_sections: Sequence[str] = (), heading_offset: int = 1) -> str:
    """``text`` as HTML. Headings move down ``heading_offset`` levels (a file's ``#`` becomes ``<h2>``);
    a section whose heading starts with one of ``skip_sections`` is left out up to the next heading of
    its level or above."""
    blocks, paragraph, items, table = [], [], [], []
    skipping = None

    def flush():
        if paragraph:
            blocks.append("<p>" + " ".join(inline(line) for line in paragraph) + "</p>")
        if items:
            blocks.append("<ul>" + "".join(f"<li>{_item(item)}</li>" for item in items) + "</ul>")
        if table:
            blocks.append(table_html(table))
        paragraph.clear(), items.clear(), table.clear()

    for line in text.splitlines():
        heading = re.match(r"(#{1,6})\s+(.*)", line)
        if heading:
            flush()
            level = len(heading.group(1))
            if skipping is not None and level > skipping:
                continue
            skipping = level if heading.group(2).startswith(tuple(skip_sections)) and skip_sections else None
            if skipping is None:
                tag = f"h{min(6, level + heading_offset)}"
                blocks.append(f"<{tag}>{inline(heading.group(2))}</{tag}>")
            continue
        if skipping is not None:
            continue
        stripped = line.strip()
        block = table if stripped.startswith("|") else items if stripped.startswith("- ") else paragraph
        if not stripped or any(other for other in (paragraph, items, table) if other is not block):
            flush()  # a blank line, or a line of another kind of block, ends the open one
        if stripped:
            block.append(stripped[2:] if block is items else stripped)
    flush()
    return "\n".join(blocks)


def table_html(rows: Sequence[str]) -> str:
    """A pipe table (header, alignment row, body) as an HTML table; cells keep their inline markers."""
    cells = [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]
    header, body = cells[0], cells[1:]
    align = [""] * len(header)
    if body and all(re.fullmatch(r":?-{3,}:?", cell) for cell in body[0]):
        align = [' class="num"' if cell.endswith(":") else "" for cell in body[0]]
        body = body[1:]
    head = "".join(f"<th{a}>{inline(c)}</th>" for c, a in zip(header, align))
    rows_html = "".join("<tr>" + "".join(f"<td{a}>{inline(c)}</td>" for c, a in zip(row, align)) + "</tr>"
                        for row in body)
    return f'<table><thead><tr>{head}</tr></thead><tbody>{rows_html}</tbody></table>'


def _item(text: str) -> str:
    """A list item; a leading PASS or FAIL (demo.md's claims) becomes a badge."""
    verdict = re.match(r"(PASS|FAIL): (.*)", text)
    if verdict:
        return f'<span class="badge {verdict.group(1).lower()}">{verdict.group(1)}</span> {inline(verdict.group(2))}'
    return inline(text)
