"""What an answer may rest on: the candidate bases of a context, and the basis inside a question's time
reference (its window over the tree's leaves, the knowledge base's events and the short-term frames).

Functions of a ``StreamMemory`` (``memory``), called under its state lock; the decision among them is
``StreamMemory._decide``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..components.answers import Outcome, answer_features, content_words, short_term_text
from ..components.memory import caption_text
from ..components.timeref import TimeReference, best_in_window
from .context import Context, node_view

__all__ = ["candidates", "time_basis", "time_units"]


def time_units(memory) -> list[dict]:
    """Every leaf of the tree and every knowledge-base event, as units a time reference selects from."""
    units = [dict(node_view(n), source="tree", embedding=n.embedding)
             for n in memory.long_term.nodes.values() if n.level == 0]
    units += [{"source": "knowledge", "event": e.event_id, "t_start": round(e.t_start, 3),
               "t_end": round(e.t_end, 3), "caption": e.caption, "embedding": e.embedding}
              for e in memory.knowledge_base.entries]
    return units


def time_basis(memory, ref: TimeReference, q: torch.Tensor, anchor_q: torch.Tensor | None, short: list[dict]) -> dict:
    """The basis inside a time reference's window (under the state lock): ``{"basis", "reference"}``.

    Units: the tree's leaves and the events; when none meets the window,
    the short-term frames (one unit each).  ``basis`` is None when the
    window holds nothing, or the anchor of "before X" / "after X" is not
    in memory.
    """
    units = time_units(memory)
    in_memory = units + [{"source": "short_term", "t_start": f["t"], "t_end": f["t"], "frames": [f]}
                         for f in short]
    reference = {**ref.to_dict(), "window": None}
    if not in_memory or memory.stream_time is None:
        return {"basis": None, "reference": {**reference, "reason": "the memory is empty"}}
    start = min(u["t_start"] for u in in_memory)
    now = float(memory.stream_time)
    anchor_span = None
    if ref.anchor is not None:
        if not units:
            return {"basis": None, "reference": {**reference, "reason": "no memory to find the anchor in"}}
        emb = torch.stack([F.normalize(u["embedding"].float(), dim=0) for u in units])
        anchor_scores = (emb @ anchor_q).tolist()
        j = max(range(len(units)), key=lambda i: (anchor_scores[i], -i))
        anchor_text = caption_text(units[j]["caption"])
        with memory._word_lock:
            features = answer_features(ref.anchor, anchor_text, anchor_scores[j], word_vectors=memory.word_vectors)
        conf, outcome = memory.calibration.decide(features)
        reference["anchor_match"] = {"text": anchor_text, "t_start": units[j]["t_start"],
                                     "t_end": units[j]["t_end"], "confidence": round(conf, 4)}
        if outcome != Outcome.ANSWERED:
            return {"basis": None, "reference": {**reference, "reason": "the anchor is not in memory"}}
        anchor_span = (units[j]["t_start"], units[j]["t_end"])
    lo, hi = ref.window(stream_start=start, now=now, anchor_span=anchor_span)
    reference["window"] = [round(lo, 3), round(hi, 3)]
    generic = not content_words(ref.question)
    for pool in (units, [u for u in in_memory if u["source"] == "short_term"]):
        if not pool:
            continue
        if pool is units:
            emb = torch.stack([F.normalize(u["embedding"].float(), dim=0) for u in pool])
            scores = (emb @ q).tolist()
        else:
            scores = [0.0] * len(pool)
        i = best_in_window(ref, [u["t_start"] for u in pool], [u["t_end"] for u in pool], scores,
                           generic=generic, stream_start=start, now=now, anchor_span=anchor_span)
        if i is not None:
            u = pool[i]
            if u["source"] == "short_term":
                return {"basis": {"source": "short_term", "t_start": u["t_start"], "t_end": u["t_end"],
                                  "text": short_term_text(u["frames"]), "score": None},
                        "reference": reference}
            basis = {"source": u["source"], "t_start": u["t_start"], "t_end": u["t_end"],
                     "text": caption_text(u["caption"]), "score": round(scores[i], 4)}
            basis["node" if u["source"] == "tree" else "event"] = u.get("node", u.get("event"))
            return {"basis": basis, "reference": reference}
    return {"basis": None, "reference": {**reference, "reason": "nothing in memory in that span"}}


def candidates(ctx: Context) -> list[dict]:
    """What a context's answer may rest on, as bases: the short-term frames, the tree's best node, the
    injected events and the knowledge base's best event."""
    out = []
    if ctx.short_term:
        out.append({"source": "short_term", "t_start": ctx.short_term[0]["t"], "t_end": ctx.short_term[-1]["t"],
                    "text": short_term_text(ctx.short_term), "score": None})
    if ctx.tree_best is not None:
        b = ctx.tree_best
        out.append({"source": "tree", "t_start": b["t_start"], "t_end": b["t_end"],
                    "text": caption_text(b["caption"]), "score": b.get("score"), "node": b["node"]})
    for k in ctx.knowledge + ([ctx.knowledge_best] if ctx.knowledge_best is not None else []):
        out.append({"source": "knowledge", "t_start": k["t_start"], "t_end": k["t_end"],
                    "text": caption_text(k["caption"]), "score": k.get("score"), "event": k["event"]})
    return out
