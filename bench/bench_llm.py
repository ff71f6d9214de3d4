"""LLM inference on CPU: decode and prefill tokens/s of a Llama model quantized by quanta, beside its baselines.

The model of issue 17: transformers ``LlamaForCausalLM`` with hidden size 2048,
16 layers, 32 query / 4 key-value heads, intermediate size 5632, vocabulary
32000, random weights, bfloat16 (1.7 GB: far beyond the L3). quanta's
``quantize_`` turns it into int8 weight-only, int4 weight-only (groups of 32 and
128), int8 dynamic activations; then a greedy decode loop with the KV cache
(``DynamicCache``) runs, as a user would write it.

Measured in one run, rounds interleaved across all variants (medians over rounds):

* decode tokens/s: new tokens after a 128-token prompt, one at a time;
* prefill tokens/s at 128 and 512 prompt tokens (only the last position's logits);
* the read-bandwidth roofline of decode: bytes of the weights read per token
  (every Linear, ``lm_head`` included; one embedding row is negligible) divided
  by the bandwidth of summing a large float32 tensor, measured in the same run (before the rounds and after
  each: the median, and the range, since a shared machine's memory bandwidth moves by tens of percent);
* llama.cpp on the same weights (GGUF F16 / Q8_0 / Q4_0 / Q4_1 written with the ``gguf``
  package, run through llama-cpp-python; Q4_1, blocks of 32 weights with a float16 scale and minimum, is
  5 bits a weight like quanta's int4 g32, Q4_0 4.5) when ``--llama-python`` names an
  interpreter that has both (or this one has): it runs in its own process, which
  measures only while this one waits;
* torchao (Int8WeightOnlyConfig, Int4WeightOnlyConfig(int4_packing_format="opaque"),
  Int8DynamicActivationInt8WeightConfig) when it is importable here.

``--attn quanta_cpu`` runs every torch variant (bf16 too) with quanta's decode attention
(:mod:`quanta.quantization.cpu_attention`) instead of transformers' SDPA; ``--attn eager``
with transformers' eager attention. ``--cache static`` gives every torch variant transformers'
preallocated ``StaticCache`` instead of the ``DynamicCache`` that grows by concatenation.

``--compile`` runs every torch variant's decode steps through ``torch.compile`` (inductor, static
shapes) with transformers' ``StaticCache``, as a serving loop would (the prompt, one call of its own
shape, stays eager); the compilation happens in the warm-up, outside the timings, and each compiled
step is checked against the eager one (its logits) before anything is timed. dynamo's guards on the
modules are skipped (``torch.compiler.skip_guard_on_all_nn_modules_unsafe``: the model does not change
while it serves; see ``_compiled_step``), the timed steps run without evaluating guards at all and
inductor's size asserts are left out; ``--module-guards`` keeps all three. Every compiled step gets
:class:`quanta.kernels.linear_fusion.FuseSharedInputLinears` (int4 projections of one input in one call).

Not a test: nothing asserts on time. Threads: 2 for everyone (``--threads``).
OpenMP's wait policy is the environment's (``OMP_WAIT_POLICY``, unset by default: torch's
OpenMP runtime spins briefly after each parallel region, then sleeps); ``--omp-wait-policy
passive`` sets it for this process and the llama.cpp worker alike. On a quiet machine the
default is what a user gets and the fastest: measured here (2 cores, issue 17's model, int4
g128), decode took 31 ms a token with the default and 52 ms with ``passive``, whose threads
sleep at once and must be woken for each of a decode step's ~120 parallel regions (llama.cpp
runs one region per step). On a machine whose cores other jobs also use, spinning makes every
parallel region wait for a descheduled thread (a 2-layer model once decoded 13x slower with 2
threads than with 1 here), and ``passive`` is the better measurement.

    python bench/bench_llm.py [--rounds 3] [--decode-tokens 32] [--llama-python /path/to/python]
                              [--attn sdpa|eager|quanta_cpu] [--cache dynamic|static] [--compile [--module-guards]]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

CONFIG = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=4,
              intermediate_size=5632, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-6,
              rope_theta=10000.0, tie_word_embeddings=False)
PROMPTS = (128, 512)
DECODE_CONTEXT = 128


# ============================================================================ llama.cpp worker (no torch)
def _gguf_write(src: pathlib.Path, dst: pathlib.Path, kind: str) -> None:
    """GGUF ``kind`` (F16, Q8_0, Q4_0, Q4_1) of the float16 .npy tensors in ``src`` (HF names)."""
    import gguf
    import numpy as np

    cfg = CONFIG
    qtype = {"F16": gguf.GGMLQuantizationType.F16, "Q8_0": gguf.GGMLQuantizationType.Q8_0,
             "Q4_0": gguf.GGMLQuantizationType.Q4_0, "Q4_1": gguf.GGMLQuantizationType.Q4_1}[kind]
    ftype = {"F16": gguf.LlamaFileType.MOSTLY_F16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}[kind]
    w = gguf.GGUFWriter(str(dst), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_file_type(ftype)
    n_vocab = cfg["vocab_size"]
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"t{i}".encode() for i in range(3, n_vocab)])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([2, 3, 3] + [1] * (n_vocab - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf, gg in names.items():
        a = np.load(src / f"{hf}.npy")
        if a.ndim == 1:
            w.add_tensor(gg, a.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(gg, a.astype(np.float16))
        else:
            w.add_tensor(gg, gguf.quants.quantize(a.astype(np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _llama_worker(args) -> None:
    """Write the GGUF files, load them, then answer one JSON command a line on stdin (a measurement round)."""
    import numpy as np
    from llama_cpp import Llama

    src, kinds = pathlib.Path(args.weights_dir), args.kinds.split(",")
    models = {}
    for kind in kinds:
        path = src / f"model-{kind}.gguf"
        if not path.exists():
            _gguf_write(src, path, kind)
        models[kind] = Llama(model_path=str(path), n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=args.threads,
                             n_threads_batch=args.threads, verbose=False)
        models[kind].eval([1, 2, 3])  # load and touch
    rng = np.random.default_rng(0)
    print(json.dumps({"ready": kinds, "bytes": {k: (src / f"model-{k}.gguf").stat().st_size for k in kinds}}),
          flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        out = {}
        for kind, llm in models.items():
            res = {}
            for n in cmd["prompts"]:
                llm.reset()
                toks = [int(t) for t in rng.integers(3, CONFIG["vocab_size"], n)]
                t0 = time.perf_counter()
                llm.eval(toks)
                res[f"prefill{n}"] = n / (time.perf_counter() - t0)
            llm.reset()
            llm.eval([int(t) for t in rng.integers(3, CONFIG["vocab_size"], cmd["context"])])
            t0 = time.perf_counter()
            for _ in range(cmd["decode"]):
                tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                llm.eval([tok])
            res["decode"] = cmd["decode"] / (time.perf_counter() - t0)
            out[kind] = res
        print(json.dumps(out), flush=True)


# ============================================================================ main process (torch)
def _bandwidth(torch, threads: int) -> float:
    """Bytes/s of reading a 1 GiB float32 tensor (sum), median of 5."""
    big = torch.empty(256 * 2**20, dtype=torch.float32).uniform_()
    big.sum()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        big.sum()
        ts.append(time.perf_counter() - t0)
    return big.numel() * 4 / statistics.median(ts)


def _weight_bytes(torch, model) -> int:
    """Bytes of every Linear weight (codes, scales, zero points) and norm: what one decode step reads."""
    total = 0
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if w is None or isinstance(mod, torch.nn.Embedding):
            continue
        if hasattr(w, "storage_nbytes"):
            total += int(w.storage_nbytes)
        elif hasattr(w, "__tensor_flatten__"):  # a torchao tensor subclass: its inner tensors
            names, _ = w.__tensor_flatten__()
            for n in names:
                t = getattr(w, n)
                total += _weight_bytes_of(t)
        else:
            total += w.numel() * w.element_size()
    return total


def _weight_bytes_of(t) -> int:
    if hasattr(t, "__tensor_flatten__") and type(t).__name__ != "Tensor" and type(t).__name__ != "Parameter":
        names, _ = t.__tensor_flatten__()
        return sum(_weight_bytes_of(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def _cache_kw(model) -> str:
    """The forward's KV-cache argument: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def _new_cache(model, kind: str, tokens: int):
    """transformers' ``DynamicCache`` (grows by concatenation) or ``StaticCache`` (preallocated for ``tokens``)."""
    from transformers import DynamicCache, StaticCache

    return DynamicCache() if kind == "dynamic" else StaticCache(config=model.config, max_cache_len=tokens)


