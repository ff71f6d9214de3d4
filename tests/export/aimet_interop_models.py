"""The two models of the AIMET interoperability test (``test_aimet_interop.py``), in plain torch: the test
builds them in quanta's venv, ``aimet_interop_worker.py`` in the one with aimet-torch.

* ``InteropCNN``: conv, relu, conv, relu, pool, linear (the model of issue 16).
* ``InteropBlock``: a pre-LN transformer block whose attention is written with functional ops
  (``torch.matmul``, ``softmax``) between ``nn`` modules: AIMET's QuantizationSimModel quantizes the modules
  only, so quanta's sim is built with ``trace=False`` (module outputs only) for the same placement.

``CONFIG`` is a quantsim config file both read (AIMET's format): 8-bit activations and per-channel
symmetric weights, bias off, Conv/Linear + ReLU supergroups, model inputs quantized; with it AIMET 2.42 and
quanta place the same quantizers on both models.
"""

from __future__ import annotations

import math

import torch
from torch import nn

CONFIG = {
    "defaults": {
        "ops": {"is_output_quantized": "True"},
        "params": {"is_quantized": "True", "is_symmetric": "True"},
        "strict_symmetric": "False",
        "unsigned_symmetric": "False",
        "per_channel_quantization": "True",
    },
    "params": {"bias": {"is_quantized": "False"}},
    # the LayerNorms' inputs quantized (AIMET quantizes ln2's: it follows the functional residual add) and their
    # weights not (AIMET quantizes a LayerNorm weight asymmetric below 16 bits)
    "op_type": {"LayerNormalization": {"is_input_quantized": "True", "params": {"weight": {"is_quantized": "False"}}}},
    "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
    "model_input": {"is_input_quantized": "True"},
    "model_output": {},
}


class InteropCNN(nn.Module):
    """``(N, 3, 16, 16)`` images → 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class InteropBlock(nn.Module):
    """Pre-LN encoder block on ``(N, T, 32)``: LayerNorm, qkv Linear, attention, projection, GELU MLP."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).unflatten(-1, (3, self.heads, self.head_dim)).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim), dim=-1)
        x = x + self.proj(torch.matmul(attn, v).transpose(1, 2).flatten(2))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


#: name -> (model class, input shape)
MODELS = {"cnn": (InteropCNN, (4, 3, 16, 16)), "block": (InteropBlock, (4, 6, 32))}


def make(name: str, seed: int = 0) -> tuple[nn.Module, list[torch.Tensor], torch.Tensor]:
    """The model (seeded weights, eval mode), three calibration batches and an evaluation batch."""
    cls, shape = MODELS[name]
    torch.manual_seed(seed)
    model = cls().eval()
    g = torch.Generator().manual_seed(seed + 1)
    calib = [torch.randn(*shape, generator=g) for _ in range(3)]
    return model, calib, 1.2 * torch.randn(*shape, generator=g)
