"""Training configuration: defaults, presets, a YAML/JSON file, then command-line flags.

Precedence, lowest first: the dataclass defaults (the embedded benchmark on a CPU), a preset
(``--preset paper``: the paper's optimiser and decoding for a real backbone), a config file
(``--config run.yaml``), then flags (``--lr 1e-4``). Every setting is validated before any work
starts, with an error that names it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from avex import _checks
from avex.registry import BENCHMARK_PRESETS, CAPTIONER_PRESETS, EVAL_METHODS, SPLITS
from avex.merging import NO_MERGING, check_merge_threshold, parse_merge_threshold
from avex.run_files import warmup_policy_file
from avex.set_selection import SELECTIONS

EXCHANGE_TYPES = ("vv", "aa", "va", "av")
#: what a kept set is rewarded by (docs/training.md, "Rewards"; avex.fidelity)
REWARDS = ("cider", "fidelity", "cider+fidelity")
FIDELITY_FORMS = ("logp", "margin", "grounded")
#: what the warmup imitates (docs/training.md, "Warmup teachers"; warmup_teachers.py beside this)
WARMUP_TEACHERS = ("prompt-attention", "caption-attention", "fidelity-gain")

#: what a run whose config.json predates a setting trained with: read into a resumed run so
#: that a newer default never changes a run half way
SETTINGS_BEFORE_THEY_EXISTED = {"reward": "cider", "selection": "topk", "redundancy": 0.0,
                                "warmup_teacher": "prompt-attention", "retention_input": False,
                                # no effect without the retention input: today's default
                                "retention_lr": 1e-2, "lambda_pairs": 0.0, "ema": 0.0,
                                "policy_init_layers": 1, "advantage_scale": "micro-batch",
                                "merge_threshold": None}

#: what RLOO's advantages are divided by (TrainConfig.advantage_scale)
ADVANTAGE_SCALES = ("micro-batch", "running")
POLICY_LAYERS = 2   # the policy's encoder blocks (AVEXPolicy.from_llm's num_layers)

#: each selection's redundancy when none is given (set-aware's: results/set-aware-pilot.md)
DEFAULT_REDUNDANCY = {"set-aware": 4.0, "topk": 0.0}

#: the final table's other rows when none are asked for; a label-free cache leaves
#: CaCoVID-AV out (training/loop.py, comparisons_the_data_can_train)
DEFAULT_EVAL_METHODS = ["random", "attention", "cacovid"]

PRESETS = {
    # Section 3.4 of the paper, for a real backbone (VideoLLaMA 2 / VILA features).
    "paper": dict(lr=2e-5, weight_decay=0.01, lr_warmup=0.05, grad_clip=1.0, batch_size=64,
                  epochs=3, num_beams=3, max_new_tokens=64, lambda_ex=1.0, rl=True,
                  policy_hidden=768, rl_estimator="paper", anchors=1, train_retentions=[],
                  policy_positional=False, tau=1.0, warmup_epochs=0.5, exchanges=True,
                  exchange_anchors="first",
                  # the paper's g = 8 at K = 64 and w's 5 points at full tokens' 56.8, carried
                  # to any K and reward scale; L_ex's gradient normalised to lambda_ex x
                  # L_RL's (unnormalised, clipping left it ~0.2% of the update)
                  g_fraction=0.125, exchange_saturation=None, normalize_exchange=True,
                  # the paper's reward and selection, whatever the embedded recipe's defaults
                  reward="cider", selection="topk", redundancy=0.0,
                  # section 3.4's warmup: cached text-to-AV attention of the full prefill
                  warmup_teacher="prompt-attention", merge_threshold=None),
    # The embedded benchmark on a CPU: the dataclass defaults (docs/training.md, "The recipe").
    "embedded": {},
}


@dataclass
class TrainConfig:
    # what to train on
    data: str = "embedded"            # "embedded" or the path of a feature cache
    benchmark_preset: str = "default"  # size of the generated benchmark when data="embedded"
    captioner: str = "embedded"       # "embedded" or the path of a local Hugging Face causal LM
    captioner_preset: str = "default"  # size of the embedded captioner
    # embedded data and captioners; default $AVEX_CACHE or ~/.cache/avex
    cache_dir: str | None = None
    run_dir: str | None = None        # default runs/<date-time>; --resume alone takes the newest
    device: str = "auto"
    seed: int = 0
    # the policy
    policy_hidden: int | None = None  # None: the captioner's width, first block from its LLM
    # how many of the policy's 2 encoder blocks start as the captioner LLM's first decoder
    # layers (0: none, all random; more than 1 needs policy_hidden None)
    policy_init_layers: int = 1
    tau: float = 0.5                  # Gumbel temperature: anchors near the deployed Top-K
    policy_positional: bool = True    # within-modality position features (avex.policy)
    # how the policy's scores become a kept set, in training and wherever the saved policy
    # serves (issue #36 item 5; avex/set_selection.py): "topk", or "set-aware": K picks in
    # turn, each token's logit lowered by redundancy x its largest cosine similarity (in the
    # policy's head input) to a token already picked
    # set-aware with redundancy 4 (arm D-fid): chosen on benchmarks 0-3's val splits and
    # confirmed on the deciding benchmark's test split (docs/results.md, "The default recipe")
    # (None: "set-aware", or "topk" with the exchange term or the exchange search, which rank
    # tokens by their scores alone)
    selection: str | None = None
    # beta of "set-aware" (> 0; 0 with "topk"); None: the selection's own, 4 or 0
    redundancy: float | None = None
    # the retention as an input of the policy's score head (avex.policy.network), learned in
    # RL from zero; the warmup runs without it. Off: not chosen (docs/results.md, "Retention
    # as an input")
    retention_input: bool = False
    retention_lr: float = 1e-2        # its own lr in RL: at lr 1e-4, from zero, it barely moved
    # serving merges each dropped AV token into its most similar kept one from this cosine
    # (avex/merging.py; RL trains unmerged sets), saved with the policy; 0.8: round 6's choice
    merge_threshold: float | None = 0.8
    # the schedule
    retention: float = 0.2
    epochs: float = 3.0               # RL epochs, after the warmup
    warmup_epochs: float = 6.0        # attention-matching warmup (the paper: half an epoch)
    batch_size: int = 32
    micro_batch_size: int = 16        # batch_size is reached by gradient accumulation
    lr: float = 1e-4
    warmup_lr: float = 3e-3           # cosine-decayed over the warmup
    weight_decay: float = 0.01
    lr_warmup: float = 0.05           # fraction of RL steps with a linear ramp, then cosine
    grad_clip: float = 1.0
    # one policy for every retention: each warmup target and RL micro-batch uses these
    # (empty: `retention` alone); evaluation may pick any retention
    train_retentions: list = field(default_factory=lambda: [0.5, 0.4, 0.3, 0.2, 0.1])
    # the AVEX objective
    g: int = 8                        # the group size when g_fraction is 0
    exchange_types: list = field(default_factory=lambda: list(EXCHANGE_TYPES))
    # the exchange term L_ex (lambda_ex beside L_RL): off by default, because over 3 seeds on
    # two benchmarks it measured no better than L_RL alone on one and worse on the other
    # (docs/results.md, "The default recipe"); --exchanges turns it on
    exchanges: bool = False
    exchange_selection: str = "confidence"  # "random": groups drawn at random (ablation)
    # which anchors exchanges are built around: "first" (every type around anchor 0, the
    # paper's one anchor), "each" (one exchange per anchor, anchor a taking type a mod T, so
    # 4 anchors and 4 types give each type once per clip) or "all" (every type, every anchor)
    exchange_anchors: str = "each"
    # w(dR) = min(|dR| / saturation, 1); None: the paper's 5 points at full tokens' 56.8,
    # scaled by this run's full-token reward (about 42 on the embedded benchmark)
    exchange_saturation: float | None = None
    # L_ex's gradient rescaled per micro-batch to lambda_ex x L_RL's norm, whatever the reward
    # scale (unnormalised, the paper preset's L_ex was ~0.2% of the clipped update)
    normalize_exchange: bool = True
    # RL steps between diagnostic steps (0: none): each exchange type's gradient-norm ratio,
    # and with a fidelity reward CIDEr too, to log how often the two agree
    diagnostics_every: int = 10
    warmup_only: bool = False
    lambda_ex: float = 0.1
    rl: bool = True                   # L_RL on (the estimator: rl_estimator)
    normalize_rl: bool = False        # standardised advantages, log pi / K (not in the paper)
    # "rloo": leave-one-out b over the anchors; "group": (R - group mean) / group std (GRPO);
    # "paper": b = mean of anchor + its counterfactuals (set-level, batch b without exchanges)
    rl_estimator: str = "rloo"
    # RLOO's advantages over "micro-batch" (their deviation there: every update O(1)) or
    # "running" (a moving average of it over RL's micro-batches, shared by every retention, so
    # a retention whose sets barely differ moves the policy little; training/averaging.py)
    advantage_scale: str = "micro-batch"
    # Gumbel-Top-K anchors per clip (rloo: leave-one-out b); 8, as the matched-budget
    # comparison of issue #25 measured it (arm A)
    anchors: int = 8
    g_fraction: float = 0.125         # > 0: g = max(2, round(g_fraction * K)) per micro-batch
    lambda_target: float = 0.0        # weight of the warmup BCE kept on during RL (an anchor)
    lambda_best: float = 0.0          # weight of a BCE toward each clip's best-rewarded anchor
    # the anchor-pair exchange term: each pair of a clip's anchors is an exchange of their
    # symmetric difference, labelled by their reward difference (no extra captioner pass);
    # its weight makes its gradient norm lambda_pairs x L_RL's in every micro-batch
    lambda_pairs: float = 0.0
    # the saved policy is an exponential moving average of RL's weights with this decay,
    # started from the warmup's (0: the last step's weights)
    ema: float = 0.0
    warmup_from: str | None = None    # a run directory: start from its warmup policy, skip ours
    # the scores whose balanced keep-sets the warmup imitates (warmup_teachers.py): the prompt's
    # full-prefill attention to the AV tokens, y_full's teacher-forced attention to them or each
    # token's fidelity gain; caption-attention won round 3 (results/round3-stage2.md)
    warmup_teacher: str = "caption-attention"
    # exchange search + distillation instead of L_RL (training/exchange_search.py): a local search
    # from Top-K, the pairwise loss on its swaps, a loss toward its end set. 1 + search_candidates sets rewarded per clip per step, in search_rounds reward calls
    exchange_search: bool = False
    search_rounds: int = 2            # sequential rounds; each can accept one swap per clip
    search_candidates: int = 7        # candidate sets per clip per step, split over the rounds
    search_deep: float = 0.5          # share of G' drawn uniformly from below the next-best
    distill_weight: float = 1.0       # weight of the distillation loss beside the pairwise one
    distill_loss: str = "pl"          # "pl": each kept token's Gumbel key above every outsider's
    # the reward of a kept set: "cider" (100 x CIDEr-D of its caption against the AV
    # references), "fidelity" (100 x the mean teacher-forced log p of y_full, the captioner's
    # caption of the full tokens: no references, no generation) or "cider+fidelity" (CIDEr,
    # its ties broken by fidelity, never reordering two sets whose CIDEr differs)
    reward: str = "fidelity"
    # R_fid's form: "logp" (mean log p(y_full | S)) or "margin" (a hinge on each step's logit
    # margin of y_full's token; all margins > 0 is greedy decoding writing y_full exactly)
    fidelity_form: str = "logp"
    # reward decoding (CIDEr's captions, and y_full)
    num_beams: int = 1
    max_new_tokens: int = 24
    # evaluation and bookkeeping
    evaluate: bool = True             # the results table at the end of training
    eval_retentions: list = field(default_factory=lambda: [0.4, 0.2])
    eval_split: str = "test"
    # the table scores the split's first 200 clips, so `make train` stays within minutes now
    # that the embedded test split holds 1000 (the same 200 as before); None: every clip
    max_eval_clips: int | None = 200
    checkpoint_every: int = 20        # optimiser steps
    deterministic: bool = False
    progress: bool = True
    # the final table's other rows (registry names; "cacovid" trains CaCoVID-AV from our warmup)
    eval_methods: list = field(default_factory=lambda: list(DEFAULT_EVAL_METHODS))

    def __post_init__(self):
        if self.selection is None:
            self.selection = "topk" if self.exchanges or self.exchange_search else "set-aware"
        if self.redundancy is None:
            self.redundancy = DEFAULT_REDUNDANCY.get(self.selection, 0.0)

    def validate(self) -> "TrainConfig":
        """Check every setting (type, range, choice) before any file is written; the error
        names the setting and the value it got."""
        self._validate_run()
        self._validate_optimiser()
        self._validate_exchange_terms()
        self._validate_reward_and_table()
        self._validate_sources()
        self._validate_selection()
        self._validate_rl()
        self._validate_search()
        _checks.choice("benchmark_preset", self.benchmark_preset, set(BENCHMARK_PRESETS))
        _checks.choice("captioner_preset", self.captioner_preset, set(CAPTIONER_PRESETS))
        return self

    def _validate_run(self) -> None:
        """The data, the captioner's presets, where files go, the schedule's lengths."""
        for name in ("data", "benchmark_preset", "captioner", "captioner_preset"):
            _checks.text(name, getattr(self, name))
        for name in ("cache_dir", "run_dir"):  # a prebuilt cache may be read-only
            if _checks.text(name, getattr(self, name), optional=True) is not None:
                _checks.output_dir(name, getattr(self, name), writable=name == "run_dir")
        _checks.device("device", self.device)
        _checks.int_at_least("seed", self.seed, 0)
        _checks.optional_int_at_least("policy_hidden", self.policy_hidden, 1)
        _checks.int_at_least("policy_init_layers", self.policy_init_layers, 0)
        if self.policy_init_layers > POLICY_LAYERS:
            raise ValueError(f"policy_init_layers must be at most {POLICY_LAYERS} (the policy's "
                             f"encoder blocks), got {self.policy_init_layers}")
        if self.policy_init_layers > 1 and self.policy_hidden is not None:
            raise ValueError(f"policy_init_layers = {self.policy_init_layers} copies the LLM's "
                             "decoder layers, which a policy of its own width (policy_hidden = "
                             f"{self.policy_hidden}) can't take; drop --policy-hidden or use 0-1")
        _checks.positive_float("tau", self.tau)
        _checks.ratio("retention", self.retention)
        for name in ("epochs", "warmup_epochs", "lambda_ex", "weight_decay"):
            _checks.real(name, getattr(self, name), low=0)
        _checks.positive_float("grad_clip", self.grad_clip)  # 0 would zero every gradient
        if self.epochs == 0 and not self.warmup_only:
            raise ValueError("epochs is 0: the run would take no RL step; pass --warmup-only "
                             "for a warmup-only run")
        if self.warmup_only and self.warmup_epochs == 0:
            raise ValueError("warmup_only with warmup_epochs 0 trains nothing; give "
                             "--warmup-epochs > 0")
        if self.warmup_only and self.warmup_from is not None:
            raise ValueError(f"warmup_only with warmup_from={self.warmup_from!r} trains "
                             "nothing (the warmup would be read, not trained); drop one")

    def _validate_optimiser(self) -> None:
        """Batch sizes and learning rates."""
        _checks.int_at_least("batch_size", self.batch_size, 1)
        _checks.int_at_least("micro_batch_size", self.micro_batch_size, 1)
        _checks.positive_float("lr", self.lr)
        _checks.positive_float("warmup_lr", self.warmup_lr)
        _checks.real("lr_warmup", self.lr_warmup, low=0, high=1, high_open=True)
        if self.batch_size % self.micro_batch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of "
                             f"micro_batch_size ({self.micro_batch_size})")

    def _validate_exchange_terms(self) -> None:
        """The exchange groups and types, and the on/off flags."""
        _checks.int_at_least("g", self.g, 1)
        _checks.str_list("exchange_types", self.exchange_types)
        for name in ("exchanges", "warmup_only", "rl", "normalize_rl", "evaluate",
                     "deterministic", "progress"):
            _checks.flag(name, getattr(self, name))
        if not self.exchange_types and self.exchanges:
            raise ValueError("exchange_types is empty; pass --no-exchanges for the set-level "
                             "reward variant")
        for t in self.exchange_types:
            if t not in EXCHANGE_TYPES:
                raise ValueError(f"exchange_types must be drawn from {list(EXCHANGE_TYPES)}, "
                                 f"got {t!r}")
        if len(set(self.exchange_types)) != len(self.exchange_types):
            raise ValueError(f"exchange_types has duplicates: {self.exchange_types}")
        _checks.choice("exchange_selection", self.exchange_selection, {"confidence", "random"})

    def _validate_reward_and_table(self) -> None:
        """The reward, the warmup teacher, decoding and the end-of-run table."""
        _checks.choice("reward", self.reward, REWARDS)
        _checks.choice("warmup_teacher", self.warmup_teacher, WARMUP_TEACHERS)
        _checks.choice("fidelity_form", self.fidelity_form, FIDELITY_FORMS)
        _checks.int_at_least("num_beams", self.num_beams, 1)
        _checks.int_at_least("max_new_tokens", self.max_new_tokens, 1)
        if not isinstance(self.eval_retentions, (list, tuple)):
            raise TypeError(f"eval_retentions must be a list of ratios in (0, 1], got "
                            f"{type(self.eval_retentions).__name__}: {self.eval_retentions!r}")
        for i, r in enumerate(self.eval_retentions):
            _checks.ratio(f"eval_retentions[{i}]", r)
        if len(set(self.eval_retentions)) != len(self.eval_retentions):
            raise ValueError(f"eval_retentions has duplicates: {list(self.eval_retentions)}")
        if self.evaluate and not self.eval_retentions:
            raise ValueError("eval_retentions is empty: the table would score no retention; "
                             "give at least one, or --no-evaluate")
        _checks.choice("eval_split", self.eval_split, set(SPLITS))
        _checks.optional_int_at_least("max_eval_clips", self.max_eval_clips, 1)
        _checks.int_at_least("checkpoint_every", self.checkpoint_every, 1)
        _checks.real("lambda_target", self.lambda_target, low=0)
        _checks.real("lambda_best", self.lambda_best, low=0)
        _checks.real("lambda_pairs", self.lambda_pairs, low=0)
        _checks.real("ema", self.ema, low=0, high=1, high_open=True)

    def _validate_sources(self) -> None:
        """The files the run reads, the table's methods, the retentions it trains at."""
        if self.data != "embedded" and not Path(self.data).exists():
            raise FileNotFoundError(f"data: no feature cache at {self.data!r}")
        if self.warmup_from is not None:
            warmup_policy_file(self.warmup_from)
        if self.captioner != "embedded" and not Path(self.captioner).exists():
            raise FileNotFoundError(f"captioner: no model directory at {self.captioner!r}")
        if self.captioner == "embedded" and self.data != "embedded":
            raise ValueError("captioner='embedded' goes with data='embedded'; for your own "
                             "feature cache pass --captioner PATH to its Hugging Face causal LM")
        _checks.str_list("eval_methods", self.eval_methods)
        for name in self.eval_methods:
            _checks.choice("eval_methods", name, set(EVAL_METHODS))
        if len(set(self.eval_methods)) != len(self.eval_methods):
            raise ValueError(f"eval_methods has duplicates: {self.eval_methods}")
        if not isinstance(self.train_retentions, (list, tuple)):
            raise TypeError(f"train_retentions must be a list of ratios in (0, 1], got "
                            f"{type(self.train_retentions).__name__}: {self.train_retentions!r}")
        for r in self.train_retentions:
            _checks.ratio("train_retentions", r)
        for name, values in (("train_retentions", self.train_retentions),
                             ("retention", [] if self.train_retentions else [self.retention])):
            if 1.0 in values:  # every token kept: one possible set, nothing to learn
                raise ValueError(f"{name} holds 1.0, which keeps every token: every sampled "
                                 "set is the same and RL has nothing to learn; use ratios < 1")
        _checks.flag("policy_positional", self.policy_positional)

    def _validate_rl(self) -> None:
        """The RL estimator, its anchors and the exchange term's calibration."""
        _checks.text("warmup_from", self.warmup_from, optional=True)
        _checks.choice("rl_estimator", self.rl_estimator, {"paper", "rloo", "group"})
        _checks.choice("advantage_scale", self.advantage_scale, ADVANTAGE_SCALES)
        _checks.int_at_least("anchors", self.anchors, 1)
        if self.rl_estimator in ("rloo", "group") and self.anchors < 2:
            raise ValueError(f"anchors must be >= 2 with rl_estimator={self.rl_estimator!r} "
                             f"(an anchor's baseline is the other anchors' reward), got "
                             f"{self.anchors}")
        _checks.choice("exchange_anchors", self.exchange_anchors, {"first", "each", "all"})
        if self.exchange_saturation is not None:
            _checks.positive_float("exchange_saturation", self.exchange_saturation)
        _checks.flag("normalize_exchange", self.normalize_exchange)
        _checks.int_at_least("diagnostics_every", self.diagnostics_every, 0)
        if self.exchanges and self.normalize_exchange and not self.rl:
            raise ValueError("normalize_exchange scales L_ex's gradient to L_RL's, but rl is off; "
                             "pass --no-normalize-exchange for L_ex alone")
        if not 0 <= self.g_fraction <= 1:
            raise ValueError(f"g_fraction must be in [0, 1], got {self.g_fraction}")

    def _validate_selection(self) -> None:
        """The selection rule's settings (:mod:`avex.set_selection`)."""
        _checks.choice("selection", self.selection, SELECTIONS)
        _checks.real("redundancy", self.redundancy, low=0)
        _checks.flag("retention_input", self.retention_input)
        _checks.positive_float("retention_lr", self.retention_lr)
        check_merge_threshold("merge_threshold", self.merge_threshold)
        if self.selection == "topk" and self.redundancy != 0:
            raise ValueError(f"redundancy = {self.redundancy!r} has no effect with selection "
                             "'topk'; add --selection set-aware or drop redundancy")
        if self.selection == "set-aware" and self.redundancy == 0:
            raise ValueError("selection 'set-aware' with redundancy 0 is Top-K; give "
                             "--redundancy > 0 (docs/training.md, \"Set-aware selection\")")
        if self.selection == "set-aware" and (self.exchanges or self.exchange_search):
            arm = "exchanges" if self.exchanges else "exchange_search"
            raise ValueError(f"selection 'set-aware' can't train with {arm}: the exchanges rank "
                             "tokens by their scores alone; drop --selection set-aware or "
                             f"--{arm.replace('_', '-')}")

    def _validate_search(self) -> None:
        """The exchange search's settings (:mod:`avex.training.exchange_search`)."""
        _checks.flag("exchange_search", self.exchange_search)
        _checks.int_at_least("search_rounds", self.search_rounds, 1)
        _checks.int_at_least("search_candidates", self.search_candidates, 1)
        if self.search_candidates < self.search_rounds:
            raise ValueError(f"search_candidates ({self.search_candidates}) must be at least "
                             f"search_rounds ({self.search_rounds}): each round scores one "
                             "candidate or more")
        _checks.real("search_deep", self.search_deep, low=0, high=1)
        _checks.real("distill_weight", self.distill_weight, low=0)
        _checks.choice("distill_loss", self.distill_loss, {"pl", "bce"})
        if self.exchange_search and self.exchanges:
            raise ValueError("exchange_search and exchanges are two training arms; pass one of "
                             "--exchange-search and --exchanges")
        if self.exchange_search and not self.exchange_types:
            raise ValueError("exchange_types is empty; the exchange search needs a type")
        if self.lambda_pairs > 0 and (self.exchange_search or self.anchors < 2):
            raise ValueError(f"lambda_pairs = {self.lambda_pairs!r} pairs a clip's anchors, and "
                             + ("exchange_search draws none" if self.exchange_search else
                                f"anchors = {self.anchors} makes no pair")
                             + "; drop lambda_pairs")
        if self.exchange_search and self.lambda_best > 0:
            raise ValueError(f"lambda_best = {self.lambda_best!r} imitates the best anchor, and "
                             "exchange_search draws no anchors; drop lambda_best")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_config_file(path) -> dict:
    """The settings of a YAML or JSON file; an unreadable one is refused naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config: no file at {str(path)!r}")
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix in (".yaml", ".yml"):
            import yaml
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as err:  # yaml.YAMLError, JSONDecodeError, UnicodeDecodeError, OSError
        detail = str(err).replace("<unicode string>", str(path))
        raise ValueError(f"config {path}: cannot be read as "
                         f"{'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: "
                         f"{detail}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config {path}: expected a mapping of settings, got "
                         f"{type(data).__name__}")
    return data


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_list(kind):
    def parse(text: str):
        return [kind(item) for item in text.split(",") if item.strip()]
    parse.__name__ = f"comma-separated {kind.__name__}"  # argparse's "invalid ... value"
    return parse


def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="a YAML or JSON file of settings")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="embedded",
                        help="defaults to start from (default: embedded)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its latest checkpoint")
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        default = getattr(defaults, f.name)
        help_text = f"default: {default}"
        if isinstance(default, bool):
            parser.add_argument(_flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        elif isinstance(default, list):
            kind = float if default and isinstance(default[0], float) else str
            parser.add_argument(_flag(f.name), dest=f.name, type=_parse_list(kind), default=None,
                                help=help_text + " (comma-separated)")
        else:
            kind = {int: int, float: float}.get(type(default), str)
            if f.name in ("policy_hidden", "max_eval_clips"):
                kind = int
            elif f.name in ("exchange_saturation", "redundancy"):
                kind = float
            elif f.name == "merge_threshold":   # "none" turns the default's merging off
                kind = parse_merge_threshold
            if f.name in ("selection", "redundancy"):
                help_text = {"selection": "default: set-aware (topk with --exchanges or "
                                          "--exchange-search)",
                             "redundancy": "default: 4 with set-aware selection, 0 with topk"
                             }[f.name]
            elif f.name in ("run_dir", "cache_dir", "warmup_from"):
                kind = str
            parser.add_argument(_flag(f.name), dest=f.name, type=kind, default=None,
                                help=help_text)
    return parser


#: settings that only shape the exchange term: asked for without it, they would do nothing
EXCHANGE_SETTINGS = ("g", "g_fraction", "exchange_types", "exchange_selection", "lambda_ex",
                     "exchange_anchors", "exchange_saturation", "normalize_exchange")
#: the exchange settings the exchange search reads too (its g, types and w's saturation)
SEARCH_EXCHANGE_SETTINGS = ("g", "g_fraction", "exchange_types", "exchange_saturation")
#: settings that only shape the exchange search
SEARCH_SETTINGS = ("search_rounds", "search_candidates", "search_deep", "distill_weight",
                   "distill_loss")


#: settings only the RL phase reads (the warmup reads its own lr, epochs and the batch sizes)
RL_SETTINGS = ("epochs", "lr", "lr_warmup", "anchors", "rl_estimator", "advantage_scale",
               "normalize_rl", "rl", "lambda_target", "lambda_best", "lambda_pairs",
               "retention_lr", "tau", "ema")
#: settings only the warmup reads
WARMUP_SETTINGS = ("warmup_epochs", "warmup_lr", "policy_init_layers")
#: settings only the end-of-run table reads
TABLE_SETTINGS = ("eval_retentions", "eval_split", "max_eval_clips", "eval_methods")


def explicit_settings(args: argparse.Namespace, *, with_preset: bool = True) -> dict:
    """The settings the command line asked for: the preset's, the config file's, then flags."""
    values = dict(PRESETS[args.preset]) if with_preset else {}
    if args.config:
        file_values = load_config_file(args.config)
        unknown = set(file_values) - {f.name for f in dataclasses.fields(TrainConfig)}
        if unknown:
            raise ValueError(f"config {args.config}: unknown settings {sorted(unknown)}")
        values.update(file_values)
    for f in dataclasses.fields(TrainConfig):
        flag_value = getattr(args, f.name, None)
        if flag_value is not None:
            values[f.name] = None if flag_value is NO_MERGING else flag_value
    return values


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults < preset < config file < flags; then validate. An exchange setting asked for
    (by the file or a flag) while the exchange term is off is refused: it would be ignored."""
    asked = explicit_settings(args, with_preset=False)
    cfg = TrainConfig(**{**PRESETS[args.preset], **asked}).validate()
    if not getattr(args, "resume", False):  # a resume checks its own run
        refuse_without_effect(cfg, asked)
        refuse_outside_their_phase(cfg, asked)
    return cfg


