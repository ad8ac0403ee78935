"""A long synthetic video (as ImageNet labels) with planted answerable events and their questions."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .index import LabelTextEmbedder, VideoIndex, _check_count

__all__ = ["PlantedQuestion", "PlantedEventVideo", "SCENES", "CUE_FAMILIES", "OBJECTS", "TEMPLATES"]

# The longest synthetic video: a typo (1000000000 frames) stops with a ValueError, not an allocation.
MAX_FRAMES = 1_000_000


# Every name below is an ImageNet-1k class (EfficientNet-lite0's label set), so the
# synthetic frames carry labels the real frame encoder could emit.
SCENES: dict[str, tuple[str, ...]] = {
    "kitchen": ("refrigerator", "microwave oven", "dining table", "toaster", "stove", "sink", "coffee mug",
                "tea cup", "dishwasher"),
    "street": ("taxicab", "traffic light", "minivan", "parking meter", "traffic or street sign", "trolleybus",
               "school bus", "tram", "mountain bike"),
    "office": ("desk", "desktop computer", "computer keyboard", "computer mouse", "monitor", "printer",
               "filing cabinet", "wall clock", "folding chair"),
    "living room": ("couch", "table lamp", "bookcase", "lampshade", "vase", "china cabinet", "candle",
                    "rocking chair", "quilt"),
    "park": ("park bench", "lakeshore", "valley", "fountain", "tent", "picket fence", "patio", "stone wall",
             "split-rail fence"),
    "bathroom": ("bathtub", "shower curtain", "toilet seat", "medicine cabinet", "toilet paper", "washing machine",
                 "window shade", "soap dispenser", "paper towel"),
}


# Cues come in families of related classes: a question's distractor events show
# another member of its cue's family, which retrieval confuses with the cue.
CUE_FAMILIES: dict[str, tuple[str, ...]] = {
    "terriers": ("Border Terrier", "Irish Terrier", "Norfolk Terrier", "Yorkshire Terrier", "Cairn Terrier",
                 "Airedale Terrier", "Scottish Terrier", "Boston Terrier", "Lakeland Terrier"),
    "retrievers": ("Flat-Coated Retriever", "Curly-coated Retriever", "Golden Retriever", "Labrador Retriever",
                   "Chesapeake Bay Retriever"),
    "spaniels": ("Clumber Spaniel", "English Springer Spaniel", "Welsh Springer Spaniel", "Cocker Spaniel",
                 "Sussex Spaniel", "Irish Water Spaniel"),
    "hounds": ("Basset Hound", "Beagle", "Bloodhound", "Afghan Hound", "Ibizan Hound", "Otterhound"),
    "sheepdogs": ("Old English Sheepdog", "Shetland Sheepdog", "collie", "Border Collie", "Australian Kelpie"),
    "cats": ("tabby cat", "Persian cat", "Siamese cat", "Egyptian Mau"),
    "big cats": ("cougar", "lynx", "leopard", "snow leopard", "jaguar", "lion", "tiger", "cheetah"),
    "bears": ("brown bear", "American black bear", "polar bear", "sloth bear"),
    "wild dogs": ("grey wolf", "red fox", "kit fox", "Arctic fox", "grey fox", "coyote"),
    "small birds": ("goldfinch", "house finch", "brambling", "junco", "indigo bunting", "American robin"),
    "parrots": ("african grey parrot", "macaw", "sulphur-crested cockatoo", "lorikeet"),
    "snakes": ("garter snake", "water snake", "vine snake", "kingsnake", "boa constrictor", "green mamba"),
    "lizards": ("green iguana", "Carolina anole", "agama", "chameleon", "Komodo dragon"),
    "crabs": ("Dungeness crab", "rock crab", "fiddler crab", "red king crab", "hermit crab"),
}


OBJECTS: tuple[str, ...] = (
    "tennis ball", "basketball", "baseball", "golf ball", "ping-pong ball", "croquet ball", "rugby ball",
    "soccer ball", "volleyball ball", "teddy bear", "umbrella", "backpack", "sunglasses", "water bottle", "pillow",
    "balloon", "acoustic guitar", "violin", "drum", "cowboy hat", "mobile phone", "comic book", "shopping basket",
    "frying pan", "whistle", "harmonica", "sombrero", "bow tie", "wallet", "binoculars", "banjo", "accordion",
    "football helmet", "dumbbell", "hair dryer", "sleeping bag", "wooden spoon", "screwdriver", "hammer",
    "power drill", "teapot", "pineapple",
)


TEMPLATES: tuple[str, ...] = (
    "What was next to the {cue}?",
    "Which object appeared together with the {cue}?",
    "What did the {cue} have with it?",
)


@dataclass
class PlantedQuestion:
    """A multiple-choice question about one planted event, with its ground truth.

    ``span``: the event's ``[start, end)`` frames; ``answer_frames``: the frames
    of the span whose labels show the answer (the frames that hold it);
    ``distractor_spans``: events of related cues with wrong options.
    """

    question: str
    options: tuple[str, ...]
    answer: int
    cue: str
    span: tuple[int, int]
    answer_frames: tuple[int, ...]
    distractor_spans: tuple[tuple[int, int], ...]

    @property
    def answer_text(self) -> str:
        return self.options[self.answer]


class PlantedEventVideo:
    """A long video as per-frame ImageNet labels, with planted answerable events; deterministic from ``seed``.

    Background: scenes (``SCENES``) of ``scene_frames`` frames, each frame
    three distinct labels of its scene.  Per question, a true event of
    ``event_frames`` frames where a cue (an animal from ``CUE_FAMILIES``)
    appears with the answer (an object from ``OBJECTS``), and ``distractors``
    events elsewhere where another animal of the same family appears with a
    wrong option.  Like a classifier's top-3, an event frame shows its animal
    with probability ``p_cue`` and its object with ``p_object`` (in random
    label slots, the scene filling the rest), and the animal shown is another
    member of its family with probability ``p_confuse`` (the classifier
    confusing related classes: a distractor frame can carry the question's
    cue); the middle frame shows the event's own animal and object, so every
    question is answerable.  Events never overlap or touch, and no cue appears
    in two questions.  Options: the answer, the distractors' objects and
    random other objects (``options`` in all), in random order.

    Parameters
    ----------
    num_frames : int
    questions : int
    fps : float
        Timestamps are ``i / fps``.
    event_frames : (int, int)
        Inclusive range of event lengths.
    distractors : int
    options : int
        Must be at least ``1 + distractors``.
    p_cue, p_object, p_confuse : float in [0, 1]
    scene_frames : (int, int)
        Inclusive range of background scene lengths.
    seed : int
    """

    def __init__(self, num_frames: int = 3600, questions: int = 20, *, fps: float = 1.0,
                 event_frames: tuple[int, int] = (2, 5), distractors: int = 2, options: int = 5,
                 p_cue: float = 0.75, p_object: float = 0.75, p_confuse: float = 0.2,
                 scene_frames: tuple[int, int] = (30, 150),
                 seed: int = 0):
        self.num_frames = _check_count(num_frames, "num_frames", 1)
        if self.num_frames > MAX_FRAMES:
            raise ValueError(f"num_frames must be <= {MAX_FRAMES} (about 12 days at 1 fps; its index would not fit in "
                             f"memory beyond), got {num_frames}")
        n_questions = _check_count(questions, "questions", 1)
        self.distractors = _check_count(distractors, "distractors", 0)
        self.n_options = _check_count(options, "options", 2)
        if self.n_options < 1 + self.distractors:
            raise ValueError(f"options must be >= 1 + distractors = {1 + self.distractors}, got {options}")
        if self.n_options > len(OBJECTS):
            raise ValueError(f"options must be <= {len(OBJECTS)} (the object vocabulary), got {options}")
        lo, hi = (_check_count(x, "event_frames", 1) for x in event_frames)
        s_lo, s_hi = (_check_count(x, "scene_frames", 1) for x in scene_frames)
        if lo > hi or s_lo > s_hi:
            raise ValueError("event_frames and scene_frames must be (low, high) with low <= high")
        for name, p in (("p_cue", p_cue), ("p_object", p_object), ("p_confuse", p_confuse)):
            if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps must be > 0, got {fps!r}")
        per_family = [len(c) // (1 + self.distractors) for c in CUE_FAMILIES.values()]
        if n_questions > sum(per_family):
            raise ValueError(f"questions must be <= {sum(per_family)} with {self.distractors} distractors "
                             "(each question uses 1 + distractors cues of one family)")
        n_events = n_questions * (1 + self.distractors)
        if n_events * (hi + 1) > self.num_frames // 2:
            raise ValueError(f"{n_events} events of up to {hi} frames do not fit in half of {num_frames} frames; "
                             "use a longer video or fewer questions")
        self.fps = float(fps)
        self.seed = int(seed)
        rng = np.random.default_rng(seed)

        # Background scenes.
        scene_names = list(SCENES)
        self.scene_of = np.zeros(self.num_frames, dtype=np.int64)
        pos, previous = 0, -1
        while pos < self.num_frames:
            scene = int(rng.integers(len(scene_names)))
            if scene == previous:
                scene = (scene + 1) % len(scene_names)
            length = int(rng.integers(s_lo, s_hi + 1))
            self.scene_of[pos:pos + length] = scene
            pos, previous = pos + length, scene
        labels = [self._scene_labels(rng, scene_names[s]) for s in self.scene_of]

        # Cues: per question one family, its cue and distractor cues, none reused.
        free = {name: list(rng.permutation(len(cues))) for name, cues in CUE_FAMILIES.items()}
        families = [name for name, count in zip(CUE_FAMILIES, per_family) for _ in range(count)]
        families = [families[i] for i in rng.permutation(len(families))[:n_questions]]

        # Event positions: non-overlapping, at least one background frame between events.
        lengths = rng.integers(lo, hi + 1, size=n_events)
        spans = self._place(rng, lengths)
        self.questions: list[PlantedQuestion] = []
        for qi, family in enumerate(families):
            cues = [CUE_FAMILIES[family][free[family].pop()] for _ in range(1 + self.distractors)]
            objects = [OBJECTS[i] for i in rng.permutation(len(OBJECTS))[: self.n_options]]
            own = spans[qi * (1 + self.distractors):(qi + 1) * (1 + self.distractors)]
            for (start, end), cue, obj in zip(own, cues, objects):
                others = [c for c in CUE_FAMILIES[family] if c != cue]
                self._plant(rng, labels, start, end, cue, others, obj, p_cue, p_object, p_confuse)
            order = list(rng.permutation(self.n_options))
            options = tuple(objects[i] for i in order)
            true_start, true_end = own[0]
            self.questions.append(PlantedQuestion(
                question=TEMPLATES[int(rng.integers(len(TEMPLATES)))].format(cue=cues[0]),
                options=options, answer=order.index(0), cue=cues[0], span=(true_start, true_end),
                answer_frames=tuple(i for i in range(true_start, true_end) if objects[0] in labels[i]),
                distractor_spans=tuple(own[1:])))
        self.labels: list[tuple[str, ...]] = labels
        self.timestamps = np.arange(self.num_frames, dtype=np.float64) / self.fps

    @staticmethod
    def _scene_labels(rng, scene: str) -> tuple[str, ...]:
        names = SCENES[scene]
        return tuple(names[i] for i in rng.choice(len(names), size=3, replace=False))

    def _place(self, rng, lengths) -> list[tuple[int, int]]:
        taken = np.zeros(self.num_frames + 2, dtype=bool)  # one guard frame either side
        spans = []
        for length in lengths:
            for _ in range(10_000):
                start = int(rng.integers(1, self.num_frames - length))
                if not taken[start - 1:start + length + 1].any():
                    break
            else:  # pragma: no cover - the size check above leaves at least half of the video free
                raise RuntimeError("could not place the planted events")
            taken[start:start + length] = True
            spans.append((start, start + int(length)))
        return spans

    @staticmethod
    def _plant(rng, labels, start, end, cue, others, obj, p_cue, p_object, p_confuse) -> None:
        middle = (start + end - 1) // 2
        for i in range(start, end):
            frame = list(labels[i])
            slots = list(rng.permutation(3))
            if i == middle:
                frame[slots[0]] = cue
            elif rng.random() < p_cue:
                frame[slots[0]] = others[int(rng.integers(len(others)))] if rng.random() < p_confuse else cue
            if i == middle or rng.random() < p_object:
                frame[slots[1]] = obj
            labels[i] = tuple(frame)

    def __len__(self) -> int:
        return self.num_frames

    def index(self, text_encoder) -> VideoIndex:
        """The video indexed like a real one: each frame's labels through ``LabelTextEmbedder(text_encoder)``."""
        return VideoIndex.from_labels(self.timestamps, self.labels, LabelTextEmbedder(text_encoder))
