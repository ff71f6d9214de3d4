"""Record aimet-torch's cross-layer equalization (``equalize_model``) for ``test_aimet_cle.py``.

Not a test; needs aimet-torch 2.42 (the scratch venv of ``../shared/scripts/anchor_venv.sh``)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_cle.py

Writes ``aimet_cle.json`` beside itself. Inputs are not stored: each case names a seed and the model is rebuilt by
:func:`build` (plain torch, the same CPU generator in both venvs). For every convolution, in model order, the
equalized weight and bias are stored as float32 bytes, zlib-compressed and base64-encoded (``_record.pack``).
"""

from __future__ import annotations

import torch
from torch import nn

CASES = [
    # name, seed, input shape, activation
    ("mobilenet_style_0", 0, (1, 3, 16, 16), "ReLU"),
    ("mobilenet_style_1", 1, (1, 3, 16, 16), "ReLU"),
    ("mobilenet_style_2", 2, (1, 3, 16, 16), "ReLU"),
    ("mobilenet_style_relu6", 0, (1, 3, 16, 16), "ReLU6"),  # aimet-torch >= 2.4: BN fold only, nothing scaled
]


def build(seed: int, activation: str = "ReLU") -> nn.Sequential:
    """Depthwise-separable blocks with BN + ``activation``, BN parameters and statistics spread as in trained
    networks (MobileNet's shape)."""
    act = getattr(nn, activation)
    torch.manual_seed(seed)
    layers = [nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), act()]
    for _ in range(3):
        layers += [nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), act(),
                   nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16), act()]
    model = nn.Sequential(*layers, nn.Conv2d(16, 8, 1))
    g = torch.Generator().manual_seed(seed + 1)
    for m in model:
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.copy_(torch.exp(torch.randn(16, generator=g) * 1.5) * 0.5)
                m.bias.copy_(torch.randn(16, generator=g) * 0.5 + 0.5)
                m.running_var.copy_(torch.exp(torch.randn(16, generator=g) * 1.5))
                m.running_mean.copy_(torch.randn(16, generator=g) * 0.1)
    return model.eval()


def convs(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Conv2d)]




def main() -> None:
    from _record import pack, write  # beside this script (run it as one)
    from aimet_torch.cross_layer_equalization import equalize_model

    out = {"cases": {}}
    for name, seed, shape, activation in CASES:
        model = build(seed, activation)
        equalize_model(model, input_shapes=shape, dummy_input=torch.randn(shape))
        out["cases"][name] = {"seed": seed, "input_shape": list(shape), "activation": activation,
                              "weights": [pack(c.weight) for c in convs(model)],
                              "biases": [pack(c.bias) for c in convs(model)]}
    write("aimet_cle.json", out)


if __name__ == "__main__":
    main()
