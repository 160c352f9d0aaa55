"""The embedded audio-visual benchmark: generated clips written in the feature-cache format.

Each clip's tokens are what a frozen backbone's projector would hand the LLM, synthesised from a
fixed random "backbone" (one unit vector per concept, drawn from the seed):

* visual tokens, frame-major (frame t, patch p): the scene fills every background patch (dense,
  redundant across frames and patches); the subject covers one or a few patches for part of the
  clip, carrying its class, action and, in most of its patches, its colour; uncaptioned moving
  things (swaying leaves, a flickering screen) share the subject's "motion" salience; a few
  background patches are high-norm artifacts with no content (as ViT "register" outliers are);
* audio tokens, one or more per frame: a silence/ambience floor, short sound events (1-3 frames,
  an onset-decay envelope, loud or faint), music over most of the clip in music-heavy clips,
  uncaptioned transients (rustle, clicks, wind) with the same "onset" salience as events; some
  clips are silent.

Salience shared by content and distractors, redundancy, and the LM's own position and modality
biases are what make attention a weak guide to a token's contribution here, as in the paper's
Fig. 1a; the gates (``python -m avex.data gates``) measure it. The transfer split shifts the
statistics (scene/subject combinations, event lengths, music share, distractors, noise, a
camera/domain offset) and is never trained on.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import _checks
from ..paths import benchmarks_dir
from ..progress import progress_bar
from . import world
from .cache import SPLITS, CacheWriter, peek_meta

GENERATOR_VERSION = 1
SPLIT_CODES = {name: i + 1 for i, name in enumerate(SPLITS)}

# token roles stored as annotations (analysis only: no policy or baseline may read them)
VISUAL_ROLES = {"scene": 0, "subject": 1, "artifact": 2, "distractor": 3}
AUDIO_ROLES = {"silence": 0, "event": 1, "music": 2, "distractor": 3}
N_DISTRACTOR_KINDS = 3   # uncaptioned sources: e.g. swaying leaves, a flickering screen; rustle,
                         # clicks, wind (identities only; no caption ever names them)


@dataclass(frozen=True)
class BenchmarkConfig:
    """Size and statistics of a generated benchmark. ``grid`` is the patch grid side (patches per
    frame = grid**2); ``audio_per_frame`` audio tokens per frame. Split sizes default to
    AVCaps's 1661 train clips, 1000 val and 1000 test clips (enough to tell methods apart with
    paired intervals; AVCaps has 200 of each) and a 200-clip transfer split.

    Every clip is drawn from a generator seeded by (seed, split, index) alone, so a split's
    first N clips do not depend on its size or on the other splits' sizes: the 1000-clip
    splits begin with the 200 clips the earlier 200-clip benchmark held, byte for byte."""

    seed: int = 0
    n_frames: int = 16
    grid: int = 2
    audio_per_frame: int = 1
    dim: int = 64
    train: int = 1661
    val: int = 1000
    test: int = 1000
    transfer: int = 200
    clips_per_shard: int = 256
    noise: float = 0.06

    @property
    def n_visual(self) -> int:
        return self.n_frames * self.grid * self.grid

    @property
    def n_audio(self) -> int:
        return self.n_frames * self.audio_per_frame

    def split_sizes(self) -> dict:
        return {name: getattr(self, name) for name in SPLITS}

    def validate(self) -> "BenchmarkConfig":
        for name in ("n_frames", "grid", "audio_per_frame", "dim", "clips_per_shard"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.n_frames < 4:
            raise ValueError(f"n_frames must be >= 4 (events and objects need room), "
                             f"got {self.n_frames}")
        if self.dim < 16:
            raise ValueError(f"dim must be >= 16 (concept vectors must be near-orthogonal), "
                             f"got {self.dim}")
        for name in SPLITS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} (clips in that split) must be an int >= 0, "
                                 f"got {value!r}")
        if self.train + self.val + self.test + self.transfer == 0:
            raise ValueError("every split size is 0; nothing to build")
        if not (isinstance(self.noise, (int, float)) and 0 <= self.noise < 1):
            raise ValueError(f"noise must be in [0, 1), got {self.noise!r}")
        _checks.int_at_least("seed", self.seed, 0)
        return self


PRESETS = {
    # a few seconds to build; for tests
    "tiny": BenchmarkConfig(n_frames=8, grid=2, audio_per_frame=1, dim=32, train=48, val=8,
                            test=8, transfer=8, clips_per_shard=16),
    # CPU-friendly default: 16 frames, 4 patches a frame (Nv = 64), 1 audio token a frame (Na = 16)
    "default": BenchmarkConfig(),
    # the paper's token structure: Nv = 16 x 16 = 256, Na = 64
    "paper": BenchmarkConfig(grid=4, audio_per_frame=4),
}


@dataclass(frozen=True)
class SplitStatistics:
    """What differs between the in-domain splits and the transfer split."""

    p_silent: float = 0.12
    p_music: float = 0.15
    p_two_events: float = 0.4
    p_own_event: float = 0.5
    flat_subjects: bool = False            # ignore the scene -> subject prior
    event_frames: tuple = (1, 2, 3)
    event_frame_weights: tuple = (4, 4, 2)
    presence: tuple = (0.3, 0.75)          # share of frames the subject is on screen
    size_scale: float = 1.0
    noise_scale: float = 1.0
    domain_offset: float = 0.0
    audio_distractors: tuple = (0.4, 0.4, 0.2)    # P(0, 1, 2 uncaptioned transients)
    visual_distractors: tuple = (0.2, 0.3, 0.3, 0.2)  # P(0..3 uncaptioned moving things)


IN_DOMAIN = SplitStatistics()
TRANSFER = SplitStatistics(p_silent=0.05, p_music=0.3, p_two_events=0.3, p_own_event=0.4,
                           flat_subjects=True, event_frames=(2, 3, 4),
                           event_frame_weights=(3, 4, 3), presence=(0.5, 1.0), size_scale=2.0,
                           noise_scale=1.6, domain_offset=0.3, audio_distractors=(0.3, 0.4, 0.3),
                           visual_distractors=(0.1, 0.3, 0.3, 0.3))

SIZE_SHARE = {"small": 1 / 16, "medium": 1 / 8, "large": 1 / 4}


# -- the fixed random "backbone" -----------------------------------------------------------------

def _norm(vector) -> float:
    """The Euclidean norm, correctly rounded (math.fsum), so the same on every machine:
    np.linalg.norm of a vector is a BLAS dot product, whose summation order depends on the CPU
    kernel OpenBLAS picks (its Haswell/Zen and SkylakeX kernels differ in the last bit)."""
    return math.sqrt(math.fsum(float(x) * float(x) for x in vector))


class Backbone:
    """One unit vector per concept (scene, subject class, colour, action, sound, ...), drawn once
    from the seed; every clip's tokens are mixtures of these."""

    def __init__(self, seed: int, dim: int, grid: int, n_frames: int, n_audio: int):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x5EED])))
        self.dim = dim

        def table(names):
            vectors = rng.standard_normal((len(names), dim))
            vectors /= np.array([[_norm(v)] for v in vectors])
            return dict(zip(names, vectors))

        colors = sorted({c for s in world.SUBJECTS.values() for c in s.colors})
        self.scene = table(sorted(world.SCENES))
        self.texture = {s: table(range(grid * grid)) for s in sorted(world.SCENES)}
        self.ambience = table(sorted(world.SCENES))
        self.subject = table(sorted(world.SUBJECTS))
        self.color = table(colors)
        self.action = table(sorted(world.ACTIONS))
        self.event = table(sorted(world.EVENTS))
        self.music = table(world.INSTRUMENTS)
        self.frame_pos = table(range(n_frames))
        self.patch_pos = table(range(grid * grid))
        self.audio_pos = table(range(n_audio))
        self.clutter = table(range(N_DISTRACTOR_KINDS))
        self.transient = table(range(N_DISTRACTOR_KINDS))
        misc = table(["silence", "artifact", "domain", "motion", "onset"])
        self.silence, self.artifact, self.domain = misc["silence"], misc["artifact"], misc["domain"]
        # salience shared by content and distractors: whatever moves carries "motion", whatever
        # starts loud carries "onset", captioned or not (as real encoders' features do)
        self.motion, self.onset = misc["motion"], misc["onset"]


