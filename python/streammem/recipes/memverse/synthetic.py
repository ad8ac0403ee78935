"""A synthetic multi-session memory with planted facts, for the MemVerse recipe's hit rate.

LoCoMo-like: ``sessions`` conversations among ``people`` speakers with video
clips in between (video events are simulated by their label captions, as
``LabelCaptioner`` writes them: ``"3610.0-3620.0s: minivan, street sign"``).
Each person gets, at random places in random sessions:

* four **attribute facts** in their own words -- where they work, which city
  they moved to, the pet they adopted, the instrument they play
  ("Yara: I started a new job at the bakery last month.");
* one **kin fact** naming another person ("Alice: Yara is my sister, we grew up
  together.");
* one **cross-modal fact**: a turn about their new car right before a clip
  showing it ("Alice: Look, my new car is parked outside." then
  ``"...s: minivan, parking meter, street sign"``).

Distractors fill the sessions: small talk that names the same workplaces,
cities, pets and instruments (and who *visited* which city), and clips of the
same vehicles and street objects.  Every chunk carries as ``labels`` the names
it mentions (what a frame encoder's labels are to a clip).

Questions, each with its evidence chunks (the ground truth):

* ``single`` -- "Where does Alice work?": the attribute chunk;
* ``two-hop`` -- "Where does Alice's sister work?": the kin chunk and the
  sister's attribute chunk (which never mentions Alice);
* ``cross-modal`` -- "What car does Alice drive?": the turn and the clip after it.

:class:`GroundTruthExtractor` returns the generator's own triples for each
chunk -- a stand-in for a *perfect* extraction model (an upper bound for the
extractor, not a model); the recipe's default extractor is measured next to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .extraction import Extraction, ExtractionContext, MemoryChunk
from .memory import MemVerse

__all__ = ["PlantedItem", "PlantedQuestion", "PlantedFactMemory", "GroundTruthExtractor"]

PEOPLE = ("Alice", "Bruno", "Chloe", "Diego", "Emma", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Liam",
          "Maya", "Nils", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wade", "Yara")
KIN = ("sister", "brother", "cousin", "neighbour", "best friend", "colleague")
# relation -> (values, statement, single-hop question, two-hop question)
ATTRIBUTES = {
    "works at": (("bakery", "hospital", "library", "museum", "airport", "school", "bank", "pharmacy", "cinema",
                  "post office", "bookshop", "garden centre"),
                 "I started a new job at the {v} last month.", "Where does {p} work?",
                 "Where does {p}'s {kin} work?"),
    "moved to": (("Lisbon", "Oslo", "Vienna", "Dublin", "Prague", "Madrid", "Helsinki", "Athens", "Warsaw", "Porto",
                  "Zurich", "Krakow"),
                 "We finally moved to {v} this spring.", "Which city did {p} move to?",
                 "Which city did {p}'s {kin} move to?"),
    "adopted": (("tortoise", "beagle", "parrot", "hamster", "tabby cat", "goldfish", "rabbit", "ferret", "iguana",
                 "poodle", "canary", "guinea pig"),
                "Our family adopted a {v} from the shelter.", "What pet did {p} adopt?",
                "What pet did {p}'s {kin} adopt?"),
    "plays": (("violin", "cello", "banjo", "harmonica", "trombone", "accordion", "flute", "oboe", "ukulele",
               "saxophone", "harp", "drum"),
              "I have been practising the {v} every evening.", "Which instrument does {p} play?",
              "Which instrument does {p}'s {kin} play?"),
}
VEHICLES = ("minivan", "pickup", "convertible", "jeep", "limousine", "sports car", "moped", "tractor", "cab",
            "police van", "trolleybus", "tow truck")
STREET = ("street sign", "traffic light", "parking meter", "park bench", "mailbox", "fire engine", "streetcar",
          "crosswalk")
SMALL_TALK = ("Did you watch the game last night?", "I am so tired this week.", "The weather is finally better.",
              "Let us meet again next weekend.", "I need a holiday soon.")


@dataclass
class PlantedItem:
    """One chunk of the synthetic stream (``modality`` "dialogue" or "video")."""

    session: int
    t: float
    modality: str
    text: str
    speaker: str | None
    labels: tuple[str, ...]
    triples: tuple[tuple[str, str, str], ...] = ()


@dataclass
class PlantedQuestion:
    """A question, its kind and the stream positions (``items`` indices) of its evidence."""

    kind: str
    question: str
    evidence: tuple[int, ...]
    answer: str


@dataclass
class PlantedFactMemory:
    """The stream (``items``, in time order, ``sessions`` of them) and the questions.

    Parameters
    ----------
    people : int <= 24
    sessions : int
    fillers : int
        Distractor chunks per session (small talk and clips).
    two_hop_per_person : int
        Two-hop questions per person (about their kin's attributes).
    seed : int
    """

    people: int = 24
    sessions: int = 8
    fillers: int = 40
    two_hop_per_person: int = 2
    seed: int = 0
    items: list[PlantedItem] = field(init=False)
    questions: list[PlantedQuestion] = field(init=False)

    def __post_init__(self):
        if not 2 <= self.people <= len(PEOPLE):
            raise ValueError(f"people must be in [2, {len(PEOPLE)}], got {self.people}")
        if self.sessions < 1 or self.fillers < 0 or not 0 <= self.two_hop_per_person <= len(ATTRIBUTES):
            raise ValueError("sessions must be >= 1, fillers >= 0 and two_hop_per_person in [0, 4]")
        rng = np.random.default_rng(self.seed)
        people = PEOPLE[: self.people]
        # Events: (session, key, builder); a builder returns the items of one event.
        planned: list[list] = [[] for _ in range(self.sessions)]
        facts: dict[tuple[str, str], str] = {}
        kin_of: dict[str, tuple[str, str]] = {}
        for p in people:
            for rel, (values, statement, *_questions) in ATTRIBUTES.items():
                v = values[rng.integers(len(values))]
                facts[p, rel] = v
                planned[rng.integers(self.sessions)].append(("attr", p, rel, v, statement))
            q = people[(people.index(p) + 1 + rng.integers(len(people) - 1)) % len(people)]
            kin = KIN[rng.integers(len(KIN))]
            kin_of[p] = (kin, q)
            planned[rng.integers(self.sessions)].append(("kin", p, kin, q))
            car = VEHICLES[rng.integers(len(VEHICLES))]
            facts[p, "drives"] = car
            planned[rng.integers(self.sessions)].append(("car", p, car))
        for s in range(self.sessions):
            planned[s] += [("filler",)] * self.fillers
            order = rng.permutation(len(planned[s]))
            planned[s] = [planned[s][i] for i in order]
        self.items, where = [], {}
        t = 0.0
        for s, events in enumerate(planned):
            t = max(3600.0 * s, t + 600.0)  # sessions an hour apart (at least 10 minutes)
            for event in events:
                for item in self._items(event, s, rng, people):
                    item.t = t
                    item.labels = tuple(str(x) for x in item.labels)  # numpy's str_ from rng.choice -> str
                    item.triples = tuple(tuple(str(x) for x in triple) for triple in item.triples)
                    t += 10.0
                    if item.modality == "video":  # LabelCaptioner's caption of a 10 s event
                        item.text = f"{item.t:.1f}-{item.t + 10.0:.1f}s: {', '.join(item.labels)}"
                    self.items.append(item)
                if event[0] != "filler":
                    where[event[:2] + (event[2] if event[0] == "attr" else event[0],)] = len(self.items) - 1
        self.questions = []
        for p in people:
            for rel, (_, _, single, double) in ATTRIBUTES.items():
                self.questions.append(PlantedQuestion("single", single.format(p=p), (where[("attr", p, rel)],),
                                                      facts[p, rel]))
            kin, q = kin_of[p]
            for rel in map(str, rng.choice(list(ATTRIBUTES), self.two_hop_per_person, replace=False)):
                double = ATTRIBUTES[rel][3]
                self.questions.append(PlantedQuestion("two-hop", double.format(p=p, kin=kin),
                                                      (where[("kin", p, "kin")], where[("attr", q, rel)]),
                                                      facts[q, rel]))
            turn = where[("car", p, "car")]
            self.questions.append(PlantedQuestion("cross-modal", f"What car does {p} drive?", (turn - 1, turn),
                                                  facts[p, "drives"]))

    @staticmethod
    def _items(event, session: int, rng, people) -> list[PlantedItem]:
        kind = event[0]
        if kind == "attr":
            _, p, rel, v, statement = event
            return [PlantedItem(session, 0.0, "dialogue", statement.format(v=v), p, (v,), ((p, rel, v),))]
        if kind == "kin":
            _, p, kin, q = event
            return [PlantedItem(session, 0.0, "dialogue", f"{q} is my {kin}, we grew up together.", p, (q,),
                                ((p, f"has a {kin} named", q),))]
        if kind == "car":
            _, p, car = event
            street = tuple(rng.choice(STREET, 2, replace=False))
            return [PlantedItem(session, 0.0, "dialogue", "Look, my new car is parked outside.", p, ()),
                    PlantedItem(session, 0.0, "video", "", None, (car,) + street, ((p, "drives", car),))]
        p = people[rng.integers(len(people))]
        r = rng.integers(6)
        if r == 0:
            labels = tuple(rng.choice(VEHICLES + STREET, 3, replace=False))
            return [PlantedItem(session, 0.0, "video", "", None, labels)]
        if r == 5:
            return [PlantedItem(session, 0.0, "dialogue", SMALL_TALK[rng.integers(len(SMALL_TALK))], p, ())]
        rel = list(ATTRIBUTES)[r - 1]
        values = ATTRIBUTES[rel][0]
        v = values[rng.integers(len(values))]
        other = people[rng.integers(len(people))]
        said = {"works at": (f"The {v} on Main Street was packed this morning.", (p, "talked about", v)),
                "moved to": (f"{other} spent a weekend in {v}.", (other, "visited", v)),
                "adopted": (f"I saw a {v} at the park today.", (p, "saw", v)),
                "plays": (f"There was a {v} player at the concert downtown.", (p, "heard", v))}[rel]
        labels = (other, v) if rel == "moved to" else (v,)
        return [PlantedItem(session, 0.0, "dialogue", said[0], p, labels, (said[1],))]

    # ---- feeding a memory ------------------------------------------------------
    def feed(self, memory: MemVerse) -> list[MemoryChunk]:
        """Push every session into ``memory`` (one ``add_texts`` call per run of one modality), ending each session.

        Returns the chunks, one per item (so ``chunks[i].chunk_id`` is item i's id).
        """
        out: list[MemoryChunk] = []
        for s in range(self.sessions):
            session = [it for it in self.items if it.session == s]
            start = 0
            while start < len(session):
                end = start
                while end < len(session) and session[end].modality == session[start].modality:
                    end += 1
                run = session[start:end]
                out += memory.add_texts([it.t for it in run], [it.text for it in run],
                                        speakers=[it.speaker for it in run], labels=[it.labels for it in run],
                                        modality=run[0].modality)
                start = end
            memory.end_session()
        return out

    def ground_truth_extractor(self) -> "GroundTruthExtractor":
        return GroundTruthExtractor({_shown(it): it.triples for it in self.items})


def _shown(item: PlantedItem) -> str:
    return item.text if item.speaker is None else f"{item.speaker}: {item.text}"


class GroundTruthExtractor:
    """The generator's own triples per chunk: a perfect extraction model's output (an upper bound, not a model).

    Entities are the chunk's speaker and labels, relations the planted triples
    of the chunk's text (``{}`` for a text the generator did not write).
    """

    name = "ground-truth triples (synthetic upper bound, not a model)"

    def __init__(self, triples_by_text: dict[str, tuple[tuple[str, str, str], ...]]):
        self.triples_by_text = dict(triples_by_text)

    def extract(self, chunk: MemoryChunk, context: ExtractionContext) -> Extraction:
        names = ((chunk.speaker,) if chunk.speaker else ()) + tuple(chunk.labels)
        return Extraction(names, tuple(self.triples_by_text.get(chunk.text, ())))
