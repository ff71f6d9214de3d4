"""Generate golden vectors for quanta's torchao-dialect numerics.

This script is NOT a test (its name does not start with ``test_``) and does
nothing on import: torch and torchao are imported inside ``main()`` only.
It needs the anchor library installed beside torch, e.g. in a scratch venv::

    python -m venv /tmp/ao-venv
    /tmp/ao-venv/bin/pip install torch==2.13.0          # CPU wheel first
    /tmp/ao-venv/bin/pip install --no-deps torchao==0.15.0
    /tmp/ao-venv/bin/python tests/golden/generate_torchao_primitives.py

torchao 0.15.0 is the newest release that still ships the real
``AffineQuantizedTensor`` (0.16/0.17 dropped ``from_hp_to_fpx``; 0.18 turned
``torchao.dtypes.AffineQuantizedTensor`` into an empty stub).  torchao has no
runtime dependencies beyond torch; its C++ extensions are skipped on
torch 2.13 (pure-python paths only, which is what we want on CPU).

It writes ``torchao_primitives.json`` next to itself (or to the path given as
the first argument).

Encoding
--------
* Floats: strings accepted by ``float.fromhex`` (trailing mantissa zeros
  stripped) or ``"inf"``/``"-inf"``/``"nan"``.  Every value is exact in
  float64, so ``torch.tensor([float.fromhex(v)...], dtype=float64).to(dtype)``
  rebuilds the tensor bit for bit (float32/16/bfloat16/float8 alike; signed
  zeros kept as ``-0x0p+0``).
* Tensors: ``{"dtype", "shape", "values"}``, values flat row-major.  Integer
  and bool tensors hold JSON ints; float tensors hold hex strings.  A float8
  tensor that contains NaN also carries ``"bits"`` (the raw uint8 codes), so
  its NaN encodings (0x7f / 0xff) are unambiguous.
* ``dq`` is omitted where ``dq_matches_formula`` is true and the case is not
  one of the kept ones: the generator checked that torchao's dequantize equals
  ``float32(float32(q - zp) * float32(scale))`` bit for bit (float8:
  ``float32(q) * scale``); it is always stored when that check fails.
* ``"input": "<name>"`` (a string) refers to ``inputs[<name>]``; per-dtype
  inputs are stored already cast (``<base>/<dtype>``).
* An operation that raised is recorded as ``{"error": "<Type>: <message>"}``
  in place of its outputs.
"""

from __future__ import annotations

import json
import math
import os
import sys