def refuse_without_effect(cfg: TrainConfig, asked: dict) -> None:
    """Refuse a setting of ``asked`` (those given explicitly) that ``cfg``, the settings it
    ends up in, would ignore: it would be dropped without a word."""
    for name in EXCHANGE_SETTINGS if not cfg.exchanges else ():
        if name in asked and not (cfg.exchange_search and name in SEARCH_EXCHANGE_SETTINGS):
            raise ValueError(f"{name} = {asked[name]!r} has no effect without the exchange "
                             "term (off by default); add --exchanges (exchanges: true) or "
                             f"drop {name}")
    for name in SEARCH_SETTINGS if not cfg.exchange_search else ():
        if name in asked:
            raise ValueError(f"{name} = {asked[name]!r} has no effect without the exchange "
                             "search; add --exchange-search (exchange_search: true) or drop "
                             f"{name}")
    if "retention_lr" in asked and not cfg.retention_input:
        raise ValueError(f"retention_lr = {asked['retention_lr']!r} has no effect without the "
                         "retention input; add --retention-input (retention_input: true) or "
                         "drop retention_lr")
    if "fidelity_form" in asked and cfg.reward == "cider":
        raise ValueError(f"fidelity_form = {asked['fidelity_form']!r} has no effect with "
                         "reward 'cider'; add --reward fidelity (or cider+fidelity) or drop "
                         "fidelity_form")
    if "warmup_teacher" in asked and cfg.warmup_from and cfg.lambda_target == 0:
        raise ValueError(f"warmup_teacher = {asked['warmup_teacher']!r} has no effect with "
                         "warmup_from (no warmup here, and lambda_target is 0); drop one")
    if "g" in asked and cfg.g_fraction > 0:
        raise ValueError(f"g = {asked['g']!r} has no effect while g_fraction is "
                         f"{cfg.g_fraction} (g = g_fraction x K); add --g-fraction 0 for a "
                         "fixed g")


