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
* **Utility-based bounded memory**: ``BoundedMemory`` (ProStream sec. 5.3)
  with its rule u = 0.6 log(f + 1) + 0.4 exp(-dt / tau), enforced at every
  segment and session close: turns are evicted by least u / token cost, and a
  segment or session goes with its last turn.  f counts uses of a turn: being
  quoted by its segment summary is one (so distilled turns outlive chatter),
  being a recall's best turn is another (``config.access``).
  **Supersession** (at a segment's close, when its summary quotes a turn):
  when a quoted turn is close to an older quoted turn (cosine >=
  ``theta_update``: the same subject restated, e.g. a changed address), the
  newer one takes over the older one's uses, the older one's drop to 0 (it is
  evicted first) and it is marked superseded (it ranks lower in recall).
* **Ad-hoc recall** (:meth:`ProStream.recall`, :meth:`ProStream.ask`), at any
  point of the stream: ``tree_search`` beam search as in ProStream -- the top
  ``beam[0]`` sessions, the top ``beam[1]`` segments under them (plus the open
  session's segments and the open segment's turns, which are roots), and the
  turns under those ranked by cos(q, v) x w (w = (1 + 0.05 u), halved for a superseded turn:
  ``rank_utility``, ``superseded_weight``) among those with cosine >=
  ``min_similarity``.  The default answer (``streammem.extractive_answer`` of a ``Recall``) is the
  best unit's text, labelled extractive: it is not a language model; pass
  ``answer_fn`` for one.

Baselines on the same embeddings (:class:`FlatTurnMemory`): retrieve-everything
(exact ``cosine_topk`` over every turn: unbounded memory, latency linear in the
stream) and a recent window (the newest turns within the same token budget).
:func:`synthetic_dialogue` generates a deterministic STEM-like stream with
planted facts, later updates of some of them, chatter on drifting topics and
questions about near, far and superseded facts with their ground truth;
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
from .extract import Fact, FactExtractor, PatternExtractor, fact_key
from .memory import DialogueTree, ProStream, ProStreamStats, Recall, RecalledUnit
from .synthetic import KINDS, SyntheticDialogue, synthetic_dialogue

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
    "fact_key",
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
    "evaluate",
    "recalls_answer",
]
