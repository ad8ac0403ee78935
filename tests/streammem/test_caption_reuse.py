"""update_caption: token-exact equality with model.generate on [prefix; c[0..o-1]].

Tiny LlamaForCausalLM models are built offline from a config with random
weights (a wide initializer so next-token distributions are peaked and greedy
choices are not decided by rounding).
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from streammem.models.caption_reuse import PromptPrefixCache, update_caption  # noqa: E402
from streammem_kernels.logprobs import divergence_point_reference  # noqa: E402

# A deprecated transformers keyword in our own calls (the KV cache's old name) fails here, not in a
# later transformers release.
pytestmark = pytest.mark.filterwarnings("error::FutureWarning", "error::DeprecationWarning:streammem")

EOS = 3
SIZES = [  # (seed, vocab, hidden, layers, heads, kv_heads)
    (0, 97, 32, 2, 4, 2),
    (1, 131, 48, 3, 6, 3),
    (2, 64, 16, 1, 2, 1),
]


def tiny_llama(seed, vocab, hidden, layers, heads, kv_heads):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=512, initializer_range=0.2, bos_token_id=1, eos_token_id=EOS,
                         pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def generate_new(model, input_ids=None, inputs_embeds=None, max_new_tokens=12, eos=EOS):
    """Tokens model.generate appends (greedy)."""
    with torch.no_grad():
        if inputs_embeds is not None:
            out = model.generate(inputs_embeds=inputs_embeds[None], max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=eos, pad_token_id=0)
            return out[0].tolist()  # with inputs_embeds, generate returns only the new tokens
        out = model.generate(input_ids[None], max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                             pad_token_id=0)
    return out[0, input_ids.shape[0]:].tolist()


def full_forward_logprobs(model, prefix, caption):
    with torch.no_grad():
        logits = model(torch.cat((prefix, caption))[None]).logits[0].float()
    n = prefix.shape[0]
    return torch.log_softmax(logits[n - 1:n - 1 + caption.shape[0]], -1).gather(1, caption[:, None])[:, 0]


def natural_caption(model, prefix, length, seed, corrupt_at=None):
    """A greedy continuation (no EOS) with, optionally, one unlikely token planted."""
    with torch.no_grad():
        logits_bias = torch.zeros(model.config.vocab_size)
        logits_bias[EOS] = -1e9
        ids = prefix.clone()
        for _ in range(length):
            nxt = int(torch.argmax(model(ids[None]).logits[0, -1] + logits_bias))
            ids = torch.cat((ids, torch.tensor([nxt])))
    caption = ids[prefix.shape[0]:].clone()
    if corrupt_at is not None:
        probs = torch.softmax(model(ids[None]).logits[0, prefix.shape[0] + corrupt_at - 1], -1)
        probs[EOS] = 1.0
        caption[corrupt_at] = int(torch.argmin(probs))
    return caption


def check_against_generate(model, prefix, caption, result, max_new_tokens):
    o = result.kept
    assert result.cache_length_after_crop == prefix.shape[0] + o
    expected = generate_new(model, torch.cat((prefix, caption[:o])), max_new_tokens=max_new_tokens)
    assert result.new_token_ids.tolist() == expected
    body = expected[:-1] if expected and expected[-1] == EOS else expected
    assert result.caption_ids.tolist() == caption[:o].tolist() + body
    assert result.timings.tokens_decoded == len(expected)
    if result.caption_ids.numel():
        assert result.reuse_ratio == pytest.approx(o / result.caption_ids.numel())


@pytest.mark.parametrize("size", SIZES, ids=[f"seed{s[0]}-V{s[1]}-H{s[2]}" for s in SIZES])
def test_reuse_matches_generate_for_o_zero_middle_and_full(size):
    model = tiny_llama(*size)
    g = torch.Generator().manual_seed(size[0])
    prefix = torch.randint(4, size[1], (7 + size[0],), generator=g)
    caption = natural_caption(model, prefix, 24, size[0], corrupt_at=13)
    budget = 10
    ref_lp = full_forward_logprobs(model, prefix, caption)

    # o = 0: the first event (no previous caption) and an empty caption.
    for prev in (None, caption[:0]):
        first = update_caption(model, prefix, prev, max_new_tokens=budget)
        assert first.kept == 0 and first.logprobs is None and first.reuse_ratio == 0.0
        check_against_generate(model, prefix, caption[:0], first, budget)

    # o = L: thresholds no drop can pass.
    full = update_caption(model, prefix, caption, max_new_tokens=budget, alpha=0.999, beta=1e6)
    assert full.kept == caption.shape[0]
    check_against_generate(model, prefix, caption, full, budget)
    torch.testing.assert_close(full.logprobs, ref_lp, atol=1e-4, rtol=1e-4)

    # o in the middle: the planted unlikely token is the divergence point.
    mid = update_caption(model, prefix, caption, max_new_tokens=budget, delta=4, alpha=0.5, beta=0.5)
    assert mid.kept == int(divergence_point_reference(ref_lp[None].double(), 4, 0.5, 0.5)[0])
    assert 0 < mid.kept < caption.shape[0]
    check_against_generate(model, prefix, caption, mid, budget)

    # o at the first eligible position: near-zero thresholds and delta = 1.
    early = update_caption(model, prefix, caption, max_new_tokens=budget, delta=1, alpha=1e-6, beta=1e-9)
    assert early.kept == int(divergence_point_reference(ref_lp[None].double(), 1, 1e-6, 1e-9)[0])
    check_against_generate(model, prefix, caption, early, budget)


def test_prompt_prefix_cache_gives_identical_outputs_over_events():
    model = tiny_llama(*SIZES[0])
    g = torch.Generator().manual_seed(11)
    instruction = torch.randint(4, 97, (6,), generator=g)
    cache = PromptPrefixCache(model, instruction)
    prev_plain = prev_cached = None
    for event in range(4):
        visual = torch.randint(4, 97, (3 + event,), generator=g)
        prefix = torch.cat((instruction, visual))
        kwargs = dict(max_new_tokens=16, delta=3, alpha=0.3, beta=0.3)
        plain = update_caption(model, prefix, prev_plain, **kwargs)
        cached = update_caption(model, prefix, prev_cached, prompt_cache=cache, **kwargs)
        assert cached.kept == plain.kept
        assert cached.new_token_ids.tolist() == plain.new_token_ids.tolist()
        assert cached.caption_ids.tolist() == plain.caption_ids.tolist()
        if plain.logprobs is not None:
            torch.testing.assert_close(cached.logprobs, plain.logprobs, atol=1e-5, rtol=1e-5)
        assert cached.cache_length_after_crop == prefix.shape[0] + cached.kept
        assert cache.cache.get_seq_length() == instruction.shape[0]  # cropped back after the event
        prev_plain, prev_cached = plain.caption_ids, cached.caption_ids
    # The instruction may be the whole prefix (no event-specific tokens).
    whole = update_caption(model, instruction, prev_plain, prompt_cache=cache, max_new_tokens=8)
    assert whole.new_token_ids.tolist() == update_caption(model, instruction, prev_plain,
                                                          max_new_tokens=8).new_token_ids.tolist()
    first = update_caption(model, instruction, None, prompt_cache=cache, max_new_tokens=8)
    assert first.new_token_ids.tolist() == generate_new(model, instruction, max_new_tokens=8)


def test_inputs_embeds_prefix_matches_generate():
    model = tiny_llama(*SIZES[1])
    g = torch.Generator().manual_seed(4)
    visual = torch.randn(5, 48, generator=g) * 0.2  # stand-in visual tokens
    text = model.get_input_embeddings()(torch.randint(4, 131, (4,), generator=g)).detach()
    prefix = torch.cat((visual, text))
    caption = torch.randint(4, 131, (15,), generator=g)
    result = update_caption(model, prefix, caption, max_new_tokens=9, delta=3, alpha=0.3, beta=0.3)
    kept_embeds = model.get_input_embeddings()(caption[:result.kept]).detach()
    expected = generate_new(model, inputs_embeds=torch.cat((prefix, kept_embeds)), max_new_tokens=9)
    assert result.new_token_ids.tolist() == expected
    assert result.cache_length_after_crop == prefix.shape[0] + result.kept
    cache = PromptPrefixCache(model, visual)
    cached = update_caption(model, prefix, caption, max_new_tokens=9, delta=3, alpha=0.3, beta=0.3,
                            prompt_cache=cache)
    assert cached.new_token_ids.tolist() == expected


def test_stops_on_eos_and_strips_it_from_the_caption():
    model = tiny_llama(*SIZES[2])
    prefix = torch.tensor([5, 9, 17, 33])
    greedy = generate_new(model, prefix, max_new_tokens=6, eos=None)
    stop = greedy[2]
    result = update_caption(model, prefix, None, max_new_tokens=6, eos_token_id=stop)
    assert result.new_token_ids.tolist() == greedy[:greedy.index(stop) + 1]
    assert stop not in result.caption_ids.tolist()


def test_sampling_is_reproducible_with_a_generator():
    model = tiny_llama(*SIZES[0])
    prefix = torch.tensor([5, 9, 17, 33, 40])
    caption = torch.tensor([7, 8, 9, 10])
    runs = [update_caption(model, prefix, caption, do_sample=True, generator=torch.Generator().manual_seed(7),
                           max_new_tokens=12).new_token_ids.tolist() for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) >= 1
    assert all(0 <= t < 97 for t in runs[0])


def test_validation():
    model = tiny_llama(*SIZES[2])
    prefix = torch.tensor([5, 9, 17])
    with pytest.raises(ValueError, match="max_new_tokens"):
        update_caption(model, prefix, None, max_new_tokens=0)
    with pytest.raises(ValueError, match="prefix token ids must have shape"):
        update_caption(model, torch.zeros(2, 2, dtype=torch.long), None)
    with pytest.raises(ValueError, match="prefix must hold at least one token"):
        update_caption(model, torch.zeros(0, dtype=torch.long), None)
    with pytest.raises(ValueError, match="prev_caption must hold token ids"):
        update_caption(model, prefix, torch.tensor([1, 64]))
    with pytest.raises(ValueError, match="prefix embeddings must have shape"):
        update_caption(model, torch.zeros(3, 5), None)
    cache = PromptPrefixCache(model, torch.tensor([5, 9]))
    with pytest.raises(ValueError, match="must start with the prompt cache"):
        update_caption(model, torch.tensor([5, 8, 1]), None, prompt_cache=cache)
    with pytest.raises(ValueError, match="alpha"):
        update_caption(model, prefix, torch.arange(4, 30), alpha=1.5)
    with pytest.raises(ValueError, match="alpha"):
        update_caption(model, prefix, torch.arange(4, 30), alpha=float("nan"))
    # Bool token ids and an eos_token_id string used to be accepted.
    with pytest.raises(ValueError, match="prefix must be integer token ids or floating embeddings"):
        update_caption(model, torch.tensor([True, False, True]), None)
    for bad in ("3", True, 3.0, [1, "2"], [64], -1):
        with pytest.raises(ValueError, match="eos_token_id must be an int or a sequence of ints"):
            update_caption(model, prefix, None, eos_token_id=bad)
    assert cache.cache.get_seq_length() == 2
