"""Record a wide sweep of torchao 0.18's quantization primitives for ``test_torchao_sweep.py``.

Not a test, and nothing happens on import. Run it beside torchao in a scratch venv::

    /tmp/anchors/bin/python tests/golden/generate_torchao_sweep.py

It writes ``torchao_sweep.json`` next to itself (or to the path given as the first
argument). Inputs are rebuilt from seeds by :mod:`anchor_sweep` (a digest of each
is kept); outputs are stored with :func:`anchor_sweep.pack`. An operation that
raised is recorded as ``{"error": "<Type>: <message>"}``.

* ``affine``: ``choose_qparams_affine`` / ``quantize_affine`` / ``dequantize_affine`` /
  ``_fake_quantize_affine`` for bitwidths 1-16 x signed/unsigned targets x the three
  mapping types x per tensor/row/group; then the same qparams on an input with
  ``+-inf``, ``+-0`` and subnormals (``quantize_affine``) and NaN too (fake quantize).
* ``float8``: ``_choose_scale_float8`` / ``_quantize_affine_float8`` /
  ``_dequantize_affine_float8`` for e4m3fn, e5m2, e4m3fnuz, e5m2fnuz per tensor/row/
  block over the whole dynamic range (float8 subnormals and beyond the largest
  value), plus the special values with a given scale.
* ``fpx``: ``_f32_to_floatx_unpacked`` for every ``(e, m)`` torchao takes
  (``1 + e + m <= 8``) over the whole range, ``_floatx_unpacked_to_f32`` over every
  code, and the per-row ``_choose_qparams_affine_floatx`` / ``_quantize_affine_floatx``
  / ``_dequantize_affine_floatx``.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from anchor_sweep import (  # noqa: E402
    SPECIALS,
    calibration_batches,
    degenerate_input,
    digest,
    float8_input,
    fpx_input,
    pack,
    write_recording,
)

SHAPE = (4, 32)
GROUP = 8
GRANULARITY = {"tensor": SHAPE, "row": (1, SHAPE[1]), "group": (1, GROUP)}


def target(bitwidth: int, signed: bool) -> tuple[str, int, int]:
    """torchao's target dtype name and ``(quant_min, quant_max)`` for a grid."""
    qmin, qmax = (-(2 ** (bitwidth - 1)), 2 ** (bitwidth - 1) - 1) if signed else (0, 2**bitwidth - 1)
    if bitwidth < 8:  # torch.int1-7 cannot be written to (copy_), torchao.TorchAODType is refused by its ops
        name = "int8" if signed else f"uint{bitwidth}"
    elif bitwidth == 8:
        name = "int8" if signed else "uint8"
    else:
        name = "int16" if signed else "int32"
    return name, qmin, qmax


