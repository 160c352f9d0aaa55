"""Modality codes: one per position of an LLM's ``inputs_embeds``.

====================  =====  ==========================================
``PAD``               -1     padding (left or right, or anywhere); dropped
``VISUAL``             0     a visual token; prunable
``AUDIO``              1     an audio token; prunable
``TEXT``               2     a text token (markers included); never pruned
====================  =====  ==========================================
"""
from __future__ import annotations

__all__ = ["PAD", "VISUAL", "AUDIO", "TEXT", "CODES"]

PAD, VISUAL, AUDIO, TEXT = -1, 0, 1, 2
CODES = (PAD, VISUAL, AUDIO, TEXT)
