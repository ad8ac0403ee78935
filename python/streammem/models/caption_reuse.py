"""Caption update with KV-cache prefix reuse (StreamRAG's Knowledge Extraction Accelerator, sec. 3.3).

Each new event is captioned by continuing the previous event's caption as far
as the model still agrees with it:

1. one forward of the *base* model over ``[prefix ; prev_caption]`` with the
   KV cache on gives the last hidden states of every caption position;
2. ``linear_token_logprobs`` applies the LM head to those hidden states (the
   ``(L, V)`` logits are never materialised) and yields
   ``lp[j] = log p(c[j] | prefix, c[0..j-1])``;
3. ``divergence_point`` (Eq. 9-10) finds ``o``: the caption tokens ``c[0..o-1]``
   are kept;
4. the cache is cropped to ``len(prefix) + o`` tokens -- it already holds the
   keys and values of the kept tokens, so there is no second forward over them
   -- and the next-token logits come from the hidden state at position
   ``len(prefix) + o - 1``, which step 1 already computed;
5. decoding continues token by token from the cropped cache until EOS or
   ``max_new_tokens``.

With greedy decoding the new tokens are exactly what ``model.generate`` returns
for ``[prefix ; c[0..o-1]]`` with ``do_sample=False`` and the same
``max_new_tokens`` (the tests check this token for token).

A :class:`PromptPrefixCache` holds the KV cache of the constant instruction
part of the prompt (system prompt, "Describe this video", ...), prefilled once;
each event appends to it and crops back to the instruction afterwards, so the
instruction is never recomputed and results are unchanged.

Works with Hugging Face causal LMs whose LM head is a plain linear layer
(Llama, Qwen2, SmolLM, Mistral, ...), transformers 4.4x and 5.x
(``DynamicCache.crop`` is only ever called with a negative count -- "drop this
many tokens" -- which both major versions accept; it is skipped when nothing
is dropped).  The KV cache is passed under the keyword the model's ``forward``
declares and read from the output field of the same name: ``cache`` where
transformers 5.x renamed it (the old ``past_key_values`` there only warns that
it goes away), ``past_key_values`` before.
"""
from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass, fields
from typing import Optional, Sequence, Union

import numpy as np
import torch

from streammem_kernels import divergence_point, linear_token_logprobs

__all__ = ["CaptionTimings", "CaptionUpdate", "PromptPrefixCache", "update_caption"]


@dataclass
class CaptionTimings:
    """Wall-clock seconds of one caption update.

    ``prefill_s`` covers the forward over [prefix; previous caption], the
    log-probs, the divergence point, the crop and the first next-token logits;
    ``decode_s`` the token-by-token loop; ``tokens_decoded`` the number of
    tokens produced by that loop (EOS included when it was produced).
    """

    prefill_s: float
    decode_s: float
    tokens_decoded: int

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


@dataclass
class CaptionUpdate:
    """Result of :func:`update_caption`.

    Attributes
    ----------
    caption_ids : (n,) int64
        The new caption: the kept prefix ``c[0..o-1]`` followed by the decoded
        tokens, without a final EOS (feed it back as the next ``prev_caption``).
    new_token_ids : (m,) int64
        The decoded tokens exactly as ``model.generate`` returns them after its
        input (a final EOS included when decoding stopped on it).
    kept : int
        The divergence point o (0 on the first event).
    reuse_ratio : float
        ``kept / len(caption_ids)`` (0 for an empty caption).
    logprobs : (L,) float32 or None
        ``log p(c[j] | prefix, c[0..j-1])`` of the previous caption (None when
        there was none).
    cache_length_after_crop : int
        Tokens in the KV cache when decoding started: ``len(prefix) + kept``.
    timings : CaptionTimings
    """

    caption_ids: torch.Tensor
    new_token_ids: torch.Tensor
    kept: int
    reuse_ratio: float
    logprobs: Optional[torch.Tensor]
    cache_length_after_crop: int
    timings: CaptionTimings


class PromptPrefixCache:
    """KV cache of a constant prompt prefix, prefilled once and shared by every event.

    Parameters
    ----------
    model : transformers causal LM
    instruction : (n,) token ids or (n, H) input embeddings, n >= 1
        The constant start of every event's ``prefix``.  :func:`update_caption`
        checks that the prefix it is given starts with exactly these ids (or
        embeddings).

    Notes
    -----
    Not thread-safe: an event appends to the cache in place and crops it back
    to the instruction when it finishes (cropping slices the stored tensors, so
    the instruction's keys and values are never recomputed or copied).
    """

    def __init__(self, model, instruction):
        self.model = model
        self.instruction = _prefix_tensor(model, instruction, "instruction")
        with torch.no_grad():
            out = _forward(_base_model(model), _model_inputs(self.instruction), None)
        self.cache = _output_cache(out)
        # Hidden state of the instruction's last position: it predicts the first
        # token after the instruction when an event adds nothing to the prefix.
        self.last_hidden = out.last_hidden_state[0, -1].clone()
        self.length = self.instruction.shape[0]

    def restore(self) -> None:
        """Crop the shared cache back to the instruction."""
        extra = self.cache.get_seq_length() - self.length
        if extra > 0:
            self.cache.crop(-extra)

    def check_prefix(self, prefix: torch.Tensor) -> None:
        if prefix.dtype.is_floating_point != self.instruction.dtype.is_floating_point:
            raise ValueError("prefix and the prompt cache's instruction must both be token ids or both embeddings")
        if prefix.shape[0] < self.length or not torch.equal(prefix[: self.length], self.instruction):
            raise ValueError(
                f"prefix must start with the prompt cache's instruction ({self.length} tokens) to reuse its KV cache"
            )


