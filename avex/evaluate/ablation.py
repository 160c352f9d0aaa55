"""The paper's Table 3 at one retention: training-signal variants and the group size g; at
several retentions, the matched-budget comparison of issue #25. Every row records each clip's
scores, and where arm A (the default recipe) is scored, the tables show A − each other variant
with its paired bootstrap 95% interval (:mod:`avex.intervals`)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from avex import _checks
from avex.intervals import (LEVEL, REPLICATES, SEED, compact_per_clip, difference_table,
                            differences, interval_fields)
from avex.judge_identity import judge_line, judge_record
from avex.methods import load_policy, make_selector
from avex.paths import relative_path
from avex.progress import progress_bar
from avex.registry import label as method_label
from avex.run_files import read_run_config
from avex.scoring import caption_split, keep_all, score_captions
from avex.tables import markdown_table
from avex.training.config import (SETTINGS_BEFORE_THEY_EXISTED, TrainConfig,
                                  refuse_without_effect)
from avex.training.loop import run_finished, train_variant, variant_config
from avex.training.run_records import NOT_TRAINING, check_reusable

from .common import (PATHS_NOTE, ExperimentSettings, begin, check_names, check_retentions,
                     check_seeds, check_split, check_training_references, fmt, given_run,
                     load_experiment_inputs, results_json, split_clips, trained_elsewhere)

#: The exchange term as Table 3's rows were measured (before issue #25's calibration): L_RL +
#: 0.1 L_ex unnormalised, RLOO over 4 anchors, every type around the first anchor, g fixed, w
#: saturating at 5 points.
TABLE3_EXCHANGES = {"exchanges": True, "anchors": 4, "exchange_anchors": "first",
                    "g_fraction": 0.0, "exchange_saturation": 5.0, "normalize_exchange": False}
#: The paper's objective (``--preset paper``'s: its L_RL baseline, lambda_ex 1 with L_ex's
#: gradient normalised, tau 1, the calibrated g and w) on the embedded recipe's policy, warmup
#: and optimiser, at the matched budget: 4 anchors, one exchange each (8 sets per clip).
PAPER_OBJECTIVE = {"exchanges": True, "rl_estimator": "paper", "lambda_ex": 1.0, "tau": 1.0,
                   "anchors": 4, "exchange_anchors": "each", "g_fraction": 0.125,
                   "exchange_saturation": None, "normalize_exchange": True}
#: The exchange search arm at the matched budget (avex/training/exchange_search.py): 1 + 7
#: rewarded sets per clip per step, in 2 reward calls (4 candidates, then 3). Distillation
#: weight 0 (the pairwise loss over every evaluated swap alone): the best of 1, 0.1 and 0 in the
#: one-seed val pilot (results/exchange-search-pilot.md), the only one level with arm A at 20%.
EXCHANGE_SEARCH = {"exchanges": False, "exchange_search": True, "search_rounds": 2,
                   "search_candidates": 7, "distill_weight": 0.0}
#: Set-aware selection (issue #36 item 5; avex/set_selection.py): arm A's training, but the
#: anchors and the deployed set are K picks in turn, each token's logit lowered by
#: redundancy x its largest cosine (in the policy's head input) to a token already picked.
#: Redundancy 4: the better of the two the one-seed val pilot tried (2 and 4; fidelity
#: reward, benchmark 0; results/set-aware-pilot.md).
SET_AWARE = {"exchanges": False, "anchors": 8, "selection": "set-aware", "redundancy": 4.0}
#: CaCoVID-AV's training at the matched budget: 8 samples, group-normalised advantage
CACOVID_ARM = {"exchanges": False, "rl_estimator": "group", "anchors": 8}
#: RL's retentions drawn 10% three times in seven (the others once): the draw that raised arm
#: A's 10% over 3 seeds on benchmark 0 (docs/results.md, "What was tried for the quality
#: targets"); issue #36's round 2 tried it under set-aware selection (arm E)
LOW_RETENTION_DRAW = [0.5, 0.4, 0.3, 0.2, 0.1, 0.1, 0.1]

#: Table 3's rows and the matched-budget arms (issue #25): name -> (label, V-V, A-A, V-A, A-V
#: marks, TrainConfig settings). "rloo" is L_RL alone over 4 anchors; the arms caption 8 sets
#: per clip per step.
ABLATIONS = {
    "warmup": ("Warmup only", "✗ ✗ ✗ ✗", {"warmup_only": True}),
    "rloo": ("L_RL alone (RLOO, 4 anchors)", "✗ ✗ ✗ ✗", {"exchanges": False, "anchors": 4}),
    "random": ("Random exchange", "✗ ✗ mixed mixed",
               {**TABLE3_EXCHANGES, "exchange_selection": "random",
                "exchange_types": ["va", "av"]}),
    "vv": ("V-to-V only", "✓ ✗ ✗ ✗", {**TABLE3_EXCHANGES, "exchange_types": ["vv"]}),
    "aa": ("A-to-A only", "✗ ✓ ✗ ✗", {**TABLE3_EXCHANGES, "exchange_types": ["aa"]}),
    "vv+aa": ("V-to-V + A-to-A", "✓ ✓ ✗ ✗", {**TABLE3_EXCHANGES, "exchange_types": ["vv", "aa"]}),
    "no-aa": ("w/o A-to-A", "✓ ✗ ✓ ✓", {**TABLE3_EXCHANGES, "exchange_types": ["vv", "va", "av"]}),
    "no-vv": ("w/o V-to-V", "✗ ✓ ✓ ✓", {**TABLE3_EXCHANGES, "exchange_types": ["aa", "va", "av"]}),
    "full": ("Full AVEX (g = 8)", "✓ ✓ ✓ ✓", {**TABLE3_EXCHANGES, "g": 8}),
    "g4": ("g = 4", "✓ ✓ ✓ ✓", {**TABLE3_EXCHANGES, "g": 4}),
    "g16": ("g = 16", "✓ ✓ ✓ ✓", {**TABLE3_EXCHANGES, "g": 16}),
    "g32": ("g = 32", "✓ ✓ ✓ ✓", {**TABLE3_EXCHANGES, "g": 32}),
    # the matched-budget arms: 8 captioned sets per clip per step each
    "A": ("A: RLOO over 8 anchors (the default until issue #36)", "✗ ✗ ✗ ✗",
          {"exchanges": False, "anchors": 8}),
    "B": ("B: RLOO over 4 anchors + calibrated L_ex on 4 exchange sets", "✓ ✓ ✓ ✓",
          {"exchanges": True, "anchors": 4, "exchange_anchors": "each"}),
    "C": ("C: CaCoVID-AV, 8 samples, group-normalised advantage", "✗ ✗ ✗ ✗", CACOVID_ARM),
    "paper": ("the paper's objective (normalised), 4 anchors x 1 exchange", "✓ ✓ ✓ ✓",
              PAPER_OBJECTIVE),
    # issue #36 item 4: the Top-K set and 7 exchange candidates over 2 rounds = 8 sets a clip
    "S": ("S: exchange search, pairwise loss on every evaluated swap, 8 rewarded sets per step",
          "✓ ✓ ✓ ✓", EXCHANGE_SEARCH),
    # issue #36 item 5: arm A with set-aware selection, in training and at inference
    "D": (f"D: A with set-aware selection (redundancy {SET_AWARE['redundancy']:g})",
          "✗ ✗ ✗ ✗", SET_AWARE),
    # issue #36, round 2 (docs/evaluation.md): candidates against D-fid, and E's control
    "E": ("E: D with RL's retentions drawn 10% three times in seven", "✗ ✗ ✗ ✗",
          {**SET_AWARE, "train_retentions": LOW_RETENTION_DRAW}),
    "D8": ("D8: D at redundancy 8", "✗ ✗ ✗ ✗", {**SET_AWARE, "redundancy": 8.0}),
    "C10": ("C10: C with E's retention draw (control)", "✗ ✗ ✗ ✗",
            {**CACOVID_ARM, "train_retentions": LOW_RETENTION_DRAW}),
    # issue #36, round 3: D from a warmup of its own, imitating caption attention
    "Dc": ("Dc: D from a caption-attention warmup", "✗ ✗ ✗ ✗",
           {**SET_AWARE, "warmup_teacher": "caption-attention"}),
    # Dc's control in stage 2: CaCoVID-AV from the same caption-attention warmup
    "Cc": ("Cc: C from a caption-attention warmup (control)", "✗ ✗ ✗ ✗",
           {**CACOVID_ARM, "warmup_teacher": "caption-attention"}),
    # issue #36, round 6: Dc served with its dropped tokens merged (avex/merging.py)
    "Dcm": ("Dcm: Dc served with its dropped tokens merged (T = 0.8)", "✗ ✗ ✗ ✗",
            {**SET_AWARE, "warmup_teacher": "caption-attention", "merge_threshold": 0.8}),
}
#: issue #36 item 6: the warmup alone, from each of the other warmup teachers
#: (avex/training/warmup_teachers.py); each trains its own warmup and is scored at its warmup
#: checkpoint, as "warmup" is
ABLATIONS["warmup-capattn"] = ("Warmup only, caption-attention teacher", "✗ ✗ ✗ ✗",
                               {"warmup_only": True, "warmup_teacher": "caption-attention"})
ABLATIONS["warmup-fidgain"] = ("Warmup only, fidelity-gain teacher", "✗ ✗ ✗ ✗",
                               {"warmup_only": True, "warmup_teacher": "fidelity-gain"})
#: issue #36's matched-budget arms under the fidelity reward: each arm's settings above, with
#: reward="fidelity" (the table still scores C_av, CIDEr against the references)
for _arm in ("A", "B", "C", "S", "D", "E", "D8", "C10", "Dc", "Cc", "Dcm"):
    _label, _marks, _settings = ABLATIONS[_arm]
    ABLATIONS[f"{_arm}-fid"] = (f"{_label}, fidelity reward", _marks,
                                {**_settings, "reward": "fidelity"})
del _arm, _label, _marks, _settings
#: what every arm trains with unless it says otherwise: the recipe the arms were defined
#: against, the one a run trained with before these settings existed, so that changing the
#: recipe's defaults changes no arm
ARM_BASE = dict(SETTINGS_BEFORE_THEY_EXISTED)
ABLATIONS = {name: (label, marks, {**ARM_BASE, **settings})
             for name, (label, marks, settings) in ABLATIONS.items()}


@dataclass
class AblationSettings(ExperimentSettings):
    """The variants of ``variants`` (:data:`ABLATIONS`), trained at ``retention`` for each of
    ``seeds`` and scored on ``split`` at ``retentions`` (default: ``retention``). ``runs``:
    variant -> a trained run to reuse instead (one seed only). ``derived``: name -> (variant,
    {setting: value}), a variant of :data:`ABLATIONS` with those training settings changed,
    labelled as such and scored beside the others (added to ``variants`` if not named there)."""

    variants: list = field(default_factory=lambda: list(ABLATIONS))
    retention: float = 0.2
    retentions: list | None = None
    seeds: list = field(default_factory=lambda: [0])
    split: str = "test"
    runs: dict = field(default_factory=dict)
    derived: dict = field(default_factory=dict)

    def check(self) -> None:
        super().check()
        check_split("split", self.split)
        self.check_derived()
        _checks.str_list("variants", self.variants)
        self.variants = list(self.variants) + [n for n in self.derived if n not in self.variants]
        check_names("variants", self.variants, self.definitions())
        _checks.ratio("retention", self.retention)
        if self.retentions is not None:
            check_retentions(self.retentions)
        check_seeds(self.seeds)
        if not isinstance(self.runs, dict):
            raise TypeError(f"runs must be a dict of variant -> run directory, got "
                            f"{type(self.runs).__name__}")
        if self.runs and len(self.seeds) > 1:
            raise ValueError(f"--run reuses one run per variant, so it takes one seed; got "
                             f"seeds {list(self.seeds)}")
        table = self.definitions()
        captioner = self.captioner_model() if self.runs else None
        for name, path in self.runs.items():
            if name not in table:
                raise ValueError(f"--run must be VARIANT=DIR with VARIANT one of "
                                 f"{list(table)}, got {name!r}")
            self.check_run_used(name, path)
            given_run(path, scored_checkpoint(name, table), f"--run {name}",
                      captioner=captioner)
        self.check_training_kept(self.trained_definitions(), "variant",
                                 retention=self.retention)
        own = [name for name in self.variants
               if name not in self.runs and own_warmup(name, table)]
        if self.train.warmup_from is not None and own:
            raise ValueError(f"--train-args: warmup_from={self.train.warmup_from!r} would be "
                             f"ignored by {own}, which train warmups of their own; drop the "
                             "flag or those variants")
        if self.out is not None:   # a run already in --out must be the run asked for
            base = self.base_train_config()
            for run_dir, run in self.planned_runs(Path(self.out)).values():
                check_reusable(variant_config(base, run_dir, **run))

    def check_run_used(self, name: str, path) -> None:
        """Refuse a given run (``--run NAME=DIR``) that nothing would read: a variant not in
        ``variants``; for "warmup", one neither scored nor started from by a variant trained
        here, or one that ``train.warmup_from`` would compete with."""
        if name in self.variants:
            pass
        elif name != "warmup":
            raise ValueError(f"--run {name}={path} would have no effect: {name!r} is not in "
                             f"--variants ({','.join(self.variants)}); add it or drop the run")
        elif not any(uses_shared_warmup(v, self.definitions()) for v in self.variants
                     if v not in self.runs):
            raise ValueError(f"--run warmup={path} would have no effect: warmup is not in "
                             f"--variants ({','.join(self.variants)}) and no variant trained "
                             "here starts from the shared warmup; drop the run")
        if name == "warmup" and self.train.warmup_from is not None:
            raise ValueError(f"--run warmup={path} and --train-args' warmup_from="
                             f"{self.train.warmup_from!r} both name the shared warmup; give "
                             "one of them")

    def trained_definitions(self) -> dict:
        """Variant -> the settings of each run this ablation trains: every variant not given
        by ``runs``, and each seed's shared warmup where one of them starts from it, unless it
        is given (``runs["warmup"]``, or ``train.warmup_from``)."""
        table = self.definitions()
        names = [name for name in self.variants if name not in self.runs]
        if any(uses_shared_warmup(name, table) for name in names) \
                and "warmup" not in self.runs and self.train.warmup_from is None:
            names.append("warmup")
        return {name: table[name][2] for name in dict.fromkeys(names)}

    def shared_warmup(self, out: Path, seed: int) -> Path:
        """The run a variant of ``seed`` that doesn't train its own warmup starts from: a given
        one (``runs["warmup"]``, ``train.warmup_from``), else the one this ablation trains."""
        given = self.runs.get("warmup") or self.train.warmup_from
        return Path(given) if given else out / "runs" / f"seed{seed}" / "warmup"

    def planned_runs(self, out: Path) -> dict:
        """(seed, variant) -> (run folder, :func:`train_variant`'s settings) of each run this
        ablation trains in ``out``, in the order it trains them: per seed, the shared warmup
        (where a variant starts from it and none is given) before the variants."""
        table = self.definitions()
        given_warmup = self.runs.get("warmup") or self.train.warmup_from
        plan = {}
        for seed in self.seeds:
            for name in self.variants:
                if name in self.runs:
                    continue
                if uses_shared_warmup(name, table) and given_warmup is None:
                    plan.setdefault((seed, "warmup"), (
                        out / "runs" / f"seed{seed}" / "warmup",
                        dict(seed=seed, retention=self.retention, **table["warmup"][2])))
                if name != "warmup":
                    warmup = None if own_warmup(name, table) else self.shared_warmup(out, seed)
                    plan[(seed, name)] = (out / "runs" / f"seed{seed}" / name,
                                          dict(warmup_from=warmup, seed=seed,
                                               retention=self.retention, **table[name][2]))
        return plan

    def definitions(self) -> dict:
        """Every variant this ablation can name, as (label, marks, settings): those of
        :data:`ABLATIONS`, and each of ``derived`` (its variant's, with the changed settings
        named in the label)."""
        table = dict(ABLATIONS)
        for name, (base, changes) in self.derived.items():
            label, marks, settings = ABLATIONS[base]
            table[name] = (f"{label}; {changes_text(changes)}", marks, {**settings, **changes})
        return table

    def check_derived(self) -> None:
        """Each derived variant: a new name, a variant of :data:`ABLATIONS` and at least one
        training setting it really changes, and that the run keeps (not one the ablation sets
        per run, nor one the changed settings would ignore)."""
        if not isinstance(self.derived, dict):
            raise TypeError(f"derived must be a dict of name -> (variant, settings), got "
                            f"{type(self.derived).__name__}")
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        base_cfg = self.base_train_config()
        for name, value in self.derived.items():
            where = f"--derive {name}"
            if not isinstance(name, str) or not name.strip() or name != name.strip():
                raise ValueError(f"--derive: a derived variant's name must be a non-empty str "
                                 f"without surrounding spaces, got {name!r}")
            if name in ABLATIONS or name == FULL_TOKENS:
                raise ValueError(f"{where}: {name!r} already names a variant; choose a new name "
                                 f"(for example {name}@2)")
            if not (isinstance(value, (tuple, list)) and len(value) == 2
                    and isinstance(value[1], dict)):
                raise TypeError(f"{where}: expected (variant, {{setting: value}}), got {value!r}")
            base, changes = value
            _checks.choice(f"{where}: variant", base, set(ABLATIONS))
            if not changes:
                raise ValueError(f"{where}: no training setting is changed; it would be "
                                 f"{base!r} again")
            for key, setting in changes.items():
                if key not in fields:
                    raise ValueError(f"{where}: {key!r} is not a training setting")
                if key in PER_RUN_SETTINGS:
                    raise ValueError(f"{where}: {key}={setting!r} is set by the ablation for "
                                     "each run it trains; drop it")
            before = dataclasses.replace(base_cfg, **ABLATIONS[base][2])
            same = [k for k, v in changes.items() if getattr(before, k) == v]
            if same:
                raise ValueError(f"{where}: {base!r} already trains with "
                                 + ", ".join(f"{k}={changes[k]!r}" for k in same)
                                 + "; change something else")
            shared = [k for k in changes if k in WARMUP_PHASE_SETTINGS]
            if shared and not warmup_of_its_own({**ABLATIONS[base][2], **changes}):
                raise ValueError(f"{where}: {', '.join(shared)} would change the warmup, but "
                                 f"{base!r} starts from the seed's shared warmup run; derive "
                                 "from a variant that trains its own warmup (or change "
                                 "warmup_teacher too)")
            try:
                cfg = dataclasses.replace(before, **changes).validate()
                refuse_without_effect(cfg, changes)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{where}: {err}") from None


#: training settings the ablation gives each run itself (a derived variant can't change them)
PER_RUN_SETTINGS = ("run_dir", "seed", "retention", "warmup_from", "data", "captioner",
                    "benchmark_preset", "captioner_preset", "cache_dir", "evaluate", "progress")


def changes_text(changes: dict) -> str:
    """A derived variant's changed settings as its label shows them: ``redundancy 2``,
    ``retention input`` (a flag turned on), ``no rl`` (one turned off)."""
    def text(key, value):
        name = key.replace("_", " ")
        if isinstance(value, bool):
            return name if value else f"no {name}"
        return f"{name} {','.join(map(str, value)) if isinstance(value, list) else value}"
    return ", ".join(text(key, value) for key, value in changes.items())


#: settings of the warmup phase (or of the policy's shape, which a warmup's weights fix): a
#: variant that starts from the seed's shared warmup can't change them
WARMUP_PHASE_SETTINGS = ("warmup_epochs", "warmup_lr", "policy_hidden", "policy_positional")


def departures(run_config: dict, expected: dict) -> dict:
    """The training settings where a run (its config.json; a run from before a setting existed
    has that setting's old value) differs from ``expected``, the settings the ablation would
    train the variant with: setting -> the run's value. What it sets per run and what doesn't
    shape the policy are left out."""
    run = {**SETTINGS_BEFORE_THEY_EXISTED, **run_config}
    return {key: run.get(key) for key, value in expected.items()
            if key not in PER_RUN_SETTINGS + NOT_TRAINING and run.get(key) != value}


def given_run_label(label: str, run_config: dict, expected: dict,
                    elsewhere: str | None) -> tuple[str, dict]:
    """(label, departures) of a given run scored as a variant: the settings it was trained with
    otherwise than ``expected`` (:func:`departures`) and the other data it was trained on
    (``elsewhere``, :func:`avex.evaluate.common.trained_elsewhere`), both said in its label."""
    differs = departures(run_config, expected)
    given = ([changes_text(differs)] if differs else []) + ([elsewhere] if elsewhere else [])
    return (f"{label} (the given run: {'; '.join(given)})" if given else label), differs


def own_warmup(name: str, table: dict | None = None) -> bool:
    """A variant that trains its own warmup instead of starting from the seed's "warmup" run.
    ``table``: the variants' definitions (default :data:`ABLATIONS`)."""
    return warmup_of_its_own((table or ABLATIONS)[name][2])


def warmup_of_its_own(settings: dict) -> bool:
    """A variant's settings train a warmup of their own: a warmup-only variant, or one whose
    warmup imitates another teacher than the shared warmup's."""
    return bool(settings.get("warmup_only")) or \
        settings["warmup_teacher"] != ARM_BASE["warmup_teacher"]


def uses_shared_warmup(name: str, table: dict | None = None) -> bool:
    """The seed's shared warmup run is needed: the "warmup" row itself, or a variant that
    starts from it."""
    return name == "warmup" or not own_warmup(name, table)


def scored_checkpoint(name: str, table: dict | None = None) -> str:
    """A warmup-only variant is scored at its warmup checkpoint, every other at its last."""
    return "warmup" if (table or ABLATIONS)[name][2].get("warmup_only") else "latest"


def run_ablation(settings: AblationSettings) -> dict:
    """Train (or reuse) every variant at ``settings.retention`` for each of ``settings.seeds``
    and score it on ``settings.split``; mean ± std over the seeds. Every setting is checked
    first.

    Variants differ from the default ``python -m avex.train`` only by their settings in
    :data:`ABLATIONS` (plus ``settings.train``). The variants only change the RL phase, so each
    seed's warmup is trained once (the "warmup" row's run) and every other variant of that seed
    starts from it (``warmup_from``), as the sweep's CaCoVID-AV does. The random-exchange row
    draws G and G' at random (``--exchange-selection random``) for cross-modal exchanges, with
    the same g and number of reward evaluations per step."""
    started = time.perf_counter()
    settings, out = begin(settings, AblationSettings, "ablation")
    cache, captioner = load_experiment_inputs(settings)
    clips = split_clips(cache, settings.split, settings.max_clips)
    check_planned_references(settings, cache, out)
    out.mkdir(parents=True, exist_ok=True)
    decode = dict(batch_size=settings.batch_size, num_beams=settings.num_beams,
                  max_new_tokens=settings.max_new_tokens)
    base = settings.base_train_config()
    retentions = list(settings.retentions or [settings.retention])
    table = settings.definitions()
    plan = settings.planned_runs(out)
    rows = []
    jobs = [(seed, name) for seed in settings.seeds for name in settings.variants]
    trained = []  # the runs trained here, not reused: what "Took N s" includes
    for seed, name in progress_bar(jobs, desc="ablation variants", unit="run",
                                   disable=not settings.progress):
        label, marks, _ = table[name]
        if uses_shared_warmup(name, table) and (seed, "warmup") in plan:
            trained_here(trained, base, *plan[(seed, "warmup")])
        if name in settings.runs:
            run_dir = Path(settings.runs[name])
        elif (seed, name) in plan:
            run_dir = trained_here(trained, base, *plan[(seed, name)])
        else:   # the "warmup" row, given by train.warmup_from
            run_dir = settings.shared_warmup(out, seed)
        policy = load_policy(run_dir, captioner, checkpoint=scored_checkpoint(name, table))
        cfg = read_run_config(run_dir)
        label, differs = given_run_label(label, cfg, {**dataclasses.asdict(base), **table[name][2]},
                                         trained_elsewhere(cfg, cache.root, captioner.path)) \
            if name in settings.runs else (label, {})
        for retention in retentions:
            captions = caption_split(captioner, clips, make_selector("avex", policy=policy),
                                     retention, **decode)
            rows.append({"variant": name, "label": label, "marks": marks,
                         "run": relative_path(run_dir, out), "seed": cfg.get("seed"),
                         "g": cfg.get("g"), "exchange_types": cfg.get("exchange_types"),
                         # what the run selects by (runs from before the setting: topk)
                         "selection": cfg.get("selection", "topk"),
                         "redundancy": cfg.get("redundancy", 0.0),
                         **({"given_run_differs": differs} if differs else {}),
                         "retention": retention, **scored(captions, clips)})
    # full tokens: the C_av / full table, and the reference row of the intervals
    full = scored(caption_split(captioner, clips, keep_all, 1.0, **decode), clips)
    intervals = arm_differences(rows, full, retentions)
    seconds = time.perf_counter() - started
    took = took_line(seconds, len(trained))
    judge = judge_record(cache.root, captioner.path, cache_dir=settings.cache_dir)
    if len(retentions) == 1:
        text = ablation_table(rows, retentions[0], settings.split, len(clips), took)
    else:
        text = comparison_table(rows, full, retentions, settings.split, len(clips), took)
    text = "\n".join([text, "", *differences_markdown(intervals, rows, retentions),
                      judge_line(judge)])
    (out / "ablation.md").write_text(text + "\n")
    (out / "ablation.json").write_text(results_json({
        "rows": rows, "retention": settings.retention, "retentions": retentions, "full": full,
        "seeds": list(settings.seeds), "split": settings.split, "clips": len(clips),
        "judge": judge, "paths": PATHS_NOTE,
        "derived": {name: {"variant": base, "changes": changes}
                    for name, (base, changes) in settings.derived.items()},
        "intervals": [{"ours": "A", "variant": other, "retention": retention, "metric": "C_av",
                       **interval_fields(v)}
                      for (other, retention), v in intervals.items()],
        "bootstrap": {"level": LEVEL, "replicates": REPLICATES, "seed": SEED},
        "seconds": round(seconds, 1), "runs_trained": len(trained)}))
    print(text)
    return {"rows": rows, "full": full, "table": text, "out": str(out)}


def check_planned_references(settings: AblationSettings, cache, out: Path) -> None:
    """Every run the ablation would train, checked as python -m avex.train checks it: a
    reward that reads CIDEr needs the train clips' references."""
    base = settings.base_train_config()
    for (seed, name), (run_dir, changes) in settings.planned_runs(out).items():
        check_training_references(variant_config(base, run_dir, **changes), cache,
                                  f"variant {name} (seed {seed})")


def trained_here(trained: list, base, run_dir, settings: dict):
    """:func:`train_variant`, with ``run_dir`` appended to ``trained`` (the runs this call
    trains or resumes, which its wall time includes) unless it holds a finished run, which is
    reused."""
    if not run_finished(run_dir) and run_dir not in trained:
        trained.append(run_dir)
    return train_variant(base, run_dir, **settings)


def took_line(seconds: float, runs_trained: int) -> str:
    """"Took N s", saying whether training is in it: with every run reused, the time is
    scoring alone."""
    what = (f"training of {runs_trained} run(s) included" if runs_trained
            else "scoring only: every run was reused")
    return f"Took {seconds:.0f} s ({what})."


def scored(captions, clips) -> dict:
    """:func:`~avex.scoring.score_captions` with the per-clip scores rounded for the file."""
    score = score_captions(captions, clips)
    return {**score, "per_clip": compact_per_clip(score["per_clip"])}


# Full tokens' name in the intervals: "full" is a variant here (Full AVEX, g = 8).
FULL_TOKENS = "full tokens"


def arm_differences(rows, full: dict, retentions) -> dict:
    """(variant, retention) -> A − variant in C_av with its paired 95% interval (or why there
    is none), for every other variant and full tokens; {} without an arm A row."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    if "A" not in variants:
        return {}
    return differences(rows, "A", [v for v in variants if v != "A"] + [FULL_TOKENS], retentions,
                       "C_av", key="variant", full=full, full_key=FULL_TOKENS)


def differences_markdown(intervals: dict, rows, retentions) -> list[str]:
    """The section under the table: A − each variant, 95% interval."""
    if not intervals:
        return []
    labels = {r["variant"]: r["label"] for r in rows if r["variant"] != "A"}
    labels[FULL_TOKENS] = method_label("full")
    return [f"A − variant, C_av, with the paired bootstrap {LEVEL:.0%} interval ({REPLICATES} "
            "replicates resampling clips and training seeds together; docs/evaluation.md, "
            "\"Paired intervals\"). Above 0: arm A is ahead at that retention; below 0: "
            "behind; across 0: level.", "",
            difference_table(intervals, "A", labels, retentions, others="variant"), ""]


def ablation_table(rows, retention, split, clip_count, took: str) -> str:
    """One line per variant: its C_av, C_v and C_a, mean ± std over the seeds it ran with."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lines = []
    for name in variants:
        group = [r for r in rows if r["variant"] == name]
        label, marks = group[0]["label"], group[0]["marks"]
        seeds = ",".join(str(r["seed"]) for r in group)
        lines.append([label, *marks.split(), *(fmt([r[k] for r in group])
                                                for k in ("C_av", "C_v", "C_a")), seeds])
    return "\n".join([
        f"# Ablation scored at {retention:.0%} retention ({split} split, {clip_count} clips)",
        "",
        markdown_table(["variant", "V-V", "A-A", "V-A", "A-V", "C_av", "C_v", "C_a", "seeds"],
                       lines), "",
        "With several seeds: mean ± std (population std) over the training seeds. Every "
        "variant of a seed starts from that seed's warmup (the Warmup only row).", "",
        took])


def comparison_table(rows, full, retentions, split, clip_count, took: str) -> str:
    """Every variant at every retention: C_av mean ± std over the seeds, C_av over full tokens,
    and each seed's C_av (the matched-budget comparison of issue #25)."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    header = ["variant", *(f"{r:.0%}" for r in retentions), "seeds"]

    def cells(name, value):
        out = []
        for retention in retentions:
            group = [r for r in rows if r["variant"] == name and r["retention"] == retention]
            out.append(value(group))
        return out

    mean_lines, ratio_lines, seed_lines = [], [], []
    for name in variants:
        label = next(r["label"] for r in rows if r["variant"] == name)
        ran = ",".join(str(s) for s in sorted({r["seed"] for r in rows if r["variant"] == name}))
        mean_lines.append([label, *cells(name, lambda g: fmt([r["C_av"] for r in g])), ran])
        ratio_lines.append([label, *cells(name, lambda g: fmt(
            [r["C_av"] / full["C_av"] for r in g], digits=3)), ran])
        for seed in seeds:
            seed_lines.append([label, *cells(name, lambda g: fmt(
                [r["C_av"] for r in g if r["seed"] == seed])), str(seed)])
    return "\n".join([
        f"# Matched-budget comparison ({split} split, {clip_count} clips)", "",
        f"C_av (CIDEr points), mean ± std (population) over the training seeds. Full tokens: "
        f"{full['C_av']:.1f}. Every variant of a seed starts from that seed's warmup.", "",
        markdown_table(header, mean_lines), "",
        "C_av / full tokens:", "", markdown_table(header, ratio_lines), "",
        "Per training seed (C_av):", "", markdown_table(header, seed_lines), "",
        took])