def _measure(torch, model, prompts, decode_tokens: int, gen, cache_kind: str = "dynamic", step=None,
             cache_tokens: int | None = None, skip_guards: bool = False) -> dict:
    """Prefill and decode tokens/s of ``model``; the decode steps call ``step`` (default: the model itself, else
    its compiled form, under ``_guard_stance(skip_guards)``) on a cache of ``cache_tokens`` (default: the prompt
    plus the decoded tokens)."""
    kw = _cache_kw(model)
    step = model if step is None else step
    res = {}
    with torch.inference_mode():
        for n in prompts:
            ids = torch.randint(3, CONFIG["vocab_size"], (1, n), generator=gen)
            cache = _new_cache(model, cache_kind, n)
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=True, logits_to_keep=1, cache_position=torch.arange(n), **{kw: cache})
            res[f"prefill{n}"] = n / (time.perf_counter() - t0)
        ids = torch.randint(3, CONFIG["vocab_size"], (1, DECODE_CONTEXT), generator=gen)
        cache = _new_cache(model, cache_kind, cache_tokens or DECODE_CONTEXT + decode_tokens)
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, cache_position=torch.arange(DECODE_CONTEXT),
                    **{kw: cache})
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        with _guard_stance(torch, skip_guards):
            t0 = time.perf_counter()
            for i in range(decode_tokens):
                out = step(input_ids=tok, use_cache=True, cache_position=torch.tensor([DECODE_CONTEXT + i]),
                           **{kw: cache})
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
            res["decode"] = decode_tokens / (time.perf_counter() - t0)
    return res