def main(out_path: str | None = None) -> None:  # noqa: C901 - a flat list of cases
    import torch

    import torchao
    from torchao.quantization import quant_primitives as qp

    warnings.filterwarnings("ignore")
    MT = qp.MappingType

    def err(e: Exception) -> str:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    def codes(t):
        return pack(t.to(torch.int32)) if not t.is_floating_point() else pack(t)

    def expand(t, like):
        """A per-block qparam repeated over its block (torchao's block layout: one entry per block)."""
        reps = [a // b for a, b in zip(like.shape, t.shape)] if t.dim() == like.dim() else None
        if reps is None:
            t = t.reshape([like.shape[0] if t.numel() % like.shape[0] == 0 and t.numel() > 1 else 1, -1])
            reps = [a // b for a, b in zip(like.shape, t.shape)]
        for d, r in enumerate(reps):
            t = t.repeat_interleave(r, dim=d)
        return t

    def formula(q, scale, zp):
        """``float32(q - zp) * scale``, torchao's dequantize."""
        return (q.to(torch.int32) - expand(zp.to(torch.int32), q)).to(torch.float32) * expand(scale, q)

    def same(a, b):
        a, b = a.detach(), b.detach()
        return a.shape == b.shape and a.dtype == b.dtype and bool(
            ((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())

    # ------------------------------------------------------------------ integer affine
    affine = []
    seed = 30000
    for bw in range(1, 17):
        for signed in (False, True):
            dname, qmin, qmax = target(bw, signed)
            dt = getattr(torch, dname)
            for mapping in ("ASYMMETRIC", "SYMMETRIC", "SYMMETRIC_NO_CLIPPING_ERR"):
                for gran, block in GRANULARITY.items():
                    seed += 1
                    x = calibration_batches(seed, SHAPE, 1)[0]
                    special = x.clone()
                    special[0, : len(SPECIALS)] = torch.tensor(SPECIALS)
                    case = {"id": f"b{bw}_{'s' if signed else 'u'}_{mapping.lower()}_{gran}", "seed": seed,
                            "bitwidth": bw, "signed": signed, "dtype": dname, "qmin": qmin, "qmax": qmax,
                            "mapping": mapping, "gran": gran, "block_size": list(block), "input": digest(x)}
                    try:
                        scale, zp = qp.choose_qparams_affine(x, getattr(MT, mapping), block, dt, qmin, qmax)
                        case["scale"], case["zero_point"] = pack(scale), pack(zp.to(torch.int32))
                        q = qp.quantize_affine(x, block, scale, zp, dt, qmin, qmax)
                        case["q"] = codes(q)
                        dq = qp.dequantize_affine(q, block, scale, zp, dt, qmin, qmax)
                        case["dq"] = "formula" if same(dq, formula(q, scale, zp)) else pack(dq)
                        fq = qp._fake_quantize_affine(x, block, scale, zp, dt, qmin, qmax)
                        case["fq"] = "dq" if same(fq, dq) else pack(fq)
                        no_nan = special.clone()
                        no_nan[0, 0] = 0.5
                        # the special values sit in row 0, columns 0-8: only those are stored
                        n = len(SPECIALS)
                        case["q_special"] = codes(qp.quantize_affine(no_nan, block, scale, zp, dt, qmin,
                                                                     qmax)[0, :n])
                        case["fq_special"] = pack(qp._fake_quantize_affine(special, block, scale, zp, dt, qmin,
                                                                           qmax)[0, :n])
                    except Exception as e:  # noqa: BLE001 - record torchao's error
                        case["error"] = err(e)
                    affine.append(case)

    # ------------------------------------------------------------------ degenerate blocks, running min/max
    degenerate = []
    seed = 35000
    for bw, signed in ((4, True), (8, False), (8, True), (16, True)):
        dname, qmin, qmax = target(bw, signed)
        dt = getattr(torch, dname)
        for mapping in ("ASYMMETRIC", "SYMMETRIC"):
            for gran, block in GRANULARITY.items():
                seed += 1
                x = degenerate_input(seed, SHAPE, GROUP)
                case = {"id": f"b{bw}_{'s' if signed else 'u'}_{mapping.lower()}_{gran}", "seed": seed,
                        "bitwidth": bw, "dtype": dname, "qmin": qmin, "qmax": qmax, "mapping": mapping,
                        "gran": gran, "block_size": list(block), "input": digest(x)}
                for key, kw in (("default_eps", {}), ("eps", {"eps": torch.finfo(torch.float32).eps})):
                    scale, zp = qp.choose_qparams_affine(x, getattr(MT, mapping), block, dt, qmin, qmax, **kw)
                    case[key] = {"scale": pack(scale), "zero_point": pack(zp.to(torch.int32)),
                                 "q": codes(qp.quantize_affine(x, block, scale, zp, dt, qmin, qmax))}
                # running min/max over three batches, then choose_qparams_affine_with_min_max
                batches = calibration_batches(seed, SHAPE, 3)
                case["batches"] = [digest(b) for b in batches]
                view = (lambda t: t.reshape(1, -1)) if gran == "tensor" else (
                    (lambda t: t) if gran == "row" else (lambda t: t.reshape(-1, GROUP)))
                mn = torch.stack([view(b).amin(1) for b in batches]).amin(0)
                mx = torch.stack([view(b).amax(1) for b in batches]).amax(0)
                scale, zp = qp.choose_qparams_affine_with_min_max(mn, mx, getattr(MT, mapping), block, dt, qmin,
                                                                  qmax, eps=torch.finfo(torch.float32).eps,
                                                                  zero_point_dtype=torch.int32)
                case["min_max"] = {"scale": pack(scale), "zero_point": pack(zp.to(torch.int32))}
                degenerate.append(case)

    # ------------------------------------------------------------------ float8
    float8 = []
    f8 = {"float8_e4m3fn": (torch.float8_e4m3fn, 4, 3), "float8_e5m2": (torch.float8_e5m2, 5, 2),
          "float8_e4m3fnuz": (torch.float8_e4m3fnuz, 4, 3), "float8_e5m2fnuz": (torch.float8_e5m2fnuz, 5, 2)}
    seed = 40000
    for name, (fdt, e, m) in f8.items():
        for gran, block in GRANULARITY.items():
            seed += 1
            x = float8_input(seed, SHAPE, e, m)
            case = {"id": f"{name}_{gran}", "seed": seed, "dtype": name, "gran": gran, "block_size": list(block),
                    "input": digest(x)}
            try:
                scale = qp._choose_scale_float8(x, list(block), fdt)
                case["scale"] = pack(scale)
                q = qp._quantize_affine_float8(x, scale, fdt)
                case["q"] = pack(q)
                case["dq"] = pack(qp._dequantize_affine_float8(q, scale))
                # the special values (and values beyond the range: x * 16) with the same scale
                s = x.clone() * 16
                s[0, : len(SPECIALS)] = torch.tensor(SPECIALS)
                case["q_special"] = pack(qp._quantize_affine_float8(s, scale, fdt))
            except Exception as e:  # noqa: BLE001
                case["error"] = err(e)
            float8.append(case)

    # ------------------------------------------------------------------ fpx
    fpx = []
    seed = 50000
    for e in range(1, 8):
        for m in range(0, 8 - e):
            seed += 1
            x = fpx_input(seed, e, m)
            case = {"id": f"e{e}m{m}", "seed": seed, "ebits": e, "mbits": m, "input": digest(x)}
            try:
                c = qp._f32_to_floatx_unpacked(x, e, m)
                case["codes"] = pack(c)
                case["inf_codes"] = pack(qp._f32_to_floatx_unpacked(torch.tensor([math.inf, -math.inf]), e, m))
                all_codes = torch.arange(2 ** (1 + e + m), dtype=torch.uint8)
                case["decoded"] = pack(qp._floatx_unpacked_to_f32(all_codes, e, m))
                w = x.reshape(8, 64)
                scale = qp._choose_qparams_affine_floatx(w, e, m)
                case["row_scale"] = pack(scale)
                rq = qp._quantize_affine_floatx(w, scale, e, m)
                case["row_codes"] = pack(rq)
                case["row_dq"] = pack(qp._dequantize_affine_floatx(rq, scale, e, m))
            except Exception as ex:  # noqa: BLE001
                case["error"] = err(ex)
            fpx.append(case)

    doc = {
        "generator": "tests/golden/generate_torchao_sweep.py",
        "torchao": torchao.__version__, "torch": torch.__version__,
        "shape": list(SHAPE), "group": GROUP, "affine": affine, "degenerate": degenerate, "float8": float8,
        "fpx": fpx,
    }
    path = write_recording(doc, __file__, "torchao_sweep.json", out_path)
    n_err = sum("error" in c for c in affine + float8 + fpx)
    print(f"wrote {path}: {len(affine)} affine, {len(float8)} float8, {len(fpx)} fpx cases, {n_err} errors "
          f"({os.path.getsize(path) // 1024} KiB)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
