"""Stopping a training run: SIGINT / SIGTERM at a step boundary (the signals are
:mod:`avex.stop_signals`'), and a run that learns nothing."""
from __future__ import annotations

from pathlib import Path


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped training at a step boundary, after a checkpoint was written;
    ``resume`` is the command that continues the run. ``python -m avex.train`` prints it and
    exits with status 130."""

    def __init__(self, checkpoint: Path, resume: str,
                 what: str = "training stopped at a step boundary"):
        super().__init__(f"{what}; checkpoint {checkpoint}; resume with: {resume}")
        self.checkpoint, self.resume, self.what = checkpoint, resume, what


#: RL steps at the start of a run whose rewards must not all be 0
ZERO_REWARD_STEPS = 3
#: a captioner whose recorded validation CIDEr (x100) is below this writes nothing its own
#: references share: it is undertrained, whatever its tokenizer
UNDERTRAINED_CIDER = 1.0


def zero_reward_error(steps: int, clips: int, captioner=None) -> RuntimeError:
    """Why every reward of the first ``steps`` RL steps was 0. ``captioner``: the frozen
    captioner; where its training record (avex_captioner.json) shows it captions its own
    validation clips at CIDEr ~0, the cause is named as that, not as its tokenizer."""
    head = (f"every reward of the first {steps} RL step(s) was 0 (CIDEr-D of the captions of "
            f"{clips} clips against their references): the frozen captioner writes nothing the "
            "references share, so there is no gradient to learn from. ")
    tail = " The run stopped; nothing was learned"
    record = (getattr(captioner, "info", None) or {}).get("training") or {}
    val = record.get("val_cider")
    if isinstance(val, (int, float)) and not isinstance(val, bool) and val < UNDERTRAINED_CIDER:
        where = getattr(captioner, "path", None)
        return RuntimeError(
            head + f"The captioner{f' at {where}' if where else ''} is undertrained: it was "
            f"trained {record.get('steps', '?')} steps at lr {record.get('lr', '?')} and "
            f"captions its own validation clips at CIDEr {val:g} (its avex_captioner.json). "
            "Train it longer (a captioner preset with more steps; a captioner built by an older "
            "preset is rebuilt once its folder is deleted)." + tail)
    return RuntimeError(
        head + "That usually means that the captioner was never trained to caption these "
        "clips (check the full-token CIDEr with python -m avex.evaluate --methods random), "
        "that --max-new-tokens is too small to write a caption, or that its tokenizer is not "
        "the one it was trained with (a custom tokenizer saved beside a config.json is loaded "
        "as that model type's tokenizer; save it in the tokenizer/ sub-folder)." + tail)
