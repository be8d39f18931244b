"""The pure-PyTorch reference: the executable form of SPEC (docs/spec.md) and the oracle of every kernel.

Modules follow SPEC sections: `rope` (section 1), `positions` (section 3), `selection` (section 2),
`attention` (everything together in one dense softmax).
"""

from .attention import attention, attention_packed, block_summary, sdpa_with_rope
from .positions import body_relative_positions, group_size, relative_positions
from .rope import relative_scores, rotate
from .selection import retrieved_blocks

__all__ = [
    "attention", "attention_packed", "block_summary", "sdpa_with_rope", "body_relative_positions", "group_size",
    "relative_positions", "relative_scores", "rotate", "retrieved_blocks",
]
