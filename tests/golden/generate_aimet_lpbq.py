"""Record aimet-torch's GroupedBlockQuantizeDequantize (LPBQ) for ``test_aimet_lpbq.py``.

Not a test; needs aimet-torch 2.42 (the scratch venv of ``../shared/scripts/anchor_venv.sh``)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_lpbq.py

Writes ``aimet_lpbq.json`` beside itself. Inputs are not stored: each case names a seed, and the test makes the
same tensor with ``torch.manual_seed(seed); torch.randn(shape) * spread`` (the same CPU generator). Outputs are
float32 bit patterns, hex, zlib-compressed and base64-encoded (``_pack``).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import zlib

import torch

CASES = [
    # name, weight shape, block size (of the weight), block grouping (of the scale), bitwidth, decompressed_bw
    ("linear_b16_g_all", (6, 64), (1, 16), (1, -1), 4, 8),
    ("linear_b8_g2", (5, 32), (1, 8), (1, 2), 4, 8),
    ("linear_b32_g_all_8to16", (4, 96), (1, 32), (1, -1), 8, 16),
    ("linear_default_grouping", (3, 48), (1, 16), None, 4, 8),
    ("conv_b4", (4, 8, 3, 3), (1, 4, 3, 3), (1, -1, 1, 1), 4, 8),
    ("same_bitwidths", (3, 32), (1, 8), (1, -1), 4, 4),
    ("two_bit", (4, 64), (1, 16), (1, -1), 2, 6),
]


def _pack(t: torch.Tensor) -> str:
    raw = t.detach().to(torch.float32).contiguous().numpy().tobytes()
    return base64.b64encode(zlib.compress(raw, 9)).decode()


def main(out_path: str | None = None) -> None:
    from aimet_torch.quantization.affine import GroupedBlockQuantizeDequantize

    cases = []
    for seed, (name, shape, block, grouping, bw, dbw) in enumerate(CASES):
        torch.manual_seed(seed)
        w = torch.randn(shape) * torch.logspace(-2, 1, shape[0]).reshape(-1, *[1] * (len(shape) - 1))
        scale_shape = tuple(s // b for s, b in zip(shape, block))
        q = GroupedBlockQuantizeDequantize(scale_shape, bw, True, dbw, block_size=block, block_grouping=grouping)
        with q.compute_encodings():
            q(w)
        x = w.clone().requires_grad_(True)
        out = q(x)
        out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
        cases.append({
            "name": name, "seed": seed, "shape": list(shape), "block_size": list(block),
            "block_grouping": None if grouping is None else list(grouping), "bitwidth": bw,
            "decompressed_bw": dbw,
            "min": _pack(q.min), "max": _pack(q.max),
            "scale": _pack(q.get_scale()), "per_channel_scale": _pack(q.get_per_channel_scale()),
            "output": _pack(out), "grad_input": _pack(x.grad),
            "grad_min": _pack(q.min.grad), "grad_max": _pack(q.max.grad),
        })
    path = out_path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "aimet_lpbq.json")
    with open(path, "w") as f:
        json.dump({"producer": "aimet-torch 2.42.0", "cases": cases}, f, indent=1)
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
