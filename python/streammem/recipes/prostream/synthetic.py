"""A deterministic STEM-like dialogue stream with planted facts, later updates of some of them, and
questions with their ground truth."""
from __future__ import annotations

import random
from dataclasses import dataclass

from .dialogue import Question, Turn

__all__ = ["SyntheticDialogue", "synthetic_dialogue", "KINDS"]


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


KINDS = ("near", "far", "updated")


@dataclass
class SyntheticDialogue:
    """A generated stream and its ground truth.

    ``items``: turns and questions in stream order.  ``segment_starts``: turn
    indices where a planted segment starts (topic changes, and each fact turn
    with the turn after it: a fact is an aside); ``session_starts`` likewise.
    ``facts``: (turn index, subject, value) of every fact turn.
    """

    items: list
    segment_starts: list[int]
    session_starts: list[int]
    facts: list[tuple[int, str, str]]

    @property
    def turns(self) -> list[Turn]:
        return [x for x in self.items if isinstance(x, Turn)]

    @property
    def questions(self) -> list[Question]:
        return [x for x in self.items if isinstance(x, Question)]


def synthetic_dialogue(turns: int, *, seed: int = 0, subjects: int = 200, fact_every: float = 25.0,
                       new_subject_share: float = 0.6, volatile_share: float = 0.5, questions: int | None = None,
                       near_turns: int = 100, far_turns: int = 500) -> SyntheticDialogue:
    """A deterministic STEM-like dialogue stream with planted facts and questions.

    Sessions of 150-400 turns (3-20 s apart) are separated by 8-16 hour pauses;
    a session is a run of topic segments of 6-16 chatter turns (a topic's
    keywords, lower case).  About one turn in ``fact_every`` is a fact aside
    ("Marlow's home city is Lisbon.", proper nouns or numbers): a new subject
    (entity x attribute, up to ``subjects`` of them) with probability
    ``new_subject_share``, otherwise an update of a volatile subject to a new
    value (a ``volatile_share`` of the subjects change; the others are stated
    once).  Questions (default: one per 25 turns, 20 to 400) are asked at
    random points, cycling through the kinds: ``near`` (a subject stated once,
    within the last ``near_turns`` turns), ``far`` (stated once, at least
    ``far_turns`` turns back) and ``updated`` (stated at least twice: the
    answer is the latest value, the earlier ones are ``superseded``).

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

    items: list = []
    facts: list[tuple[int, str, str]] = []
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
                items.append(Question(at, rng.choice(_ASK).format(E=e, A=a), vs[-1][1], vs[-1][0], kind,
                                      tuple(i for i, _ in vs[:-1])))
                asked += 1
                return

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
                    facts.append((index, f"{e}'s {a}", value))
                    items.append(Turn(t, "user", rng.choice(_FACT).format(E=e, A=a, V=value)))
                    if not seg_starts or seg_starts[-1] != index:
                        seg_starts.append(index)
                    seg_starts.append(index + 1)  # the aside ends; the topic resumes
                else:
                    a, b, c = rng.sample(_TOPICS[topic], 3)
                    text = rng.choice(_CHAT).format(a=a, b=b, c=c, topic=topic)
                    items.append(Turn(t, ("user", "assistant")[speaker], text[0].upper() + text[1:]))
                    speaker ^= 1
                index += 1
                session_left -= 1
        t += rng.uniform(8.0, 16.0) * 3600.0
    seg_starts = sorted(set(s for s in seg_starts if s < turns))
    return SyntheticDialogue(items, seg_starts, sess_starts, facts)