def _hex(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    h = float(v).hex()
    mant, exp = h.split("p")
    if "." in mant:
        mant = mant.rstrip("0").rstrip(".")
    return f"{mant}p{exp}"


def main(out_path: str | None = None) -> None:  # noqa: C901 - a flat list of cases
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torchao
    from torchao.quantization import quant_primitives as qp
    from torchao.quantization.quant_primitives import (
        MappingType,
        ZeroPointDomain,
        choose_qparams_affine,
        dequantize_affine,
        quantize_affine,
    )
    from torchao.prototype import custom_fp_utils as cfu
    from torchao.dtypes import AffineQuantizedTensor as AQT
    from torchao.dtypes import Float8Layout, PlainLayout, UintxLayout
    from torchao.prototype.dtypes.floatx import FloatxTensorCoreLayout

    MT = MappingType

    def dname(dt) -> str:
        return str(dt).replace("torch.", "")

    def enc(t) -> dict:
        if t is None:
            return None
        t = t.detach()
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            d = {
                "dtype": dname(t.dtype),
                "shape": list(t.shape),
                "values": [_hex(v) for v in t.to(torch.float64).flatten().tolist()],
            }
            if bool(t.to(torch.float32).isnan().any()):
                d["bits"] = t.contiguous().view(torch.uint8).flatten().tolist()
            return d
        if t.is_floating_point():
            vals = [_hex(v) for v in t.to(torch.float64).flatten().tolist()]
        else:
            vals = [int(v) for v in t.to(torch.int64).flatten().tolist()]
        return {"dtype": dname(t.dtype), "shape": list(t.shape), "values": vals}

    def err(e: Exception) -> str:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]

    inputs: dict[str, dict] = {}
    _input_tensors: dict[str, torch.Tensor] = {}

    def reg(name: str, t) -> str:
        if name not in inputs:
            inputs[name] = enc(t)
            _input_tensors[name] = t
        return name

    def f32(vals, shape=None):
        t = torch.tensor(vals, dtype=torch.float64).to(torch.float32)
        return t.reshape(shape) if shape is not None else t

    DTYPES = [torch.float32, torch.bfloat16, torch.float16]

    # ------------------------------------------------------------ base inputs
    g = torch.Generator().manual_seed(20240603)
    rand_2x16 = (torch.randn(2, 16, generator=g) * 1.7).to(torch.float32)
    rand_2x16[0, 3] = 0.0
    rand_2x16[1, 7] = -0.0
    rand_2x16[1, 0] = -4.25  # row minimum sits well below zero
    rand_1x64 = (torch.randn(1, 64, generator=g) * 0.9 + 0.3).to(torch.float32)
    rand_1x64[0, 40:48] = rand_1x64[0, 40:48].abs()  # part of group 1 positive
    rand_1x64[0, 10] = 0.0
    small_2x16 = (torch.randn(2, 16, generator=g) * 0.01).to(torch.float32)  # eps matters
    zeros_2x16 = torch.zeros(2, 16)
    zeros_2x16[1, ::2] = -0.0
    const_2x16 = torch.cat([torch.full((1, 16), 3.0), torch.full((1, 16), -0.625)])

    def extremes(dt):
        fi = torch.finfo(dt)
        sub = fi.smallest_normal * fi.eps  # smallest subnormal
        row0 = [fi.max, -fi.max, fi.max / 3, 1.0, -1.0, 0.0, -0.0, fi.tiny,
                -fi.tiny, sub, -sub, 0.5, 2.0, -2.0, 1e-3, -1e-3]
        row1 = [fi.tiny * 4, -fi.tiny * 2, sub * 3, -sub, fi.tiny, 0.0, -0.0, sub,
                fi.tiny * 16, -fi.tiny * 16, sub * 7, -sub * 5, fi.tiny * 2, -fi.tiny, 0.0, sub]
        return torch.tensor([row0, row1], dtype=torch.float64).to(dt)

    def cast(name, base, dt):
        return reg(f"{name}/{dname(dt)}", base.to(dt))

    # -------------------------------------------------------------- targets
    # (label, target_dtype, quant_min, quant_max) ; None -> dtype default
    TARGETS = [
        ("int8", torch.int8, None, None),
        ("uint8", torch.uint8, None, None),
        ("int4_as_int8", torch.int8, -8, 7),
        ("uint4_as_uint8", torch.uint8, 0, 15),
        ("int16", torch.int16, None, None),
    ]
    MAPPINGS = [MT.SYMMETRIC, MT.ASYMMETRIC, MT.SYMMETRIC_NO_CLIPPING_ERR]

    def bounds(tdt, qmin, qmax):
        return qp._get_and_check_qmin_qmax(tdt, qmin, qmax)

    # ------------------------------------------------ int affine (INT domain)
    affine_cases: list[dict] = []

    def affine_case(cid, inp_name, mapping, block, tdt, qmin, qmax, eps=None,
                    scale_dtype=None, zero_point_dtype=None, note=None, dq_out=None,
                    keep_dq=True):
        x = _input_tensors[inp_name]
        case = {
            "id": cid,
            "input": inp_name,
            "mapping_type": mapping.name,
            "block_size": list(block),
            "target_dtype": dname(tdt),
        }
        if qmin is not None or qmax is not None:
            case["quant_min"], case["quant_max"] = qmin, qmax
        if eps is not None:
            case["eps"] = _hex(eps)
        if scale_dtype is not None:
            case["scale_dtype"] = dname(scale_dtype)
        if zero_point_dtype is not None:
            case["zero_point_dtype"] = dname(zero_point_dtype)
        if note:
            case["note"] = note
        try:
            kw = {}
            if zero_point_dtype is not None:
                kw["zero_point_dtype"] = zero_point_dtype
            s, z = choose_qparams_affine(x, mapping, tuple(block), tdt, qmin, qmax,
                                         eps, scale_dtype, **kw)
            case["scale"], case["zero_point"] = enc(s), enc(z)
        except Exception as e:
            case["error"] = err(e)
            affine_cases.append(case)
            return case
        try:
            q = quantize_affine(x, tuple(block), s, z, tdt, qmin, qmax)
            case["q"] = enc(q)
        except Exception as e:
            case["q"] = {"error": err(e)}
            affine_cases.append(case)
            return case
        try:
            dq = dequantize_affine(q, tuple(block), s, z, tdt, qmin, qmax)
            ok = dq_formula_holds(dq, q, s, z, block)
            case["dq_matches_formula"] = ok
            if keep_dq or not ok:
                case["dq"] = enc(dq)  # default output_dtype=float32
        except Exception as e:
            case["dq"] = {"error": err(e)}
        if dq_out is not None:
            try:
                case["dq_output_dtype"] = dname(dq_out)
                case["dq_out"] = enc(dequantize_affine(q, tuple(block), s, z, tdt, qmin, qmax,
                                                       output_dtype=dq_out))
            except Exception as e:
                case["dq_out"] = {"error": err(e)}
        affine_cases.append(case)
        return case

    def expand(t, shape, block):
        t = t.reshape([n // b for n, b in zip(shape, block)])
        for i, b in enumerate(block):
            if b > 1:
                t = t.repeat_interleave(b, dim=i)
        return t

    def dq_formula_holds(dq, q, s, z, block):
        """dequantize_affine == float32(float32(q - zp) * float32(scale)), bit for bit."""
        shape = list(q.shape)
        ref = q.to(torch.float32)
        if z is not None:
            ref = ref - expand(z.to(torch.float32), shape, block)
        ref = ref * expand(s.to(torch.float32), shape, block)
        same = torch.equal(ref.view(torch.int32), dq.view(torch.int32))
        return bool(same or (torch.equal(ref.isnan(), dq.isnan())
                             and torch.equal(ref.nan_to_num().view(torch.int32),
                                             dq.nan_to_num().view(torch.int32))))

    # main grid: granularity x target x mapping x input dtype (default eps);
    # bfloat16/float16: per-row only (per-tensor / per-group reshape is dtype independent)
    for dt in DTYPES:
        n2 = cast("rand_2x16", rand_2x16, dt)
        n1 = cast("rand_1x64", rand_1x64, dt)
        for lbl, tdt, qmin, qmax in TARGETS:
            for mt in MAPPINGS:
                for gran, inp, block in (("per_tensor", n2, (2, 16)), ("per_row", n2, (1, 16)),
                                         ("per_group32", n1, (1, 32))):
                    if dt != torch.float32 and gran != "per_row":
                        continue
                    if (lbl, gran) in (("int16", "per_group32"), ("uint4_as_uint8", "per_tensor")):
                        continue
                    affine_case(f"grid/{dname(dt)}/{lbl}/{mt.name}/{gran}", inp, mt, block,
                                tdt, qmin, qmax, keep_dq=dt == torch.float32 and gran == "per_row",
                                dq_out=dt if (dt != torch.float32 and lbl in ("int8", "uint8")) else None)
        # per-column (block spans dim 0) once per dtype
        affine_case(f"grid/{dname(dt)}/int8/SYMMETRIC/per_col", n2, MT.SYMMETRIC, (2, 1),
                    torch.int8, None, None)

    # exact ties: scale is a power of two so x*(1/s) is exact and lands on k+0.5
    def tie_input(tdt, qmin, qmax, mapping):
        qmin, qmax = bounds(tdt, qmin, qmax)
        s = 2.0 ** -4
        if mapping == MT.SYMMETRIC:
            # s = amax / ((qmax-qmin)/2)
            amax = s * (qmax - qmin) / 2
            lo, hi = -amax, amax
            zp = int((qmax + qmin + 1) / 2)
        elif mapping == MT.ASYMMETRIC:
            m = (qmax - qmin) // 3  # zero lands m steps above qmin
            lo = -s * m
            hi = s * (qmax - qmin) + lo
            zp = qmin + m
        else:  # SYMMETRIC_NO_CLIPPING_ERR, signed targets: s = max(lo/qmin, hi/qmax)
            if qmin < 0:
                lo, hi = s * qmin, s * qmax
            else:
                lo, hi = 0.0, s * qmax
            zp = int((qmax + qmin + 1) / 2)
        ks = []
        # ties well inside, at zero, and next to both clamp edges (in grid units)
        for k in (0, 1, 2, -1, -2, -3):
            ks.append(k + 0.5)
        for e in (qmin - zp, qmax - zp):
            ks += [e - 1.5, e - 0.5, e + 0.5, e + 1.5]
        vals = [lo, hi] + [k * s for k in ks]
        vals += [0.0, -0.0]
        while len(vals) < 16:
            vals.append(s * 0.25)
        row = vals[:16]
        return f32([row, row[::-1]])

    for lbl, tdt, qmin, qmax in TARGETS:
        for mt in MAPPINGS:
            base = tie_input(tdt, qmin, qmax, mt)
            for dt in DTYPES:
                if dt == torch.float16 and lbl not in ("int8", "uint8", "int16"):
                    continue
                nm = cast(f"ties_{lbl}_{mt.name}", base, dt)
                affine_case(f"ties/{dname(dt)}/{lbl}/{mt.name}/per_row", nm, mt, (1, 16),
                            tdt, qmin, qmax, keep_dq=False)

    # special inputs x {SYM, ASYM, SNCE} x {int8, uint8} x dtypes
    for dt in DTYPES:
        for nm_base, base in (("zeros_2x16", zeros_2x16), ("const_2x16", const_2x16),
                              ("small_2x16", small_2x16)):
            nm = cast(nm_base, base, dt)
            for lbl, tdt, qmin, qmax in TARGETS[:2]:
                for mt in MAPPINGS:
                    if mt == MT.SYMMETRIC_NO_CLIPPING_ERR and lbl == "int8":
                        continue
                    if nm_base == "small_2x16" and lbl != "int8":
                        continue
                    if nm_base != "small_2x16" and dt == torch.float16 and mt != MT.ASYMMETRIC:
                        continue
                    affine_case(f"special/{nm_base}/{dname(dt)}/{lbl}/{mt.name}/per_row", nm, mt,
                                (1, 16), tdt, qmin, qmax, keep_dq=False)
        nm = reg(f"extremes_2x16/{dname(dt)}", extremes(dt))
        for lbl, tdt, qmin, qmax in TARGETS[:2]:
            for mt in MAPPINGS:
                if dt != torch.float32 and (mt == MT.SYMMETRIC_NO_CLIPPING_ERR or
                                            (lbl == "uint8" and mt == MT.SYMMETRIC)):
                    continue
                affine_case(f"special/extremes_2x16/{dname(dt)}/{lbl}/{mt.name}/per_row", nm, mt,
                            (1, 16), tdt, qmin, qmax, keep_dq=dt == torch.float32)
        affine_case(f"special/extremes_2x16/{dname(dt)}/int8/SYMMETRIC/per_tensor", nm,
                    MT.SYMMETRIC, (2, 16), torch.int8, None, None)

    # eps: default vs custom, scale_dtype / zero_point_dtype overrides
    for dt in DTYPES:
        nm = cast("small_2x16", small_2x16, dt)
        for eps in (1e-5, torch.finfo(dt).smallest_normal, 0.5):
            for mt in (MT.SYMMETRIC, MT.ASYMMETRIC):
                affine_case(f"eps/{dname(dt)}/{_hex(eps)}/{mt.name}/int8/per_row", nm, mt,
                            (1, 16), torch.int8, None, None, eps=eps, keep_dq=False)
        if dt != torch.float32:
            affine_case(f"scale_dtype_f32/{dname(dt)}/ASYMMETRIC/uint8/per_row", nm,
                        MT.ASYMMETRIC, (1, 16), torch.uint8, None, None,
                        scale_dtype=torch.float32)
    n2 = _input_tensors["rand_2x16/float32"]
    for zdt in (torch.int8, torch.int64, torch.float32, torch.bfloat16):
        affine_case(f"zp_dtype/{dname(zdt)}/ASYMMETRIC/uint8/per_row", "rand_2x16/float32",
                    MT.ASYMMETRIC, (1, 16), torch.uint8, None, None, zero_point_dtype=zdt)
    affine_case("scale_dtype_bf16/float32/SYMMETRIC/int8/per_row", "rand_2x16/float32",
                MT.SYMMETRIC, (1, 16), torch.int8, None, None, scale_dtype=torch.bfloat16)
    # sub-byte torch dtypes and other bounds
    for tdt in (torch.int4, torch.uint4, torch.int2, torch.uint2, torch.int32):
        for mt in (MT.SYMMETRIC, MT.ASYMMETRIC):
            affine_case(f"dtype/{dname(tdt)}/{mt.name}/per_row", "rand_2x16/float32", mt, (1, 16),
                        tdt, None, None)
    affine_case("bounds/int8_-127_127/SYMMETRIC/per_row", "rand_2x16/float32", MT.SYMMETRIC,
                (1, 16), torch.int8, -127, 127)
    affine_case("bounds/int8_0_127/SYMMETRIC_NO_CLIPPING_ERR/per_row", "rand_2x16/float32",
                MT.SYMMETRIC_NO_CLIPPING_ERR, (1, 16), torch.int8, 0, 127)
    affine_case("bounds/int8_out_of_range", "rand_2x16/float32", MT.SYMMETRIC, (1, 16),
                torch.int8, -200, 127)
    affine_case("bounds/qmin_gt_qmax", "rand_2x16/float32", MT.ASYMMETRIC, (1, 16),
                torch.int8, 5, -5)
    affine_case("block/all_ones", "rand_2x16/float32", MT.SYMMETRIC, (1, 1), torch.int8,
                None, None, note="torchao reduces over ALL dims when no dim has block>1")
    affine_case("block/not_divisible", "rand_2x16/float32", MT.SYMMETRIC, (1, 5), torch.int8,
                None, None)
    affine_case("block/wrong_rank", "rand_2x16/float32", MT.SYMMETRIC, (16,), torch.int8,
                None, None)
    nan_in = reg("nan_inf_2x16", f32([[float("nan")] + [0.5] * 15,
                                      [float("inf"), -1.0] + [0.25] * 14]))
    for mt in MAPPINGS:
        affine_case(f"special/nan_inf/{mt.name}/uint8/per_row", nan_in, mt, (1, 16),
                    torch.uint8, None, None)
        affine_case(f"special/nan_inf/{mt.name}/int8/per_row", nan_in, mt, (1, 16),
                    torch.int8, None, None)

    # ------------------------------------------ quantize/dequantize with given qparams
    static_cases: list[dict] = []

    def static_case(cid, inp_name, block, scale, zp, tdt, qmin=None, qmax=None, out=None):
        x = _input_tensors[inp_name]
        case = {"id": cid, "input": inp_name, "block_size": list(block),
                "scale": enc(scale), "zero_point": enc(zp), "target_dtype": dname(tdt),
                "quant_min": qmin, "quant_max": qmax}
        try:
            q = quantize_affine(x, tuple(block), scale, zp, tdt, qmin, qmax)
            case["q"] = enc(q)
            kw = {} if out is None else {"output_dtype": out}
            case["dq_output_dtype"] = "float32" if out is None else dname(out)
            case["dq"] = enc(dequantize_affine(q, tuple(block), scale, zp, tdt, qmin, qmax, **kw))
        except Exception as e:
            case["error"] = err(e)
        static_cases.append(case)

    s_row = f32([0.1, 0.3])
    static_case("scale_0.1_0.3/zp_int/f32", "rand_2x16/float32", (1, 16), s_row,
                torch.tensor([3, -7], dtype=torch.int32), torch.int8)
    static_case("scale_0.1_0.3/zp_none/f32", "rand_2x16/float32", (1, 16), s_row, None, torch.int8)
    static_case("scale_0.1_0.3/zp_float/f32", "rand_2x16/float32", (1, 16), s_row,
                f32([2.5, -1.25]), torch.int8)
    static_case("scale_bf16/input_f32", "rand_2x16/float32", (1, 16), s_row.bfloat16(),
                torch.tensor([0, 0], dtype=torch.int32), torch.int8)
    static_case("scale_f32/input_bf16/out_bf16", "rand_2x16/bfloat16", (1, 16), s_row,
                torch.tensor([0, 0], dtype=torch.int32), torch.int8, out=torch.bfloat16)
    static_case("scale_f32/input_f16/out_f16", "rand_2x16/float16", (1, 16), s_row,
                torch.tensor([1, -1], dtype=torch.int32), torch.int8, out=torch.float16)
    static_case("scale_3d_keepdim_shape", "rand_2x16/float32", (1, 16), s_row.reshape(2, 1),
                torch.tensor([[0], [0]], dtype=torch.int32), torch.int8)
    static_case("zero_scale", "rand_2x16/float32", (1, 16), f32([0.0, 0.1]),
                torch.tensor([0, 0], dtype=torch.int32), torch.int8)
    static_case("per_element_scale_all_ones_block", "rand_2x16/float32", (1, 1),
                torch.full((2, 16), 0.25), torch.zeros((2, 16), dtype=torch.int32), torch.int8)
    static_case("uint4_dtype", "rand_2x16/float32", (1, 16), s_row,
                torch.tensor([8, 8], dtype=torch.int32), torch.uint4)
    static_case("int4_dtype", "rand_2x16/float32", (1, 16), s_row,
                torch.tensor([0, 0], dtype=torch.int32), torch.int4)

    # ---------------------------------------------------------------- other zero-point domains
    zpd_cases: list[dict] = []

    def zpd_case(cid, domain, inp_name, block, tdt, qmin, qmax, mapping=MT.ASYMMETRIC,
                 eps=None, zero_point_dtype=None, preserve_zero=True, out=None):
        x = _input_tensors[inp_name]
        case = {"id": cid, "zero_point_domain": domain.name, "preserve_zero": preserve_zero,
                "input": inp_name, "mapping_type": mapping.name, "block_size": list(block),
                "target_dtype": dname(tdt), "quant_min": qmin, "quant_max": qmax,
                "eps": None if eps is None else _hex(eps),
                "zero_point_dtype": None if zero_point_dtype is None else dname(zero_point_dtype)}
        try:
            if domain == ZeroPointDomain.FLOAT:
                case["functions"] = ["_choose_qparams_affine_tinygemm", "_quantize_affine_tinygemm",
                                     "_dequantize_affine_tinygemm"]
                s, z = qp._choose_qparams_affine_tinygemm(x, mapping, tuple(block), tdt, qmin, qmax,
                                                          eps, None, zero_point_dtype)
                q = qp._quantize_affine_tinygemm(x, tuple(block), s, z, tdt, qmin, qmax)
                dqf = qp._dequantize_affine_tinygemm
            elif domain == ZeroPointDomain.NONE:
                case["functions"] = ["choose_qparams_affine (zero_point discarded)",
                                     "_quantize_affine_no_zero_point",
                                     "_dequantize_affine_no_zero_point"]
                s, _ = choose_qparams_affine(x, mapping, tuple(block), tdt, qmin, qmax, eps)
                z = None
                q = qp._quantize_affine_no_zero_point(x, tuple(block), s, None, tdt, qmin, qmax)
                dqf = qp._dequantize_affine_no_zero_point
            else:
                assert not preserve_zero
                case["functions"] = ["_choose_qparams_affine_dont_preserve_zero",
                                     "quantize_affine", "dequantize_affine"]
                s, z = qp._choose_qparams_affine_dont_preserve_zero(
                    x, mapping, tuple(block), tdt, qmin, qmax, eps, None, zero_point_dtype)
                q = quantize_affine(x, tuple(block), s, z, tdt, qmin, qmax)
                dqf = dequantize_affine
            case["scale"], case["zero_point"], case["q"] = enc(s), enc(z), enc(q)
            qdt = q.dtype if tdt not in qp._SUB_BYTE_UINT_BOUNDS else tdt
            case["dq"] = enc(dqf(q, tuple(block), s, z, qdt, qmin, qmax))
            if out is not None:
                case["dq_output_dtype"] = dname(out)
                case["dq_out"] = enc(dqf(q, tuple(block), s, z, qdt, qmin, qmax, output_dtype=out))
        except Exception as e:
            case["error"] = err(e)
        zpd_cases.append(case)

    for dt in DTYPES:
        n2, n1 = f"rand_2x16/{dname(dt)}", f"rand_1x64/{dname(dt)}"
        out = dt if dt == torch.bfloat16 else None
        for tlbl, tdt, qmin, qmax in (("int32_0_15", torch.int32, 0, 15), ("uint8", torch.uint8, None, None),
                                      ("uint4", torch.uint4, None, None)):
            if dt != torch.float32 and tlbl != "int32_0_15":
                continue
            zpd_case(f"FLOAT/{dname(dt)}/{tlbl}/per_group32", ZeroPointDomain.FLOAT, n1, (1, 32),
                     tdt, qmin, qmax, out=out)
            if tlbl == "int32_0_15":
                zpd_case(f"FLOAT/{dname(dt)}/{tlbl}/per_row", ZeroPointDomain.FLOAT, n2, (1, 16),
                         tdt, qmin, qmax)
            if tlbl != "uint4" and dt != torch.float16:
                zpd_case(f"INT_no_preserve_zero/{dname(dt)}/{tlbl}/per_group32", ZeroPointDomain.INT,
                         n1, (1, 32), tdt, qmin, qmax, preserve_zero=False, out=out)
        if dt != torch.float16:
            zpd_case(f"FLOAT/{dname(dt)}/int32_0_15/per_group32/eps1e-6/zp_bf16", ZeroPointDomain.FLOAT,
                     n1, (1, 32), torch.int32, 0, 15, eps=1e-6, zero_point_dtype=torch.bfloat16)
        for tlbl, tdt, qmin, qmax in (("int8", torch.int8, None, None), ("int4_as_int8", torch.int8, -8, 7)):
            for mt in (MT.SYMMETRIC, MT.SYMMETRIC_NO_CLIPPING_ERR, MT.ASYMMETRIC):
                if (dt != torch.float32 or tlbl != "int8") and mt != MT.SYMMETRIC:
                    continue
                zpd_case(f"NONE/{dname(dt)}/{tlbl}/{mt.name}/per_row", ZeroPointDomain.NONE, n2, (1, 16),
                         tdt, qmin, qmax, mapping=mt, out=out)
    zpd_case("FLOAT/float32/SYMMETRIC_rejected", ZeroPointDomain.FLOAT, "rand_2x16/float32", (1, 16),
             torch.int32, 0, 15, mapping=MT.SYMMETRIC)
    zpd_case("FLOAT/float32/zeros", ZeroPointDomain.FLOAT, "zeros_2x16/float32", (1, 16),
             torch.int32, 0, 15)
    zpd_case("FLOAT/float32/const", ZeroPointDomain.FLOAT, "const_2x16/float32", (1, 16),
             torch.int32, 0, 15)

    # ------------------------------------------------------------- fake quantize
    fq_cases: list[dict] = []

    def fq_case(cid, inp_name, domain, mapping, block, tdt, qmin, qmax):
        x = _input_tensors[inp_name]
        case = {"id": cid, "input": inp_name, "zero_point_domain": domain.name,
                "mapping_type": mapping.name, "block_size": list(block), "quant_dtype": dname(tdt),
                "quant_min": qmin, "quant_max": qmax, "function": "_fake_quantize_affine"}
        try:
            if domain == ZeroPointDomain.FLOAT:
                s, z = qp._choose_qparams_affine_tinygemm(x, mapping, tuple(block), tdt, qmin, qmax)
            else:
                s, z = choose_qparams_affine(x, mapping, tuple(block), tdt, qmin, qmax)
                if domain == ZeroPointDomain.NONE:
                    z = None
            case["scale"], case["zero_point"] = enc(s), enc(z)
            case["fq"] = enc(qp._fake_quantize_affine(x, tuple(block), s, z, tdt, qmin, qmax,
                                                      zero_point_domain=domain))
            fq, mask = qp._fake_quantize_affine_cachemask(x, tuple(block), s, z, tdt,
                                                          *bounds(tdt, qmin, qmax),
                                                          zero_point_domain=domain)
            case["cachemask_fq_equal"] = bool(torch.equal(fq, qp._fake_quantize_affine(
                x, tuple(block), s, z, tdt, qmin, qmax, zero_point_domain=domain)))
            case["cachemask_mask_all_true"] = bool(mask.all())
        except Exception as e:
            case["error"] = err(e)
        fq_cases.append(case)

    for dt in DTYPES:
        n2 = f"rand_2x16/{dname(dt)}"
        fq_case(f"INT/{dname(dt)}/int8/SYMMETRIC/per_row", n2, ZeroPointDomain.INT, MT.SYMMETRIC,
                (1, 16), torch.int8, None, None)
        if dt != torch.float16:
            fq_case(f"INT/{dname(dt)}/uint4_as_uint8/ASYMMETRIC/per_row", n2, ZeroPointDomain.INT,
                    MT.ASYMMETRIC, (1, 16), torch.uint8, 0, 15)
        if dt == torch.float16:  # fp16: INT int8 + int16 only
            fq_case(f"INT/{dname(dt)}/int16/ASYMMETRIC/per_tensor", n2, ZeroPointDomain.INT,
                    MT.ASYMMETRIC, (2, 16), torch.int16, None, None)
            continue
        fq_case(f"NONE/{dname(dt)}/int4_as_int8/SYMMETRIC/per_row", n2, ZeroPointDomain.NONE,
                MT.SYMMETRIC, (1, 16), torch.int8, -8, 7)
        fq_case(f"FLOAT/{dname(dt)}/int32_0_15/ASYMMETRIC/per_row", n2, ZeroPointDomain.FLOAT,
                MT.ASYMMETRIC, (1, 16), torch.int32, 0, 15)
        fq_case(f"INT/{dname(dt)}/int16/ASYMMETRIC/per_tensor", n2, ZeroPointDomain.INT,
                MT.ASYMMETRIC, (2, 16), torch.int16, None, None)

    # ---------------------------------------------------------------- float8
    f8_cases: list[dict] = []
    F8 = [torch.float8_e4m3fn, torch.float8_e5m2]

    def f8_case(cid, inp_name, fdt, block, static_scale=None, out=None, keep_dq=True):
        x = _input_tensors[inp_name]
        case = {"id": cid, "input": inp_name, "float8_dtype": dname(fdt),
                "block_size": None if block is None else list(block)}
        try:
            if static_scale is None:
                s = qp._choose_scale_float8(x, list(block), fdt)
            else:
                s = static_scale
                case["static"] = True
            case["scale"] = enc(s)
            q = qp._quantize_affine_float8(x, s, fdt)
            case["q"] = enc(q)
            dq = qp._dequantize_affine_float8(q, s)  # output_dtype float32
            ref = q.to(torch.float32) * qp._maybe_expand_scale_to_tensor_shape(s, q.shape)
            ok = bool(torch.equal(ref.nan_to_num(), dq.nan_to_num())
                      and torch.equal(ref.isnan(), dq.isnan()))
            case["dq_matches_formula"] = ok
            if keep_dq or not ok:
                case["dq"] = enc(dq)
            if out is not None:
                case["dq_output_dtype"] = dname(out)
                case["dq_out"] = enc(qp._dequantize_affine_float8(q, s, out))
        except Exception as e:
            case["error"] = err(e)
        f8_cases.append(case)

    for dt in DTYPES:
        for nm_base, base in (("rand_2x16", rand_2x16), ("zeros_2x16", zeros_2x16),
                              ("const_2x16", const_2x16)):
            nm = cast(nm_base, base, dt)
            for fdt in F8:
                if nm_base != "rand_2x16" and dt != torch.float32:
                    continue
                f8_case(f"{nm_base}/{dname(dt)}/{dname(fdt)}/per_row", nm, fdt, (1, 16),
                        out=dt if (dt != torch.float32 and nm_base == "rand_2x16") else None,
                        keep_dq=dt == torch.float32)
                if nm_base == "rand_2x16":
                    if dt != torch.float16:
                        f8_case(f"{nm_base}/{dname(dt)}/{dname(fdt)}/per_tensor_full_block", nm,
                                fdt, (2, 16), keep_dq=False)
                    if dt == torch.float32:
                        f8_case(f"{nm_base}/{dname(dt)}/{dname(fdt)}/per_tensor_empty_block", nm, fdt,
                                (), keep_dq=False)
                        if fdt == torch.float8_e4m3fn:
                            f8_case(f"{nm_base}/{dname(dt)}/{dname(fdt)}/per_col", nm, fdt, (2, 1),
                                    keep_dq=False)
        nm = f"extremes_2x16/{dname(dt)}"
        for fdt in F8:
            f8_case(f"extremes_2x16/{dname(dt)}/{dname(fdt)}/per_row", nm, fdt, (1, 16),
                    keep_dq=dt == torch.float32)
    for fdt in F8:
        f8_case(f"nan_inf_2x16/float32/{dname(fdt)}/per_row", "nan_inf_2x16", fdt, (1, 16))
        f8_case(f"rand_1x64/float32/{dname(fdt)}/block_1x32", "rand_1x64/float32", fdt, (1, 32))

    # static scale = 1: exact ties between adjacent float8 codes, overflow, subnormals
    def f8_ties(fdt):
        fi = torch.finfo(fdt)
        codes = torch.arange(0, 128, dtype=torch.uint8).view(fdt).to(torch.float64)
        codes = codes[torch.isfinite(codes)]
        pick = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 40, 63, 64, 65, 100, len(codes) - 3, len(codes) - 2]
        vals = []
        for i in pick:
            vals.append(((codes[i] + codes[i + 1]) / 2).item())  # exact tie
        vals += [fi.max, fi.max * 1.0625, fi.max * 2, 1e30, -fi.max * 1.5, fi.tiny / 2, -fi.tiny / 4,
                 fi.tiny * fi.eps / 2, -fi.tiny * fi.eps / 2, 0.0, -0.0, float("inf"), float("-inf"),
                 float("nan"), 1.0 + 2.0 ** -10]
        vals = [-v for v in vals[:12]] + vals
        return f32(vals[:64])

    for fdt in F8:
        nm = reg(f"f8_ties/{dname(fdt)}", f8_ties(fdt))
        f8_case(f"ties_static_scale1/float32/{dname(fdt)}", nm, fdt, None,
                static_scale=torch.tensor(1.0))
    f8_case("static_scale_zero/e4m3fn", "rand_2x16/float32", torch.float8_e4m3fn, None,
            static_scale=torch.tensor([[0.0], [0.5]]))

    # ------------------------------------------------------------------ fpx (floatx)
    FPX = [(2, 1), (3, 2), (2, 3), (4, 3), (5, 2)]
    fpx_encode: list[dict] = []
    fpx_decode: list[dict] = []
    fpx_affine: list[dict] = []

    def fpx_values(e, m):
        bias = (1 << (e - 1)) - 1
        max_normal = 2.0 ** ((1 << e) - 1 - bias) * ((1 << (m + 1)) - 1) / 2 ** m
        min_normal = 2.0 ** (1 - bias)
        sub = min_normal / 2 ** m
        vals = [0.0, -0.0, sub / 2, sub / 2 * 3, sub * 0.5000001, sub * 0.4999999, sub, sub * 1.5,
                min_normal - sub / 2, min_normal, min_normal * (1 + 2.0 ** -(m + 1)),
                min_normal * (1 + 3 * 2.0 ** -(m + 1)), 1.0, 1.0 + 2.0 ** -(m + 1),
                1.0 + 3 * 2.0 ** -(m + 1), 1.0 + 2.0 ** -(m + 1) + 2.0 ** -20,
                max_normal, max_normal * (1 + 2.0 ** -(m + 2)), max_normal * 1.5, max_normal * 4,
                3.4e38, float("inf"), float("-inf"), float("nan"), -float("nan"), 1e-45, 1e-40,
                -1.0, -(1.0 + 2.0 ** -(m + 1)), -max_normal * 2, 0.3, -0.7, 2.5, -3.25, 5.0, 7.0]
        return f32(vals)

    for e, m in FPX:
        x = fpx_values(e, m)
        nm = reg(f"fpx_values/e{e}m{m}", x)
        case = {"id": f"e{e}m{m}", "ebits": e, "mbits": m, "input": nm,
                "function": "torchao.prototype.custom_fp_utils._f32_to_floatx_unpacked"}
        try:
            codes = cfu._f32_to_floatx_unpacked(x, e, m)
            case["codes"] = enc(codes)
            case["roundtrip"] = enc(cfu._floatx_unpacked_to_f32(codes, e, m))
        except Exception as ex:
            case["error"] = err(ex)
        fpx_encode.append(case)
        n = 1 << (1 + e + m)
        for start in range(0, n, 64):
            codes = torch.arange(start, min(n, start + 64), dtype=torch.int32).to(torch.uint8)
            case = {"id": f"e{e}m{m}/codes_{start}_{start + codes.numel() - 1}", "ebits": e,
                    "mbits": m, "codes": enc(codes),
                    "function": "torchao.prototype.custom_fp_utils._floatx_unpacked_to_f32"}
            try:
                case["values"] = enc(cfu._floatx_unpacked_to_f32(codes, e, m))
            except Exception as ex:
                case["error"] = err(ex)
            fpx_decode.append(case)
        for dt in DTYPES:
            for nm_base, base in (("rand_2x16", rand_2x16), ("zeros_2x16", zeros_2x16)):
                if dt != torch.float32 and (nm_base == "zeros_2x16" or dt == torch.float16):
                    continue
                if nm_base == "zeros_2x16" and (e, m) != (3, 2):
                    continue
                nm = f"{nm_base}/{dname(dt)}"
                case = {"id": f"e{e}m{m}/{nm}", "ebits": e, "mbits": m, "input": nm,
                        "functions": ["_choose_qparams_affine_floatx", "_quantize_affine_floatx",
                                      "_dequantize_affine_floatx"]}
                try:
                    xx = _input_tensors[nm]
                    s = qp._choose_qparams_affine_floatx(xx, e, m)
                    codes = qp._quantize_affine_floatx(xx, s, e, m)
                    case["scale"], case["codes"] = enc(s), enc(codes)
                    case["dq"] = enc(qp._dequantize_affine_floatx(codes, s, e, m))
                    if dt != torch.float32:
                        case["dq_output_dtype"] = dname(dt)
                        case["dq_out"] = enc(qp._dequantize_affine_floatx(codes, s, e, m, dt))
                except Exception as ex:
                    case["error"] = err(ex)
                fpx_affine.append(case)

    # ------------------------------------------------------------- AffineQuantizedTensor
    aqt_cases: list[dict] = []

    def aqt_case(cid, ctor, inp_name, fn, args_desc, note=None):
        case = {"id": cid, "constructor": ctor, "input": inp_name, "args": args_desc}
        if note:
            case["note"] = note
        try:
            t = fn(_input_tensors[inp_name])
            impl = t.tensor_impl
            case["layout"] = repr(t._layout)
            case["tensor_impl"] = type(impl).__name__
            case["dtype"] = dname(t.dtype)
            case["shape"] = list(t.shape)
            case["block_size"] = list(t.block_size)
            case["quant_min"], case["quant_max"] = t.quant_min, t.quant_max
            case["zero_point_domain"] = t.zero_point_domain.name
            plain = impl.get_plain()
            if len(plain) == 3:
                d, s, z = plain
            else:
                (d, s), z = plain, None
            case["plain_data"], case["plain_scale"], case["plain_zero_point"] = enc(d), enc(s), enc(z)
            dq = t.dequantize()
            case["dequantize_dtype"] = dname(dq.dtype)
            # PlainLayout/UintxLayout INT-domain float32: dequantize() is dequantize_affine of
            # the plain data (checked here); values are kept for every other case
            if (isinstance(t._layout, (PlainLayout, UintxLayout)) and dq.dtype == torch.float32
                    and t.zero_point_domain == ZeroPointDomain.INT and d.dtype in
                    (torch.int8, torch.uint8)):
                ref = dequantize_affine(d, tuple(t.block_size), s, z, d.dtype, t.quant_min,
                                        t.quant_max)
                case["dequantize_equals_dequantize_affine"] = bool(torch.equal(ref, dq))
                if not case["dequantize_equals_dequantize_affine"]:
                    case["dequantize"] = enc(dq)
            else:
                case["dequantize"] = enc(dq)
        except Exception as e:
            case["error"] = err(e)
        aqt_cases.append(case)

    for dt in (torch.float32, torch.bfloat16):
        n2, n1 = f"rand_2x16/{dname(dt)}", f"rand_1x64/{dname(dt)}"
        D = dname(dt)
        # bfloat16 repeats only the cases whose numerics differ by input dtype
        BF16_KEEP = ("intx/bfloat16/int8/SYM/per_row", "intx/bfloat16/int32_0_15/ASYM/ZPD_FLOAT",
                     "floatx/bfloat16/float8_e4m3fn/per_row", "fpx/bfloat16/e3m2",
                     "intx_static/bfloat16/int8")

        def aqt_case(cid, *a, _inner=aqt_case, **kw):
            if D == "bfloat16" and not any(cid == k or cid.startswith(k + "/") for k in BF16_KEEP):
                return
            _inner(cid, *a, **kw)
        aqt_case(f"intx/{D}/int8/SYM/per_row", "from_hp_to_intx", n2,
                 lambda v: AQT.from_hp_to_intx(v, MT.SYMMETRIC, (1, 16), torch.int8),
                 {"mapping_type": "SYMMETRIC", "block_size": [1, 16], "target_dtype": "int8"})
        aqt_case(f"intx/{D}/uint8/ASYM/per_group32", "from_hp_to_intx", n1,
                 lambda v: AQT.from_hp_to_intx(v, MT.ASYMMETRIC, (1, 32), torch.uint8),
                 {"mapping_type": "ASYMMETRIC", "block_size": [1, 32], "target_dtype": "uint8"})
        aqt_case(f"intx/{D}/int8/SYM/ZPD_NONE", "from_hp_to_intx", n2,
                 lambda v: AQT.from_hp_to_intx(v, MT.SYMMETRIC, (1, 16), torch.int8,
                                               zero_point_domain=ZeroPointDomain.NONE),
                 {"mapping_type": "SYMMETRIC", "block_size": [1, 16], "target_dtype": "int8",
                  "zero_point_domain": "NONE"})
        aqt_case(f"intx/{D}/int32_0_15/ASYM/ZPD_FLOAT/no_preserve_zero", "from_hp_to_intx", n1,
                 lambda v: AQT.from_hp_to_intx(v, MT.ASYMMETRIC, (1, 32), torch.int32, 0, 15, 1e-6,
                                               zero_point_dtype=v.dtype, preserve_zero=False,
                                               zero_point_domain=ZeroPointDomain.FLOAT),
                 {"mapping_type": "ASYMMETRIC", "block_size": [1, 32], "target_dtype": "int32",
                  "quant_min": 0, "quant_max": 15, "eps": _hex(1e-6), "zero_point_dtype": "input dtype",
                  "preserve_zero": False, "zero_point_domain": "FLOAT"})
        aqt_case(f"intx/{D}/uint8/ASYM/ZPD_INT/no_preserve_zero", "from_hp_to_intx", n1,
                 lambda v: AQT.from_hp_to_intx(v, MT.ASYMMETRIC, (1, 32), torch.uint8,
                                               preserve_zero=False),
                 {"mapping_type": "ASYMMETRIC", "block_size": [1, 32], "target_dtype": "uint8",
                  "preserve_zero": False})
        aqt_case(f"intx/{D}/uint4/ASYM/UintxLayout", "from_hp_to_intx", n1,
                 lambda v: AQT.from_hp_to_intx(v, MT.ASYMMETRIC, (1, 32), torch.uint4,
                                               _layout=UintxLayout(torch.uint4)),
                 {"mapping_type": "ASYMMETRIC", "block_size": [1, 32], "target_dtype": "uint4",
                  "_layout": "UintxLayout(torch.uint4)"})
        aqt_case(f"intx/{D}/int4/SYM/PlainLayout", "from_hp_to_intx", n2,
                 lambda v: AQT.from_hp_to_intx(v, MT.SYMMETRIC, (1, 16), torch.int4),
                 {"mapping_type": "SYMMETRIC", "block_size": [1, 16], "target_dtype": "int4"})
        aqt_case(f"intx_static/{D}/int8", "from_hp_to_intx_static", n2,
                 lambda v: AQT.from_hp_to_intx_static(v, f32([0.05, 0.03]).to(v.dtype),
                                                      torch.tensor([1, -2], dtype=torch.int32),
                                                      (1, 16), torch.int8),
                 {"scale": [_hex(0.05), _hex(0.03)], "scale_cast_to_input_dtype": True,
                  "zero_point": [1, -2], "block_size": [1, 16], "target_dtype": "int8"})
        aqt_case(f"intx_static/{D}/int8/ZPD_NONE", "from_hp_to_intx_static", n2,
                 lambda v: AQT.from_hp_to_intx_static(v, f32([0.05, 0.03]).to(v.dtype), None,
                                                      (1, 16), torch.int8,
                                                      zero_point_domain=ZeroPointDomain.NONE),
                 {"scale": [_hex(0.05), _hex(0.03)], "scale_cast_to_input_dtype": True,
                  "zero_point": None, "block_size": [1, 16], "target_dtype": "int8",
                  "zero_point_domain": "NONE"})
        for fdt in F8:
            aqt_case(f"floatx/{D}/{dname(fdt)}/per_row", "from_hp_to_floatx", n2,
                     lambda v, fdt=fdt: AQT.from_hp_to_floatx(v, (1, 16), fdt, Float8Layout()),
                     {"block_size": [1, 16], "target_dtype": dname(fdt), "_layout": "Float8Layout()"})
            aqt_case(f"floatx/{D}/{dname(fdt)}/per_tensor", "from_hp_to_floatx", n2,
                     lambda v, fdt=fdt: AQT.from_hp_to_floatx(v, (2, 16), fdt, Float8Layout()),
                     {"block_size": [2, 16], "target_dtype": dname(fdt), "_layout": "Float8Layout()"})
        aqt_case(f"floatx/{D}/e4m3fn/PlainLayout", "from_hp_to_floatx", n2,
                 lambda v: AQT.from_hp_to_floatx(v, (1, 16), torch.float8_e4m3fn, PlainLayout()),
                 {"block_size": [1, 16], "target_dtype": "float8_e4m3fn", "_layout": "PlainLayout()"})
        aqt_case(f"floatx/{D}/int8_rejected", "from_hp_to_floatx", n2,
                 lambda v: AQT.from_hp_to_floatx(v, (1, 16), torch.int8, Float8Layout()),
                 {"block_size": [1, 16], "target_dtype": "int8", "_layout": "Float8Layout()"})
        aqt_case(f"floatx_static/{D}/e4m3fn/per_row", "from_hp_to_floatx_static", n2,
                 lambda v: AQT.from_hp_to_floatx_static(v, f32([[0.01], [0.02]]), (1, 16),
                                                        torch.float8_e4m3fn, Float8Layout()),
                 {"scale": [[_hex(0.01)], [_hex(0.02)]], "block_size": [1, 16],
                  "target_dtype": "float8_e4m3fn", "_layout": "Float8Layout()"})
        for e, m in FPX:
            aqt_case(f"fpx/{D}/e{e}m{m}", "from_hp_to_fpx", n2,
                     lambda v, e=e, m=m: AQT.from_hp_to_fpx(v, FloatxTensorCoreLayout(e, m)),
                     {"_layout": f"FloatxTensorCoreLayout({e}, {m})"},
                     note="tensor-core packing asserts M % 64 == 0 and N % 64 == 0 (and <= 7 bits); "
                          "on a 64x64 input the unpacked codes/scale equal _choose_qparams_affine_floatx"
                          " + _quantize_affine_floatx (see fpx_affine) and block_size is recorded as "
                          "[M, 1] although the scale is per row")

    # ------------------------------------------------------------------ assemble
    out = {
        "meta": {
            "generator": "tests/golden/generate_torchao_primitives.py",
            "torchao_version": torchao.__version__,
            "torch_version": torch.__version__,
            "float_encoding": "float.fromhex strings (exact; trailing mantissa zeros stripped; "
                              "'inf','-inf','nan')",
            "tensor_encoding": "{dtype, shape, values(row-major flat)}; ints as JSON ints, floats as "
                               "hex strings; float8 tensors holding NaN add 'bits' (raw uint8)",
            "dq_omission": "dq omitted when dq_matches_formula: float32(float32(q-zp)*scale) "
                           "(float8: float32(q)*scale), verified bit for bit by the generator",
            "input_refs": "a string 'input' names an entry of 'inputs' (already cast to its dtype)",
            "errors": "an exception is recorded as 'error': '<Type>: <first line>'",
            "defaults": {
                "choose_qparams_affine.eps": "torch.finfo(input.dtype).eps (torchao<=0.17; 0.18 uses "
                                             "finfo.smallest_normal)",
                "choose_qparams_affine.scale_dtype": "input.dtype",
                "choose_qparams_affine.zero_point_dtype": "int32",
                "dequantize_affine.output_dtype": "float32",
                "_dequantize_affine_float8.output_dtype": "float32",
                "_dequantize_affine_floatx.output_dtype": "float32",
            },
        },
        "inputs": inputs,
        "affine": affine_cases,
        "affine_static": static_cases,
        "zero_point_domains": zpd_cases,
        "fake_quantize": fq_cases,
        "float8": f8_cases,
        "fpx_encode": fpx_encode,
        "fpx_decode": fpx_decode,
        "fpx_affine": fpx_affine,
        "aqt": aqt_cases,
    }
    path = out_path or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "torchao_primitives.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {os.path.getsize(path)} bytes; "
          + ", ".join(f"{k}={len(v)}" for k, v in out.items() if isinstance(v, list)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
