"""A deterministic STEM-like dialogue stream with planted facts, later updates of some of them, distractor
turns about the same entities and attributes, and questions with their ground truth."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import NamedTuple

from .dialogue import Question, Turn

__all__ = ["SyntheticDialogue", "synthetic_dialogue", "KINDS", "STYLES", "FACT_FORMS", "DISTRACTOR_KINDS",
           "PlantedFact", "Distractor"]


_ENTITIES = ("Marlow", "Quentin", "Ysolde", "Bertil", "Calla", "Dashiell", "Elowen", "Fenwick", "Greer", "Hollis",
             "Ingrid", "Jasper", "Kestrel", "Linnea", "Magnus", "Nerys", "Orla", "Peregrine", "Rosalind", "Soren",
             "Tamsin", "Ulric", "Vesna", "Wendeline", "Xavi", "Yorick", "Zelda", "Anouk", "Bastian", "Cordelia",
             "Dorian", "Esme", "Fitzroy", "Gideon", "Hester", "Ivo", "Juniper", "Kasimir", "Leopold", "Mireille")


_ATTRIBUTES = {
    "home city": ("Lisbon", "Oslo", "Porto", "Kyoto", "Denver", "Nairobi", "Quito", "Hanoi", "Tallinn", "Valencia",
                  "Adelaide", "Bergen"),
    "car": ("Volvo", "Toyota", "Fiat", "Subaru", "Peugeot", "Skoda", "Mazda", "Renault", "Hyundai", "Lancia"),
    "locker number": tuple(str(n) for n in range(1043, 9999, 811)),
    "manager": ("Abernathy", "Okonkwo", "Lindqvist", "Castellano", "Nakamura", "Petrov", "Delacroix", "Haraldsen"),
    "gym": ("Ironworks", "Pulse", "Summit", "Forge", "Vertex", "Anchor", "Zenith"),
    "dentist": ("Dr Whitlock", "Dr Osei", "Dr Brannigan", "Dr Moreau", "Dr Takahashi", "Dr Eriksen"),
    "birthday month": ("January", "March", "April", "June", "August", "October", "November", "December"),
    "football team": ("Arsenal", "Benfica", "Ajax", "Celtic", "Napoli", "Sevilla", "Feyenoord", "Galatasaray"),
    "phone extension": tuple(str(n) for n in range(214, 990, 61)),
    "flight gate": ("B12", "C7", "D21", "A3", "E15", "F9", "G4"),
    "favourite bakery": ("Crumb", "Larder", "Rye", "Hearth", "Oven Lane", "Bramble"),
    "project codename": ("Halcyon", "Obsidian", "Meridian", "Tesseract", "Basilisk", "Sirocco", "Nimbus"),
}


_TOPICS = {
    "cooking": ("garlic", "pasta", "oven", "sauce", "basil", "dough", "recipe", "skillet"),
    "hiking": ("trail", "boots", "ridge", "summit", "backpack", "map", "blisters", "campsite"),
    "gardening": ("tomatoes", "compost", "seedlings", "soil", "watering", "weeds", "greenhouse", "mulch"),
    "movies": ("film", "director", "sequel", "cinema", "popcorn", "trailer", "actor", "screenplay"),
    "weather": ("rain", "forecast", "sunshine", "wind", "umbrella", "storm", "humidity", "clouds"),
    "music": ("guitar", "concert", "album", "drums", "melody", "playlist", "band", "chorus"),
    "cycling": ("bike", "gears", "helmet", "puncture", "saddle", "hills", "chain", "pedals"),
    "reading": ("novel", "chapter", "library", "author", "bookmark", "poetry", "plot", "paperback"),
    "pets": ("dog", "leash", "kitten", "vet", "treats", "walks", "puppy", "fur"),
    "coffee": ("espresso", "beans", "grinder", "latte", "roast", "barista", "crema", "filter"),
    "chess": ("opening", "bishop", "endgame", "knight", "gambit", "checkmate", "pawn", "rook"),
    "swimming": ("pool", "laps", "goggles", "freestyle", "lane", "diving", "chlorine", "backstroke"),
}


_CHAT = ("{a} with {b}, then {c}.", "Loved the {a}, the {b} and the {c}.", "More {topic}: {a}, {b}, {c}.",
         "{a} before {b}, {c} after.", "Still thinking about {a}, {b} and {c}.", "{topic} again: {a} and {b}.")


_FACT = ("{E}'s {A} is {V}.", "So {E}'s {A} is {V}.", "{E}'s {A} is definitely {V}.")


_ASK = ("What is {E}'s {A}?", "Remind me, what is {E}'s {A}?", "Do you know {E}'s {A}?")


# The "varied" style's ways of stating a fact, with their weights: the three plain forms, eight other
# constructions (a possessive after a discourse marker, reported speech, "the A of E", a change of state,
# a colon, the value first), and two that need more than the sentence itself to read -- a topic named
# before the clause, an antecedent in the previous phrase -- at a tenth of the weight of the others
# each.  Names are the forms' labels in ``SyntheticDialogue.facts``.
FACT_FORMS = {
    "possessive": ("{E}'s {A} is {V}.", 1.0),
    "so": ("So {E}'s {A} is {V}.", 1.0),
    "definitely": ("{E}'s {A} is definitely {V}.", 1.0),
    "for-the-record": ("For the record, {E}'s {A} is {V}.", 1.0),
    "turns-out": ("Turns out {E}'s {A} is actually {V} these days.", 1.0),
    "said": ("{E} said their {A} is {V}.", 1.0),
    "told-me": ("{E} told me that their {A} is now {V}.", 1.0),
    "of": ("The {A} of {E} is {V}, apparently.", 1.0),
    "changed": ("{E} changed their {A} to {V}.", 1.0),
    "new": ("{E} has a new {A}: {V}.", 1.0),
    "value-first": ("{V} is {E}'s {A} now.", 1.0),
    "topic-first": ("As for {E}, the {A} is {V}.", 0.1),
    "antecedent": ("{V}, that's {E}'s {A}.", 0.1),
}


# Distractor turns: they name a planted subject's entity and attribute (and often a value of that
# attribute) without stating the entity's value -- a question asked in the dialogue, a negation, a
# hypothetical, a mention -- or mix entities with proper nouns and numbers in chatter (an aside).
_DISTRACTORS = {
    "question": ("What was {E}'s {A} again?", "Does anyone remember {E}'s {A}?", "Has {E}'s {A} changed lately?"),
    "negation": ("{E}'s {A} is not {W}.", "{E}'s {A} isn't {W}, for what it's worth.",
                 "No, {E} never changed their {A} to {W}."),
    "hypothetical": ("If {E}'s {A} were {W}, that would be odd.", "{E} might change their {A} to {W} next year.",
                     "Maybe {E}'s {A} will be {W} someday."),
    "mention": ("{E} keeps talking about their {A}.", "I asked {E} about the {A} yesterday.",
                "Nobody knows why {E} cares so much about the {A}."),
    "aside": ("{E} and {F} met in {C} at {N} pm.", "{E} watched {T} with {F} in {C}.",
              "Saw {E} near the {C} station around {N}."),
}
DISTRACTOR_KINDS = tuple(_DISTRACTORS)


_ASK_VARIED = _ASK + ("What's the {A} of {E}?", "Which {A} does {E} have now?", "Tell me {E}'s {A}, please.")


KINDS = ("near", "far", "updated")


STYLES = ("varied", "plain")


class PlantedFact(NamedTuple):
    """A fact turn: its index, subject ("Marlow's car"), value, entity, attribute and form (a key of
    :data:`FACT_FORMS`, or "plain")."""

    turn: int
    subject: str
    value: str
    entity: str
    attribute: str
    form: str


class Distractor(NamedTuple):
    """A distractor turn: its index, kind (:data:`DISTRACTOR_KINDS`), the entity and attribute it names
    (the attribute is "" for an aside)."""

    turn: int
    kind: str
    entity: str
    attribute: str


@dataclass
class SyntheticDialogue:
    """A generated stream and its ground truth.

    ``items``: turns and questions in stream order.  ``segment_starts``: turn
    indices where a planted segment starts (topic changes, and each fact or
    distractor turn with the turn after it: they are asides);
    ``session_starts`` likewise.
    ``facts``: a :class:`PlantedFact` per fact turn (it unpacks as (turn index,
    subject, value, entity, attribute, form)); ``distractors``: a
    :class:`Distractor` per distractor turn.
    """

    items: list
    segment_starts: list[int]
    session_starts: list[int]
    facts: list[PlantedFact]
    distractors: list[Distractor] = field(default_factory=list)

    @property
    def turns(self) -> list[Turn]:
        return [x for x in self.items if isinstance(x, Turn)]

    @property
    def questions(self) -> list[Question]:
        return [x for x in self.items if isinstance(x, Question)]


def synthetic_dialogue(turns: int, *, seed: int = 0, subjects: int = 200, fact_every: float = 25.0,
                       new_subject_share: float = 0.6, volatile_share: float = 0.5, questions: int | None = None,
                       near_turns: int = 100, far_turns: int = 500, style: str = "varied",
                       distractor_every: float = 10.0) -> SyntheticDialogue:
    """A deterministic STEM-like dialogue stream with planted facts, distractors and questions.

    Sessions of 150-400 turns (3-20 s apart) are separated by 8-16 hour pauses;
    a session is a run of topic segments of 6-16 chatter turns (a topic's
    keywords, lower case).  About one turn in ``fact_every`` is a fact aside
    ("Marlow's home city is Lisbon.", proper nouns or numbers): a new subject
    (entity x attribute, up to ``subjects`` of them, drawn from 40 entities x
    12 attributes, so many entities share an attribute) with probability
    ``new_subject_share``, otherwise an update of a volatile subject to a new
    value (a ``volatile_share`` of the subjects change; the others are stated
    once).  Questions (default: one per 25 turns, 20 to 400) are asked at
    random points, cycling through the kinds: ``near`` (a subject stated once,
    within the last ``near_turns`` turns), ``far`` (stated once, at least
    ``far_turns`` turns back) and ``updated`` (stated at least twice: the
    answer is the latest value, the earlier ones are ``superseded``).

    ``style="varied"`` (the default) states facts in the forms of
    :data:`FACT_FORMS` (drawn by weight: about one fact in 55 in a form that
    needs its context to be read) and asks in six phrasings; about one turn in
    ``distractor_every`` is a distractor (:data:`DISTRACTOR_KINDS`, drawn
    uniformly) about a subject already stated: a question asked in the dialogue
    ("What was Marlow's car again?"), a negation or a hypothetical with another
    value of the attribute ("Marlow's car is not a Volvo.", "Marlow might
    change their car to Volvo next year."), a mention without a value, or an
    aside mixing entities, cities, teams and numbers.  Distractors never change
    the ground truth.  ``style="plain"`` is the stream without distractors in
    three possessive forms ("Marlow's car is Fiat.") and three phrasings of
    questions (``distractor_every`` unused); the same seed gives the same
    plain stream as before the varied style existed.

    Parameters
    ----------
    turns : int >= 1
    seed : int
        Same seed, same stream (Python's ``random.Random``; no global state).
    """
    for arg, value, low in (("turns", turns, 1), ("subjects", subjects, 1), ("near_turns", near_turns, 2),
                            ("far_turns", far_turns, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{arg} must be an int >= {low}, got {value!r}")
    if not fact_every >= 1:
        raise ValueError(f"fact_every must be >= 1, got {fact_every!r}")
    for arg, value in (("new_subject_share", new_subject_share), ("volatile_share", volatile_share)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{arg} must be in [0, 1], got {value!r}")
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    varied = style == "varied"
    if varied and not (distractor_every >= 1 and 1.0 / fact_every + 1.0 / distractor_every <= 1.0):
        raise ValueError(f"distractor_every must be >= 1 and leave room for the facts (1/fact_every + "
                         f"1/distractor_every <= 1), got {distractor_every!r}")
    rng = random.Random(seed)
    pool = [(e, a) for e in _ENTITIES for a in _ATTRIBUTES]
    rng.shuffle(pool)
    if subjects > len(pool):
        raise ValueError(f"subjects must be <= {len(pool)}, got {subjects}")
    pool = pool[:subjects]
    volatile = set(range(round(volatile_share * subjects)))
    n_questions = questions if questions is not None else min(400, max(20, turns // 25))
    warm = min(50, turns // 10)
    slots = sorted(rng.sample(range(warm, turns), min(n_questions, turns - warm))) if turns > warm else []
    ask_at = {p: n for n, p in enumerate(slots)}
    forms = list(FACT_FORMS)
    weights = [FACT_FORMS[f][1] for f in forms]
    asks = _ASK_VARIED if varied else _ASK
    # Among the turns that are not facts, the share that are distractors.
    distractor_p = (1.0 / distractor_every) / (1.0 - 1.0 / fact_every) if varied else 0.0

    items: list = []
    facts: list[PlantedFact] = []
    distractors: list[Distractor] = []
    versions: dict[int, list[tuple[int, str]]] = {}  # subject -> [(turn index, value)]
    seg_starts: list[int] = []
    sess_starts: list[int] = []
    introduced = 0
    t = 0.0
    index = 0
    asked = 0
    topic = None
    speaker = 0

    def ask(p: int, at: float) -> None:
        nonlocal asked
        for shift in range(len(KINDS)):
            kind = KINDS[(asked + shift) % len(KINDS)]
            ok = []
            for s, vs in versions.items():
                age = p - vs[-1][0]
                if kind == "near" and len(vs) == 1 and 2 <= age <= near_turns:
                    ok.append(s)
                elif kind == "far" and len(vs) == 1 and age >= far_turns:
                    ok.append(s)
                elif kind == "updated" and len(vs) >= 2 and age >= 2:
                    ok.append(s)
            if ok:
                s = rng.choice(sorted(ok))
                e, a = pool[s]
                vs = versions[s]
                items.append(Question(at, rng.choice(asks).format(E=e, A=a), vs[-1][1], vs[-1][0], kind,
                                      tuple(i for i, _ in vs[:-1])))
                asked += 1
                return

    def distractor() -> str:
        kind = rng.choice(DISTRACTOR_KINDS)
        s = rng.randrange(introduced) if introduced else rng.randrange(len(pool))
        e, a = pool[s]
        current = versions[s][-1][1] if s in versions else None
        other = rng.choice([v for v in _ATTRIBUTES[a] if v != current])
        f = rng.choice([x for x in _ENTITIES if x != e])
        text = rng.choice(_DISTRACTORS[kind]).format(
            E=e, A=a, W=other, F=f, C=rng.choice(_ATTRIBUTES["home city"]), T=rng.choice(_ATTRIBUTES["football team"]),
            N=rng.randint(2, 11))
        distractors.append(Distractor(index, kind, e, "" if kind == "aside" else a))
        return text

    while index < turns:
        sess_starts.append(index)
        session_left = rng.randint(150, 400)
        while session_left > 0 and index < turns:
            topic = rng.choice(sorted(set(_TOPICS) - {topic}))
            seg_starts.append(index)
            for _ in range(min(rng.randint(6, 16), session_left)):
                if index >= turns:
                    break
                if index in ask_at:
                    ask(index, t + 0.5)
                t += rng.uniform(3.0, 20.0)
                if rng.random() < 1.0 / fact_every:
                    can_update = [s for s in versions if s in volatile]
                    if introduced < subjects and (rng.random() < new_subject_share or not can_update):
                        s = introduced
                        introduced += 1
                        value = rng.choice(_ATTRIBUTES[pool[s][1]])
                    else:
                        s = rng.choice(can_update)
                        current = versions[s][-1][1]
                        value = rng.choice([v for v in _ATTRIBUTES[pool[s][1]] if v != current])
                    e, a = pool[s]
                    versions.setdefault(s, []).append((index, value))
                    if varied:
                        form = rng.choices(forms, weights)[0]
                        template = FACT_FORMS[form][0]
                    else:
                        form, template = "plain", rng.choice(_FACT)
                    facts.append(PlantedFact(index, f"{e}'s {a}", value, e, a, form))
                    text = template.format(E=e, A=a, V=value)
                    items.append(Turn(t, "user", text[0].upper() + text[1:]))
                    if not seg_starts or seg_starts[-1] != index:
                        seg_starts.append(index)
                    seg_starts.append(index + 1)  # the aside ends; the topic resumes
                elif varied and rng.random() < distractor_p:
                    items.append(Turn(t, ("user", "assistant")[speaker], distractor()))
                    speaker ^= 1
                    if not seg_starts or seg_starts[-1] != index:
                        seg_starts.append(index)
                    seg_starts.append(index + 1)  # a distractor is an aside too
                else:
                    a, b, c = rng.sample(_TOPICS[topic], 3)
                    text = rng.choice(_CHAT).format(a=a, b=b, c=c, topic=topic)
                    items.append(Turn(t, ("user", "assistant")[speaker], text[0].upper() + text[1:]))
                    speaker ^= 1
                index += 1
                session_left -= 1
        t += rng.uniform(8.0, 16.0) * 3600.0
    seg_starts = sorted(set(s for s in seg_starts if s < turns))
    return SyntheticDialogue(items, seg_starts, sess_starts, facts, distractors)
