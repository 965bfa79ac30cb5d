# This file is generated from chapters/01-tokenizer.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""Module docstring: what this module of lib holds (chapter N of the course)."""

from __future__ import annotations

import torch
from einops import einsum

__all__ = ["double"]


def double(x: torch.Tensor) -> torch.Tensor:
    """Twice ``x``.

    Shapes: ``x`` is ``(... d)``, the result ``(... d)``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"double() takes a torch.Tensor, got {type(x).__name__}")
    return 2 * x
