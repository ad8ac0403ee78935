"""The ProStream memory: the dialogue tree, what a recall returns, and the streaming memory that keeps
turns and recalls them."""
from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ...checkpoint import StateReader, reader_for
from ...checkpoint import load as load_checkpoint, save as save_checkpoint
from ...components.answers import NOT_IN_MEMORY_ANSWER, Calibration, Outcome, extractive_answer
from ...components.bounded import BoundedMemory, utility
from ...components.memory import FrameRecord, LongTermMemory, MemoryNode
from ...components.timeref import parse_time_reference
from .answering import decide, default_calibration, recall_in_window
from .config import ProStreamConfig
from .dialogue import Turn, _check_time
from .distill import Distillate, Distiller, ExtractiveDistiller
from .extract import Fact, FactExtractor, PatternExtractor, check_facts, fact_key
from .recall import Recall, RecalledUnit
from .units import KeyedUnits, MemoryUnit, statement
from .state_checks import check_prostream_state

__all__ = ["ProStream", "DialogueTree", "RecalledUnit", "Recall", "ProStreamStats"]


_FORMAT = "streammem.ProStream"
_WORDS = re.compile(r"[a-z0-9]+")
_VERSION = 2


# --------------------------------------------------------------------------
# The memory tree: turns, segments, sessions
# --------------------------------------------------------------------------
class _KeepCaption:
    """``LongTermMemory.merge_leaves`` re-captions a merged leaf; dialogue turns keep their own texts."""

    @staticmethod
    def summarize(nodes) -> str:
        return " ".join(n.caption for n in nodes)


class DialogueTree(LongTermMemory):
    """``LongTermMemory`` whose leaves are turns and whose parents are segments and sessions.

    Same node table, ``CosineTree`` index, eviction and checkpoint machinery
    (so ``BoundedMemory`` manages it unchanged); only formation differs:
    :meth:`add_turn` adds one leaf per turn (its caption the text, its
    embedding the turn's, its one "centre" the same vector: nothing to
    compress in text), and :meth:`add_summary` adds a parent over given
    current roots (a closed segment's turns, a closed session's segments),
    instead of StreamChat's every-g-nodes grouping.
    """

    def __init__(self, text_encoder, *, backend: str = "auto"):
        super().__init__(text_encoder, _KeepCaption(), chunk=1, group=2, centres=1, backend=backend)

    def _grow(self) -> list[MemoryNode]:
        return []  # parents come from segment and session closes, not from counts

    def add_turn(self, index: int, t: float, speaker: str, text: str, embedding: torch.Tensor) -> MemoryNode | None:
        """Add turn ``index`` as a leaf; None when the novelty filter (if installed) skips it."""
        emb = F.normalize(embedding.float().reshape(-1), dim=0)
        if self.novelty_filter is not None and self.novelty_filter(emb, [FrameRecord(index, t, emb, (speaker,))]):
            return None
        node = MemoryNode(node_id=self._new_id(), level=0, t_start=t, t_end=t, first_frame=index, last_frame=index,
                          caption=text, embedding=emb, centres=emb[None].clone(), created_at=t, last_access=t)
        node.label_counts[speaker] += 1
        t0 = time.perf_counter()
        self._insert(node)
        self.timings["tree_insert"] += time.perf_counter() - t0
        return node

    def add_summary(self, child_ids: Sequence[int], caption: str, embedding: torch.Tensor) -> MemoryNode:
        """Add a parent (segment or session) over current roots ``child_ids`` of one level."""
        children = [self.nodes[i] for i in child_ids]
        levels = {c.level for c in children}
        if not children or len(levels) != 1 or any(c.parent is not None for c in children):
            raise ValueError(f"child_ids must be current roots of one level, got {list(child_ids)}")
        emb = F.normalize(embedding.float().reshape(-1), dim=0)
        label_counts = sum((c.label_counts for c in children), type(children[0].label_counts)())
        node = MemoryNode(
            node_id=self._new_id(), level=children[0].level + 1, t_start=children[0].t_start,
            t_end=children[-1].t_end, first_frame=children[0].first_frame, last_frame=children[-1].last_frame,
            caption=caption, embedding=emb, centres=emb[None].clone(), label_counts=label_counts,
            children=[c.node_id for c in children], created_at=children[-1].t_end,
            last_access=max(c.last_access for c in children), merged=sum(c.merged for c in children))
        t0 = time.perf_counter()
        self._insert(node)
        self.timings["tree_insert"] += time.perf_counter() - t0
        return node


