"""ProStream over a dialogue stream: drift segments, multi-granular distillation, bounded memory, ad-hoc recall.

ProStream (Wang, Li and Xu, "Proactive Memory for Ad-Hoc Recall over Streaming
Dialogues", arXiv 2603.04885, with the STEM-Bench benchmark) keeps a bounded,
hierarchical memory of an endless dialogue and answers questions at any point
of it.  This recipe composes it from the kernels and the memory pieces the
package already has:

* **Stream in**: ``Turn(t, speaker, text)`` objects (or a JSONL file of them,
  :func:`read_dialogue`), pushed in any batch size with :meth:`ProStream.push`;
  texts are embedded in one encoder call per batch (or passed pre-computed).
* **Drift segmentation**: ``streammem_kernels.StreamingSegmenter(drift=...,
  max_event=...)`` on the turn embeddings cuts a segment where the cosine of
  consecutive turns drops below ``drift`` or the open segment reaches
  ``max_event`` turns.  A pause of ``session_gap`` seconds (or a change of
  ``Turn.session``) closes the session.
* **Multi-granular distillation**: turn -> segment summary -> session summary,
  stored as the three levels of one ``CosineTree`` (leaves = turns, level 1 =
  segments, level 2 = sessions) through :class:`DialogueTree`, a
  ``LongTermMemory`` whose grouping is by segments and sessions instead of by
  counts.  The default :class:`ExtractiveDistiller` is **extractive and uses
  no model**: a segment's summary quotes its most informative turns (proper
  nouns and numbers, the way classic extractive summarisers weight named
  entities), a session's summary quotes the most informative sentences of its
  segment summaries.  :class:`ModelDistiller` wraps a user's language model
  (any ``generate(prompt) -> str``) for abstractive summaries; any object with
  ``distill_segment`` / ``distill_session`` plugs in.
* **Keyed memory units** (the paper keys its memory on entities and what is
  said about them, extracted with GLiNER): every turn goes through a
  :class:`FactExtractor`, which returns its (entity, attribute, value)
  :class:`Fact` objects.  The default :class:`PatternExtractor` reads a few
  English constructions with regular expressions and **uses no model**
  (questions, negations, modals and conditions assert nothing);
  :class:`ModelExtractor` wraps a user's language model, and any model-based
  extractor (GLiNER, relation extraction) plugs in through the same two methods.  Each fact becomes the
  :class:`MemoryUnit` of its key (:func:`fact_key`: entity and attribute,
  normalised), held in :class:`KeyedUnits` beside the tree.
  **Supersession** is by key only: a newer statement of the same entity's
  same attribute replaces the unit (it inherits the older one's uses), and the
  older turn, once none of its facts is current, is marked superseded;
  statements about different entities, or different attributes, never touch
  each other however similar their words.
* **Retention by expected utility** under one token budget for the tree and
  the units (a turn or unit costs its words + 1): at every segment and session
  close over the budget, turns and units are evicted by least expected utility
  per token, u = 0.6 log(f + 1) + 0.4 exp(-dt / tau) (ProStream sec. 5.3; 0
  for a superseded turn), down to ``low_water`` x budget; a segment or session
  goes with its last turn.  f counts a unit's statements (first, restatements,
  updates) and the recalls it answered, a turn's recalls (``config.access``);
  dt is the time since the last of them.  So a fact outlives the chatter and
  the distractors around it (they have no statement to count), and among facts
  the ones stated and asked more often, and more recently, stay longest.
* **Ad-hoc recall** (:meth:`ProStream.recall`, :meth:`ProStream.ask`), at any
  point of the stream: ``tree_search`` beam search as in ProStream -- the top
  ``beam[0]`` sessions, the top ``beam[1]`` segments under them (plus the open
  session's segments and the open segment's turns, which are roots), and the
  turns under those ranked by cos(q, v) x w (w = (1 + 0.05 u), halved for a
  superseded turn: ``rank_utility``, ``superseded_weight``) among those with
  cosine >= ``min_similarity`` -- beside the keyed units: the units of the
  entities the question names and the ``k`` best units by cosine (an exact
  scan: the units fit in the budget), each matched through the embedding of its
  canonical statement ("Marlow's car is Fiat.") and weighted by ``key_weight``
  when the question names its entity (squared when it also names its
  attribute).  The default answer (``streammem.extractive_answer`` of a
  ``Recall``) is the best item's text, labelled extractive: it is not a
  language model; pass ``answer_fn`` for one.

Baselines on the same embeddings (:class:`FlatTurnMemory`): retrieve-everything
(exact ``cosine_topk`` over every turn: unbounded memory, latency linear in the
stream) and a recent window (the newest turns within the same token budget).
:func:`synthetic_dialogue` generates a deterministic STEM-like stream with
planted facts in a dozen phrasings, later updates of some of them, chatter on
drifting topics, distractor turns about the same entities and attributes
(questions, negations, hypotheticals, mentions, asides) and questions about
near, far and superseded facts with their ground truth;
:func:`evaluate` streams it through any of the three and reports recall
accuracy and question latency.  ``streammem prostream`` runs it from the shell.

Out of scope: STEM-Bench's temporal-reasoning and global-awareness question
types (this recipe measures recall of planted facts), and ProStream's
language-model answering and summarisation themselves (hooks only).
"""
from .config import ProStreamConfig
from .dialogue import Question, Turn, read_dialogue, write_dialogue
from .distill import Distillate, Distiller, ExtractiveDistiller, ModelDistiller, informative_tokens
from .evaluation import FlatTurnMemory, evaluate, recalls_answer
from .extract import Fact, FactExtractor, ModelExtractor, PatternExtractor, fact_key
from .memory import DialogueTree, ProStream, ProStreamStats
from .recall import Recall, RecalledUnit
from .synthetic import (
    DISTRACTOR_KINDS, FACT_FORMS, KINDS, STYLES, Distractor, PlantedFact, SyntheticDialogue, synthetic_dialogue,
)
from .units import KeyedUnits, MemoryUnit

__all__ = [
    "Turn",
    "Question",
    "read_dialogue",
    "write_dialogue",
    "Distillate",
    "Distiller",
    "ExtractiveDistiller",
    "ModelDistiller",
    "informative_tokens",
    "Fact",
    "FactExtractor",
    "PatternExtractor",
    "ModelExtractor",
    "fact_key",
    "MemoryUnit",
    "KeyedUnits",
    "ProStreamConfig",
    "DialogueTree",
    "RecalledUnit",
    "Recall",
    "ProStream",
    "ProStreamStats",
    "FlatTurnMemory",
    "SyntheticDialogue",
    "synthetic_dialogue",
    "KINDS",
    "STYLES",
    "FACT_FORMS",
    "DISTRACTOR_KINDS",
    "PlantedFact",
    "Distractor",
    "evaluate",
    "recalls_answer",
]
