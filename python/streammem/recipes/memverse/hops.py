"""Possessive hops: a question about "Alice's sister" asked about the sister, through the relation that names her.

A question "Where does Alice's sister work?" is two questions: who Alice's
sister is (a relation of Alice's), then where that person works.  Asked as it
is, the question's embedding sits next to Alice's own statements, and the
sister's statement about her job (which never names Alice) ranks below them.
:func:`resolve_possessives` answers the first question in the graph and
rewrites the second, as a question-decomposition step of multi-hop retrieval
does:

1. **The possessor**: a possessive ``X's`` whose ``X`` (its last one to
   ``max_words`` words, the longest first) is an entity of the graph.
2. **The bridge**: among X's relations (those with X as head when there are
   any -- in ``"X's R"`` X is the subject of the relation, as the speaker of
   ``"Alice: Yara is my sister"`` is; and of those, the ones stated in a chunk
   that spells out both ends, when there are any), the one whose embedding
   best matches the possessive phrase and not the rest of the question:
   ``cos(rel, "X's w1") + cos(rel, "X's w1 w2") - cos(rel, question)``, where
   ``w1 w2`` are the words after ``'s`` (a relation named by two words, "best
   friend", is met by the second phrase; the question's own subject, "adopt",
   by the whole question, which the bridge does not explain).
3. **The phrase**: the leading words after ``'s`` that the bridge's text
   spells (stemmed as ``components.answers.content_words`` stems them);
   none means the possessive is not about a relation the graph holds, and the
   question stays as it is.
4. **The rewrite**: ``"X's <phrase>"`` is replaced by the bridge's other end
   (``"Where does Yara work?"``), and the next possessive (``"Alice's
   sister's dog"``) is resolved in turn, at most ``max_hops`` times.

The bridges are the first hop's evidence: ``LongTermGraph.search`` lists their
chunks first.  ``MemVerse`` asks the graph (and the hybrid's flat half) the
rewritten question; the flat mode never resolves.  Nothing is typed or learnt: the relation is whatever the
extractor wrote, matched by the text encoder.
"""
from __future__ import annotations

import re
from typing import Callable, NamedTuple

import torch

from ...checks import check_int
from ...components.answers import content_words
from .extraction import name_key
from .graph import RELATION, LongTermGraph

__all__ = ["Resolution", "resolve_possessives"]


_POSSESSIVE = re.compile(r"['\u2019]s\b")
_WORDS = re.compile(r"[A-Za-z0-9][\w-]*")


class Resolution(NamedTuple):
    """A question with its possessives resolved.

    ``question``: the rewritten question (the original when nothing
    resolved); ``bridges``: the relation nodes it went through, in order.
    """

    question: str
    bridges: tuple[int, ...] = ()


def resolve_possessives(graph: LongTermGraph, question: str, embed: Callable[[list[str]], torch.Tensor], *,
                        max_hops: int = 2, max_words: int = 4) -> Resolution:
    """Resolve ``"X's R"`` phrases of ``question`` through the graph's relations (see the module docstring).

    Parameters
    ----------
    graph : LongTermGraph
    question : str
    embed : callable(list of str) -> (n, dim) normalised float tensor
        The text encoder the graph's nodes were embedded with.
    max_hops : int
        Possessives resolved at most (``"Alice's sister's dog"``: two).
    max_words : int
        Longest entity name looked for before ``'s``.

    Raises
    ------
    ValueError
        ``question`` is not a non-empty string, ``max_hops`` < 0 or ``max_words`` < 1.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {question!r}")
    max_hops = check_int(max_hops, "max_hops", 0)
    max_words = check_int(max_words, "max_words", 1)
    bridges: list[int] = []
    for _ in range(max_hops):
        hop = _next_hop(graph, question, embed, max_words, bridges)
        if hop is None:
            break
        question, bridge = hop
        bridges.append(bridge)
    return Resolution(question, tuple(bridges))


def _next_hop(graph: LongTermGraph, question: str, embed, max_words: int, taken: list[int]):
    """The first resolvable possessive of ``question``: (rewritten question, bridge relation) or None."""
    for mark in _POSSESSIVE.finditer(question):
        before = list(_WORDS.finditer(question[:mark.start()]))
        if not before or before[-1].end() != mark.start():
            continue
        possessor = None
        for n in range(min(max_words, len(before)), 0, -1):
            name = question[before[-n].start():mark.start()]
            node = graph.entity_id(name)
            if node is not None:
                possessor = (node, name, before[-n].start())
                break
        after = list(_WORDS.finditer(question, mark.end()))
        if possessor is None or not after:
            continue
        found = _bridge(graph, question, possessor, [w.group(0) for w in after[:2]], embed, taken)
        if found is None:
            continue
        bridge, other = found
        stems = set(content_words(graph.texts[bridge]))
        phrase = 0  # words of the possessive phrase: the leading words after 's that the bridge spells
        while phrase < len(after) and set(content_words(after[phrase].group(0))) <= stems and \
                content_words(after[phrase].group(0)):
            phrase += 1
        if phrase == 0:
            continue
        end = after[phrase - 1].end()
        return question[:possessor[2]] + graph.texts[other] + question[end:], bridge
    return None


def _bridge(graph: LongTermGraph, question: str, possessor, words: list[str], embed, taken: list[int]):
    """The relation of the possessor that the possessive phrase names, and its other end; None if it has none."""
    node, name, _ = possessor
    relations = [v for v in dict.fromkeys(graph.neighbours(node)) if int(graph.kinds[v]) == RELATION
                 and v not in taken]
    if not relations:
        return None
    ends = {v: graph.relation_ends(v) for v in relations}
    headed = [v for v in relations if ends[v][0] == node]
    relations = headed or relations
    others = {v: ends[v][1] if ends[v][0] == node else ends[v][0] for v in relations}
    stated = [v for v in relations if _stated(graph, v, node, others[v])]
    relations = stated or relations
    phrases = [f"{name}'s {' '.join(words[:k])}" for k in range(1, len(words) + 1)]
    if len(phrases) == 1:
        phrases *= 2
    e = torch.as_tensor(embed(phrases + [question])).float()
    cos = graph.embeddings[torch.tensor(relations)] @ e.T
    score = cos[:, 0] + cos[:, 1] - cos[:, 2]
    best = relations[int(torch.argmax(score))]  # ties: the first listed, the newest
    return best, others[best]


def _stated(graph: LongTermGraph, relation: int, a: int, b: int) -> bool:
    """Whether a chunk of ``relation`` spells out both its ends (a chunk that states it rather than follows it)."""
    names = [f" {name_key(graph.texts[a])} ", f" {name_key(graph.texts[b])} "]
    for row in graph.node_chunks(relation):
        text = f" {name_key(graph.chunks[row].text)} "
        if all(n in text for n in names):
            return True
    return False