def _check_compiled(torch, name: str, model, step, cache_kind: str, cache_tokens: int, skip_guards: bool) -> None:
    """The compiled decode step gives the eager step's logits (its own variant's graph, not another's), run as the
    timed steps run (``_guard_stance(skip_guards)``)."""
    kw = _cache_kw(model)
    ids = torch.randint(3, CONFIG["vocab_size"], (1, DECODE_CONTEXT), generator=torch.Generator().manual_seed(3))
    logits = []
    with torch.inference_mode():
        for fn in (model, step):
            cache = _new_cache(model, cache_kind, cache_tokens)
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1, cache_position=torch.arange(DECODE_CONTEXT),
                        **{kw: cache})
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            with _guard_stance(torch, skip_guards and fn is step):
                out = fn(input_ids=tok, use_cache=True, cache_position=torch.tensor([DECODE_CONTEXT]), **{kw: cache})
            logits.append(out.logits[:, -1].float())
    # inductor rounds bfloat16 intermediates less often than eager (measured: 2.5 % of the largest logit for bf16);
    # another variant's graph, or a wrong one, is off by the logits' whole size
    err = float((logits[0] - logits[1]).abs().max() / logits[0].abs().max())
    if not err <= 0.1:
        raise SystemExit(f"{name}: the compiled decode step differs from eager (relative error {err:.3g})")


def _compiled_step(torch, model, index: int, module_guards: bool):
    """``torch.compile`` of one decode step of ``model``, as a serving loop would compile it.

    Without ``module_guards``, dynamo does not guard on the modules' attributes and parameters
    (``torch.compiler.skip_guard_on_all_nn_modules_unsafe``): on this model, checking those guards took
    1.6 ms of each ~19 ms int4 step (profiled), since every parameter, quantized storage and config
    attribute the forward reads is guarded. That is safe when the model is not changed after compiling.
    dynamo keeps its compiled graphs per code object and, without the guards that tell models apart, would
    run one model's graph on another model of the same class (seen: a crash); so each model gets a step
    function of its own code object, and ``_check_compiled`` compares every compiled step with eager. The
    same serving assumption leaves out inductor's size asserts (its Python wrapper checks the size and
    stride of every graph input and extern kernel output, about 370 calls a step here) and, in ``_measure``,
    runs the timed steps under ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` (each step
    function has one graph, so no guard is evaluated): together 13.92 -> 13.52 ms an int4 g128 step
    (medians of 11 alternating runs in one process). Every compiled step also gets quanta's
    ``FuseSharedInputLinears`` pass (int4 q/k/v and gate/up in one call each: 13.69 -> 13.29 ms a g128
    step, 15.12 -> 15.05 ms g32, the same way).
    """
    import types

    from quanta.kernels.linear_fusion import FuseSharedInputLinears

    fuse = {"post_grad_custom_post_pass": FuseSharedInputLinears()}
    if module_guards:
        return torch.compile(model, dynamic=False, options=fuse)

    def step(**kw):
        return model(**kw)

    own = types.FunctionType(step.__code__.replace(co_name=f"decode_step_{index}"), step.__globals__,
                             f"decode_step_{index}", None, step.__closure__)
    return torch.compile(own, dynamic=False, fullgraph=True,
                         options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                                  "size_asserts": False, **fuse})


def _guard_stance(torch, skip: bool):
    """Where compiled steps run: without evaluating dynamo's guards when ``skip`` (see ``_compiled_step``)."""
    return torch.compiler.set_stance(skip_guard_eval_unsafe=True) if skip else contextlib.nullcontext()


