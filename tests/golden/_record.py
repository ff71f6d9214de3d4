"""What the golden generators and their tests share: tensors as compressed float32 bytes, and the JSON file
beside them, one per CPU vector width where the recording depends on it.

Convolutions and matrix products sum in an order that follows the CPU's vector width (torch's
``get_cpu_capability()``: AVX2, AVX512, ...), so what AIMET records through them differs between an AVX2 and an
AVX-512 machine by an ulp here and there, and quanta matches AIMET bit for bit on each. A recording made on a
machine other than AVX2 is written as ``<name>.<capability>.json`` beside the AVX2 one ``<name>.json``, and
:func:`golden_path` gives a test the one of its own machine (the AVX2 one when there is none). On an AVX-512
machine, ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` makes torch compute (and
report its capability) as on an AVX2 one: run a generator, or the tests, with them to record or check the AVX2 file.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Sequence

import torch


def pack(t: torch.Tensor) -> str:
    """float32 bytes of ``t``, zlib-compressed, base64-encoded."""
    return base64.b64encode(zlib.compress(t.detach().to(torch.float32).contiguous().numpy().tobytes(), 9)).decode()


def unpack(data: str, shape: Sequence[int] | None = None) -> torch.Tensor:
    """What :func:`pack` wrote, as a float32 tensor: flat, or of ``shape``."""
    flat = torch.frombuffer(bytearray(zlib.decompress(base64.b64decode(data))), dtype=torch.float32)
    return flat if shape is None else flat.reshape(tuple(shape))


HERE = os.path.dirname(os.path.abspath(__file__))
BASE_CAPABILITY = "AVX2"  # the machines the recordings without a suffix were made on


def _for_this_cpu(name: str) -> str:
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == BASE_CAPABILITY:
        return name
    stem, ext = os.path.splitext(name)
    return f"{stem}.{capability.lower()}{ext}"


def golden_path(name: str) -> str:
    """The recording ``name`` made on a CPU of this machine's vector width, if there is one, else ``name``."""
    mine = os.path.join(HERE, _for_this_cpu(name))
    return mine if os.path.isfile(mine) else os.path.join(HERE, name)


def write(name: str, out: dict) -> None:
    """``out`` as ``name`` in this directory (``name`` with this CPU's capability before the extension when it is
    not AVX2), with the versions of aimet-torch and torch and the capability that made it."""
    import aimet_torch

    out = {"aimet_torch": aimet_torch.__version__, "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), **out}
    with open(os.path.join(HERE, _for_this_cpu(name)), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
