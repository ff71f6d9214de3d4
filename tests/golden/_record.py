"""What the golden generators share: tensors as compressed float32 bytes, and the JSON file beside them."""

from __future__ import annotations

import base64
import json
import os
import zlib

import torch


def pack(t: torch.Tensor) -> str:
    """float32 bytes of ``t``, zlib-compressed, base64-encoded."""
    return base64.b64encode(zlib.compress(t.detach().to(torch.float32).contiguous().numpy().tobytes(), 9)).decode()


def write(name: str, out: dict) -> None:
    """``out`` as ``name`` in this directory, with the versions of aimet-torch and torch that made it."""
    import aimet_torch

    out = {"aimet_torch": aimet_torch.__version__, "torch": torch.__version__, **out}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
