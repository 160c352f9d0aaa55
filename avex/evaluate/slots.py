"""Captions of the embedded benchmark read back into their content slots (issue #33's
diagnostics): which subject, colour, action, place, sound events and music a caption states,
parsed with the tables of the grammar that wrote the references (:mod:`avex.data.world`).

Two captions with the same slots are paraphrases of one content ("a brown puppy runs in a
park" and "a brown dog is running in the park"); any slot that differs is a change of content.
The parser reads the grammar's phrases wherever they stand, so it also reads the captioner's
off-grammar outputs: a slot it cannot find is None (an empty set for the events), which a
comparison counts as a change where the other caption has it.
"""
from __future__ import annotations

from typing import NamedTuple

from avex.data import world

__all__ = ["Slots", "SLOT_NAMES", "parse_caption", "slots_of_info", "changed_slots"]

#: the slots a comparison reports, in table order
SLOT_NAMES = ("object", "colour", "action", "event", "music", "place")

# word -> subject class ("puppy" -> "dog"), colour words, action forms -> action
_NOUNS = {noun: name for name, s in world.SUBJECTS.items() for noun, _ in s.nouns}
_COLOURS = {c for s in world.SUBJECTS.values() for c in s.colors}
_ACTION_FORMS = {form: act for act, forms in world.ACTIONS.items() for form in forms}
# a sound's verb or gerund -> its kind; the last word of each noun phrase naming its source
_EVENT_FORMS = {form: kind for kind, e in world.EVENTS.items() for form in (e.verb, e.gerund)}
_SOURCE_WORDS = {kind: {noun.split()[-1] for noun, _ in e.nouns}
                 for kind, e in world.EVENTS.items()}
# a scene's phrases as word tuples, longest first so "in the living room" wins over a prefix
_PLACES = sorted(((tuple(p.split()), scene) for scene, options in world.SCENES.items()
                  for p, _ in options), key=lambda item: -len(item[0]))


class Slots(NamedTuple):
    """A caption's content. ``object``: the subject's class (``"dog"`` for "puppy" too);
    ``events``: frozenset of (kind, "own" | "background") pairs, own when the subject makes the
    sound ("a brown dog runs and barks"), background when a clause names another source ("while
    a dog barks"); ``music``: the instrument; None (or empty) where the caption has none."""
    object: str | None
    colour: str | None
    action: str | None
    place: str | None
    events: frozenset
    music: str | None


def _subject(words: list[str]) -> tuple[str | None, str | None, int, int]:
    """(class, colour, index of the subject's noun, index after its phrase) of the first
    subject phrase: "a <colour> <noun>" or "a <noun> in|wearing a <colour> shirt"; else a bare
    "a <noun>" followed by an action ("a dog runs"), colour None; else (None, None, -1, 0)."""
    for i, word in enumerate(words[:-2]):
        if word != "a":
            continue
        if words[i + 1] in _COLOURS and words[i + 2] in _NOUNS:
            return _NOUNS[words[i + 2]], words[i + 1], i + 2, i + 3
        shirt = words[i + 2:i + 6]
        if words[i + 1] in _NOUNS and len(shirt) == 4 and shirt[0] in ("in", "wearing") \
                and shirt[1] == "a" and shirt[2] in _COLOURS and shirt[3] == "shirt":
            return _NOUNS[words[i + 1]], shirt[2], i + 1, i + 6
    for i, word in enumerate(words[:-2]):
        if word == "a" and words[i + 1] in _NOUNS and (words[i + 2] in _ACTION_FORMS
                                                       or words[i + 2] == "is"):
            return _NOUNS[words[i + 1]], None, i + 1, i + 2
    return None, None, -1, 0


def _place(words: list[str]) -> str | None:
    """The scene of the first place phrase in ``words`` (earliest start, longest phrase)."""
    for start in range(len(words)):
        for phrase, scene in _PLACES:
            if tuple(words[start:start + len(phrase)]) == phrase:
                return scene
    return None


def parse_caption(text: str) -> Slots:
    """The :class:`Slots` of a caption (lower-case words separated by spaces, as the captioner
    and the references write them). Never fails: an absent slot is None / empty."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    words = text.lower().split()
    subject, colour, noun_at, after = _subject(words)
    action = None
    for j in range(max(after, 0), len(words)):
        # "plays" after "music" is the music's verb, not the subject's
        if words[j] in _ACTION_FORMS and not (j > 0 and words[j - 1] == "music"):
            action = _ACTION_FORMS[words[j]]
            break
    events = set()
    for j, word in enumerate(words):
        kind = _EVENT_FORMS.get(word)
        if kind is None:
            continue
        # "a dog barks": a source named before the verb (not the subject's own noun) makes it
        # a background sound; "runs and barks", "a brown dog barks": the subject's own
        named = j > 0 and words[j - 1] in _SOURCE_WORDS[kind] and j - 1 != noun_at
        events.add((kind, "background" if named else "own"))
    music = next((w for w in words if w in world.INSTRUMENTS), None)
    return Slots(subject, colour, action, _place(words), frozenset(events), music)


def slots_of_info(info: dict) -> Slots:
    """The slots the generator drew for a clip (its manifest ``info``,
    :meth:`avex.data.world.ClipSpec.summary`): what a faithful caption states."""
    events = frozenset((e["kind"], "own" if e["own"] else "background")
                       for e in info.get("events", []))
    return Slots(info["subject"], info["color"], info["action"], info["scene"], events,
                 info.get("instrument"))


def changed_slots(first: Slots, second: Slots) -> list[str]:
    """The names (:data:`SLOT_NAMES`, in that order) of the slots that differ; [] for two
    paraphrases of one content."""
    pairs = {"object": (first.object, second.object), "colour": (first.colour, second.colour),
             "action": (first.action, second.action), "event": (first.events, second.events),
             "music": (first.music, second.music), "place": (first.place, second.place)}
    return [name for name in SLOT_NAMES if pairs[name][0] != pairs[name][1]]