# -- sampling a clip -----------------------------------------------------------------------------

def _place_spans(rng, lengths: list, n_tokens: int) -> list | None:
    """Start positions for non-overlapping spans with the given lengths, or None if they do not
    fit after a few tries."""
    for _ in range(50):
        starts = [int(rng.integers(0, n_tokens - length + 1)) for length in lengths]
        spans = sorted(zip(starts, lengths))
        if all(a + la <= b for (a, la), (b, _) in zip(spans, spans[1:])):
            return starts
    return None


def sample_clip(rng, cfg: BenchmarkConfig, stats: SplitStatistics) -> world.ClipSpec:
    scene = world._pick(rng, {s: 1 for s in world.SCENES})
    prior = {s: 1 for s in world.SUBJECTS} if stats.flat_subjects else world.SUBJECT_PRIOR[scene]
    subject_name = world._pick(rng, prior)
    subject = world.SUBJECTS[subject_name]
    color = subject.colors[int(rng.integers(len(subject.colors)))]
    action = subject.actions[int(rng.integers(len(subject.actions)))]
    p_music = stats.p_music * (3 if scene == "stage" else 1)
    draw = rng.random()
    kind = "silent" if draw < stats.p_silent else "music" if draw < stats.p_silent + p_music \
        else "events"
    spec = world.ClipSpec(scene=scene, subject=subject_name, color=color, action=action,
                          audio_kind=kind)

    def background_kinds(exclude: set) -> dict:
        return {k: w for k, w in world.EVENT_PRIOR[scene].items()
                if k not in exclude and k not in subject.own_events}

    chosen: list[tuple[str, bool]] = []
    if kind == "events":
        if rng.random() < stats.p_own_event:
            chosen.append((subject.own_events[int(rng.integers(len(subject.own_events)))], True))
        else:
            chosen.append((world._pick(rng, background_kinds(set())), False))
        if rng.random() < stats.p_two_events:
            options = background_kinds({k for k, _ in chosen})
            if options:
                chosen.append((world._pick(rng, options), False))
    elif kind == "music":
        spec.instrument = world.INSTRUMENTS[int(rng.integers(len(world.INSTRUMENTS)))]
        length = int(round(cfg.n_audio * rng.uniform(0.6, 1.0)))
        spec.music_span = (int(rng.integers(0, cfg.n_audio - length + 1)), length)
        if rng.random() < 0.3:
            chosen.append((world._pick(rng, background_kinds(set())), False))
    if chosen:
        frames = [int(world._pick(rng, list(zip(stats.event_frames, stats.event_frame_weights))))
                  for _ in chosen]
        lengths = [min(f * cfg.audio_per_frame, cfg.n_audio // 2) for f in frames]
        starts = _place_spans(rng, lengths, cfg.n_audio)
        if starts is None:  # does not fit: keep the first event only
            chosen, lengths = chosen[:1], lengths[:1]
            starts = [int(rng.integers(0, cfg.n_audio - lengths[0] + 1))]
        spans = [world.EventSpan(kind=k, start=s, length=n, own=own,
                                 amplitude=float(rng.uniform(0.4, 1.2)))
                 for (k, own), s, n in zip(chosen, starts, lengths)]
        spec.events = sorted(spans, key=lambda e: e.start)
    return spec


# -- features ------------------------------------------------------------------------------------

def _subject_cells(rng, cfg: BenchmarkConfig, stats: SplitStatistics,
                   spec: world.ClipSpec) -> dict:
    """frame -> list of patch indices the subject covers."""
    n_patches = cfg.grid * cfg.grid
    share = SIZE_SHARE[world.SUBJECTS[spec.subject].size] * stats.size_scale
    cells = max(1, min(n_patches // 2, int(round(share * n_patches))))
    low, high = (max(2, int(round(p * cfg.n_frames))) for p in stats.presence)
    length = int(rng.integers(low, max(low, high) + 1))
    start = int(rng.integers(0, cfg.n_frames - length + 1))
    anchor = int(rng.integers(n_patches))
    moving = spec.action in world.MOVING_ACTIONS
    out = {}
    for t in range(start, start + length):
        if moving and t > start and (t - start) % 4 == 0 and rng.random() < 0.5:
            anchor = (anchor + 1) % n_patches
        out[t] = [(anchor + k) % n_patches for k in range(cells)]
    return out


def _runs(rng, count: int, n_slots: int, lengths: tuple, free) -> list:
    """Up to ``count`` (start, length) runs inside ``n_slots`` whose slots are all ``free``."""
    runs = []
    for _ in range(count):
        length = int(rng.integers(lengths[0], lengths[1] + 1))
        starts = [s for s in range(n_slots - length + 1) if free[s:s + length].all()]
        if not starts:
            continue
        start = int(starts[int(rng.integers(len(starts)))])
        free[start:start + length] = False
        runs.append((start, length))
    return runs


def synthesize(rng, cfg: BenchmarkConfig, stats: SplitStatistics, bb: Backbone,
               spec: world.ClipSpec):
    """Visual [Nv, d] and audio [Na, d] tokens (float32) and their role annotations."""
    n_patches, d = cfg.grid * cfg.grid, cfg.dim
    noise = cfg.noise * stats.noise_scale
    scene = bb.scene[spec.scene]
    visual = np.zeros((cfg.n_frames, n_patches, d))
    visual_role = np.zeros((cfg.n_frames, n_patches), dtype=np.int8)
    camera = 0.05 * rng.standard_normal((cfg.n_frames, d)) / np.sqrt(d)  # small per-frame drift
    for t in range(cfg.n_frames):
        for p in range(n_patches):
            visual[t, p] = (scene + 0.4 * bb.texture[spec.scene][p] + 0.15 * bb.frame_pos[t]
                            + 0.15 * bb.patch_pos[p] + camera[t])
    instance = rng.standard_normal(d)
    instance *= 0.2 / _norm(instance)
    for t, patches in _subject_cells(rng, cfg, stats, spec).items():
        for p in patches:
            color = bb.color[spec.color] * (0.8 if rng.random() < 0.75 else 0.0)
            visual[t, p] = (0.3 * scene + bb.subject[spec.subject] + color
                            + 0.7 * bb.action[spec.action] + 0.5 * bb.motion + instance
                            + 0.15 * bb.frame_pos[t] + 0.15 * bb.patch_pos[p])
            visual_role[t, p] = VISUAL_ROLES["subject"]
    # uncaptioned moving things: salient (motion) but never named by any reference
    n_clutter = int(rng.choice(len(stats.visual_distractors), p=stats.visual_distractors))
    for _ in range(n_clutter):
        kind, p = int(rng.integers(N_DISTRACTOR_KINDS)), int(rng.integers(n_patches))
        free = visual_role[:, p] == VISUAL_ROLES["scene"]
        for start, length in _runs(rng, 1, cfg.n_frames, (3, max(3, cfg.n_frames // 2)), free):
            for t in range(start, start + length):
                visual[t, p] = (0.6 * scene + 0.7 * bb.clutter[kind] + 0.5 * bb.motion
                                + 0.15 * bb.frame_pos[t] + 0.15 * bb.patch_pos[p])
                visual_role[t, p] = VISUAL_ROLES["distractor"]
    # high-norm background outliers with no content (ViT "register" artifacts)
    background = np.flatnonzero(visual_role.reshape(-1) == VISUAL_ROLES["scene"])
    n_artifacts = int(rng.binomial(max(1, 3 * n_patches // 4), 0.5))
    for index in rng.choice(background, size=min(n_artifacts, len(background)), replace=False):
        t, p = divmod(int(index), n_patches)
        visual[t, p] = 2.5 * bb.artifact + 0.4 * scene
        visual_role[t, p] = VISUAL_ROLES["artifact"]
    visual = visual.reshape(-1, d) + stats.domain_offset * bb.domain \
        + noise * rng.standard_normal((cfg.n_visual, d))

    floor = np.stack([0.6 * bb.silence + 0.35 * bb.ambience[spec.scene] + 0.15 * bb.audio_pos[i]
                      for i in range(cfg.n_audio)])
    audio = floor.copy()
    audio_role = np.zeros(cfg.n_audio, dtype=np.int8)
    audio_noise = np.full(cfg.n_audio, noise)
    if spec.music_span is not None:
        start, length = spec.music_span
        for i in range(start, start + length):
            audio[i] = (0.7 * bb.music[spec.instrument] + 0.2 * bb.ambience[spec.scene]
                        + 0.15 * bb.audio_pos[i])
            audio_role[i] = AUDIO_ROLES["music"]
            audio_noise[i] = 1.5 * noise  # each music token alone is a weak cue

    def transient(i: int, j: int, amplitude: float, identity) -> None:
        envelope = amplitude * (0.75 ** (j / cfg.audio_per_frame))
        audio[i] = 0.5 * audio[i] + envelope * (identity + 0.7 * bb.onset)

    for event in spec.events:
        for j in range(event.length):
            transient(event.start + j, j, event.amplitude, bb.event[event.kind])
            audio_role[event.start + j] = AUDIO_ROLES["event"]
    # uncaptioned transients (rustle, clicks, wind): loud onsets no annotator writes down
    count = int(rng.choice(len(stats.audio_distractors), p=stats.audio_distractors))
    free = audio_role != AUDIO_ROLES["event"]
    lengths = (cfg.audio_per_frame, 2 * cfg.audio_per_frame)
    for start, length in _runs(rng, count, cfg.n_audio, lengths, free):
        kind, amplitude = int(rng.integers(N_DISTRACTOR_KINDS)), float(rng.uniform(0.8, 1.4))
        for j in range(length):
            transient(start + j, j, amplitude, bb.transient[kind])
            audio_role[start + j] = AUDIO_ROLES["distractor"]
    audio = audio + audio_noise[:, None] * rng.standard_normal((cfg.n_audio, d))
    return (torch.from_numpy(visual.astype(np.float32)),
            torch.from_numpy(audio.astype(np.float32)),
            torch.from_numpy(visual_role.reshape(-1)), torch.from_numpy(audio_role))


# -- tokenizer -----------------------------------------------------------------------------------

def build_tokenizer():
    """A word-level Hugging Face fast tokenizer over the world's vocabulary (special tokens
    first: pad 0, unk 1, eos ``<|im_end|>`` 2, ``<|im_start|>`` 3)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(world.SPECIAL_TOKENS) + world.grammar_words()
    vocab = {word: i for i, word in enumerate(words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=world.UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # the WordPiece decoder joins tokens with spaces (no word here starts with its "##" marker);
    # without a decoder a reloaded tokenizer would glue the words together
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token=world.UNK_TOKEN,
                                   pad_token=world.PAD_TOKEN, eos_token=world.EOS_TOKEN,
                                   additional_special_tokens=["<|im_start|>"])


# -- building ------------------------------------------------------------------------------------

def resolve_config(preset: str = "default", **overrides) -> BenchmarkConfig:
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    fields = {f.name for f in dataclasses.fields(BenchmarkConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown benchmark setting(s) {unknown}; known: {sorted(fields)}")
    values = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(PRESETS[preset], **values).validate()


def benchmark_name(cfg: BenchmarkConfig, preset: str = "default") -> str:
    """Directory name: the preset and seed, plus a short hash when other settings differ."""
    base = dataclasses.replace(PRESETS[preset], seed=cfg.seed) if preset in PRESETS else None
    name = f"embedded-{preset}-seed{cfg.seed}"
    if cfg != base:
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
        name += "-" + digest.hexdigest()[:8]
    return name


def default_benchmark_path(preset: str = "default", cache_dir=None, **overrides) -> Path:
    cfg = resolve_config(preset, **overrides)
    return benchmarks_dir(cache_dir) / benchmark_name(cfg, preset)


#: a clip's bytes besides its features (manifest row, roles, prompt ids; measured on the
#: default build: 86.3 MB for 3861 clips of 80 x 64 float32 features)
CLIP_OVERHEAD_BYTES = 2048


def estimated_bytes(cfg: BenchmarkConfig) -> int:
    """About what :func:`build_benchmark` writes for ``cfg`` (float32 features)."""
    clip = (cfg.n_visual + cfg.n_audio) * cfg.dim * 4 + CLIP_OVERHEAD_BYTES
    return sum(cfg.split_sizes().values()) * clip


def build_benchmark(out_dir, cfg: BenchmarkConfig, *, preset: str = "custom",
                    overwrite: bool = False, progress: bool = True) -> Path:
    """Generate every split of ``cfg`` and write it as a feature cache at ``out_dir``.
    The same ``cfg`` gives byte-identical files."""
    cfg.validate()
    bb = Backbone(cfg.seed, cfg.dim, cfg.grid, cfg.n_frames, cfg.n_audio)
    tokenizer = build_tokenizer()
    prefix_ids = tokenizer(world.PROMPT_PREFIX, add_special_tokens=False)["input_ids"]
    suffix_ids = tokenizer(world.PROMPT_SUFFIX, add_special_tokens=False)["input_ids"]
    source = {"kind": "embedded", "generator_version": GENERATOR_VERSION, "preset": preset,
              "config": dataclasses.asdict(cfg),
              "layout": {"grid": cfg.grid, "patches_per_frame": cfg.grid * cfg.grid,
                         "audio_per_frame": cfg.audio_per_frame},
              "roles": {"visual": VISUAL_ROLES, "audio": AUDIO_ROLES}}
    total = sum(cfg.split_sizes().values())
    writer = CacheWriter(out_dir, dim=cfg.dim, n_frames=cfg.n_frames, tokenizer="tokenizer",
                         source=source, clips_per_shard=cfg.clips_per_shard, overwrite=overwrite)
    with writer, progress_bar(total=total, desc="building embedded benchmark", unit="clip",
                              disable=not progress) as bar:
        tokenizer.save_pretrained(str(writer.staging_dir / "tokenizer"))
        for split in SPLITS:
            stats = TRANSFER if split == "transfer" else IN_DOMAIN
            for index in range(getattr(cfg, split)):
                # seeded by (seed, split, index) alone: a larger split keeps its first clips
                seq = np.random.SeedSequence([cfg.seed, SPLIT_CODES[split], index])
                rng = np.random.Generator(np.random.PCG64(seq))
                spec = sample_clip(rng, cfg, stats)
                refs_av, refs_v, refs_a = world.references(spec, rng)
                visual, audio, visual_role, audio_role = synthesize(rng, cfg, stats, bb, spec)
                writer.add(f"{split}-{index:05d}", split, visual, audio,
                           refs_av=refs_av, refs_v=refs_v, refs_a=refs_a,
                           prompt_prefix_ids=prefix_ids, prompt_suffix_ids=suffix_ids,
                           prompt_text={"prefix": world.PROMPT_PREFIX,
                                        "suffix": world.PROMPT_SUFFIX},
                           annotations={"visual_role": visual_role, "audio_role": audio_role},
                           info=spec.summary())
                bar.update(1)
    return Path(out_dir)


#: the generator's settings that only say how many clips it draws; the others (seed, feature
#: dim, grid, frames, noise) decide its world: concepts, words and features
SPLIT_SIZE_SETTINGS = ("train", "val", "test", "transfer", "clips_per_shard")


def built_mismatch(path, cfg: BenchmarkConfig, preset: str = "default", *,
                   sizes: bool = True) -> str | None:
    """None when the folder ``path`` holds the embedded benchmark ``cfg`` would build (same
    generator version and settings; with ``sizes`` False, split sizes aside: the 200- and
    1000-clip builds of a seed share their train split); else why not, naming what differs."""
    meta = peek_meta(path)
    source = meta.get("source") if meta else None
    where = f"{str(path)!r} holds"
    if not isinstance(source, dict) or source.get("kind") != "embedded":
        kind = "no readable meta.json" if meta is None else (
            "a meta.json that records no embedded benchmark (source kind "
            f"{source.get('kind') if isinstance(source, dict) else None!r})")
        return f"{where} {kind}, not an embedded benchmark"
    if source.get("generator_version") != GENERATOR_VERSION:
        return (f"{where} an embedded benchmark of generator_version "
                f"{source.get('generator_version')!r}; this build is version {GENERATOR_VERSION}")
    built = source.get("config")
    wanted = dataclasses.asdict(cfg)
    if not isinstance(built, dict):
        return f"{where} an embedded benchmark whose meta.json records no settings (config)"
    differ = [f"{key} {built.get(key, '(absent)')!r} there, {wanted.get(key, '(absent)')!r} "
              f"asked" for key in sorted(set(built) | set(wanted))
              if built.get(key, "(absent)") != wanted.get(key, "(absent)")
              and (sizes or key not in SPLIT_SIZE_SETTINGS)]
    if differ:
        return (f"{where} an embedded benchmark built with other settings (preset "
                f"{source.get('preset')!r} there, {preset!r} asked): " + "; ".join(differ))
    return None


def ensure_benchmark(preset: str = "default", *, cache_dir=None, progress: bool = True,
                     **overrides) -> Path:
    """The path of the embedded benchmark for these settings, building it first if it is not
    there yet (training calls this, so a first run needs no separate build step)."""
    path = default_benchmark_path(preset, cache_dir, **overrides)
    if (path / "meta.json").is_file():
        # an earlier build of other split sizes (200 val / test clips) is the same world
        mismatch = built_mismatch(path, resolve_config(preset, **overrides), preset,
                                  sizes=False)
        if mismatch:
            raise ValueError(f"{mismatch}; move it aside or pass another cache_dir")
    else:
        cfg = resolve_config(preset, **overrides)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            build_benchmark(path, cfg, preset=preset, progress=progress)
        except FileExistsError:
            pass  # another process finished the same build first; its files are identical
    return path
