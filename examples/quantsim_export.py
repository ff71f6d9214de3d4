"""Whole-model quantization simulation and export, end to end (runs in a few seconds on CPU).

A small attention block written with functional ops goes through QuantizationSimModel:
calibrate, compare with float layer by layer, a few steps of QAT, then export ONNX with
QuantizeLinear/DequantizeLinear plus an AIMET 1.0.0 encodings file.

    python examples/quantsim_export.py [OUT_DIR]
"""

from __future__ import annotations

import math
import sys
import tempfile
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from quanta.quantsim import QuantizationSimModel


class Attention(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        return x + self.out(attn @ v)


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    model = Attention().eval()
    batches = [torch.randn(4, 16, 32) for _ in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the division by sqrt(d) stays in float: said in a warning
        sim = QuantizationSimModel(model, batches[0], quant_scheme="range_learning_min_max")
    sim.compute_encodings(batches, progress=False)
    print(sim.layer_sqnr(batches[:2]))

    target = lambda x: model(x).detach()  # noqa: E731  (distil the float model into the quantized one)
    opt = torch.optim.Adam(sim.model.parameters(), lr=1e-4)
    sim.model.train()
    for x in batches:
        loss = F.mse_loss(sim.model(x), target(x))
        opt.zero_grad()
        loss.backward()
        opt.step()
    sim.model.eval()
    print(f"QAT loss after {len(batches)} steps: {loss.item():.2e}")

    names = sim.export(out_dir, "attention", batches[0], encoding_version="1.0.0")
    print(f"wrote {out_dir}/attention.onnx and attention.encodings ({len(names)} quantized tensors)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
