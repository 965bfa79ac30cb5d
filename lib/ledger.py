# This file is generated from chapters/08-5-ledger.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/08-5-ledger.md, section "8.5 A ledger of training choices".
"""A ledger of training choices for a small GPT, each measured with seeds
(page 8.5): the Muon optimiser, a warm-up-stable-decay schedule, z-loss,
and the runner that trains the baseline and each change alone.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = []
