"""LanguageModelCaptioner: the Captioner protocol over update_caption, with tiny
random Llama models built offline (a byte-level tokenizer stands in for a real one)."""
import pytest
import torch

from streammem import HashingTextEncoder, MemoryConfig, PixelEncoder, Preset, StreamPipeline, SyntheticVideo
from streammem.models.captioners import LanguageModelCaptioner
from streammem.models.caption_reuse import update_caption
from streammem.components.memory import Captioner, FrameRecord

transformers = pytest.importorskip("transformers")

OFFSET = 3  # ids 0..2 are special (bos, eos, pad)


def encode(text):
    return [b + OFFSET for b in text.encode("utf-8")]


def decode(ids):
    return bytes(max(0, i - OFFSET) % 256 for i in ids if i >= OFFSET).decode("utf-8", errors="replace")


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=OFFSET + 256, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=1024, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return transformers.LlamaForCausalLM(config).eval()


def _frames(labels, t0=0.0):
    return [FrameRecord(i, t0 + 0.1 * i, torch.zeros(4), (lab,)) for i, lab in enumerate(labels)]


def test_protocol_and_first_caption_equals_plain_generation():
    model = tiny_llama()
    cap = LanguageModelCaptioner(model, encode, decode, max_new_tokens=12)
    assert isinstance(cap, Captioner)
    text = cap.caption_frames(_frames(["taxicab", "taxicab", "minivan"]))
    assert isinstance(text, str)
    first = cap.updates[0]
    assert first.kept == 0 and first.logprobs is None and first.timings.tokens_decoded >= 1
    # Same as calling update_caption on the full prompt without any cache.
    prefix = torch.tensor(cap.instruction_ids + encode(
        "From 0.0 s to 0.2 s the camera shows taxicab, minivan.\nCaption:"))
    direct = update_caption(model, prefix, None, max_new_tokens=12)
    assert torch.equal(direct.caption_ids, first.caption_ids)


def test_previous_caption_is_reused_token_exactly():
    model = tiny_llama(1)
    # beta huge: no position counts as a divergence, so the whole previous caption is kept.
    cap = LanguageModelCaptioner(model, encode, decode, max_new_tokens=8, beta=1e9)
    a = cap.caption_frames(_frames(["tram"] * 3))
    b = cap.caption_frames(_frames(["tram", "ambulance"], t0=1.0), previous=a)
    first, second = cap.updates
    assert second.logprobs is not None and second.kept == first.caption_ids.numel()
    assert torch.equal(second.caption_ids[: second.kept], first.caption_ids)
    assert second.reuse_ratio > 0 and b.startswith(a[: len(a) // 2])
    summary = cap.reuse_summary()
    assert summary["captions"] == 2 and summary["with_previous"] == 1 and summary["tokens_kept"] == second.kept


def test_no_reuse_baseline_and_divergence_forced_at_start():
    model = tiny_llama(2)
    base = LanguageModelCaptioner(model, encode, decode, max_new_tokens=8, reuse=False)
    a = base.caption_frames(_frames(["tram"] * 3))
    base.caption_frames(_frames(["bus"] * 3), previous=a)
    assert all(u.kept == 0 and u.logprobs is None for u in base.updates)
    parent = base.summarize([type("N", (), {"caption": a, "t_start": 0.0, "t_end": 0.2})()])
    assert isinstance(parent, str) and len(base.updates) == 3


def test_pipeline_with_language_model_event_captions():
    model = tiny_llama(3)
    cap = LanguageModelCaptioner(model, encode, decode, max_new_tokens=6, beta=1e9)
    video = SyntheticVideo(["red", "green", "blue"], 30, size=(16, 16))
    pipe = StreamPipeline(video, PixelEncoder(), HashingTextEncoder(),
                          config=MemoryConfig(preset=Preset("t", 0.0, 10, 3, 3), motion_size=None), event_captioner=cap)
    pipe.run()
    entries = pipe.knowledge_base.entries
    assert len(entries) == 3 and all(isinstance(e.caption, str) for e in entries)
    s = cap.reuse_summary()
    assert s["captions"] == 3 and s["with_previous"] == 2 and s["tokens_kept"] > 0