def _unit(node: MemoryNode, q: torch.Tensor, utility: float, score: float | None = None) -> RecalledUnit:
    cos = float(node.embedding @ q)
    speaker = next(iter(node.label_counts), "") if node.label_counts else ""
    return RecalledUnit(node.node_id, node.first_frame, node.last_frame, node.t_start, speaker, node.caption, cos,
                        utility, cos * utility if score is None else score)


# --------------------------------------------------------------------------
# ProStream
# --------------------------------------------------------------------------
@dataclass
class ProStreamStats:
    turns: int = 0
    skipped: int = 0
    segments: int = 0
    sessions: int = 0
    cited: int = 0
    facts: int = 0
    superseded: int = 0
    restated: int = 0
    evicted_units: int = 0
    recalls: int = 0


class ProStream:
    """ProStream's bounded hierarchical memory of one dialogue stream (see the package docstring).

    Parameters
    ----------
    text_encoder : TextEncoder
        Embeds turns (unless embeddings are passed to ``push``), summaries, the
        units' statements and questions.
    config : ProStreamConfig, optional
    distiller : Distiller, optional
        Default :class:`ExtractiveDistiller` (model-free).
    extractor : FactExtractor, optional
        Reads (entity, attribute, value) facts out of every turn and the entities
        a question names; default :class:`PatternExtractor` (model-free).
    answer_fn : callable(Recall) -> str, optional
        A language model's answer from the recalled turns; default
        :func:`extractive_answer` (reported as ``answer_kind="extractive"``).
        Called only when the recall's outcome is answered.
    calibration : Calibration, optional
        Decides the confidence and outcome of ``ask`` (``answering.decide``;
        default ``answering.default_calibration(text_encoder)``).

    The memory holds two kinds of item under one token budget: the dialogue
    tree (every turn, its segment and session summaries) and the keyed units
    (:class:`MemoryUnit`, the newest statement of each (entity, attribute)).
    When their total cost exceeds ``config.budget``, turns and units are evicted
    by least expected utility per token (:meth:`expected_utility`) down to
    ``low_water`` x budget.

    Single-threaded.  ``state_dict`` / ``save`` / ``load`` checkpoint
    everything (the segmenter's state, the node table and tree row for row,
    the units, the open segment and session, statistics), so a restored memory
    continues exactly; the encoder and hooks are not state.
    """

    def __init__(self, text_encoder, config: ProStreamConfig | None = None, *, distiller: Distiller | None = None,
                 extractor: FactExtractor | None = None, answer_fn: Callable[[Recall], str] | None = None,
                 calibration: Calibration | None = None):
        from streammem_kernels import StreamingSegmenter

        if text_encoder is None or not callable(getattr(text_encoder, "encode", None)):
            raise ValueError("text_encoder must have encode(texts) -> (n, E) tensor (e.g. load_text_encoder())")
        config = ProStreamConfig() if config is None else config
        if not isinstance(config, ProStreamConfig):
            raise ValueError(f"config must be a ProStreamConfig, got {type(config).__name__}")
        distiller = ExtractiveDistiller() if distiller is None else distiller
        if not (callable(getattr(distiller, "distill_segment", None))
                and callable(getattr(distiller, "distill_session", None))):
            raise ValueError("distiller must have distill_segment(texts, embeddings) and distill_session(summaries)")
        extractor = PatternExtractor() if extractor is None else extractor
        if not (callable(getattr(extractor, "extract", None)) and callable(getattr(extractor, "mentions", None))):
            raise ValueError("extractor must have extract(text) -> facts and mentions(text) -> names "
                             "(a FactExtractor, e.g. PatternExtractor())")
        if answer_fn is not None and not callable(answer_fn):
            raise ValueError("answer_fn must be callable(Recall) -> str")
        self.text_encoder = text_encoder
        self.config = config
        self.distiller = distiller
        self.extractor = extractor
        self.answer_fn = answer_fn
        if calibration is not None and not isinstance(calibration, Calibration):
            raise ValueError(f"calibration must be a Calibration or None, got {type(calibration).__name__}")
        self.calibration = calibration if calibration is not None else default_calibration(text_encoder)
        self.tree = DialogueTree(text_encoder, backend=config.backend)
        # theta_sim = 1: BoundedMemory never merges two different turns (a merge would blend an
        # update with what it replaces); only exact duplicates can exceed it through rounding.
        # ProStream enforces the budget itself (turns and units together, _enforce); BoundedMemory
        # prices the tree's nodes, scores them, keeps the eviction statistics and the novelty filter.
        self.bounded = BoundedMemory(self.tree, config.budget, alpha=config.alpha, beta=config.beta, tau=config.tau,
                                     theta_sim=1.0, theta_concept=config.theta_concept, tokens_per_centre=1,
                                     low_water=config.low_water)
        self.units = KeyedUnits()
        self.segmenter = StreamingSegmenter(window=8, max_event=config.max_event, drift=config.drift,
                                            backend=config.backend)
        self.stats = ProStreamStats()
        self.stream_time: float | None = None
        self.timings: dict[str, float] = {}
        self._session: int | None = None  # Turn.session of the last turn
        self._open_turns: list[tuple[int, int | None]] = []  # (segmenter position, node id or None if skipped)
        self._open_segments: list[int] = []  # segment node ids of the open session
        self._superseded: set[int] = set()  # turn node ids whose every stated fact has a newer value
        self._cost = 0  # == self.bounded.total_cost() (the tree's tokens), kept incrementally

    # ---- reading the memory ----------------------------------------------------
    @property
    def memory_tokens(self) -> int:
        """Token cost of everything stored, tree and units (what ``budget`` bounds)."""
        return self._cost + self.units.cost

    @property
    def stored_turns(self) -> int:
        return sum(1 for n in self.tree.nodes.values() if n.level == 0)

    def summary(self) -> dict:
        levels = self.tree.levels()
        s = self.bounded.stats
        return {
            "turns": self.stats.turns, "skipped_redundant": self.stats.skipped, "segments": self.stats.segments,
            "sessions": self.stats.sessions, "cited": self.stats.cited, "facts": self.stats.facts,
            "superseded": self.stats.superseded, "restated": self.stats.restated, "recalls": self.stats.recalls,
            "stream_time": self.stream_time,
            "stored": {"turns": levels.get(0, 0), "segments": levels.get(1, 0), "sessions": levels.get(2, 0),
                       "units": len(self.units)},
            "memory_tokens": self.memory_tokens, "unit_tokens": self.units.cost, "budget": self.config.budget,
            "peak_tokens": s.peak_cost, "evicted_turns": s.removed_leaves, "evicted_summaries": s.removed_parents,
            "evicted_units": self.stats.evicted_units, "eviction_rounds": s.rounds,
            "distiller": getattr(self.distiller, "name", type(self.distiller).__name__),
            "extractor": getattr(self.extractor, "name", type(self.extractor).__name__),
            "seconds": {k: round(v, 4) for k, v in sorted(self.timings.items())},
        }

    def _time(self, name: str, t0: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0

    # ---- the stream --------------------------------------------------------------
    def push(self, turns: Turn | Sequence[Turn], embeddings: torch.Tensor | None = None) -> int:
        """Add turns in stream order; returns the number of segments closed.

        Parameters
        ----------
        turns : Turn or sequence of Turn
            Times must not decrease (across pushes too).
        embeddings : (n, E) float tensor, optional
            The turns' text embeddings, if already computed (else one encoder call).

        Every turn is read by the extractor before anything is stored, so a
        bad turn, bad embeddings or an extractor's bad output raise
        ``ValueError`` and leave the memory as it was.
        """
        if isinstance(turns, Turn):
            turns = [turns]
        turns = list(turns)
        if not all(isinstance(x, Turn) for x in turns):
            raise ValueError("turns must be Turn objects")
        if not turns:
            return 0
        last = self.stream_time if self.stream_time is not None else -math.inf
        for i, turn in enumerate(turns):
            t = _check_time(turn.t, f"turns[{i}]")
            if t < last:
                raise ValueError(f"turns[{i}].t = {t} is before the stream time {last}; times must not decrease")
            if not isinstance(turn.text, str) or not turn.text.strip():
                raise ValueError(f"turns[{i}].text must be a non-empty string")
            last = t
        t0 = time.perf_counter()
        if embeddings is None:
            embeddings = self.text_encoder.encode([turn.text for turn in turns])
            self._time("encode", t0)
        embeddings = torch.as_tensor(embeddings)
        dim = int(self.text_encoder.dim)
        if embeddings.dim() != 2 or embeddings.shape[0] != len(turns) or not embeddings.is_floating_point() \
                or embeddings.shape[1] != dim:
            raise ValueError(f"embeddings must be a float ({len(turns)}, E) tensor with E = {dim} (the text "
                             f"encoder's), got {tuple(embeddings.shape)} {embeddings.dtype}")
        if not bool(torch.isfinite(embeddings).all()):
            raise ValueError("embeddings must be finite")
        embeddings = F.normalize(embeddings.float(), dim=1)
        facts = self._extract(turns, embeddings)
        closed = 0
        for turn, emb, (turn_facts, fact_embs) in zip(turns, embeddings, facts):
            closed += self._push_one(turn, emb, turn_facts, fact_embs)
        return closed

    def _extract(self, turns: Sequence[Turn], embeddings: torch.Tensor) -> list[tuple[list[Fact], list[torch.Tensor]]]:
        """Every turn's facts, and the embedding of each fact's statement (one encoder call per push)."""
        t0 = time.perf_counter()
        facts = [check_facts(self.extractor.extract(turn.text), f"extractor.extract(turns[{i}].text)")
                 for i, turn in enumerate(turns)]
        self._time("extract", t0)
        statements = sorted({statement(f.entity, f.attribute, f.value) for fs in facts for f in fs})
        encoded = {}
        if statements:
            t0 = time.perf_counter()
            encoded = dict(zip(statements, F.normalize(self.text_encoder.encode(statements).float(), dim=1)))
            self._time("encode", t0)
        return [(fs, [encoded[statement(f.entity, f.attribute, f.value)] for f in fs]) for fs in facts]

    def _push_one(self, turn: Turn, emb: torch.Tensor, facts: Sequence[Fact], fact_embs: Sequence[torch.Tensor]) -> int:
        closed = 0
        gap = self.stream_time is not None and turn.t - self.stream_time >= self.config.session_gap
        new_session = turn.session is not None and self._session is not None and turn.session != self._session
        if gap or new_session:
            closed += self.close_session()
        self.stream_time = turn.t if self.stream_time is None else max(self.stream_time, turn.t)
        self._session = turn.session
        index = self.stats.turns
        self.stats.turns += 1
        t0 = time.perf_counter()
        node = self.tree.add_turn(index, turn.t, turn.speaker, turn.text, emb)
        self._time("insert", t0)
        if node is None:
            self.stats.skipped += 1
        else:
            self._cost += self.bounded.cost(node)
        t0 = time.perf_counter()
        for fact, fact_emb in zip(facts, fact_embs):
            self._state_fact(fact, fact_emb, turn, index, -1 if node is None else node.node_id)
        self._time("supersede", t0)
        t0 = time.perf_counter()
        events = self.segmenter.push(emb)
        self._time("segment", t0)
        self._open_turns.append((self.segmenter.frames_seen - 1, None if node is None else node.node_id))
        for event in events:
            self._close_segment(event.start, event.end)
            closed += 1
        return closed

    def _state_fact(self, fact: Fact, embedding: torch.Tensor, turn: Turn, index: int, node_id: int) -> None:
        """Make ``fact`` the current unit of its key; the unit it replaces goes (supersession, same key only)."""
        entity, attribute, value = fact.entity.strip(), fact.attribute.strip(), fact.value.strip()
        unit = MemoryUnit(self.units.new_id(), entity, attribute, value, fact.key, index, node_id, turn.t,
                          turn.speaker, statement(entity, attribute, value), embedding, uses=1, last_use=turn.t)
        current, old = self.units.state(unit)
        self.stats.facts += 1
        if current is not unit:
            self.stats.restated += 1
        if old is None:
            return
        self.stats.superseded += 1
        # The older turn now states a value that no longer holds; once none of its facts is current its
        # expected utility is 0 (it is evicted first) and recall ranks it down.
        if old.node in self.tree.nodes and not any(u.node == old.node for u in self.units.units.values()):
            self._superseded.add(old.node)

    def _close_segment(self, start: int, end: int) -> None:
        members = [(pos, nid) for pos, nid in self._open_turns if start <= pos <= end]
        self._open_turns = [(pos, nid) for pos, nid in self._open_turns if pos > end]
        ids = [nid for _, nid in members if nid is not None and nid in self.tree.nodes]
        if not ids:
            return
        t0 = time.perf_counter()
        nodes = [self.tree.nodes[i] for i in ids]
        embs = torch.stack([n.embedding for n in nodes])
        out = self.distiller.distill_segment([n.caption for n in nodes], embs)
        distillate = out if isinstance(out, Distillate) else Distillate(str(out), None)
        if not isinstance(distillate.summary, str) or not distillate.summary.strip():
            raise ValueError(f"distill_segment must return a non-empty summary, got {distillate.summary!r}")
        self._time("distill", t0)
        summary_emb = self._embed_summary(distillate.summary, nodes)
        if distillate.cited is None:
            cited = [i for i, c in enumerate((embs @ summary_emb).tolist()) if c >= self.config.cite_threshold]
        else:
            cited = sorted(set(int(i) for i in distillate.cited))
            if any(not 0 <= i < len(nodes) for i in cited):
                raise ValueError(f"Distillate.cited must index the segment's {len(nodes)} turns, got {cited}")
        t0 = time.perf_counter()
        segment = self.tree.add_summary(ids, distillate.summary, summary_emb)
        self._cost += self.bounded.cost(segment)
        self._time("insert", t0)
        self._open_segments.append(segment.node_id)
        self.stats.segments += 1
        self.stats.cited += len(cited)
        self._enforce()

    def _embed_summary(self, summary: str, nodes: Sequence[MemoryNode]) -> torch.Tensor:
        for n in nodes:  # an extractive summary of one turn is that turn: reuse its embedding
            if n.caption == summary:
                return n.embedding
        t0 = time.perf_counter()
        emb = self.text_encoder.encode([summary])[0]
        self._time("encode", t0)
        return F.normalize(emb.float(), dim=0)

    def close_session(self) -> int:
        """Close the open segment and the open session (a pause did); returns the segments closed."""
        closed = 0
        for event in self.segmenter.flush():
            self._close_segment(event.start, event.end)
            closed += 1
        ids = [i for i in self._open_segments if i in self.tree.nodes]
        self._open_segments = []
        if ids:
            t0 = time.perf_counter()
            caption = self.distiller.distill_session([self.tree.nodes[i].caption for i in ids])
            if not isinstance(caption, str) or not caption.strip():
                raise ValueError(f"distill_session must return a non-empty summary, got {caption!r}")
            self._time("distill", t0)
            emb = self._embed_summary(caption, [self.tree.nodes[i] for i in ids])
            t0 = time.perf_counter()
            session = self.tree.add_summary(ids, caption, emb)
            self._cost += self.bounded.cost(session)
            self._time("insert", t0)
            self.stats.sessions += 1
            self._enforce()
        return closed

    def finish(self) -> int:
        """End of stream: close the open segment and session."""
        return self.close_session()

    # ---- retention -----------------------------------------------------------------
    def expected_utility(self, item: MemoryNode | MemoryUnit, now: float | None = None) -> float:
        """Expected utility of keeping a turn or a unit: u = alpha log(f + 1) + beta exp(-dt / tau), 0 for a
        turn whose every fact has a newer value.

        f: a unit's uses (its key's statements and the recalls it answered), a
        turn's recalls; dt: stream seconds since the last of them (a turn's
        creation otherwise).  Eviction removes the least u per token first.
        """
        now = (self.stream_time or 0.0) if now is None else now
        if isinstance(item, MemoryUnit):
            b = self.bounded
            return utility(item.uses, item.last_use, now, alpha=b.alpha, beta=b.beta, tau=b.tau)
        return 0.0 if item.node_id in self._superseded else self.bounded.utility(item, now)

    def _enforce(self) -> None:
        if self.stream_time is None:
            return
        # Costs are fixed at creation, so the running sums are exact and the O(stored) pass runs
        # only when the budget is exceeded.
        stats = self.bounded.stats
        total = self.memory_tokens
        stats.peak_cost = max(stats.peak_cost, total)
        if total <= self.config.budget:
            return
        t0 = time.perf_counter()
        now = self.stream_time
        target = self.config.low_water * self.config.budget
        nodes = self.tree.nodes
        leaves = [n for n in nodes.values() if n.level == 0]
        # (expected utility per token, creation time, kind, id, cost): least useful first, older first among
        # equals.
        ranked = sorted(
            [(self.expected_utility(n, now) / max(1, self.bounded.cost(n)), n.created_at, 0, n.node_id,
              self.bounded.cost(n)) for n in leaves]
            + [(self.expected_utility(u, now) / u.cost, u.t, 1, u.unit_id, u.cost) for u in self.units.units.values()])
        live_children = {n.node_id: len(n.children) for n in nodes.values() if n.children}
        doomed_leaves, doomed_units = [], []
        for _, _, kind, item_id, cost in ranked:
            if total <= target:
                break
            total -= cost
            if kind:
                doomed_units.append(item_id)
                continue
            doomed_leaves.append(item_id)
            # A segment or session goes with its last turn: count what that frees too.
            parent = nodes[item_id].parent
            while parent is not None:
                live_children[parent] -= 1
                if live_children[parent]:
                    break
                total -= self.bounded.cost(nodes[parent])
                parent = nodes[parent].parent
        removed = self.tree.remove(doomed_leaves) if doomed_leaves else []
        self.units.remove(doomed_units)
        self._superseded.difference_update(removed)
        self._cost = self.bounded.total_cost()
        stats.rounds += 1
        stats.removed_leaves += len(doomed_leaves)
        stats.removed_parents += len(removed) - len(doomed_leaves)
        self.stats.evicted_units += len(doomed_units)
        self._time("evict", t0)

    # ---- questions ---------------------------------------------------------------
    def encode_question(self, question: str) -> torch.Tensor:
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-empty string")
        return F.normalize(self.text_encoder.encode([question])[0].float(), dim=0)

    def ask(self, question: str, *, k: int | None = None, answer: bool = True) -> Recall:
        """Encode the question, recall now, decide (``answering.decide``) and answer (``answer_fn`` or
        extractive; ``NOT_IN_MEMORY_ANSWER`` when not in memory).

        A question with a time reference is recalled from the stored turns
        inside its window (``answering.recall_in_window``) instead of the tree search.
        """
        t0 = time.perf_counter()
        q = self.encode_question(question)
        encode_s = time.perf_counter() - t0
        ref = parse_time_reference(question)
        if ref is None:
            rec = self.recall(q, question=question, k=k)
        else:
            anchor = self.encode_question(ref.anchor) if ref.anchor is not None else None
            rec = recall_in_window(self, q, ref, question=question, k=k, anchor=anchor)
        rec.timings["question_encode"] = encode_s
        decide(rec, self.calibration, None if ref is None else ref.question)
        if answer:
            if rec.outcome != Outcome.ANSWERED:
                rec.answer, rec.answer_kind = NOT_IN_MEMORY_ANSWER, "not_in_memory"
            elif self.answer_fn is not None:
                t1 = time.perf_counter()
                rec.answer, rec.answer_kind = self.answer_fn(rec), "model"
                rec.timings["answer"] = time.perf_counter() - t1
            else:
                rec.answer, rec.answer_kind = extractive_answer(rec), "extractive"
        return rec

    def _beam(self) -> tuple[int, ...]:
        sessions, segments = self.config.beam
        return (sessions, segments) if self.tree.tree.height >= 2 else (segments,)

    def rank_weight(self, item: MemoryNode | MemoryUnit, now: float | None = None, *, match: int = 0) -> float:
        """Recall's weight: (1 + rank_utility x u), x superseded_weight for a superseded turn, and for a unit
        x key_weight ** ``match`` (1: the question names its entity, 2: its entity and its attribute)."""
        now = (self.stream_time or 0.0) if now is None else now
        if isinstance(item, MemoryUnit):
            return (1.0 + self.config.rank_utility * self.expected_utility(item, now)) * self.config.key_weight ** match
        w = 1.0 + self.config.rank_utility * self.bounded.utility(item, now)
        return w * self.config.superseded_weight if item.node_id in self._superseded else w

    def refresh_utility(self) -> None:
        """Write every stored turn's rank weight at the current stream time into the tree's utility column."""
        tree = self.tree.tree
        if tree is None or tree.num_live == 0:
            return
        now = self.stream_time if self.stream_time is not None else 0.0
        self._superseded &= self.tree.nodes.keys()
        rows = ((tree.level == 0) & tree.alive).nonzero()[:, 0]
        nodes = [self.tree.node_at(r) for r in rows.tolist()]
        # rank_weight for every stored turn at once (one Python pass to read the nodes, then tensors).
        uses = torch.tensor([n.access_count for n in nodes], dtype=torch.float64)
        idle = (now - torch.tensor([n.last_access for n in nodes], dtype=torch.float64)).clamp_min(0.0)
        b = self.bounded
        u = b.alpha * torch.log1p(uses) + b.beta * torch.exp(-idle / b.tau)
        weight = 1.0 + self.config.rank_utility * u
        superseded = torch.tensor([n.node_id in self._superseded for n in nodes], dtype=torch.bool)
        weight = torch.where(superseded, weight * self.config.superseded_weight, weight)
        tree.set_utility(rows, weight.to(torch.float32))

    def key_match(self, question: str) -> dict[int, int]:
        """How well ``question`` names each stored unit's key: {unit id: 1 (its entity) or 2 (its entity and
        every word of its attribute)}, for the units whose entity ``extractor.mentions`` finds in it."""
        if not question:
            return {}
        names = self.extractor.mentions(question)
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"extractor.mentions must return a list of strings, got {names!r}")
        entities = {fact_key(n, "")[0] for n in names} & self.units.by_entity.keys()
        if not entities:
            return {}
        words = set(_WORDS.findall(question.lower()))
        return {u.unit_id: 2 if words.issuperset(_WORDS.findall(u.key[1])) else 1
                for u in self.units.of_entities(entities)}

    def recall(self, query_embedding, *, question: str = "", k: int | None = None) -> Recall:
        """Ad-hoc recall now: the tree's turns (beam over sessions and segments) and the keyed units, ranked
        by cos x rank weight among those with cos >= min_similarity.

        Parameters
        ----------
        query_embedding : (E,) float tensor
            The question's embedding (normalised here).
        question : str
            The question's text: the units keyed on an entity it names
            (``extractor.mentions``) are candidates beside the ``k`` nearest units,
            weighted by ``key_weight`` (squared when it also names the unit's
            attribute: then min_similarity does not apply to them either; see
            :meth:`key_match`).
        k : int, optional
            Items returned (default ``config.k``); a unit and the turn that
            stated it are one item (the better scored is kept).

        The best (``config.access="answer"``) or every returned item
        (``"context"``) counts a use at the current stream time.
        """
        from streammem_kernels import tree_search

        k = self.config.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        if not isinstance(question, str):
            raise ValueError(f"question must be a string, got {type(question).__name__}")
        q = torch.as_tensor(query_embedding, dtype=torch.float32).reshape(-1)
        if q.shape[0] != self.text_encoder.dim or not bool(torch.isfinite(q).all()):
            raise ValueError(f"query_embedding must be a finite ({self.text_encoder.dim},) vector, "
                             f"got {tuple(q.shape)}")
        q = F.normalize(q, dim=0)
        t0 = time.perf_counter()
        now = self.stream_time if self.stream_time is not None else 0.0
        tree = self.tree.tree
        found: dict[int, tuple[RecalledUnit, object]] = {}  # turn index -> (unit, the item behind it)
        timings = {}
        if tree is not None and tree.num_live > 0:
            self.refresh_utility()
            t1 = time.perf_counter()
            res = tree_search(tree, q[None], beam=self._beam(), k=k, min_score=self.config.min_similarity,
                              use_utility=True, backend=self.config.backend)
            timings.update(utility=t1 - t0, search=time.perf_counter() - t1)
            for row, score in zip(res.ids[0].tolist(), res.scores[0].tolist()):
                if row >= 0:
                    node = self.tree.node_at(row)
                    found[node.first_frame] = (_unit(node, q, self.bounded.utility(node, now), score), node)
        t1 = time.perf_counter()
        if self.units:
            matches = self.key_match(question)
            for unit_id in sorted(set(matches) | set(self.units.nearest(q, k))):
                unit = self.units.units[unit_id]
                cos = float(unit.embedding @ q)
                match = matches.get(unit_id, 0)
                # A question that names a unit's entity and attribute asks for it, however its wording
                # scores: min_similarity applies to the other units only.
                if cos < self.config.min_similarity and match < 2:
                    continue
                score = cos * self.rank_weight(unit, now, match=match)
                held = found.get(unit.turn)
                if held is None or held[0].score <= score:
                    found[unit.turn] = (RecalledUnit(-1, unit.turn, unit.turn, unit.t, unit.speaker, unit.text, cos,
                                                     self.expected_utility(unit, now), score, unit.unit_id,
                                                     unit.entity, unit.attribute, unit.value), unit)
        timings["units"] = time.perf_counter() - t1
        ranked = sorted(found.values(), key=lambda pair: (-pair[0].score, pair[0].first_turn))[:k]
        used = ranked if self.config.access == "context" else ranked[:1] if self.config.access == "answer" else []
        for _, item in used:
            if isinstance(item, MemoryUnit):
                item.uses += 1
                item.last_use = max(item.last_use, now)
            else:
                item.access_count += 1
                item.last_access = max(item.last_access, now)
        latency = time.perf_counter() - t0
        timings["total"] = latency
        self.stats.recalls += 1
        return Recall(question, self.stream_time, [u for u, _ in ranked], latency, timings)

    # ---- checkpoints ---------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly; ``torch.load(weights_only=True)`` reads it."""
        return {
            "format": _FORMAT, "version": _VERSION, "config": self.config.to_dict(),
            "text_dim": int(self.text_encoder.dim),
            "tree": self.tree.state_dict(), "bounded": self.bounded.state_dict(), "units": self.units.state_dict(),
            "segmenter": self.segmenter.state_dict(),
            "stats": asdict(self.stats), "stream_time": self.stream_time, "timings": dict(self.timings),
            "session": self._session, "open_turns": [[p, -1 if n is None else n] for p, n in self._open_turns],
            "open_segments": list(self._open_segments), "superseded": sorted(self._superseded),
        }

    def load_state_dict(self, state) -> None:
        """Restore ``state_dict()`` output (a dict, or a ``checkpoint.StateReader`` of a file).  Every
        field is checked before the memory changes (``state_checks.check_prostream_state``), each
        failure one ``ValueError`` naming the field (and the file)."""
        reader = reader_for(state, "ProStream")
        check_prostream_state(reader, _FORMAT, _VERSION, self.config, int(self.text_encoder.dim))
        state = reader.state
        # The segmenter checks its own tensors before it changes: first, so a bad one leaves all as it was.
        reader.restore("segmenter", lambda: self.segmenter.load_state_dict(reader.sub("segmenter")))
        reader.restore("tree", lambda: self.tree.load_state_dict(state["tree"]))
        reader.restore("bounded", lambda: self.bounded.load_state_dict(state["bounded"]))
        reader.restore("units", lambda: self.units.load_state_dict(state["units"]))
        self.stats = ProStreamStats(**state["stats"])
        self.stream_time = state["stream_time"]
        self.timings = dict(state["timings"])
        self._session = state["session"]
        self._open_turns = [(int(p), None if n < 0 else int(n)) for p, n in state["open_turns"]]
        self._open_segments = [int(i) for i in state["open_segments"]]
        self._superseded = set(int(i) for i in state["superseded"])
        self._cost = self.bounded.total_cost()

    def save(self, path) -> Path:
        """Write ``state_dict()`` to ``path`` (a file) in the checkpoint format (``streammem.checkpoint``:
        a header, a SHA-256 of the payload, atomic replacement: a crash leaves the previous file)."""
        return save_checkpoint(path, "ProStream", self.state_dict(), version=_VERSION)

    @classmethod
    def load(cls, path, text_encoder, **hooks) -> "ProStream":
        """A memory saved with ``save`` (pass the same encoder; ``distiller`` / ``extractor`` / ``answer_fn`` /
        ``calibration`` as hooks).  A missing, damaged, truncated or foreign file, or a state with an invalid
        field, is one ``ValueError`` naming the file (and the field)."""
        state, _ = load_checkpoint(path, "ProStream", versions=(_VERSION,))
        reader = StateReader(path, "ProStream", state)
        config = reader.restore("config", lambda: ProStreamConfig.from_dict(reader.dict("config")))
        memory = cls(text_encoder, config, **hooks)
        memory.load_state_dict(reader)
        return memory

