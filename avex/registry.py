"""Every name a setting chooses from, in one leaf module (it imports nothing of avex), so that
settings are checked before anything they name is loaded.

* :data:`METHODS`: the token-selection methods the toolkit compares, each with its printed label,
  what its selector is built from and, for a trained method, the training settings that define
  it. :func:`avex.methods.make_selector` builds the selectors; the sweep, the ablation,
  training's own table and the profiling suite take names and labels from here.
* :data:`BENCHMARK_PRESETS` and :data:`CAPTIONER_PRESETS`: the sizes of the embedded benchmark
  and of its captioner (their settings: ``avex.data.embedded.PRESETS``,
  ``avex.captioner.train.PRESETS``).
* :data:`SPLITS`: the splits of a feature cache.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Method", "METHODS", "SELECTORS", "EVAL_METHODS", "label", "privileged_notes",
           "BENCHMARK_PRESETS", "CAPTIONER_PRESETS", "SPLITS"]


@dataclass(frozen=True)
class Method:
    label: str                   # what every table prints
    # what its selector is built from: "llm" (the frozen LLM), "attention" (a text-to-AV
    # attention function) or "policy" (a trained policy); the frozen captioner supplies the
    # first two
    needs: tuple = ()
    seeded: bool = False         # the selection depends on a seed (Random, trained policies)
    train: dict | None = None    # trained methods: TrainConfig fields that define the method
    # a privileged reference, not an efficient method: what it reads that the others can't
    # and what that costs (a table's note says it; "above every efficient method" excludes it)
    privileged: str | None = None


#: method name -> Method. "full" is the reference row every table starts with.
METHODS = {
    "full": Method("Full tokens"),
    "random": Method("Random", seeded=True),
    "fastv": Method("FastV-AV", ("llm",)),
    "tome": Method("ToMe-AV"),
    "fastav": Method("FastAV", ("llm",)),
    "attention": Method(
        "Attention-AV (balanced; privileged reference)", ("attention",),
        privileged="it reads the frozen captioner's full-token prefill attention at inference "
                   "(a full prefill with eager attention before the pruned one: about 145% of "
                   "the full prefill's FLOPs at real size, results/profiling-*.md), and it is "
                   "the paper's warmup teacher. It is a reference, not an efficient method: "
                   "\"above every efficient method\" excludes it"),
    # CaCoVID's set-level reward at the matched budget (issue #25): 8 sampled sets per clip,
    # as AVEX-Prune captions per step, with a group-normalised advantage; served as CaCoVID
    # serves, unmerged, whatever the run's merge threshold
    "cacovid": Method("CaCoVID-AV", ("policy",), seeded=True,
                      train={"exchanges": False, "rl_estimator": "group", "anchors": 8,
                             "reward": "cider", "selection": "topk", "redundancy": 0.0,
                             "merge_threshold": None}),
    "avex": Method("AVEX-Prune", ("policy",), seeded=True, train={}),
}
#: the methods that select a subset (every one but "full")
SELECTORS = tuple(name for name in METHODS if name != "full")
#: the rows a training run's own table can score beside the run itself ("cacovid" trains
#: CaCoVID-AV from the run's warmup)
EVAL_METHODS = tuple(name for name in SELECTORS if name != "avex")


def label(name: str) -> str:
    """The printed name of method ``name``."""
    return METHODS[name].label


def privileged_notes(names) -> list[str]:
    """One sentence per privileged reference among ``names``, for the notes under a table."""
    return [f"{METHODS[n].label}: {METHODS[n].privileged}." for n in dict.fromkeys(names)
            if n in METHODS and METHODS[n].privileged]


BENCHMARK_PRESETS = ("tiny", "default", "paper")
CAPTIONER_PRESETS = ("tiny", "default", "large")
SPLITS = ("train", "val", "test", "transfer")
