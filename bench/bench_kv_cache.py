"""int8 KV cache at long context: cache memory and decode tokens/s, beside transformers' own bfloat16 cache.

The decoder of issue 17 (transformers ``LlamaForCausalLM``: hidden 2048, 32 query / 4 key-value heads of 64,
intermediate 5632, vocabulary 32000, random bfloat16 weights) with ``--layers`` layers (4 by default, so a
long prefill stays short on a small machine; the cache per layer does not depend on the count), its Linears
int8 weight-only (``quantize_``) so the weights do not drown the cache's share of a decode step. For each
context length: a prompt of that many tokens fills the cache, then ``--decode`` greedy tokens are generated
one at a time, with ``DynamicCache`` (bfloat16) and with :class:`quanta.quantization.kv_cache.Int8KVCache`,
rounds interleaved, medians over rounds. Printed: the cache's bytes each way, decode tokens/s each way and
their ratio (int8 / bf16), and the cosine between the two caches' logits at the first decode step (which
reads the whole prompt from the cache; its input token is the same for both). Attention: ``--attn quanta_cpu``
(default) registers quanta's decode attention (:mod:`quanta.quantization.cpu_attention`), which reads the int8
cache's codes directly; ``--attn sdpa`` is transformers' default, which gets the int8 cache dequantized at every
step.

Not a test: nothing asserts on time.

    python bench/bench_kv_cache.py [--layers 4] [--contexts 1024 4096] [--decode 16] [--rounds 3] [--threads 2]
                                   [--attn quanta_cpu|sdpa]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _decode(torch, model, cache, prompt, steps: int):
    """Fill ``cache`` with ``prompt``, then time ``steps`` greedy tokens: (tokens/s, the first decode step's
    logits, which read the whole prompt from the cache). The first decode step's input is the prompt's first
    token, the same for every cache (the prompt's own greedy token can differ between caches on a random model,
    whose top logits are near ties, and logits for different inputs are not comparable)."""
    with torch.inference_mode():
        model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
        tok = prompt[:, :1]
        first = None
        t0 = time.perf_counter()
        for _ in range(steps):
            logits = model(input_ids=tok, cache=cache, use_cache=True).logits
            first = logits[0, -1].float() if first is None else first
            tok = logits[:, -1].argmax(-1, keepdim=True)
        return steps / (time.perf_counter() - t0), first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--decode", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--attn", choices=("quanta_cpu", "sdpa"), default="quanta_cpu")
    args = p.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # see bench_llm.py: spin-waiting on a shared machine

    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from quanta.quantization import Int8WeightOnlyConfig, quantize_
    from quanta.quantization.cpu_attention import register
    from quanta.quantization.kv_cache import Int8KVCache

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=2048, num_hidden_layers=args.layers, num_attention_heads=32,
                         num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                         max_position_embeddings=max(args.contexts) + args.decode + 8, torch_dtype=torch.bfloat16,
                         attn_implementation=register() if args.attn == "quanta_cpu" else "sdpa")
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    quantize_(model, Int8WeightOnlyConfig())
    gen = torch.Generator().manual_seed(1)
    print(f"# Llama: {args.layers} layers, GQA 32/4 heads of 64, int8 weight-only Linears, attention "
          f"{args.attn}; {args.threads} threads, "
          f"{args.decode} decode tokens after each prompt, {args.rounds} rounds interleaved")
    print("| context | bf16 cache (MB) | int8 cache (MB) | int8 / bf16 memory | bf16 decode tok/s | "
          "int8 decode tok/s | int8 / bf16 speed | logits cosine |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.contexts:
        prompt = torch.randint(3, config.vocab_size, (1, n), generator=gen)
        speeds: dict[str, list[float]] = {"bf16": [], "int8": []}
        sizes, logits = {}, {}
        for _ in range(args.rounds):
            for name in ("bf16", "int8"):
                cache = DynamicCache(config=config) if name == "bf16" else Int8KVCache(config)
                speed, logits[name] = _decode(torch, model, cache, prompt, args.decode)
                speeds[name].append(speed)
                if name == "bf16":
                    sizes[name] = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
                else:
                    sizes[name] = cache.nbytes()
                del cache
        bf, i8 = statistics.median(speeds["bf16"]), statistics.median(speeds["int8"])
        cos = float(torch.nn.functional.cosine_similarity(logits["bf16"], logits["int8"], dim=0))
        print(f"| {n} | {sizes['bf16'] / 2**20:.1f} | {sizes['int8'] / 2**20:.1f} | "
              f"{sizes['int8'] / sizes['bf16']:.2f} | {bf:.2f} | {i8:.2f} | {i8 / bf:.2f} | "
              f"{cos:.5f} |", flush=True)


if __name__ == "__main__":
    main()
