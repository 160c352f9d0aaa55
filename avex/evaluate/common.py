"""What every experiment of ``python -m avex.evaluate`` shares: its settings (the assets, output,
decoding and training settings, checked before any work), assets, splits, trained policies and
number formatting."""
from __future__ import annotations

import dataclasses
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from avex import _checks
from avex.cache_and_captioner import (asset_names, check_captioner_benchmark,
                                     load_cache_and_captioner, resolve_asset_paths)
from avex.data.cache import peek_meta
from avex.data.embedded import default_benchmark_path
from avex.files import check_weights
from avex.judge_identity import judge_record, judge_warnings
from avex.paths import default_captioner_path
from avex.registry import BENCHMARK_PRESETS, CAPTIONER_PRESETS, SPLITS
from avex.policy.saved import read_policy_record
from avex.run_files import (POLICY_RECORD_FILE, check_captioner, check_finished,
                            run_policy_weights)
from avex.training.config import TrainConfig
from avex.training.loop import check_references

#: decoding when no run is given and no setting asks for one
DECODING = {"num_beams": 1, "max_new_tokens": 24}
#: what the paths a results file records are relative to (the file says so itself)
PATHS_NOTE = {"data, captioner, judge": "relative to the avex cache root ($AVEX_CACHE, or "
                                        "--cache-dir)",
              "runs, run": "relative to the folder this file was written to"}