def _step_kind(args) -> str:
    if not args.compile:
        return "eager"
    if args.module_guards:
        return "decode steps torch.compile-d (module guards kept; shared-input int4 linears fused)"
    return ("decode steps torch.compile-d (module guards skipped, guards not evaluated, no size asserts; "
            "shared-input int4 linears fused)")


def _variants(torch, base):
    """(name, model) for bf16 and every quantized variant that can be built here."""
    from quanta.quantization import (Int4WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig,
                                     Int8WeightOnlyConfig, quantize_)

    out = [("bf16", base)]
    quanta_cfgs = [("quanta int8 weight-only", Int8WeightOnlyConfig()),
                   ("quanta int4 weight-only g128", Int4WeightOnlyConfig(group_size=128)),
                   ("quanta int4 weight-only g32", Int4WeightOnlyConfig(group_size=32)),
                   ("quanta int8 dynamic", Int8DynamicActivationInt8WeightConfig())]
    for name, cfg in quanta_cfgs:
        m = copy.deepcopy(base)
        t0 = time.perf_counter()
        quantize_(m, cfg, strict=True)
        print(f"# {name}: quantize_ took {time.perf_counter() - t0:.1f} s", flush=True)
        out.append((name, m))
    try:
        import torchao
        from torchao.quantization import Int4WeightOnlyConfig as AoInt4
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig as AoDyn
        from torchao.quantization import Int8WeightOnlyConfig as AoInt8
        from torchao.quantization import quantize_ as ao_quantize_
    except Exception as e:  # not installed here: the column stays empty
        print(f"# torchao not importable here ({type(e).__name__}); its rows are skipped", flush=True)
        return out
    ao_cfgs = [("torchao int8 weight-only", lambda: AoInt8()),
               ("torchao int4 weight-only g128", lambda: AoInt4(group_size=128, int4_packing_format="opaque")),
               ("torchao int4 weight-only g32", lambda: AoInt4(group_size=32, int4_packing_format="opaque")),
               ("torchao int8 dynamic", lambda: AoDyn())]
    for name, make in ao_cfgs:
        m = copy.deepcopy(base)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ao_quantize_(m, make())
            _measure(torch, m, (8,), 1, torch.Generator().manual_seed(0))
        except Exception as e:
            print(f"# {name} (torchao {torchao.__version__}) failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        out.append((name, m))
    return out


def _start_llama(args, base, torch):
    """The llama.cpp worker process (weights exported as float16 .npy), or None with the reason printed."""
    py = args.llama_python or sys.executable
    check = subprocess.run([py, "-c", "import gguf, llama_cpp, numpy"], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"# llama.cpp skipped: {py} cannot import gguf and llama_cpp", flush=True)
        return None
    if args.work_dir:
        wdir = pathlib.Path(args.work_dir)
        wdir.mkdir(parents=True, exist_ok=True)
    else:  # ~4.9 GB of .npy and GGUF files: removed when this process ends, whichever way it ends but a kill
        wdir = pathlib.Path(tempfile.mkdtemp(prefix="quanta_llm_"))
        atexit.register(shutil.rmtree, wdir, ignore_errors=True)
    import numpy as np

    for name, t in base.state_dict().items():
        if not (wdir / f"{name}.npy").exists():
            np.save(wdir / f"{name}.npy", t.float().numpy().astype(np.float16))
    proc = subprocess.Popen([py, __file__, "--llama-worker", "--weights-dir", str(wdir),
                             "--kinds", "F16,Q8_0,Q4_0,Q4_1", "--threads", str(args.threads)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = json.loads(proc.stdout.readline())
    print(f"# llama.cpp ready: {ready}", flush=True)
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-python", help="an interpreter with gguf and llama_cpp (default: this one)")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--work-dir", help="where the exported weights and GGUF files go, kept for the next run "
                                       "(default: a temp dir, removed at exit)")
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--weights-dir", help=argparse.SUPPRESS)
    ap.add_argument("--kinds", help=argparse.SUPPRESS)
    ap.add_argument("--omp-wait-policy", default=os.environ.get("OMP_WAIT_POLICY"),
                    help="OMP_WAIT_POLICY for this process and the llama.cpp worker (default: the environment's)")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager", "quanta_cpu"),
                    help="transformers' attention implementation for every torch variant, bf16 included")
    ap.add_argument("--cache", default="dynamic", choices=("dynamic", "static"),
                    help="transformers' KV cache for every torch variant: DynamicCache or StaticCache")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile every torch variant's decode step (implies --cache static)")
    ap.add_argument("--module-guards", action="store_true",
                    help="with --compile: keep dynamo's guards on the modules' attributes and parameters "
                         "(default: skipped, as a serving loop whose model does not change can)")
    args = ap.parse_args()
    if args.llama_worker:
        return _llama_worker(args)
    if args.omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy  # before torch starts its OpenMP runtime
    if args.compile:
        args.cache = "static"  # a growing cache changes shapes at every step

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from quanta.kernels import int_linear_native

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.attn == "quanta_cpu":
        from quanta.quantization.cpu_attention import register

        register()
    base = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation=args.attn)).to(torch.bfloat16).eval()
    llama = None if args.no_llama else _start_llama(args, base, torch)
    variants = _variants(torch, base)
    int_linear_native.ops()
    steps = {name: m for name, m in variants}  # what each decode step calls
    skip_guards = args.compile and not args.module_guards
    if args.compile:
        import torch._dynamo

        # one graph per variant (their weights differ in type and metadata): above the default limit of 8
        torch._dynamo.config.cache_size_limit = torch._dynamo.config.accumulated_cache_size_limit = 64
        for i, (name, m) in enumerate(variants):  # compiled at the one shape the rounds use, untimed
            steps[name] = _compiled_step(torch, m, i, args.module_guards)
            _measure(torch, m, (), 2, torch.Generator().manual_seed(2), args.cache, steps[name],
                     DECODE_CONTEXT + args.decode_tokens)
        for name, m in variants:
            _check_compiled(torch, name, m, steps[name], args.cache, DECODE_CONTEXT + args.decode_tokens,
                            skip_guards)
    bws = [_bandwidth(torch, args.threads)]  # once before the rounds and after each: it moves on a shared machine
    gen = torch.Generator().manual_seed(1)
    for _, m in variants:  # warm-up: first calls build caches
        _measure(torch, m, (16,), 2, gen, args.cache)
    rows: dict[str, list[dict]] = {name: [] for name, _ in variants}
    llama_rows: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, m in order:
            rows[name].append(_measure(torch, m, PROMPTS, args.decode_tokens, gen, args.cache, steps[name],
                                       skip_guards=skip_guards))
        if llama is not None:
            llama.stdin.write(json.dumps({"prompts": list(PROMPTS), "context": DECODE_CONTEXT,
                                          "decode": args.decode_tokens}) + "\n")
            llama.stdin.flush()
            for kind, res in json.loads(llama.stdout.readline()).items():
                llama_rows.setdefault(kind, []).append(res)
        bws.append(_bandwidth(torch, args.threads))
        print(f"# round {r + 1}/{args.rounds} done (read bandwidth {bws[-1] / 1e9:.1f} GB/s)", flush=True)
    if llama is not None:
        llama.stdin.close()
        llama.wait(timeout=60)

    def med(rs, key):
        return statistics.median(x[key] for x in rs)

    bf16_decode = med(rows["bf16"], "decode")
    bw = statistics.median(bws)
    print(f"\ntorch {torch.__version__}, {args.threads} threads, quanta kernels {int_linear_native.status()} "
          f"({int_linear_native.isa()}), attention {args.attn}, {args.cache} cache, "
          f"{_step_kind(args)}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; "
          f"read bandwidth {bw / 1e9:.1f} GB/s (median; {min(bws) / 1e9:.1f}-{max(bws) / 1e9:.1f} around the rounds); "
          f"load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}; medians of {args.rounds} interleaved rounds; decode "
          f"after a {DECODE_CONTEXT}-token prompt, {args.decode_tokens} tokens")
    header = ("| weights | weight MB read / token | decode tok/s | roofline tok/s | decode / roofline | "
              "decode / bf16 | prefill 128 tok/s | prefill 512 tok/s |")
    print(header)
    print("|" + "|".join("---" for _ in header.split("|")[1:-1]) + "|")
    for name, m in variants:
        nbytes = _weight_bytes(torch, m)
        d = med(rows[name], "decode")
        roof = bw / nbytes
        print(f"| {name} | {nbytes / 1e6:.0f} | {d:.1f} | {roof:.1f} | {d / roof:.2f} | {d / bf16_decode:.2f} | "
              f"{med(rows[name], 'prefill128'):.0f} | {med(rows[name], 'prefill512'):.0f} |")
    for kind, rs in llama_rows.items():
        print(f"| llama.cpp {kind} | | {med(rs, 'decode'):.1f} | | | {med(rs, 'decode') / bf16_decode:.2f} | "
              f"{med(rs, 'prefill128'):.0f} | {med(rs, 'prefill512'):.0f} |")


if __name__ == "__main__":
    main()
