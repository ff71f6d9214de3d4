"""Record aimet-torch's ``fold_all_batch_norms_to_scale`` for ``test_aimet_fold_to_scale.py``.

Not a test; needs aimet-torch 2.42 (the scratch venv of ``../shared/scripts/anchor_venv.sh``)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_fold_to_scale.py

Writes ``aimet_fold_to_scale.json`` beside itself. Each case is rebuilt by :func:`build` (plain torch, seeded) and
simulated with :data:`CONFIG` (per-channel 8- or 4-bit weights; Conv → BatchNorm kept, the BatchNorm's output
quantized), calibrated on :func:`inputs`; recorded: the sim's output before and after the fold, and each folded
layer's weight, bias and weight range.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from torch import nn

CASES = [("conv_bn_8", 8), ("conv_bn_4", 4)]  # name, weight bitwidth
CONFIG = {"defaults": {"ops": {"is_output_quantized": "True"},
                       "params": {"is_quantized": "True", "is_symmetric": "True"},
                       "per_channel_quantization": "True"},
          "params": {"bias": {"is_quantized": "False"}}, "op_type": {},
          "supergroups": [{"op_list": ["Conv", "BatchNormalization", "Relu"]}],
          "model_input": {"is_input_quantized": "True"}, "model_output": {}}
LAYERS = ("0", "3")  # the convolutions, each followed by a BatchNorm


def batch_norm(channels: int, kind: type[nn.Module] = nn.BatchNorm2d) -> nn.Module:
    """A BatchNorm with statistics and affine parameters drawn from a generator seeded by ``channels``."""
    bn = kind(channels)
    g = torch.Generator().manual_seed(channels)
    with torch.no_grad():  # some weights negative: the range ends swap there
        bn.weight.copy_(torch.randn(channels, generator=g))
        bn.bias.copy_(torch.randn(channels, generator=g))
        bn.running_mean.copy_(torch.randn(channels, generator=g))
        bn.running_var.copy_(torch.rand(channels, generator=g) + 0.5)
    return bn


def build() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), batch_norm(8), nn.ReLU(), nn.Conv2d(8, 6, 3, padding=1), batch_norm(6),
                         nn.ReLU()).eval()


def inputs() -> torch.Tensor:
    return torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(1))


def main() -> None:
    from _record import pack, write  # beside this script (run it as one)
    from aimet_torch.batch_norm_fold import fold_all_batch_norms_to_scale
    from aimet_torch.quantsim import QuantizationSimModel

    out = {"cases": {}}
    x = inputs()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(CONFIG, f)
        for name, bits in CASES:
            sim = QuantizationSimModel(build(), x, config_file=path, default_param_bw=bits)
            sim.compute_encodings(lambda m, _: m(x), None)
            with torch.no_grad():
                before = sim.model(x)
            folded = fold_all_batch_norms_to_scale(sim)
            with torch.no_grad():
                after = sim.model(x)
            layers = [sim.model.get_submodule(n) for n in LAYERS]
            out["cases"][name] = {
                "bits": bits, "folded": len(folded), "before": pack(before), "after": pack(after),
                "weights": [pack(m.weight) for m in layers], "biases": [pack(m.bias) for m in layers],
                "min": [pack(m.param_quantizers["weight"].min) for m in layers],
                "max": [pack(m.param_quantizers["weight"].max) for m in layers]}
    write("aimet_fold_to_scale.json", out)


if __name__ == "__main__":
    main()
