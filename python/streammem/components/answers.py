"""The model-free answer: what a memory's best evidence says, quoted; it stands in for a language model.

``extractive_answer(context)`` is the package's one extractive answer.  Here it
answers a stream's ``Context`` (``StreamMemory.ask``; or the context's dict):
see :func:`extractive_choice`.  A recipe whose memory returns a context of its
own type registers the rule for that type beside the type
(``@extractive_answer.register(RecipeContext)``): ProStream quotes its best
recalled turn, MemVerse its best long-term chunk.  Any callable(context) -> str
passed as ``answer_fn`` replaces it (a language model); answers fill the
dialogue memory.
"""
from __future__ import annotations

import functools
from collections import Counter

from .memory import caption_text

__all__ = ["extractive_answer", "extractive_choice"]


def _field(context, name, default=None):
    return context.get(name, default) if isinstance(context, dict) else getattr(context, name, default)


def _top_labels(frames: list[dict], top: int = 3) -> str:
    counts = Counter(label for f in frames for label in f.get("labels", ()))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return ", ".join(name for name, _ in ranked) if ranked else "scene"


def extractive_choice(context) -> tuple[str, str]:
    """(source, answer) of a stream context's model-free answer; source is short_term, tree, knowledge or none.

    A question about the present (instantaneity S_t > 0.5, or no tree and no
    event yet) is answered from the short-term frames, the newest the memory
    holds; any other from the best-matching tree node or knowledge-base event
    (highest cosine).  Works on a ``Context`` or its dict.
    """
    short = _field(context, "short_term") or []
    best = _field(context, "tree_best")
    knowledge = _field(context, "knowledge") or []
    s_t = float((_field(context, "injection") or {}).get("s_t", 0.0))
    if short and (s_t > 0.5 or (best is None and not knowledge)):
        return "short_term", f"Now ({short[0]['t']:.1f}-{short[-1]['t']:.1f} s) I see: {_top_labels(short)}"
    candidates = []
    if best is not None:
        candidates.append((best.get("score", 0.0), "tree", best))
    candidates.extend((k.get("score", 0.0), "knowledge", k) for k in knowledge)
    if not candidates:
        return "none", "I have not seen anything yet."
    _, source, item = max(candidates, key=lambda c: c[0])
    return source, f"At {item['t_start']:.1f}-{item['t_end']:.1f} s I saw: {caption_text(item['caption'])}"


@functools.singledispatch
def extractive_answer(context) -> str | None:
    """A model-free answer to the question of ``context``, quoted from the memory's best evidence.

    A stream ``Context`` (or its dict): the answer of :func:`extractive_choice`.
    A recipe's context: the rule its recipe registers for that type.
    """
    return extractive_choice(context)[1]
