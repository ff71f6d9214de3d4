"""Generate golden vectors for quanta's AIMET-dialect affine numerics.

This script is NOT a test (its name does not start with ``test_``) and does
nothing on import.  It needs the anchor library installed, e.g. in a scratch
venv::

    python -m venv /tmp/aimet-venv
    /tmp/aimet-venv/bin/pip install torch==2.13.0      # CPU wheel first
    /tmp/aimet-venv/bin/pip install --no-deps aimet-torch
    # + the pure-python deps it imports (numpy pyyaml tqdm psutil bokeh
    #   ml_dtypes jsonschema onnx onnxscript scipy safetensors) and a stub
    #   ``torchvision`` package (only imported, never used here)
    /tmp/aimet-venv/bin/python tests/golden/generate_aimet_affine.py

It writes ``aimet_affine.json`` next to itself (or to the path given as the
first argument).

Float encoding: every float is a string accepted by ``float.fromhex`` (hex
float with trailing mantissa zeros stripped, or ``inf``/``-inf``/``nan``).
All values are exactly representable in float64, so
``torch.tensor([float.fromhex(v) for v in values], dtype=float64).to(dtype)``
reproduces the exact tensor (float16 / bfloat16 / float32 alike).  Signed
zeros are preserved (``-0x0p+0``).

Path: AIMET's functional ``quantize_dequantize`` takes a fast path through
``torch.fake_quantize_per_{tensor,channel}_affine`` (computes ``x * (1/s)``)
whenever no block_size is given and neither scale nor offset requires grad
(or grad mode is off).  ``output`` of every quantize_dequantize case is taken
on the DIVISION path (``QuantDequantFunc``: ``round(x / s)``), forced by
passing a scale with ``requires_grad=True``.  ``output_nograd`` records what
AIMET returns with a plain scale (fast path where applicable; the field
``nograd_path`` says which path was taken), or the string ``"same"`` when it
equals ``output`` bit for bit.  ``quantize`` and ``dequantize``
have a single path (division / ``(q + o) * s``).
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
    h = float(v).hex()  # e.g. '-0x1.1111120000000p-4'
    mant, exp = h.split("p")
    if "." in mant:
        mant = mant.rstrip("0").rstrip(".")
    return f"{mant}p{exp}"


def main(out_path: str | None = None) -> None:  # noqa: C901 - a flat list of cases
    import torch
    import aimet_torch
    import aimet_torch.v2.quantization as Q
    from aimet_torch.quantization.affine.backends import torch_builtins as tb

    A = Q.affine
    torch.manual_seed(0)

    # --- record which path AIMET took when no grad is involved -------------
    fast_hits: list[bool] = []
    _orig_fast = tb._torch_fake_quantize

    def _spy_fast(*args, **kwargs):
        ret = _orig_fast(*args, **kwargs)
        fast_hits.append(ret is not None)
        return ret

    tb._torch_fake_quantize = _spy_fast

    def dname(dt: torch.dtype) -> str:
        return str(dt).replace("torch.", "")

    def enc(t: torch.Tensor) -> dict:
        t = t.detach()
        if isinstance(t, Q.QuantizedTensorBase):
            t = t.as_subclass(torch.Tensor)
        return {
            "dtype": dname(t.dtype),
            "shape": list(t.shape),
            "values": [_hex(v) for v in t.to(torch.float64).flatten().tolist()],
        }

    def grid_of(kw: dict) -> tuple[int, int]:
        if "qmin" in kw:
            return kw["qmin"], kw["qmax"]
        if "bitwidth" in kw:
            n = 2 ** kw["bitwidth"] - 1
        else:
            n = kw["num_steps"]
        if kw.get("signed", False):
            return -math.ceil(n / 2), math.floor(n / 2)
        return 0, n

    def compute_dtype(op: str, dt: torch.dtype, qmin: int, qmax: int) -> str:
        # mirrors torch_builtins' choice of internal dtype (division path)
        internal = dt
        if not tb._is_numerically_stable(internal, qmin, qmax):
            internal = torch.float32
            if not tb._is_numerically_stable(internal, qmin, qmax):
                internal = torch.float64
        return dname(internal)

    cases: list[dict] = []

    def f32(vals) -> torch.Tensor:
        return torch.tensor(vals, dtype=torch.float64).to(torch.float32)

    def add_case(cid, op, x, scale, offset, kw=None, block_size=None, note=None):
        kw = dict(kw or {})
        case = {
            "id": cid,
            "op": op,
            "input": enc(x),
            "scale": enc(scale),
            "offset": enc(offset),
            "kwargs": kw,
            "block_size": list(block_size) if block_size is not None else None,
        }
        if op != "dequantize":
            qmin, qmax = grid_of(kw)
            case["qmin"], case["qmax"] = qmin, qmax
            case["compute_dtype"] = compute_dtype(op, x.dtype, qmin, qmax)
        else:
            case["compute_dtype"] = dname(x.dtype)
        if note:
            case["note"] = note
        extra = {} if block_size is None else {"block_size": tuple(block_size)}
        try:
            if op == "quantize_dequantize":
                s_req = scale.clone().requires_grad_(True)
                with torch.enable_grad():
                    fast_hits.clear()
                    out = A.quantize_dequantize(x, s_req, offset, **kw, **extra)
                    assert not any(fast_hits)
                case["path"] = "division"
                fast_hits.clear()
                out_ng = A.quantize_dequantize(x, scale, offset, **kw, **extra)
                case["nograd_path"] = (
                    "fake_quantize(x*(1/s))" if any(fast_hits) else "division"
                )
                if torch.equal(out_ng, out.detach()) or (
                    torch.equal(out_ng.isnan(), out.isnan())
                    and torch.equal(out_ng.nan_to_num(), out.detach().nan_to_num())
                    and torch.equal(out_ng.signbit(), out.detach().signbit())
                ):
                    case["output_nograd"] = "same"
                else:
                    case["output_nograd"] = enc(out_ng)
            elif op == "quantize":
                out = A.quantize(x, scale, offset, **kw, **extra)
                case["path"] = "division"
            elif op == "dequantize":
                out = A.dequantize(x, scale, offset, **extra)
                case["path"] = "(q+o)*s"
            else:
                raise ValueError(op)
            case["output"] = enc(out)
        except Exception as e:  # record AIMET's error instead of values
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
        return case

    def edge_inputs(s: float, o: float, qmin: int, qmax: int, n_extra: int, seed: int):
        """Ties, clamp edges ±0.5 step, huge/tiny, ±0, plus random in-range."""
        s32 = float(torch.tensor(s, dtype=torch.float32))
        vals = []
        lo, hi = qmin + o, qmax + o  # grid in units of s (before clamp)
        # exact/near ties inside the grid
        for k in [lo, lo + 1, (lo + hi) // 2 - 1, (lo + hi) // 2, hi - 2, hi - 1]:
            vals.append((k + 0.5) * s32)
            vals.append((-(k + 0.5)) * s32)
        # around the clamp edges
        for k in [lo - 0.5, lo - 0.49, lo - 0.51, lo - 1.5, hi + 0.5, hi + 0.49, hi + 0.51, hi + 1.5]:
            vals.append(k * s32)
        vals += [0.0, -0.0, 1e30, -1e30, 3.0e38, -3.0e38, 1e-40, -1e-40, 1e-45, -1e-45, 1e-8, -1e-8]
        g = torch.Generator().manual_seed(seed)
        span = (hi - lo + 4) * s32
        r = (torch.rand(n_extra, generator=g, dtype=torch.float64) - 0.5) * span + (lo + hi) / 2 * s32
        vals += r.tolist()
        return f32(vals)

    # ------------------------------------------------------------------ fp32
    seed_input = torch.arange(start=-0.3, end=1.3, step=0.05)
    one15 = torch.tensor(1 / 15)
    zero = torch.tensor(0.0)
    add_case("seed001_bitwidth4", "quantize_dequantize", seed_input, one15, zero, {"bitwidth": 4})
    add_case("seed001_num_steps15", "quantize_dequantize", seed_input, one15, zero, {"num_steps": 15, "signed": False})
    add_case("seed001_qmin0_qmax15", "quantize_dequantize", seed_input, one15, zero, {"qmin": 0, "qmax": 15})
    add_case("seed001_quantize_bitwidth4", "quantize", seed_input, one15, zero, {"bitwidth": 4})
    add_case("seed001_num_steps_without_signed", "quantize_dequantize", seed_input, one15, zero, {"num_steps": 15},
             note="AIMET 2.42 raises KeyError('signed'); DESIGN says quanta defaults signed=False")

    per_tensor = [
        # id, scale, offset, kwargs
        ("pt_s0p25_int8", 0.25, 0.0, {"bitwidth": 8, "signed": True}),
        ("pt_s1_15_uint4", 1 / 15, 0.0, {"bitwidth": 4, "signed": False}),
        ("pt_s0p1_uint8_o-128", 0.1, -128.0, {"bitwidth": 8, "signed": False}),
        ("pt_s0p0137_steps255_o-85", 0.0137, -85.0, {"num_steps": 255, "signed": False}),
        ("pt_s0p05_steps15_signed", 0.05, 0.0, {"num_steps": 15, "signed": True}),
        ("pt_s0p05_steps14_signed", 0.05, 0.0, {"num_steps": 14, "signed": True}),
        ("pt_s0p3_qmin-5_qmax10_o2", 0.3, 2.0, {"qmin": -5, "qmax": 10}),
        ("pt_s1_3_uint16_o-30000", 1 / 3, -30000.0, {"bitwidth": 16, "signed": False}),
        ("pt_s0p7_int2", 0.7, 0.0, {"bitwidth": 2, "signed": True}),
        ("pt_s0p5_uint1", 0.5, 0.0, {"bitwidth": 1}),
        ("pt_s1e-7_int8", 1.1920928955078125e-07, 0.0, {"bitwidth": 8, "signed": True}),
        ("pt_s3e4_int8", 30000.0, 0.0, {"bitwidth": 8, "signed": True}),
        ("pt_s0p1_uint8_o-3p25_nonint", 0.1, -3.25, {"bitwidth": 8}),
    ]
    for i, (cid, s, o, kw) in enumerate(per_tensor):
        qmin, qmax = grid_of(kw)
        x = edge_inputs(s, o, qmin, qmax, 64 - 32, seed=100 + i)
        st, ot = torch.tensor(s, dtype=torch.float32), torch.tensor(o, dtype=torch.float32)
        add_case(cid + "_qdq", "quantize_dequantize", x, st, ot, kw)
        add_case(cid + "_q", "quantize", x, st, ot, kw)
        q = A.quantize(x, st, ot, **kw) if qmax - qmin < 2**24 else torch.round(x / st)
        dq_in = torch.cat([q[:24], f32([qmin, qmax, qmin - 3, qmax + 3, 0.5, -0.0, 1e30, -1e-40])])
        add_case(cid + "_dq", "dequantize", dq_in, st, ot)
    # 32-bit grid: fp32 input is computed in float64 for qdq; quantize refuses
    x32 = f32([0.0, -0.0, 1.5, 2.5, -2.5, 1e9, -1e9, 2.1e9, -2.2e9, 3e38, 123456.75, -7.5e-3])
    add_case("pt_int32_qdq", "quantize_dequantize", x32, torch.tensor(0.5), zero, {"bitwidth": 32, "signed": True})
    add_case("pt_int32_q", "quantize", x32, torch.tensor(0.5), zero, {"bitwidth": 32, "signed": True})
    xs = f32([float("inf"), float("-inf"), float("nan"), 1.0, -1.0])
    add_case("pt_special_inf_nan_qdq", "quantize_dequantize", xs, torch.tensor(0.1), torch.tensor(-128.0), {"bitwidth": 8},
             note="inf/nan behaviour of AIMET (nan propagates through clamp on the division path)")
    add_case("pt_special_inf_nan_q", "quantize", xs, torch.tensor(0.1), torch.tensor(-128.0), {"bitwidth": 8})

    # per-channel: scale (C, 1)
    g = torch.Generator().manual_seed(7)
    xc = torch.cat([
        (torch.randn(4, 6, generator=g) * 2.0),
        f32([[0.05, -0.05], [1 / 30, -1 / 30], [0.01, 12.75], [0.25, -0.25]]),
    ], dim=1)  # (4, 8)
    sc = f32([[0.1], [1 / 15], [0.02], [0.5]])
    oc_asym = f32([[0.0], [-128.0], [-7.0], [-200.0]])
    oc_sym = torch.zeros(4, 1)
    add_case("pc_uint8_asym_qdq", "quantize_dequantize", xc, sc, oc_asym, {"bitwidth": 8})
    add_case("pc_uint8_asym_q", "quantize", xc, sc, oc_asym, {"bitwidth": 8})
    add_case("pc_int8_sym_qdq", "quantize_dequantize", xc, sc, oc_sym, {"bitwidth": 8, "signed": True})
    add_case("pc_int4_sym_q", "quantize", xc, sc, oc_sym, {"bitwidth": 4, "signed": True})
    add_case("pc_steps15_signed_qdq", "quantize_dequantize", xc, sc, oc_sym, {"num_steps": 15, "signed": True})
    add_case("pc_qmin-3_qmax12_qdq", "quantize_dequantize", xc, sc, oc_asym.clamp(-12, 3), {"qmin": -3, "qmax": 12})
    add_case("pc_scalar_offset_qdq", "quantize_dequantize", xc, sc, torch.tensor(-10.0), {"bitwidth": 8},
             note="per-channel scale with scalar offset: AIMET's no-grad fast path does not apply")
    add_case("pc_lastdim_scale8_qdq", "quantize_dequantize", xc, torch.linspace(0.01, 0.4, 8), torch.zeros(8),
             {"bitwidth": 8, "signed": True})
    add_case("pc_uint8_asym_dq", "dequantize", A.quantize(xc, sc, oc_asym, bitwidth=8), sc, oc_asym)

    # per-block
    xb = torch.cat([
        (torch.arange(-16, 16) / 32).view(4, 8),
        (torch.randn(4, 8, generator=g) * 1.5),
    ], dim=0)  # (8, 8)
    sb = (torch.rand(8, 2, generator=g) * 0.05 + 0.005)
    ob = torch.round(torch.rand(8, 2, generator=g) * -255)
    for bs in [(-1, 4), (1, 4)]:
        tag = "wild" if bs[0] == -1 else "explicit"
        add_case(f"pb_{tag}_uint8_qdq", "quantize_dequantize", xb, sb, ob, {"bitwidth": 8}, block_size=bs)
        add_case(f"pb_{tag}_uint8_q", "quantize", xb, sb, ob, {"bitwidth": 8}, block_size=bs)
        add_case(f"pb_{tag}_uint8_dq", "dequantize", A.quantize(xb, sb, ob, bitwidth=8, block_size=bs), sb, ob,
                 block_size=bs)
    sb2 = f32([[0.01, 0.02], [0.03, 0.04]])
    add_case("pb_2x2_block4x4_int4_qdq", "quantize_dequantize", xb, sb2, torch.zeros(2, 2),
             {"bitwidth": 4, "signed": True}, block_size=(4, 4))
    add_case("pb_2x2_wild_wild_qmin_qdq", "quantize_dequantize", xb, sb2, f32([[-3, 0], [2, -8]]),
             {"qmin": -8, "qmax": 7}, block_size=(-1, -1))
    x3 = torch.randn(2, 4, 8, generator=g)
    s3 = torch.rand(4, 2, generator=g) * 0.02 + 0.004
    add_case("pb_3d_leading_broadcast_qdq", "quantize_dequantize", x3, s3, torch.zeros(4, 2),
             {"bitwidth": 8, "signed": True}, block_size=(-1, 4))
    add_case("pb_3d_leading_broadcast_q", "quantize", x3, s3, torch.zeros(4, 2),
             {"bitwidth": 8, "signed": True}, block_size=(-1, 4))
    add_case("pb_bad_block_size", "quantize_dequantize", xb, sb, ob, {"bitwidth": 8}, block_size=(-1, 3),
             note="block size does not divide: AIMET raises")

    # ------------------------------------------------------------ fp16 / bf16
    for dt in [torch.float16, torch.bfloat16]:
        dn = dname(dt)
        xh = edge_inputs(0.0137, -85.0, 0, 255, 20, seed=300).to(dt)
        st, ot = torch.tensor(0.0137), torch.tensor(-85.0)
        add_case(f"{dn}_pt_uint8_qdq", "quantize_dequantize", xh, st, ot, {"bitwidth": 8})
        add_case(f"{dn}_pt_uint8_q", "quantize", xh, st, ot, {"bitwidth": 8})
        add_case(f"{dn}_pt_uint8_dq", "dequantize", f32([0, 1, 17, 84, 85, 86, 128, 254, 255]).to(dt), st, ot)
        xh4 = edge_inputs(1 / 15, 0.0, -8, 7, 20, seed=301).to(dt)
        add_case(f"{dn}_pt_int4_qdq", "quantize_dequantize", xh4, one15, zero, {"bitwidth": 4, "signed": True})
        add_case(f"{dn}_pt_int4_q", "quantize", xh4, one15, zero, {"bitwidth": 4, "signed": True})
        add_case(f"{dn}_pt_uint16_qdq", "quantize_dequantize", xh, torch.tensor(1e-4), torch.tensor(-30000.0),
                 {"bitwidth": 16})
        add_case(f"{dn}_pt_uint16_q", "quantize", xh, torch.tensor(1e-4), torch.tensor(-30000.0), {"bitwidth": 16})
        add_case(f"{dn}_pc_int8_qdq", "quantize_dequantize", xc.to(dt), sc, oc_sym, {"bitwidth": 8, "signed": True})
        add_case(f"{dn}_pc_uint8_q", "quantize", xc.to(dt), sc, oc_asym, {"bitwidth": 8})
        add_case(f"{dn}_pb_uint8_qdq", "quantize_dequantize", xb.to(dt), sb, ob, {"bitwidth": 8}, block_size=(-1, 4))

    # -------------------------------------------------------------- gradients
    grad_cases: list[dict] = []

    def add_grad(cid, op, x, s, o, kw=None, block_size=None, seed=0):
        kw = dict(kw or {})
        extra = {} if block_size is None else {"block_size": tuple(block_size)}
        xr = x.clone().requires_grad_(True)
        sr = s.clone().requires_grad_(True)
        orq = o.clone().requires_grad_(True)
        gen = torch.Generator().manual_seed(seed)
        if op == "quantize_dequantize":
            y = A.quantize_dequantize(xr, sr, orq, **kw, **extra)
        elif op == "quantize":
            y = A.quantize(xr, sr, orq, **kw, **extra)
        else:
            y = A.dequantize(xr, sr, orq, **extra)
        up = torch.randn(y.shape, generator=gen)
        y.backward(up)
        case = {
            "id": cid, "op": op, "input": enc(x), "scale": enc(s), "offset": enc(o), "kwargs": kw,
            "block_size": list(block_size) if block_size is not None else None,
            "upstream_seed": seed, "upstream": enc(up), "output": enc(y),
            "grad_input": enc(xr.grad), "grad_scale": enc(sr.grad), "grad_offset": enc(orq.grad),
        }
        if op != "dequantize":
            case["qmin"], case["qmax"] = grid_of(kw)
        grad_cases.append(case)

    xg = edge_inputs(0.1, -128.0, 0, 255, 16, seed=500)[:-4]
    add_grad("grad_pt_uint8_qdq", "quantize_dequantize", xg, torch.tensor(0.1), torch.tensor(-128.0),
             {"bitwidth": 8}, seed=11)
    add_grad("grad_pt_int4_qdq", "quantize_dequantize", seed_input, one15, zero, {"bitwidth": 4, "signed": True},
             seed=12)
    add_grad("grad_pc_uint8_qdq", "quantize_dequantize", xc * 20, sc, oc_asym, {"bitwidth": 8}, seed=13)
    add_grad("grad_pc_int4_qdq", "quantize_dequantize", xc, sc, oc_sym, {"bitwidth": 4, "signed": True}, seed=14)
    add_grad("grad_pb_int4_qdq", "quantize_dequantize", xb, sb * 4, torch.zeros(8, 2), {"bitwidth": 4, "signed": True},
             block_size=(-1, 4), seed=15)
    # x/s overflowing to inf makes AIMET's quantize scale-grad NaN (0 * inf); keep that, plus a finite case
    add_grad("grad_pt_uint8_q", "quantize", xg, torch.tensor(0.1), torch.tensor(-128.0), {"bitwidth": 8}, seed=16)
    xg_fin = xg[xg.abs() < 1e6]
    add_grad("grad_pt_uint8_q_finite", "quantize", xg_fin, torch.tensor(0.1), torch.tensor(-128.0), {"bitwidth": 8},
             seed=19)
    add_grad("grad_pt_dq", "dequantize", A.quantize(xg, torch.tensor(0.1), torch.tensor(-128.0), bitwidth=8),
             torch.tensor(0.1), torch.tensor(-128.0), seed=17)
    add_grad("grad_pc_dq", "dequantize", A.quantize(xc, sc, oc_asym, bitwidth=8), sc, oc_asym, seed=18)

    # ---------------------------------------------------------------- modules
    module_cases: list[dict] = []

    def add_module(cid, cls, shape, bitwidth, symmetric, batches, block_size=None, test_input=None, grad_seed=None):
        kw = {"bitwidth": bitwidth, "symmetric": symmetric}
        if block_size is not None:
            kw["block_size"] = tuple(block_size)
        m = getattr(A, cls)(shape=shape, **kw)
        in_ctx = []
        with m.compute_encodings():
            for b in batches:
                in_ctx.append(m(b).detach().as_subclass(torch.Tensor))
        x = test_input if test_input is not None else batches[0]
        case = {
            "id": cid, "module": cls, "shape": list(shape), "bitwidth": bitwidth, "symmetric": symmetric,
            "block_size": list(block_size) if block_size is not None else None,
            "qmin": m.qmin, "qmax": m.qmax, "repr": repr(m),
            "batches": "input" if (len(batches) == 1 and test_input is None) else [enc(b) for b in batches],
            "min": enc(m.min), "max": enc(m.max),
            "scale": enc(m.get_scale()), "offset": enc(m.get_offset()),
            "get_min": enc(m.get_min()), "get_max": enc(m.get_max()),
            "input": enc(x),
        }
        xr = x.clone().requires_grad_(grad_seed is not None)
        y = m(xr)
        yd = y.detach().as_subclass(torch.Tensor)
        case["output"] = enc(y)  # grad mode: min/max require grad -> division path
        case["output_type"] = type(y).__name__
        with torch.no_grad():
            y_ng = m(x).as_subclass(torch.Tensor)
        case["output_nograd"] = "same" if torch.equal(y_ng, yd) else enc(y_ng)
        case["outputs_in_compute_encodings"] = [
            "same" if (torch.equal(o, yd) and test_input is None) else enc(o) for o in in_ctx
        ]
        if cls == "QuantizeDequantize":
            case["quantized"] = enc(y.quantize())
        case["quantized_repr_dtype"] = dname(y.quantized_repr().dtype)
        if grad_seed is not None:
            up = torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed))
            y.backward(up)
            case["upstream_seed"] = grad_seed
            case["upstream"] = enc(up)
            case["grad_input"] = enc(xr.grad)
            case["grad_min"] = enc(m.min.grad)
            case["grad_max"] = enc(m.max.grad)
        module_cases.append(case)

    gm = torch.Generator().manual_seed(21)
    xm = torch.randn(4, 8, generator=gm) * torch.tensor([[0.5], [1.0], [2.0], [4.0]]) + torch.tensor([[0.0], [0.3], [-1.0], [2.5]])
    xm2 = torch.randn(4, 8, generator=gm) * 1.5
    for bw in (4, 8):
        for sym in (False, True):
            tag = f"{'sym' if sym else 'asym'}_bw{bw}"
            add_module(f"qdq_pt_{tag}", "QuantizeDequantize", (), bw, sym, [xm], grad_seed=40 + bw + sym)
            add_module(f"qdq_pc_{tag}", "QuantizeDequantize", (4, 1), bw, sym, [xm], grad_seed=50 + bw + sym)
    add_module("qdq_pt_asym_bw8_two_batches", "QuantizeDequantize", (), 8, False, [xm, xm2], test_input=xm2)
    add_module("qdq_pc_sym_bw8_two_batches", "QuantizeDequantize", (4, 1), 8, True, [xm, xm2], test_input=xm2)
    add_module("qdq_pb_sym_bw4", "QuantizeDequantize", (4, 2), 4, True, [xm], block_size=(-1, 4), grad_seed=60)
    add_module("qdq_pb_asym_bw8", "QuantizeDequantize", (4, 2), 8, False, [xm], block_size=(1, 4))
    degenerate = {
        "zeros": torch.zeros(8),
        "positive": f32([0.5, 1.0, 1.5, 2.0, 3.0, 0.25, 0.75, 2.5]),
        "negative": f32([-0.5, -1.0, -1.5, -2.0, -3.0, -0.25, -0.75, -2.5]),
        "constant": torch.full((8,), 0.7),
        "tiny": f32([1e-9, -2e-9, 3e-10, 0.0, 5e-9, -1e-9, 0.0, 2e-9]),
    }
    for name, xd in degenerate.items():
        for sym in (False, True):
            for bw in (4, 8):
                add_module(f"qdq_pt_degenerate_{name}_{'sym' if sym else 'asym'}_bw{bw}", "QuantizeDequantize", (),
                           bw, sym, [xd])
    add_module("q_pt_asym_bw8", "Quantize", (), 8, False, [xm])
    add_module("q_pc_sym_bw8", "Quantize", (4, 1), 8, True, [xm])
    add_module("q_pc_sym_bw4", "Quantize", (4, 1), 4, True, [xm])

    # seed 002 per-channel / per-block examples (exact)
    w = (torch.arange(-32, 32) / 64).view(8, 8).transpose(0, 1).contiguous()
    add_module("seed002_per_channel", "QuantizeDequantize", (8, 1), 8, True, [w])
    wb = torch.cat([(torch.arange(-16, 16) / 32).view(4, 8).transpose(0, 1),
                    (torch.arange(-16, 16) / 16).view(4, 8).transpose(0, 1)], dim=1).contiguous()
    add_module("seed002_per_block", "QuantizeDequantize", (8, 2), 8, True, [wb], block_size=(-1, 4))

    # set_range cases
    setrange_cases = []
    for cls, sym, bw, mn, mx in [("QuantizeDequantize", False, 8, -1.0, 2.0), ("QuantizeDequantize", True, 8, -1.0, 2.0),
                                 ("QuantizeDequantize", False, 8, -10.0, 41.0), ("Quantize", True, 8, -12.8, 12.7),
                                 ("QuantizeDequantize", False, 4, 0.0, 0.0), ("QuantizeDequantize", False, 8, 0.3, 0.9),
                                 ("QuantizeDequantize", False, 8, -0.9, -0.3), ("QuantizeDequantize", True, 4, 2.0, -1.0)]:
        m = getattr(A, cls)(shape=(), bitwidth=bw, symmetric=sym)
        m.set_range(mn, mx)
        xin = f32([-12.0, -1.2, -0.5, -0.05, 0.0, 0.39, 0.5, 1.01, 2.0, 3.521, 9.41, 51.0])
        y = m(xin)
        setrange_cases.append({
            "id": f"set_range_{cls}_{'sym' if sym else 'asym'}_bw{bw}_{mn}_{mx}", "module": cls, "shape": [],
            "bitwidth": bw, "symmetric": sym, "set_range": [_hex(float(torch.tensor(mn))), _hex(float(torch.tensor(mx)))],
            "min": enc(m.min), "max": enc(m.max), "scale": enc(m.get_scale()), "offset": enc(m.get_offset()),
            "get_min": enc(m.get_min()), "get_max": enc(m.get_max()),
            "input": enc(xin), "output": enc(y),
        })

    tb._torch_fake_quantize = _orig_fast

    doc = {
        "meta": {
            "generator": "tests/golden/generate_aimet_affine.py",
            "aimet_torch_version": getattr(aimet_torch, "__version__", "2.42.0"),
            "torch_version": torch.__version__,
            "float_encoding": "float.fromhex strings (exact; trailing mantissa zeros stripped; 'inf','-inf','nan')",
            "tensor_encoding": "{dtype, shape, values(row-major flat)}",
            "functional_path": "quantize_dequantize 'output' = AIMET division path (QuantDequantFunc, scale "
                               "requires grad); 'output_nograd' = AIMET with plain scale ('nograd_path' tells "
                               "whether torch.fake_quantize (x*(1/s)) or division was used)",
            "module_path": "module 'output' computed in grad mode (min/max are Parameters -> division path); "
                           "'output_nograd' under torch.no_grad (fast path for per-tensor/per-channel), "
                           "'same' when bit-identical; 'outputs_in_compute_encodings' = output of each batch "
                           "inside compute_encodings() (batch's own range), 'same' when equal to 'output'; "
                           "'batches' == 'input' means the single batch is 'input'",
            "gradient_note": "grad_scale/grad_offset are autograd sums over broadcast elements: compare with a "
                             "small tolerance (summation order); grad_input is exact",
            "errors": "cases with 'error' record AIMET's exception instead of outputs",
            "compute_dtype": "internal dtype AIMET uses on the division path: input dtype unless "
                             "eps(dtype) > 0.25/(qmax-qmin) or grid not representable, then float32, then float64",
        },
        "functional": cases,
        "gradients": grad_cases,
        "modules": module_cases,
        "set_range": setrange_cases,
    }
    out_path = out_path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "aimet_affine.json")
    with open(out_path, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
        fh.write("\n")
    print(f"wrote {out_path}: {len(cases)} functional, {len(grad_cases)} gradient, "
          f"{len(module_cases)} module, {len(setrange_cases)} set_range cases")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
