"""A language-model captioner that reuses the previous caption (StreamRAG sec. 3.3).

``LanguageModelCaptioner`` follows the ``Captioner`` protocol.  Each event's
prompt is a constant instruction (prefilled once into a ``PromptPrefixCache``)
followed by what the frames show (their most frequent labels and time span;
a video-LLM would put visual tokens here instead).  The new caption continues
the previous caption of the same stream as far as the model still agrees with
it (``update_caption``: divergence point, cache crop, decode the rest), so
similar consecutive events cost only the tokens that change.
"""
from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Callable, Sequence

import torch

__all__ = ["LanguageModelCaptioner"]


class LanguageModelCaptioner:
    """Captions frames and summarises nodes with a Hugging Face causal LM.

    Parameters
    ----------
    model : transformers causal LM (eval mode)
    encode : callable(str) -> list[int]
        Text to token ids without special tokens (for a HF tokenizer:
        ``lambda s: tok.encode(s, add_special_tokens=False)``).
    decode : callable(list[int]) -> str
    instruction : str
        Constant start of every prompt (prefilled once).
    max_new_tokens, delta, alpha, beta, eos_token_id
        Passed to ``update_caption``.
    reuse : bool
        False regenerates every caption from scratch (the baseline).

    ``updates`` records every ``CaptionUpdate`` (kept tokens, reuse ratio,
    prefill / decode times), so the reuse actually achieved can be reported.

    Thread-safe: captions are generated one at a time under an internal lock
    (the prompt cache is extended and cropped in place).
    """

    def __init__(self, model, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], *,
                 instruction: str = "Describe each video event in one short sentence.\n",
                 max_new_tokens: int = 32, delta: int = 20, alpha: float = 0.85, beta: float = 1.0,
                 eos_token_id=None, reuse: bool = True):
        from .caption_reuse import PromptPrefixCache

        self.model = model
        self.encode = encode
        self.decode = decode
        self.instruction_ids = list(encode(instruction))
        if not self.instruction_ids:
            raise ValueError("instruction must encode to at least one token")
        self.prompt_cache = PromptPrefixCache(model, torch.tensor(self.instruction_ids, dtype=torch.long))
        self.kwargs = dict(max_new_tokens=max_new_tokens, delta=delta, alpha=alpha, beta=beta,
                           eos_token_id=eos_token_id)
        self.reuse = bool(reuse)
        self.updates: list = []
        # Caption text -> its token ids, so a previous caption is fed back token-exactly.
        self._ids_of: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()  # the prompt cache is extended and cropped in place

    def _generate(self, body: str, previous: str | None) -> str:
        from .caption_reuse import update_caption

        prefix = torch.tensor(self.instruction_ids + list(self.encode(body)), dtype=torch.long)
        with self._lock:  # the prompt cache and the caption -> ids cache are edited in place
            prev_ids = None
            if self.reuse and previous:
                prev_ids = self._ids_of.get(previous)
                if prev_ids is None:
                    prev_ids = list(self.encode(previous))
            update = update_caption(self.model, prefix, None if not prev_ids else torch.tensor(prev_ids),
                                    prompt_cache=self.prompt_cache, **self.kwargs)
            self.updates.append(update)
            ids = update.caption_ids.tolist()
            text = self.decode(ids)
            self._ids_of[text] = ids
            while len(self._ids_of) > 64:
                self._ids_of.popitem(last=False)
        return text

    def state_dict(self) -> dict:
        """The caption -> token ids cache, so a restored memory feeds previous captions back token-exactly."""
        return {"ids_of": [[text, list(ids)] for text, ids in self._ids_of.items()]}

    def load_state_dict(self, state: dict) -> None:
        self._ids_of = OrderedDict((text, list(ids)) for text, ids in state["ids_of"])

    def caption_frames(self, frames: Sequence, previous: str | None = None) -> str:
        counts = Counter(label for f in frames for label in f.labels)
        names = ", ".join(n for n, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]) or "a scene"
        body = f"From {frames[0].timestamp:.1f} s to {frames[-1].timestamp:.1f} s the camera shows {names}.\nCaption:"
        return self._generate(body, previous)

    def summarize(self, nodes: Sequence) -> str:
        parts = "; ".join(n.caption for n in nodes)
        body = f"Summarise these events from {nodes[0].t_start:.1f} s to {nodes[-1].t_end:.1f} s: {parts}\nSummary:"
        return self._generate(body, None)

    def reuse_summary(self) -> dict:
        """Totals over every caption so far: tokens kept and decoded, mean reuse ratio, seconds."""
        with_prev = [u for u in self.updates if u.logprobs is not None]
        return {
            "captions": len(self.updates),
            "with_previous": len(with_prev),
            "tokens_kept": sum(u.kept for u in self.updates),
            "tokens_decoded": sum(u.timings.tokens_decoded for u in self.updates),
            "mean_reuse_ratio": (sum(u.reuse_ratio for u in with_prev) / len(with_prev)) if with_prev else 0.0,
            "prefill_s": sum(u.timings.prefill_s for u in self.updates),
            "decode_s": sum(u.timings.decode_s for u in self.updates),
        }
