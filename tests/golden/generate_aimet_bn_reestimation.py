"""Record aimet-torch's ``reestimate_bn_stats`` for ``test_aimet_bn_reestimation.py``.

Not a test; needs aimet-torch 2.42 (the scratch venv of ``../shared/scripts/anchor_venv.sh``)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_bn_reestimation.py

Writes ``aimet_bn_reestimation.json`` beside itself: for each case, every BatchNorm's re-estimated running mean
and variance as float32 bytes (zlib, base64). The model and batches are rebuilt by :func:`build` (plain torch,
the same seeds in both venvs).
"""

from __future__ import annotations

import torch
from torch import nn

CASES = [("conv_bn_dropout", 0, 5), ("conv_bn_dropout_more_batches_than_asked", 1, 3)]


def build(seed: int) -> tuple[nn.Module, list[torch.Tensor]]:
    """A model with BatchNorms (2-D and 1-D) and a dropout (which must stay off), and its batches."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5),
                          nn.Conv2d(8, 6, 3, groups=2), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(),
                          nn.Linear(6 * 6 * 6, 5), nn.BatchNorm1d(5))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    g = torch.Generator().manual_seed(seed + 100)
    batches = [torch.randn(6, 3, 10, 10, generator=g) * 1.5 + 0.3 for _ in range(8)]
    return model.eval(), batches


def batch_norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d))]




def main() -> None:
    from _record import pack, write  # beside this script (run it as one)
    from aimet_torch.bn_reestimation import reestimate_bn_stats

    out = {"cases": {}}
    for name, seed, num_batches in CASES:
        model, batches = build(seed)
        reestimate_bn_stats(model, batches, num_batches=num_batches)
        out["cases"][name] = {"seed": seed, "num_batches": num_batches,
                              "running_mean": [pack(bn.running_mean) for bn in batch_norms(model)],
                              "running_var": [pack(bn.running_var) for bn in batch_norms(model)]}
    write("aimet_bn_reestimation.json", out)


if __name__ == "__main__":
    main()