@dataclass
class ExperimentSettings:
    """The settings every experiment takes (``python -m avex.evaluate``'s common flags).

    ``train`` is the training an experiment starts any policy it trains from (``--train-args``:
    the default ``python -m avex.train`` run); its data, captioner, presets and cache are the
    experiment's. ``num_beams`` / ``max_new_tokens`` left None take the given runs' decoding,
    else :data:`DECODING` (:meth:`validate` resolves them and says where each came from in
    ``decoding_source``)."""

    data: str = "embedded"            # "embedded" or the path of a feature cache
    captioner: str = "embedded"       # "embedded" or a Hugging Face causal-LM directory
    benchmark_preset: str = "default"
    captioner_preset: str = "default"
    cache_dir: str | None = None      # default: $AVEX_CACHE or ~/.cache/avex
    out: str | None = None            # default: runs/<experiment>-<time>
    max_clips: int | None = None      # the first N clips of each split
    batch_size: int = 64
    num_beams: int | None = None
    max_new_tokens: int | None = None
    device: str = "auto"
    train: TrainConfig = field(default_factory=TrainConfig)
    progress: bool = True
    decoding_source: dict | None = None

    def validate(self):
        """A checked copy, decoding resolved: every setting is checked before any captioning
        or training (the error names the setting and the value it got)."""
        settings = dataclasses.replace(self)
        settings.check()
        unused = settings.training_unused()
        if unused and settings.asked_training():
            asked = ", ".join(f"{k}={v!r}" for k, v in settings.asked_training().items())
            raise ValueError(f"--train-args would have no effect: {unused}; drop it (it sets "
                             f"{asked})")
        settings.resolve_decoding(settings.given_runs())
        return settings

    def check(self) -> None:
        _checks.available_device("device", self.device)
        if self.cache_dir is not None:  # a prebuilt cache may be read-only
            _checks.output_dir("cache_dir", self.cache_dir, writable=False)
        _checks.choice("captioner_preset", self.captioner_preset, set(CAPTIONER_PRESETS))
        _checks.choice("benchmark_preset", self.benchmark_preset, set(BENCHMARK_PRESETS))
        if self.out is not None:
            _checks.output_dir("out", self.out)
        _checks.int_at_least("batch_size", self.batch_size, 1)
        _checks.optional_int_at_least("num_beams", self.num_beams, 1)
        _checks.optional_int_at_least("max_new_tokens", self.max_new_tokens, 1)
        _checks.optional_int_at_least("max_clips", self.max_clips, 1)
        _checks.flag("progress", self.progress)
        if not isinstance(self.train, TrainConfig):
            raise TypeError(f"train must be a TrainConfig, got {type(self.train).__name__}")
        self.train.validate()
        # a run trained here picks this device (avex.training's pick_device) only once the
        # splits are captioned: checked now, as --device is
        _checks.available_device("--train-args: device", self.train.device)
        if self.data != "embedded" and not Path(self.data).exists():
            raise FileNotFoundError(f"--data: no feature cache at {self.data!r}")
        if self.captioner != "embedded" and not Path(self.captioner).exists():
            raise FileNotFoundError(f"--captioner: no model directory at {self.captioner!r}")
        if self.captioner == "embedded" and self.data != "embedded":
            raise ValueError("--captioner embedded goes with --data embedded; for your own "
                             "feature cache pass --captioner PATH to its Hugging Face causal LM")
        if self.data != "embedded" and not (Path(self.data) / "meta.json").is_file():
            raise FileNotFoundError(f"--data: no feature cache at {self.data!r}"
                                    + not_a_cache(self.data))
        if self.data != "embedded" and self.captioner != "embedded":
            check_captioner_benchmark((peek_meta(self.data) or {}).get("source"),
                                      self.captioner, self.data, name="--captioner")

    def given_runs(self) -> dict:
        """Flag -> settings of each trained run the experiment is given (checked now, before
        anything else runs); none here."""
        return {}

    def training_unused(self) -> str | None:
        """Why ``train`` (``--train-args``) would change nothing, as a phrase; None where the
        experiment trains a policy (or reads ``train`` otherwise). Such a ``train`` is
        refused rather than silently ignored."""
        return None

    def resolve_decoding(self, runs: dict) -> None:
        """Set ``num_beams`` / ``max_new_tokens``: a setting's value, else the given runs' own
        decoding (their reward and results table used it), else :data:`DECODING`. Runs that
        decode differently from each other are refused unless a setting settles it. Resolved
        once, it stays resolved: validating again keeps where each value came from."""
        sources = {}
        for key in DECODING:
            if getattr(self, key) is not None:
                sources[key] = (self.decoding_source or {}).get(key, "flag")
                continue
            values = {flag: cfg.get(key, DECODING[key]) for flag, cfg in runs.items()}
            if len(set(values.values())) > 1:
                listed = ", ".join(f"{flag} has {key}={value}" for flag, value in values.items())
                raise ValueError(f"the runs decode differently ({listed}); pass --"
                                 f"{key.replace('_', '-')} to score both with one setting")
            if values:
                setattr(self, key, next(iter(values.values())))
                sources[key] = "run " + runs_phrase(values)
            else:
                setattr(self, key, DECODING[key])
                sources[key] = "default"
        self.decoding_source = sources

    def base_train_config(self) -> TrainConfig:
        """The training settings an experiment starts from: :attr:`train` on the experiment's
        data and captioner, without its own evaluation."""
        cfg = self.train
        return dataclasses.replace(cfg, data=self.data, captioner=self.captioner,
                                   benchmark_preset=self.benchmark_preset,
                                   captioner_preset=self.captioner_preset,
                                   cache_dir=None if self.cache_dir is None
                                   else str(self.cache_dir),
                                   progress=self.progress and cfg.progress, evaluate=False)

    def asked_training(self) -> dict:
        """The training settings ``train`` asks for (``--train-args``): those that differ from
        :class:`TrainConfig`'s defaults. A setting given at its default value can't be told
        from one not given."""
        defaults = TrainConfig()
        return {f.name: getattr(self.train, f.name) for f in dataclasses.fields(TrainConfig)
                if getattr(self.train, f.name) != getattr(defaults, f.name)}

    def check_training_kept(self, definitions: dict, what: str, **forced) -> None:
        """Refuse a setting of ``train`` that a run this experiment trains would not keep,
        because it would be replaced without a word: one the experiment sets for every run
        (:meth:`base_train_config`, and ``forced``: setting -> the value it is given), or one
        that the definition of a ``what`` it trains (``definitions``: name -> settings, an
        ablation's variants, a sweep's methods) sets to another value. Then each of those runs'
        settings, ``train`` with its definition, is checked as its training will check them."""
        asked = self.asked_training()
        forced = {"data": self.data, "captioner": self.captioner,
                  "benchmark_preset": self.benchmark_preset,
                  "captioner_preset": self.captioner_preset,
                  "cache_dir": None if self.cache_dir is None else str(self.cache_dir),
                  "evaluate": False, **forced}
        for key, value in asked.items():
            if key in ("run_dir", "seed"):
                raise ValueError(f"--train-args: {key}={value!r} is set by the experiment for "
                                 "each run it trains (from --out and --seeds); drop it")
            if key in forced and forced[key] != value:
                raise ValueError(f"--train-args: {key}={value!r} would be replaced by the "
                                 f"experiment's own {key}, {forced[key]!r}; give the experiment "
                                 f"--{key.replace('_', '-')} instead")
            for name, settings in definitions.items():
                if key in settings and settings[key] != value:
                    raise ValueError(f"--train-args: {key}={value!r} would be overridden: {what} "
                                     f"{name!r} is defined with {key}={settings[key]!r}; drop "
                                     f"the flag, or choose a {what} defined with it")
        base = self.base_train_config()
        for name, settings in definitions.items():   # each run's settings as it will train
            try:
                dataclasses.replace(base, **settings).validate()
            except (ValueError, TypeError) as err:
                raise ValueError(f"--train-args with {what} {name!r}: {err}") from None

    def captioner_dir(self) -> Path:
        """The captioner's directory (the embedded one's, built or not)."""
        return Path(self.captioner) if self.captioner != "embedded" else default_captioner_path(
            default_benchmark_path(self.benchmark_preset, self.cache_dir).name,
            self.captioner_preset, self.cache_dir)

    def captioner_depth(self) -> int | None:
        """The captioner's layer count from its config.json, when it is already on disk."""
        try:
            return int(json.loads((self.captioner_dir() / "config.json").read_text())
                       ["num_hidden_layers"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not built yet, or not a plain config: checked once it is loaded

    def captioner_model(self) -> dict | None:
        """The captioner's model type and hidden size (what a policy records it was trained
        with) from its config.json, with its directory; None when it can't be read without
        loading the model (not built yet): checked once it is loaded."""
        path = self.captioner_dir()
        if not (path / "config.json").is_file():
            return None
        try:
            from transformers import AutoConfig
            config = AutoConfig.from_pretrained(str(path))
            return {"model_type": config.model_type, "path": path,
                    "hidden_size": int(config.get_text_config().hidden_size)}
        except Exception:   # an unknown model type, a config it can't read: checked later
            return None


def check_names(name: str, values, choices) -> None:
    """A non-empty list of names, each one of ``choices``."""
    _checks.str_list(name, values)
    if not values:
        raise ValueError(f"{name} is empty")
    for value in values:
        _checks.choice(name, value, set(choices))
    if len(set(values)) != len(values):   # one measurement would pass for two
        raise ValueError(f"{name} has duplicates: {list(values)}")


def check_split(name: str, value, *extra) -> str:
    return _checks.choice(name, value, set(SPLITS) | set(extra))


def check_seeds(seeds) -> None:
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (list, tuple)):
        raise TypeError(f"seeds must be a list of ints, got {type(seeds).__name__}")
    for seed in seeds:
        _checks.int_at_least("seeds", seed, 0)
    if not seeds:
        raise ValueError("seeds is empty")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds has duplicates: {list(seeds)}")


def check_retentions(retentions) -> None:
    if isinstance(retentions, (str, bytes)) or not isinstance(retentions, (list, tuple)):
        raise TypeError(f"retentions must be a list of ratios in (0, 1], got "
                        f"{type(retentions).__name__}")
    for retention in retentions:
        _checks.ratio("retentions", retention)
    if not retentions:
        raise ValueError("retentions is empty")
    if len(set(retentions)) != len(retentions):
        raise ValueError(f"retentions has duplicates: {list(retentions)}")


def given_run(path, checkpoint: str, name: str, *, finished: bool = False,
              captioner: dict | None = None) -> dict:
    """A run's settings, checked with a readable weights file (its header read, not the
    tensors) before the output folder is made or anything is trained; ``finished``: refuse a
    run that did not finish training; ``captioner``: the captioner it will be scored with
    (:meth:`ExperimentSettings.captioner_model`), refused where the run's policy was trained
    with another model type or width."""
    weights, settings = run_policy_weights(path, checkpoint, name=name)
    if captioner is not None:
        check_run_captioner(path, settings, name, captioner)
    try:
        check_weights(weights)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    if finished:
        check_finished(path, name=name)
    return settings


def check_run_captioner(path, run_config: dict, name: str, captioner: dict) -> None:
    """Refuse a run whose ``policy.json`` says its policy was trained with a captioner of
    another model type or hidden size than ``captioner`` (:meth:`ExperimentSettings.
    captioner_model`), or whose ``captioner.json`` names other weights: loading it would fail
    (or score another captioner's policy) only after the splits are captioned. A run without
    the records (from before them) is checked once it is loaded."""
    # the weights too, where the run recorded its captioner's (run_files.check_captioner)
    check_captioner(path, captioner["path"], name=name)
    record = Path(path) / POLICY_RECORD_FILE
    if not record.is_file():
        return
    try:
        trained_on = read_policy_record(record)[1]
    except (ValueError, TypeError, OSError) as err:
        raise ValueError(f"{name}: {err}") from None
    run_has = {"model_type": trained_on.model_type, "hidden_size": trained_on.hidden_size}
    differ = [f"{key.replace('_', ' ')} {captioner[key]!r} (the run's: {value!r})"
              for key, value in run_has.items() if captioner[key] != value]
    if differ:
        raise ValueError(f"{name}: {path}'s policy was trained with another captioner "
                         f"(`{asset_names(run_config)[1]}`): the captioner given here, "
                         f"{captioner['path']}, has {'; '.join(differ)}; score the run with "
                         "the captioner it was trained with (--captioner, "
                         "--captioner-preset)")


def trained_elsewhere(run_config: dict, data_root, captioner_path) -> str | None:
    """A given run (its config.json, ``run_config``) trained on another benchmark or with
    another captioner than it is scored with here (their folder names differ): a phrase saying
    so, for the results' labels and notes; None where they agree. A policy may be scored on
    other data, but a results file must not pass that off as the run's own benchmark."""
    benchmark, captioner = asset_names(run_config)
    here = Path(data_root).name, Path(captioner_path).name
    if (benchmark, captioner) == here:
        return None
    return (f"trained on `{benchmark}` with captioner `{captioner}`, scored on `{here[0]}` "
            f"with `{here[1]}`")


class Refused(ValueError):
    """What an experiment refuses before it writes anything (a split it can't score, a run it
    can't train): ``python -m avex.evaluate`` prints it as a usage error, without a
    traceback; any other error keeps its traceback."""


def not_a_cache(path) -> str:
    what = "a file" if Path(path).is_file() else "a directory without meta.json"
    return "" if not Path(path).exists() else f" ({what}; a feature cache is a directory " \
        "holding meta.json)"


def load_experiment_inputs(settings: ExperimentSettings):
    """(feature cache, frozen captioner) of an experiment's settings."""
    data_path, captioner_path = resolve_asset_paths(
        settings.data, settings.captioner, benchmark_preset=settings.benchmark_preset,
        captioner_preset=settings.captioner_preset, cache_dir=settings.cache_dir,
        progress=settings.progress)
    device = None if settings.device == "auto" else settings.device
    for problem in judge_warnings(judge_record(data_path, captioner_path,
                                               cache_dir=settings.cache_dir)):
        warnings.warn(f"the judge differs from the committed one: {problem}", stacklevel=2)
    return load_cache_and_captioner(data_path, captioner_path, device=device,
                                    progress=settings.progress)


def begin(settings, kind: type, experiment: str):
    """(``settings`` checked, its output folder) at the start of an experiment: ``settings``
    must be a ``kind``; the folder is ``settings.out`` or ``runs/<experiment>-<date-time>``."""
    if not isinstance(settings, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"settings must be {article} {kind.__name__}, got "
                        f"{type(settings).__name__}")
    settings = settings.validate()
    out = Path(settings.out) if settings.out else \
        Path("runs") / time.strftime(f"{experiment}-%Y%m%d-%H%M%S")
    return settings, out


def split_clips(cache, split: str, max_clips, *, shown: int = 0):
    """The first ``max_clips`` clips of ``split`` (all: None), each with references, their
    shards hashed; ``shown``: how many of them a report will show (``--qualitative``), a note
    where that is more than there are."""
    if split not in {r["split"] for r in cache.rows}:
        raise Refused(f"split {split!r} is not in the cache (has "
                         f"{sorted({r['split'] for r in cache.rows})})")
    clips = cache.split(split)
    n = len(clips) if max_clips is None else min(len(clips), max_clips)
    bare = [clip_id for clip_id, refs in zip(clips.clip_ids[:n], clips.references("av")[:n])
            if not refs]
    if bare:   # every command here scores C_av: refused before any caption is written
        raise Refused(
            f"{split} split of {cache.root}: {len(bare)} of {n} clips have no reference "
            f"captions (e.g. clip {bare[0]!r}), and python -m avex.evaluate scores C_av against "
            "them. A label-free cache is scored by python -m avex.train's own table (how often "
            "the pruned caption reproduces the full-token one, and its log-likelihood); "
            "export the clips with captions to evaluate them here")
    if shown > n:   # the default (3) beside --max-clips 2 is no mistake: said, not refused
        print(f"note: qualitative = {shown}, but the {split} split has {n} clip(s)"
              + (f" (max_clips = {max_clips})" if max_clips else "")
              + f"; the report shows {n}")
    # a flipped bit in a shard passes the header checks: hash what is read (once per cache)
    print(f"{split}: {cache.verify_shards(clips.indices[:n])}")
    return [clips[i] for i in range(n)]


def check_training_references(cfg: TrainConfig, cache, what: str) -> None:
    """``python -m avex.train``'s refusal of a reward that reads CIDEr on train clips without
    references, made before an experiment trains anything: ``what`` names the run."""
    try:
        check_references(cfg, cache)
    except ValueError as err:
        raise Refused(f"{what}: {err}") from None


def results_json(data) -> str:
    """``data`` as a results file's JSON: indented one space a level, except that a list of
    numbers (a row's per-clip scores) stays on one line, or each score would take a line."""
    def number(x):
        return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)

    def encode(value, depth: int) -> str:
        inner = " " * (depth + 1)
        if isinstance(value, dict) and value:
            items = [f"{inner}{json.dumps(str(k))}: {encode(v, depth + 1)}"
                     for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
        if isinstance(value, (list, tuple)) and value and not all(map(number, value)):
            items = [inner + encode(v, depth + 1) for v in value]
            return "[\n" + ",\n".join(items) + "\n" + " " * depth + "]"
        return json.dumps(value, default=float, separators=(",", ": "))
    return encode(data, 0) + "\n"


def fmt(values, digits=1):
    """One value, or mean ± std of several; "n/a" for none."""
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def percent(share) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def runs_phrase(flags) -> str:
    """The given runs' flags in a sentence, one flag's seeds together: "--avex-run (seed 0)",
    "--avex-run (seed 1)", "--cacovid-run" -> "--avex-run (seeds 0, 1) and --cacovid-run"."""
    seeds: dict[str, list[str]] = {}
    for flag in flags:
        name, per_seed, rest = flag.partition(" (seed ")
        seeds.setdefault(name, []).extend([rest.rstrip(")")] if per_seed else [])
    return " and ".join(name if not got else f"{name} (seed{'s' if len(got) > 1 else ''} "
                        f"{', '.join(got)})" for name, got in seeds.items())
