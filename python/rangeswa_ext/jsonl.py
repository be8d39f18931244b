"""JSON lines as `rangeswa generate` writes them and `rangeswa score` reads them: one object a line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Union


def json_objects(path: Union[str, Path], lines: Iterable[Union[str, bytes]],
                 advice: str = "") -> Iterator[tuple[int, Union[str, bytes], dict]]:
    """``(line number, line, object)`` for every non-blank line of ``lines`` (read from ``path``).

    A line that is not valid JSON, or not a JSON object, is a ValueError naming the file and the
    line number, followed by ``advice``.
    """
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error}).{advice}") from error
        if not isinstance(obj, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(obj).__name__}.{advice}")
        yield number, line, obj
