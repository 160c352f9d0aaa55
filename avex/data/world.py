"""The small world the embedded benchmark describes: scenes, subjects, sounds, and a paraphrase
grammar for the three kinds of reference (audio-visual, visual-only, audio-only).

A clip is a :class:`ClipSpec`: one scene, one visible subject (class, colour, action) and an audio
track that is silent, event-driven (one or two short sound events) or music-heavy. The AV caption
is not a sum of a visual and an audio caption: when the subject makes its own sound the verb
phrase fuses both ("a brown dog runs and barks"), while the same bark with a cat on screen becomes
a background clause ("while a dog barks"). Everything here is plain Python over a numpy Generator,
so it is deterministic for a seed on every platform.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# -- vocabulary of the world ---------------------------------------------------------------------

# scene -> (phrase, weight) alternatives used in captions
SCENES = {
    "park": [("in the park", 6), ("in a park", 3), ("at the park", 1)],
    "street": [("on the street", 6), ("on a busy street", 2), ("along the street", 2)],
    "kitchen": [("in the kitchen", 7), ("in a kitchen", 3)],
    "beach": [("on the beach", 6), ("at the beach", 4)],
    "forest": [("in the forest", 6), ("in the woods", 4)],
    "room": [("in a room", 5), ("in the living room", 3), ("indoors", 2)],
    "stage": [("on the stage", 6), ("on a stage", 4)],
    "field": [("in a field", 6), ("on the grass", 4)],
    "yard": [("in the yard", 6), ("in a backyard", 4)],
    "river": [("by the river", 6), ("near a river", 4)],
}

# action -> (third person singular, gerund)
ACTIONS = {
    "run": ("runs", "running"), "sit": ("sits", "sitting"), "play": ("plays", "playing"),
    "walk": ("walks", "walking"), "sleep": ("sleeps", "sleeping"),
    "dance": ("dances", "dancing"), "stand": ("stands", "standing"),
    "jump": ("jumps", "jumping"), "drive": ("drives", "driving"), "park": ("parks", "parking"),
    "fly": ("flies", "flying"),
}
MOVING_ACTIONS = {"run", "walk", "dance", "jump", "drive", "fly", "play"}


@dataclass(frozen=True)
class Subject:
    nouns: tuple            # (noun, weight) alternatives
    attribute: str          # "color" (a brown dog) or "shirt" (a man in a red shirt)
    colors: tuple
    actions: tuple
    own_events: tuple       # sound events this subject makes itself
    size: str               # "small", "medium", "large": share of the frame it covers


SUBJECTS = {
    "dog": Subject((("dog", 8), ("puppy", 2)), "color", ("black", "brown", "white"),
                   ("run", "sit", "play", "walk"), ("bark",), "medium"),
    "cat": Subject((("cat", 17), ("kitten", 3)), "color", ("black", "white", "gray"),
                   ("sit", "walk", "sleep"), ("meow",), "small"),
    "man": Subject((("man", 8), ("guy", 2)), "shirt", ("red", "blue", "green", "black"),
                   ("walk", "sit", "dance", "stand"), ("speech",), "medium"),
    "woman": Subject((("woman", 8), ("lady", 2)), "shirt", ("red", "blue", "yellow", "white"),
                     ("walk", "sit", "dance", "stand"), ("speech",), "medium"),
    "child": Subject((("child", 6), ("kid", 4)), "shirt", ("red", "blue", "yellow", "green"),
                     ("run", "play", "jump"), ("laughter",), "medium"),
    "car": Subject((("car", 1),), "color", ("red", "white", "black", "blue"),
                   ("drive", "park"), ("horn", "engine"), "large"),
    "bird": Subject((("bird", 1),), "color", ("black", "white"), ("fly", "sit"), ("chirp",),
                    "small"),
    "horse": Subject((("horse", 1),), "color", ("brown", "white", "black"), ("run", "walk"),
                     ("neigh",), "large"),
}


@dataclass(frozen=True)
class SoundEvent:
    nouns: tuple            # (noun phrase, weight) when the source is not on screen
    verb: str               # third person, agreeing with the noun phrase
    gerund: str


EVENTS = {
    "bark": SoundEvent((("a dog", 1),), "barks", "barking"),
    "meow": SoundEvent((("a cat", 1),), "meows", "meowing"),
    "speech": SoundEvent((("someone", 6), ("a person", 4)), "talks", "talking"),
    "laughter": SoundEvent((("a child", 7), ("a kid", 3)), "laughs", "laughing"),
    "horn": SoundEvent((("a car horn", 1),), "honks", "honking"),
    "engine": SoundEvent((("an engine", 1),), "roars", "roaring"),
    "chirp": SoundEvent((("a bird", 1),), "chirps", "chirping"),
    "neigh": SoundEvent((("a horse", 1),), "neighs", "neighing"),
    "siren": SoundEvent((("a siren", 1),), "wails", "wailing"),
    "applause": SoundEvent((("people", 1),), "clap", "clapping"),
    "thunder": SoundEvent((("thunder", 1),), "rumbles", "rumbling"),
    "door": SoundEvent((("a door", 1),), "slams", "slamming"),
}
INSTRUMENTS = ("piano", "guitar", "drums", "violin")

# scene -> subject weights, and scene -> weights of off-screen sound events (training statistics;
# the transfer split flattens both, so it meets combinations that training saw rarely or never)
SUBJECT_PRIOR = {
    "park": {"dog": 3, "child": 3, "man": 2, "woman": 2, "bird": 2, "horse": 1},
    "street": {"car": 4, "man": 3, "woman": 3, "dog": 2},
    "kitchen": {"man": 3, "woman": 3, "cat": 3, "child": 2},
    "beach": {"dog": 3, "child": 3, "man": 2, "woman": 2, "bird": 2, "horse": 1},
    "forest": {"bird": 3, "dog": 2, "horse": 2, "man": 2},
    "room": {"cat": 3, "man": 3, "woman": 3, "child": 2, "dog": 2},
    "stage": {"man": 4, "woman": 4},
    "field": {"horse": 3, "dog": 3, "child": 2, "bird": 2},
    "yard": {"dog": 3, "child": 3, "cat": 2, "man": 2},
    "river": {"bird": 3, "dog": 2, "man": 2, "woman": 2, "horse": 1},
}
EVENT_PRIOR = {
    "park": {"bark": 2, "chirp": 3, "speech": 2, "laughter": 2},
    "street": {"siren": 3, "horn": 3, "engine": 3, "speech": 2, "bark": 1},
    "kitchen": {"speech": 3, "door": 2, "meow": 1, "laughter": 1},
    "beach": {"speech": 2, "laughter": 2, "chirp": 2, "bark": 1, "thunder": 1},
    "forest": {"chirp": 4, "thunder": 2, "bark": 1},
    "room": {"speech": 3, "door": 2, "laughter": 1, "meow": 1, "bark": 1},
    "stage": {"applause": 4, "speech": 2},
    "field": {"chirp": 2, "neigh": 2, "bark": 2, "thunder": 1},
    "yard": {"bark": 2, "chirp": 2, "laughter": 2, "speech": 1},
    "river": {"chirp": 3, "thunder": 1, "speech": 1},
}

SILENT_AV = [("", 4), ("in silence", 3), ("with no sound", 3)]
SILENT_A = [("there is no sound", 3), ("it is silent", 3), ("silence", 2),
            ("nothing can be heard", 2)]

# Prompt around the AV tokens, in the manner of a chat template (VideoLLaMA 2 puts the video and
# audio tokens where its placeholders were, between these two pieces of text).
PROMPT_PREFIX = "<|im_start|> user"
PROMPT_SUFFIX = "describe what you see and hear in the video <|im_end|> <|im_start|> assistant"
PAD_TOKEN, UNK_TOKEN, EOS_TOKEN = "<|pad|>", "<|unk|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, EOS_TOKEN, "<|im_start|>")


# -- a clip --------------------------------------------------------------------------------------

@dataclass
class EventSpan:
    kind: str
    start: int              # first audio token
    length: int             # number of audio tokens
    amplitude: float
    own: bool               # made by the visible subject


@dataclass
class ClipSpec:
    scene: str
    subject: str
    color: str
    action: str
    audio_kind: str                          # "silent", "events" or "music"
    events: list = field(default_factory=list)          # EventSpan, in time order
    instrument: str | None = None
    music_span: tuple | None = None          # (start, length) in audio tokens

    def summary(self) -> dict:
        """A JSON-friendly description (stored in the manifest's "info")."""
        out = {"scene": self.scene, "subject": self.subject, "color": self.color,
               "action": self.action, "audio": self.audio_kind,
               "events": [{"kind": e.kind, "start": e.start, "length": e.length,
                           "own": e.own} for e in self.events]}
        if self.instrument is not None:
            out["instrument"] = self.instrument
        return out


def _pick(rng: np.random.Generator, options) -> str:
    """One item from (value, weight) pairs or a {value: weight} dict."""
    pairs = list(options.items()) if isinstance(options, dict) else list(options)
    weights = np.array([w for _, w in pairs], dtype=np.float64)
    return pairs[int(rng.choice(len(pairs), p=weights / weights.sum()))][0]


# -- references ----------------------------------------------------------------------------------

def _subject_phrase(spec: ClipSpec, rng) -> str:
    subject = SUBJECTS[spec.subject]
    noun = _pick(rng, subject.nouns)
    if subject.attribute == "shirt":
        wearing = _pick(rng, [("in", 7), ("wearing", 3)])
        return f"a {noun} {wearing} a {spec.color} shirt"
    return f"a {spec.color} {noun}"


def _verb_phrase(spec: ClipSpec, rng, *, own_event: str | None) -> str:
    act, act_ing = ACTIONS[spec.action]
    progressive = rng.random() < 0.3
    if own_event is None:
        return f"is {act_ing}" if progressive else act
    sound = EVENTS[own_event]
    if progressive:
        return f"is {act_ing} and {sound.gerund}"
    return _pick(rng, [(f"{act} and {sound.verb}", 6), (f"{sound.verb} while {act_ing}", 3),
                       (f"{act} while {sound.gerund}", 1)])


def _event_clause(kinds: list, rng) -> str:
    """Background sounds (not made by the subject) as one clause."""
    sounds = [EVENTS[k] for k in kinds]
    style = _pick(rng, [("while", 5), ("as", 2), ("with", 3)])
    if style == "with":
        parts = [f"{_pick(rng, s.nouns)} {s.gerund}" for s in sounds]
        return "with " + " and ".join(parts) + " in the background"
    parts = [f"{_pick(rng, s.nouns)} {s.verb}" for s in sounds]
    return f"{style} " + " and ".join(parts)


def _music_clause(instrument: str, rng) -> str:
    return _pick(rng, [(f"while {instrument} music plays", 5), (f"to {instrument} music", 3),
                       (f"with {instrument} music in the background", 2)])


def av_reference(spec: ClipSpec, rng) -> str:
    own = next((e.kind for e in spec.events if e.own), None)
    background = [e.kind for e in spec.events if not e.own]
    subject = _subject_phrase(spec, rng)
    verb = _verb_phrase(spec, rng, own_event=own)
    place = _pick(rng, SCENES[spec.scene])
    if spec.audio_kind == "music":
        tail = _music_clause(spec.instrument, rng)
        for kind in background:
            sound = EVENTS[kind]
            tail += f" and {_pick(rng, sound.nouns)} {sound.verb}"
    elif background:
        tail = _event_clause(background, rng)
    elif spec.audio_kind == "silent":
        tail = _pick(rng, SILENT_AV)
    else:
        tail = ""
    # a minority of annotators lead with the sound
    if tail.startswith(("while ", "as ")) and rng.random() < 0.1:
        return f"{tail} {subject} {verb} {place}"
    return " ".join(p for p in (subject, verb, place, tail) if p)


def v_reference(spec: ClipSpec, rng) -> str:
    subject = _subject_phrase(spec, rng)
    verb = _verb_phrase(spec, rng, own_event=None)
    place = _pick(rng, SCENES[spec.scene])
    if rng.random() < 0.15:
        return f"{place} {subject} {verb}"
    return f"{subject} {verb} {place}"


def a_reference(spec: ClipSpec, rng) -> str:
    if spec.audio_kind == "silent":
        return _pick(rng, SILENT_A)
    parts = []
    if spec.audio_kind == "music":
        instrument = spec.instrument
        parts.append(_pick(rng, [(f"{instrument} music plays", 5),
                                 (f"{instrument} music is playing", 3),
                                 (f"someone plays the {instrument}", 2)]))
    for event in spec.events:
        sound = EVENTS[event.kind]
        noun = _pick(rng, sound.nouns)
        progressive = rng.random() < 0.3 and noun != "people"
        parts.append(f"{noun} is {sound.gerund}" if progressive else f"{noun} {sound.verb}")
    joiner = _pick(rng, [(" and ", 7), (" then ", 3)])
    return joiner.join(parts)


def references(spec: ClipSpec, rng, count: int = 5) -> tuple[list, list, list]:
    """``count`` references each of AV, visual-only and audio-only, distinct where the grammar
    allows (a few retries, as annotators rarely write identical sentences)."""
    out = []
    for render in (av_reference, v_reference, a_reference):
        refs: list[str] = []
        for _ in range(count):
            text = render(spec, rng)
            for _retry in range(6):
                if text not in refs:
                    break
                text = render(spec, rng)
            refs.append(" ".join(text.split()))
        out.append(refs)
    return out[0], out[1], out[2]


def grammar_words() -> list[str]:
    """Every word any reference or the prompt can contain, sorted (for the word-level
    tokenizer). Built from the tables above, so a new phrase anywhere is picked up."""
    words: set[str] = set()

    def add(text: str) -> None:
        words.update(text.split())

    for options in SCENES.values():
        for phrase, _ in options:
            add(phrase)
    for act, act_ing in ACTIONS.values():
        add(f"{act} {act_ing}")
    for subject in SUBJECTS.values():
        for noun, _ in subject.nouns:
            add(noun)
        add(" ".join(subject.colors))
    for event in EVENTS.values():
        for noun, _ in event.nouns:
            add(noun)
        add(f"{event.verb} {event.gerund}")
    add(" ".join(INSTRUMENTS))
    for phrase, _ in SILENT_AV + SILENT_A:
        add(phrase)
    add("a in wearing shirt is and while as with in the background to music plays playing "
        "someone plays the then person")
    add(PROMPT_PREFIX)
    add(PROMPT_SUFFIX)
    return sorted(words - set(SPECIAL_TOKENS))
