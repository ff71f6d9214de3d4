"""AdaRound wall time: quanta's ``Adaround.apply_adaround`` beside aimet-torch's on the same model and data.

The model is transformers' ``ResNetModel`` (small random config, BatchNorm statistics settled on the data
first), weights 4 bits with min-max ranges, AdaRound on every convolution. Both libraries draw their samples
from torch's generator, seeded the same: their adarounded weights are compared bit for bit before the times
are printed. aimet-torch is optional: without it only quanta's time is printed. Run it where both import,
e.g. in the scratch venv of ``../shared/scripts/anchor_venv.sh``::

    PYTHONPATH=src /tmp/anchors/bin/python bench/bench_adaround.py
    python bench/bench_adaround.py --batches 16 --iterations 200   # quanta only, in quanta's venv

Prints each library's seconds, the ratio, and the output SQNR (weights quantized, activations float) with
round-to-nearest and with AdaRound on held-out images.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import logging
import tempfile
import time
import warnings

import torch
from torch import nn


class Backbone(nn.Module):
    """transformers' ResNetModel returning its pooled features (a tensor, which both libraries trace)."""

    def __init__(self, resnet: nn.Module) -> None:
        super().__init__()
        self.resnet = resnet

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resnet(x).pooler_output.flatten(1)


def _without_stub_torchvision() -> None:
    """aimet-torch's scratch venv holds a stub ``torchvision`` module, which transformers would import its image
    transforms from: tell transformers there is no torchvision there (the ResNet does not use it)."""
    try:
        import torchvision.transforms.functional  # noqa: F401
    except ImportError:
        import transformers.utils
        import transformers.utils.import_utils as import_utils

        import_utils.is_torchvision_available = transformers.utils.is_torchvision_available = lambda: False


def build(batches: int, batch_size: int, size: int) -> tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]]:
    _without_stub_torchvision()
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                          layer_type="basic")
    model = Backbone(ResNetModel(config))
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(batch_size, 3, size, size, generator=g) for _ in range(batches)]
    held_out = [torch.randn(batch_size, 3, size, size, generator=g) for _ in range(2)]
    model.train()
    with torch.no_grad():  # settle the BatchNorm statistics on the data
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.momentum = None
        for x in data:
            model(x)
    return model.eval(), data, held_out


def convs(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}


def sqnr(model: nn.Module, reference: nn.Module, held_out: list[torch.Tensor], bits: int, scales=None) -> float:
    """Output SQNR (dB) of ``model``'s convolutions fake-quantized per tensor with min-max ranges of
    ``bits`` (``scales``: per-layer scales to use instead, the adarounded layers' own)."""
    from quanta.quantization.affine import QuantizeDequantize

    q_model = copy.deepcopy(model)
    with torch.no_grad():
        for name, m in q_model.named_modules():
            if isinstance(m, nn.Conv2d):
                q = QuantizeDequantize((), bits, True)
                if scales is not None and name in scales:
                    q.set_range(*scales[name])
                else:
                    with q.compute_encodings():
                        q(m.weight)
                m.weight.copy_(q(m.weight).as_subclass(torch.Tensor))
        num = den = 0.0
        for x in held_out:
            ref = reference(x)
            num += float(ref.double().pow(2).sum())
            den += float((q_model(x).double() - ref.double()).pow(2).sum())
    return 10 * torch.log10(torch.tensor(num / den)).item()


def run_quanta(model, data, iterations, bits):
    from quanta.adaround import Adaround, AdaroundParameters

    params = AdaroundParameters(data, num_batches=len(data), default_num_iterations=iterations)
    torch.manual_seed(123)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        ada = Adaround.apply_adaround(model, data[0], params, path=tmp, filename_prefix="ada", default_param_bw=bits,
                                      default_quant_scheme="post_training_tf", default_config_file=_CONFIG)
        return ada, time.perf_counter() - t0


def run_aimet(model, data, iterations, bits):
    from aimet_torch.adaround import Adaround, AdaroundParameters
    from aimet_torch.common.defs import QuantScheme

    params = AdaroundParameters(data, num_batches=len(data), default_num_iterations=iterations)
    torch.manual_seed(123)
    with tempfile.TemporaryDirectory() as tmp:
        import json
        import os

        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(_CONFIG, f)
        t0 = time.perf_counter()
        ada = Adaround.apply_adaround(model, data[0], params, path=tmp, filename_prefix="ada", default_param_bw=bits,
                                      default_quant_scheme=QuantScheme.post_training_tf, default_config_file=path)
        return ada, time.perf_counter() - t0


# AIMET's default quantsim config (weights per tensor), given to both so they quantize alike
_CONFIG = {"defaults": {"ops": {"is_output_quantized": "True"},
                        "params": {"is_quantized": "True", "is_symmetric": "True"},
                        "strict_symmetric": "False", "per_channel_quantization": "False"},
           "params": {"bias": {"is_quantized": "False"}}, "op_type": {},
           "supergroups": [{"op_list": ["Conv", "Relu"]}], "model_input": {"is_input_quantized": "True"},
           "model_output": {}}
#: the same with one scale per output channel (the Sequential MSE, QuantAnalyzer and mixed-precision benches)
PER_CHANNEL_CONFIG = {**_CONFIG, "defaults": {**_CONFIG["defaults"], "per_channel_quantization": "True"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=64, help="image side")
    parser.add_argument("--iterations", type=int, default=100, help="AdaRound steps per layer")
    parser.add_argument("--bits", type=int, default=4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.INFO)
    model, data, held_out = build(args.batches, args.batch_size, args.size)
    print(f"ResNet (transformers, 4 stages), {args.batches} batches x {args.batch_size} images "
          f"{args.size}x{args.size}, {args.iterations} iterations per layer, W{args.bits}, 2 threads: "
          f"{torch.get_num_threads()}")
    ada_q, t_q = run_quanta(copy.deepcopy(model), data, args.iterations, args.bits)
    print(f"quanta      {t_q:8.1f} s")
    if importlib.util.find_spec("aimet_torch") is not None:
        ada_a, t_a = run_aimet(copy.deepcopy(model), data, args.iterations, args.bits)
        wq, wa = convs(ada_q), convs(ada_a)
        same = all(torch.equal(wq[k], wa[k]) for k in wq)
        print(f"aimet-torch {t_a:8.1f} s   quanta/aimet = {t_q / t_a:.2f}   same weights: {same}")
    else:
        print("aimet-torch n/a (not importable here)")
    print(f"output SQNR, W{args.bits} weights only, held out: nearest {sqnr(model, model, held_out, args.bits):.2f} dB, "
          f"AdaRound {sqnr(ada_q, model, held_out, args.bits, _scales(model, args.bits)):.2f} dB")


def _scales(model: nn.Module, bits: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The min-max range of every convolution's original weight (the range AdaRound rounded within)."""
    from quanta.quantization.affine import QuantizeDequantize

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            q = QuantizeDequantize((), bits, True)
            with torch.no_grad(), q.compute_encodings():
                q(m.weight)
            out[name] = (q.min.detach().clone(), q.max.detach().clone())
    return out


if __name__ == "__main__":
    main()