def refuse_outside_their_phase(cfg: TrainConfig, asked: dict) -> None:
    """Refuse a setting of ``asked`` whose phase the run skips, or that another setting
    overrides: a warmup-only run's RL settings, a --warmup-from run's warmup settings, the
    table's settings with --no-evaluate, ``retention`` beside ``train_retentions``, and the RL
    estimator's settings where the estimator does not read them."""
    def refuse(name, why, fix):
        raise ValueError(f"{name} = {asked[name]!r} has no effect {why}; {fix}")

    skipped = [(RL_SETTINGS, "in a warmup-only run (no RL phase)", "drop it or --warmup-only")
               ] if cfg.warmup_only else []
    if cfg.warmup_from is not None:
        skipped.append((WARMUP_SETTINGS, "with warmup_from (the warmup is read, not trained)",
                        "drop it or --warmup-from"))
    if not cfg.evaluate:
        skipped.append((TABLE_SETTINGS, "with --no-evaluate (no table is scored)",
                        "drop it or --no-evaluate"))
    if cfg.exchange_search:
        skipped.append((("anchors", "rl_estimator", "rl", "normalize_rl", "advantage_scale"),
                        "with the exchange search (it draws no anchors)",
                        "drop it or --exchange-search"))
    for names, why, fix in skipped:
        for name in names:
            if name in asked:
                refuse(name, why, fix)
    if cfg.warmup_only and "cacovid" in asked.get("eval_methods", ()):
        refuse("eval_methods", "in a warmup-only run: CaCoVID-AV trains from the finished "
               "run's RL settings", "leave 'cacovid' out, or drop --warmup-only")
    if "retention" in asked and cfg.train_retentions:
        refuse("retention", f"while train_retentions is {list(cfg.train_retentions)} (RL "
               "draws from those)", "to train at one retention pass --train-retentions "
               f"{asked['retention']}")
    if "advantage_scale" in asked and cfg.rl_estimator != "rloo":
        refuse("advantage_scale", f"with rl_estimator {cfg.rl_estimator!r}",
               "it scales RLOO's advantages (--rl-estimator rloo); drop it")
    if "normalize_rl" in asked and not (cfg.rl_estimator == "paper" and cfg.exchanges):
        refuse("normalize_rl", f"with rl_estimator {cfg.rl_estimator!r}"
               + ("" if cfg.exchanges else " and no exchange term"),
               "it scales the paper estimator's advantages beside --exchanges; drop it")
    if "rl" in asked and not cfg.rl and not cfg.exchanges:
        refuse("rl", "without the exchange term: L_RL is then the only signal and trains "
               "all the same", "add --exchanges for L_ex alone, or drop --no-rl")