def update_caption(model, prefix, prev_caption=None, *, max_new_tokens: int = 128, delta: int = 20,
                   alpha: float = 0.85, beta: float = 1.0, eos_token_id: Union[int, Sequence[int], None] = None,
                   do_sample: bool = False, generator: Optional[torch.Generator] = None,
                   prompt_cache: Optional[PromptPrefixCache] = None) -> CaptionUpdate:
    """Caption a new event, reusing the previous caption up to its divergence point.

    Parameters
    ----------
    model : transformers causal LM (batch 1, eval mode)
        Its LM head must be a plain linear layer (no logit soft-capping).
    prefix : (P,) int token ids or (P, H) float input embeddings, P >= 1
        (a leading batch dimension of 1 is accepted).  Embeddings let a
        video-LLM pass visual tokens.  Must start with ``prompt_cache``'s
        instruction when one is given.
    prev_caption : (L,) int token ids, optional
        The previous event's caption (without EOS).  ``None`` or empty: plain
        generation (the first event).
    max_new_tokens : int >= 1
        Budget of decoded tokens after the kept prefix, as in ``generate``.
    delta, alpha, beta
        Divergence-point parameters (paper: 20, 0.85, 1.0); see
        :func:`streammem_kernels.divergence_point`.
    eos_token_id : int or sequence of int, optional
        Stop tokens; default: the model's ``generation_config.eos_token_id``.
    do_sample : bool
        Sample from ``softmax(logits)`` instead of taking the argmax.
    generator : torch.Generator, optional
        Random source for sampling.
    prompt_cache : PromptPrefixCache, optional
        The constant instruction's KV cache; outputs are unchanged.

    Returns
    -------
    CaptionUpdate
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    prefix = _prefix_tensor(model, prefix, "prefix")
    caption = _caption_tensor(prev_caption, model.get_input_embeddings().weight.device)
    vocab = model.get_output_embeddings().weight.shape[0]
    if caption.numel() and (int(caption.min()) < 0 or int(caption.max()) >= vocab):
        raise ValueError(f"prev_caption must hold token ids in [0, {vocab})")
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError("models with final_logit_softcapping are not supported (the LM head must be linear)")
    stop_ids = _stop_ids(model, eos_token_id)
    if prompt_cache is not None:
        if prompt_cache.model is not model:
            raise ValueError("prompt_cache was built for a different model")
        prompt_cache.check_prefix(prefix)

    lm_head = model.get_output_embeddings()
    n_prefix, n_caption = prefix.shape[0], caption.shape[0]
    with torch.no_grad():
        try:
            start = time.perf_counter()
            hidden, cache = _prefill(model, prefix, caption, prompt_cache)
            # hidden[j] is the state at position n_prefix - 1 + j; it predicts c[j] (j < L)
            # or, for j = L, the token after the whole caption.
            if n_caption:
                logprobs = linear_token_logprobs(hidden[:n_caption], lm_head.weight, caption,
                                                 bias=getattr(lm_head, "bias", None))
                kept = int(divergence_point(logprobs, delta=delta, alpha=alpha, beta=beta))
            else:
                logprobs, kept = None, 0
            dropped = n_caption - kept
            if dropped > 0:
                cache.crop(-dropped)
            cache_length = cache.get_seq_length()
            next_logits = lm_head(hidden[kept][None])[0]
            prefill_s = time.perf_counter() - start

            start = time.perf_counter()
            new_tokens = _decode(model, cache, next_logits, max_new_tokens, stop_ids, do_sample, generator)
            decode_s = time.perf_counter() - start
        finally:
            if prompt_cache is not None:
                prompt_cache.restore()

    new_token_ids = torch.tensor(new_tokens, dtype=torch.long)
    body = new_tokens[:-1] if new_tokens and new_tokens[-1] in stop_ids else new_tokens
    caption_ids = torch.cat((caption[:kept].cpu(), torch.tensor(body, dtype=torch.long)))
    ratio = kept / caption_ids.numel() if caption_ids.numel() else 0.0
    return CaptionUpdate(
        caption_ids=caption_ids,
        new_token_ids=new_token_ids,
        kept=kept,
        reuse_ratio=ratio,
        logprobs=None if logprobs is None else logprobs.float().cpu(),
        cache_length_after_crop=cache_length,
        timings=CaptionTimings(prefill_s, decode_s, len(new_tokens)),
    )


def _prefill(model, prefix: torch.Tensor, caption: torch.Tensor, prompt_cache: Optional[PromptPrefixCache]):
    """Forward [prefix; caption] (after the cached instruction, if any).

    Returns (hidden (L+1, H) at positions P-1 .. P+L-1, cache holding P+L tokens).
    """
    n_prefix = prefix.shape[0]
    if prefix.dtype.is_floating_point:
        caption_part = model.get_input_embeddings()(caption).to(prefix.dtype) if caption.numel() else prefix[:0]
    else:
        caption_part = caption
    sequence = torch.cat((prefix, caption_part))
    done = 0 if prompt_cache is None else prompt_cache.length
    cache = None if prompt_cache is None else prompt_cache.cache
    if done == sequence.shape[0]:
        # Nothing new to run: the instruction is the whole prompt and there is no caption.
        return prompt_cache.last_hidden[None], cache
    out = _forward(_base_model(model), _model_inputs(sequence[done:]), cache)
    states = out.last_hidden_state[0]  # positions done .. P+L-1
    first = n_prefix - 1 - done
    if first < 0:  # the position P-1 lies inside the cached instruction
        states = torch.cat((prompt_cache.last_hidden[None], states))
        first = 0
    return states[first:], _output_cache(out)


def _decode(model, cache, next_logits: torch.Tensor, max_new_tokens: int, stop_ids: set, do_sample: bool,
            generator) -> list:
    tokens = []
    device = next_logits.device
    for step in range(max_new_tokens):
        scores = next_logits.float()
        if do_sample:
            token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))
        else:
            token = int(torch.argmax(scores))
        tokens.append(token)
        if token in stop_ids or step == max_new_tokens - 1:
            break
        out = _forward(model, {"input_ids": torch.tensor([[token]], device=device)}, cache)
        cache = _output_cache(out)
        next_logits = out.logits[0, -1]
    return tokens


def _forward(module, inputs: dict, cache):
    """``module(**inputs)`` with the KV cache on, continuing ``cache`` (None: a new cache)."""
    return module(**inputs, **{_cache_keyword(type(module)): cache}, use_cache=True)


@functools.lru_cache(maxsize=None)
def _cache_keyword(module_type) -> str:
    """The keyword under which ``module_type.forward`` takes the KV cache: ``cache`` or ``past_key_values``."""
    parameters = inspect.signature(module_type.forward).parameters  # follows the deprecation wrapper's __wrapped__
    return "cache" if "cache" in parameters else "past_key_values"


def _output_cache(out):
    """The KV cache a forward returned, from the output field that holds it (``cache`` or ``past_key_values``)."""
    return out.cache if "cache" in {f.name for f in fields(out)} else out.past_key_values


def _base_model(model):
    base = model.get_decoder() if hasattr(model, "get_decoder") else None
    if base is None:
        base = getattr(model, model.base_model_prefix)
    return base


def _model_inputs(sequence: torch.Tensor) -> dict:
    if sequence.dtype.is_floating_point:
        return {"inputs_embeds": sequence[None]}
    return {"input_ids": sequence[None]}


def _prefix_tensor(model, prefix, name: str) -> torch.Tensor:
    if not isinstance(prefix, torch.Tensor):
        prefix = torch.as_tensor(prefix)
    hidden_size = model.get_input_embeddings().weight.shape[1]
    device = model.get_input_embeddings().weight.device
    if prefix.dtype.is_floating_point:
        if prefix.dim() == 3 and prefix.shape[0] == 1:
            prefix = prefix[0]
        if prefix.dim() != 2 or prefix.shape[1] != hidden_size:
            raise ValueError(f"{name} embeddings must have shape (P, {hidden_size}), got {tuple(prefix.shape)}")
        if not bool(torch.isfinite(prefix).all()):
            raise ValueError(f"{name} embeddings must be finite")
    else:
        if prefix.dtype == torch.bool or prefix.dtype.is_complex:
            raise ValueError(f"{name} must be integer token ids or floating embeddings, got {prefix.dtype}")
        if prefix.dim() == 2 and prefix.shape[0] == 1:
            prefix = prefix[0]
        if prefix.dim() != 1:
            raise ValueError(f"{name} token ids must have shape (P,), got {tuple(prefix.shape)}")
        prefix = prefix.long()
        vocab = model.get_input_embeddings().weight.shape[0]
        if prefix.numel() and (int(prefix.min()) < 0 or int(prefix.max()) >= vocab):
            raise ValueError(f"{name} must hold token ids in [0, {vocab})")
    if prefix.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one token")
    return prefix.to(device)


def _caption_tensor(prev_caption, device) -> torch.Tensor:
    if prev_caption is None:
        return torch.zeros(0, dtype=torch.long, device=device)
    caption = torch.as_tensor(prev_caption)
    if caption.dim() == 2 and caption.shape[0] == 1:
        caption = caption[0]
    if caption.dim() != 1 or caption.dtype.is_floating_point or caption.dtype == torch.bool:
        raise ValueError(f"prev_caption must be (L,) integer token ids, got {caption.dtype} {tuple(caption.shape)}")
    return caption.long().to(device)


def _stop_ids(model, eos_token_id) -> set:
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = [eos_token_id] if _is_token_id(eos_token_id) else eos_token_id
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise ValueError(f"eos_token_id must be an int or a sequence of ints in [0, {vocab}), got {eos_token_id!r}")
    ids = list(ids)
    if not all(_is_token_id(t) and 0 <= int(t) < vocab for t in ids):
        raise ValueError(f"eos_token_id must be an int or a sequence of ints in [0, {vocab}), got {eos_token_id!r}")
    return {int(t) for t in ids}


def _is_token_id(value) -> bool:
    """An integer (Python, numpy or a 0-d integer tensor), not a bool."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.dtype.is_floating_point and value.dtype not in (torch.bool,) \
            and not value.dtype.is_complex
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
