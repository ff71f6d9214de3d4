"""quanta's torchao dialect against golden vectors recorded from torchao 0.15 (torch 2.13).

``torchao_primitives.json`` is written by ``generate_torchao_primitives.py`` (needs
torchao in a scratch venv; torchao is never a dependency). Every case is checked:
bit for bit where torchao is sane, and against quanta's documented, better
behaviour where torchao is faulty (``quanta.quantization.quant_primitives``'s
module docstring lists those faults). Each fault is recognised by a predicate
below, and a test checks that the predicates pick exactly the cases they should,
so a regenerated file cannot hide a new mismatch.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch

from quanta.quantization import quant_primitives as qp
from quanta.quantization.quant_primitives import MappingType, ZeroPointDomain

GOLDEN = json.loads((pathlib.Path(__file__).parent / "torchao_primitives.json").read_text())
INPUTS = GOLDEN["inputs"]
_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}


def DT(name: str) -> torch.dtype:
    return getattr(torch, name)


def T(d):
    """Rebuild a recorded tensor exactly (float8 NaNs from their raw bits)."""
    if d is None:
        return None
    dtype = DT(d["dtype"])
    if "bits" in d:
        return torch.tensor(d["bits"], dtype=torch.uint8).view(dtype).reshape(d["shape"])
    if dtype.is_floating_point:
        vals = [float(v) if v in ("nan", "inf", "-inf") else float.fromhex(v) for v in d["values"]]
        return torch.tensor(vals, dtype=torch.float64).to(dtype).reshape(d["shape"])
    return torch.tensor(d["values"], dtype=torch.int64).to(dtype).reshape(d["shape"])


def X(case, key="input"):
    ref = case[key]
    return T(INPUTS[ref] if isinstance(ref, str) else ref)


def assert_same(got, want, what="", *, check_shape=True):
    """Same dtype, (shape,) and bits; any NaN matches a NaN unless raw float8 bits were recorded."""
    assert got is not None and want is not None, f"{what}: got {got!r}, want {want!r}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if check_shape:
        assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    else:
        assert got.numel() == want.numel(), f"{what}: {got.numel()} elements != {want.numel()}"
    g, w = got.detach().contiguous().reshape(-1), want.detach().contiguous().reshape(-1)
    if not g.dtype.is_floating_point:
        assert torch.equal(g, w), f"{what}: {g.tolist()} != {w.tolist()}"
        return
    view = _INT_VIEW[g.element_size()]
    if g.element_size() == 1:
        assert torch.equal(g.view(view), w.view(view)), f"{what}: float8 bits differ"
        return
    nan = torch.isnan(w.float())
    assert torch.equal(torch.isnan(g.float()), nan), f"{what}: NaN positions differ"
    diff = (g.view(view) != w.view(view)) & ~nan
    assert not bool(diff.any()), f"{what}: {int(diff.sum())} values differ, e.g. {g[diff][:4]} vs {w[diff][:4]}"


def _bounds(case):
    return case.get("quant_min"), case.get("quant_max")


# ============================================================== which cases are torchao faults
def _snce_unsigned(case) -> bool:
    qmin, qmax = qp._get_and_check_qmin_qmax(DT(case["target_dtype"]), *_bounds(case))
    return case["mapping_type"] == "SYMMETRIC_NO_CLIPPING_ERR" and int((qmax + qmin + 1) / 2) != 0


def affine_fault(case) -> str | None:
    cid = case["id"]
    if cid.startswith("special/nan_inf/"):
        return "non_finite_input"
    if cid in ("bounds/int8_out_of_range", "bounds/qmin_gt_qmax", "block/not_divisible", "block/wrong_rank"):
        return "bad_argument"
    if cid == "block/all_ones":
        return "all_ones_block"
    if cid.startswith(("dtype/int4/", "dtype/int2/")):
        return "sub_byte_int"
    if cid == "zp_dtype/int8/ASYMMETRIC/uint8/per_row":
        return "zero_point_overflow"
    if cid.startswith("special/extremes_2x16/") and "/ASYMMETRIC/" in cid:
        return "range_overflow"
    if _snce_unsigned(case):
        return "snce_unsigned"
    if cid.startswith(("ties/bfloat16/int16/", "ties/float16/int16/")) and "/ASYMMETRIC/" not in cid:
        return "code_wrap"
    if cid == "ties/bfloat16/int16/ASYMMETRIC/per_row":
        return "code_wrap"
    return None


STATIC_FAULTS = {
    "scale_0.1_0.3/zp_none/f32": "zero_point_none",
    "zero_scale": "nan_code",
    "int4_dtype": "sub_byte_int",
}
ZPD_FAULTS = {"FLOAT/float32/SYMMETRIC_rejected": "bad_argument"}
FLOAT8_FAULTS = {
    "zeros_2x16/float32/float8_e4m3fn/per_row": "zero_block",
    "zeros_2x16/float32/float8_e5m2/per_row": "zero_block",
    "nan_inf_2x16/float32/float8_e4m3fn/per_row": "non_finite_input",
    "nan_inf_2x16/float32/float8_e5m2/per_row": "non_finite_input",
    "static_scale_zero/e4m3fn": "zero_scale",
    "extremes_2x16/bfloat16/float8_e5m2/per_row": "scale_underflow",
    "extremes_2x16/float16/float8_e5m2/per_row": "scale_underflow",
}
FPX_ENCODE_FAULT = "nan_input"  # every fpx_encode case holds NaN inputs: quanta raises, other values bit-exact


def _split(cases, faults):
    ok = [c for c in cases if faults(c) is None]
    bad = [c for c in cases if faults(c) is not None]
    return ok, bad


AFFINE_OK, AFFINE_FAULTS = _split(GOLDEN["affine"], affine_fault)
STATIC_OK, STATIC_BAD = _split(GOLDEN["affine_static"], lambda c: STATIC_FAULTS.get(c["id"]))
ZPD_OK, ZPD_BAD = _split(GOLDEN["zero_point_domains"], lambda c: ZPD_FAULTS.get(c["id"]))
F8_OK, F8_BAD = _split(GOLDEN["float8"], lambda c: FLOAT8_FAULTS.get(c["id"]))


def ids(cases):
    return [c["id"] for c in cases]


def test_fault_predicates_pick_exactly_the_known_faults():
    """The deviations are the documented ones, and every torchao error is among them."""
    kinds = {}
    for c in AFFINE_FAULTS:
        kinds.setdefault(affine_fault(c), []).append(c["id"])
    assert sorted(kinds) == ["all_ones_block", "bad_argument", "code_wrap", "non_finite_input", "range_overflow",
                             "snce_unsigned", "sub_byte_int", "zero_point_overflow"]
    assert len(kinds["non_finite_input"]) == 6 and len(kinds["sub_byte_int"]) == 4
    assert len(kinds["range_overflow"]) == 6
    errored = {c["id"] for c in GOLDEN["affine"] if "error" in c or "error" in (c.get("q") or {})}
    assert errored <= {c["id"] for c in AFFINE_FAULTS}
    for section, faults in (("affine_static", STATIC_FAULTS), ("zero_point_domains", ZPD_FAULTS),
                            ("float8", FLOAT8_FAULTS)):
        present = {c["id"] for c in GOLDEN[section]}
        assert set(faults) <= present, section
        assert {c["id"] for c in GOLDEN[section] if "error" in c} <= set(faults), section
    assert all(any(v == "nan" for v in INPUTS[c["input"]]["values"]) for c in GOLDEN["fpx_encode"])


# ============================================================== affine (INT domain)
def _choose(case, x=None, **extra):
    kw = {}
    if "eps" in case and case["eps"] is not None:
        kw["eps"] = float.fromhex(case["eps"])
    if "scale_dtype" in case:
        kw["scale_dtype"] = DT(case["scale_dtype"])
    if "zero_point_dtype" in case:
        kw["zero_point_dtype"] = DT(case["zero_point_dtype"])
    kw.update(extra)
    return qp.choose_qparams_affine(X(case) if x is None else x, MappingType[case["mapping_type"]],
                                    tuple(case["block_size"]), DT(case["target_dtype"]), *_bounds(case), **kw)


def _expand(t, shape, block):
    t = t.reshape([n // b for n, b in zip(shape, block)])
    for i, b in enumerate(block):
        if b > 1:
            t = t.repeat_interleave(b, dim=i)
    return t


def _dq_formula(q, s, z, block):
    """torchao's documented dequantize: float32(float32(q - zp) * float32(scale)) (checked by the generator)."""
    shape = list(q.shape)
    ref = q.to(torch.float32)
    if z is not None:
        ref = ref - _expand(z.to(torch.float32), shape, block)
    return ref * _expand(s.to(torch.float32), shape, block)


@pytest.mark.parametrize("case", AFFINE_OK, ids=ids(AFFINE_OK))
def test_affine_matches_torchao(case):
    block, tdt = tuple(case["block_size"]), DT(case["target_dtype"])
    s, z = _choose(case)
    assert_same(s, T(case["scale"]), "scale")
    assert_same(z, T(case["zero_point"]), "zero_point")
    q = qp.quantize_affine(X(case), block, s, z, tdt, *_bounds(case))
    assert_same(q, T(case["q"]), "q")
    dq = qp.dequantize_affine(q, block, s, z, tdt, *_bounds(case))
    want = T(case["dq"]) if "dq" in case else _dq_formula(T(case["q"]), T(case["scale"]), T(case["zero_point"]),
                                                           block)
    assert_same(dq, want, "dq")
    if "dq_out" in case:
        out = qp.dequantize_affine(q, block, s, z, tdt, *_bounds(case), output_dtype=DT(case["dq_output_dtype"]))
        assert_same(out, T(case["dq_out"]), "dq_out")


def _blocks(x, block):
    """A 2-D input as (number of blocks, elements per block)."""
    (n0, n1), (b0, b1) = x.shape, block
    return x.reshape(n0 // b0, b0, n1 // b1, b1).permute(0, 2, 1, 3).reshape(-1, b0 * b1)


def _no_clipping(x, block, s, z, tdt, qmin, qmax):
    """Every code lands on the grid before clamping, and the error is at most half a step."""
    _, inside = qp.fake_quantize_affine_cachemask(x.float(), block, s.float(), z, tdt, qmin, qmax)
    assert bool(inside.all())
    q = qp.quantize_affine(x.float(), block, s.float(), z, tdt, qmin, qmax)
    dq = qp.dequantize_affine(q, block, s.float(), z, tdt, qmin, qmax, output_dtype=torch.float64)
    step = _expand(s.double(), list(x.shape), block)
    assert bool(((dq - x.double()).abs() <= step / 2 * (1 + 1e-5)).all())


@pytest.mark.parametrize("case", AFFINE_FAULTS, ids=ids(AFFINE_FAULTS))
def test_affine_torchao_faults_are_fixed(case):
    kind = affine_fault(case)
    block, tdt = tuple(case["block_size"]), DT(case["target_dtype"])
    x = X(case)
    if kind == "non_finite_input":  # torchao: NaN/inf scales, then arbitrary codes
        with pytest.raises(ValueError, match="NaN or inf"):
            _choose(case)
    elif kind == "bad_argument":  # torchao: AssertionError, or silent nonsense for quant_min > quant_max
        match = {"bounds/int8_out_of_range": "below the smallest", "bounds/qmin_gt_qmax": "less than quant_max",
                 "block/not_divisible": "does not divide", "block/wrong_rank": "one entry per input dimension"}
        with pytest.raises(ValueError, match=match[case["id"]]):
            _choose(case)
    elif kind == "all_ones_block":  # torchao: one scale for everything, then a reshape error
        s, z = _choose(case)
        assert s.shape == x.shape and z.shape == x.shape
        per_elem = x.abs().clamp_min(torch.finfo(torch.float32).eps * 127.5) / 127.5
        assert torch.equal(s, per_elem)
        q = qp.quantize_affine(x, block, s, z, tdt)
        assert torch.equal(q == 0, x == 0) and bool((q[x != 0].int().abs() >= 127).all())  # each x at its own edge
    elif kind == "sub_byte_int":  # torchao: NotImplementedError ("copy_" not implemented for Int4)
        s, z = _choose(case)
        assert_same(s, T(case["scale"]), "scale")
        assert_same(z, T(case["zero_point"]), "zero_point")
        qmin, qmax = qp._get_and_check_qmin_qmax(tdt, None, None)
        q = qp.quantize_affine(x, block, s, z, tdt)
        assert q.dtype == torch.int8
        assert torch.equal(q, qp.quantize_affine(x, block, s, z, torch.int8, qmin, qmax))
    elif kind == "zero_point_overflow":  # torchao: 150 silently wraps to -106 in int8
        with pytest.raises(ValueError, match="do not fit zero_point_dtype"):
            _choose(case)
    elif kind == "range_overflow":  # torchao: max - min overflows, scale inf, every code qmin
        s, z = _choose(case)
        want_s = T(case["scale"])
        finite = torch.isfinite(want_s)
        assert not bool(finite.all()) and bool(torch.isfinite(s).all())
        assert_same(s[finite], want_s[finite], "scale of the rows torchao gets right")
        assert_same(z[finite], T(case["zero_point"])[finite], "zero point of the rows torchao gets right")
        q = qp.quantize_affine(x, block, s, z, tdt)
        qmin, qmax = qp._get_and_check_qmin_qmax(tdt, None, None)
        row, qrow = x[~finite][0], q[~finite][0]
        assert int(qrow[row.argmin()]) == qmin and int(qrow[row.argmax()]) >= qmax - 1  # the whole grid is used
        dq = qp.dequantize_affine(q, block, s, z, tdt, output_dtype=torch.float64)[~finite][0]
        assert bool(((dq - row.double()).abs() <= s[~finite][0].double()).all())
    elif kind == "code_wrap":  # torchao: bf16/fp16 codes round to 32768, the int16 cast wraps it to -32768
        s, z = _choose(case)
        assert_same(s, T(case["scale"]), "scale")
        assert_same(z, T(case["zero_point"]), "zero_point")
        q = qp.quantize_affine(x, block, s, z, tdt, *_bounds(case))
        want = T(case["q"])
        wrapped = (q != want)
        assert bool(wrapped.any())
        assert bool((q[wrapped] == 32767).all() & (want[wrapped] == -32768).all() & (x[wrapped] > 0).all())
    elif kind == "snce_unsigned":  # torchao divides by qmin = 0 and clips everything above max/2
        s, z = _choose(case)
        qmin, qmax = qp._get_and_check_qmin_qmax(tdt, *_bounds(case))
        zp = int((qmax + qmin + 1) / 2)
        assert bool((z == zp).all())
        xb = _blocks(x.float(), block)
        mn, mx = xb.amin(1).clamp_max(0), xb.amax(1).clamp_min(0)
        want = torch.maximum(mn / (qmin - zp), mx / (qmax - zp)).clamp_min(torch.finfo(x.dtype).eps)
        torch.testing.assert_close(s.float().reshape(-1), want, rtol=2**-7, atol=0)
        _no_clipping(x, block, s, z, tdt, qmin, qmax)
    else:  # pragma: no cover
        raise AssertionError(kind)


# ============================================================== static qparams
@pytest.mark.parametrize("case", STATIC_OK, ids=ids(STATIC_OK))
def test_static_quantize_matches_torchao(case):
    block, tdt = tuple(case["block_size"]), DT(case["target_dtype"])
    s, z = T(case["scale"]), T(case["zero_point"])
    q = qp.quantize_affine(X(case), block, s, z, tdt, *_bounds(case))
    assert_same(q, T(case["q"]), "q")
    dq = qp.dequantize_affine(q, block, s, z, tdt, *_bounds(case), output_dtype=DT(case["dq_output_dtype"]))
    assert_same(dq, T(case["dq"]), "dq")


@pytest.mark.parametrize("case", STATIC_BAD, ids=ids(STATIC_BAD))
def test_static_torchao_faults_are_fixed(case):
    kind = STATIC_FAULTS[case["id"]]
    block, tdt, x = tuple(case["block_size"]), DT(case["target_dtype"]), X(case)
    s, z = T(case["scale"]), T(case["zero_point"])
    if kind == "zero_point_none":  # torchao: TypeError (Tensor + None)
        q = qp.quantize_affine(x, block, s, None, tdt)
        assert torch.equal(q, qp.quantize_affine(x, block, s, torch.zeros(2, dtype=torch.int32), tdt))
        assert torch.equal(qp.dequantize_affine(q, block, s, None, tdt), _dq_formula(q, s, None, block))
    elif kind == "nan_code":  # torchao: 0 * inf = NaN, cast to an arbitrary integer (0 here)
        with pytest.raises(ValueError, match="NaN"):
            qp.quantize_affine(x, block, s, z, tdt)
        q = qp.quantize_affine(x[1:], block, s[1:], z[1:], tdt)  # the row with a real scale is unaffected
        assert_same(q, T(case["q"])[1:], "q")
    elif kind == "sub_byte_int":
        q = qp.quantize_affine(x, block, s, z, tdt)
        assert q.dtype == torch.int8 and torch.equal(q, qp.quantize_affine(x, block, s, z, torch.int8, -8, 7))
    else:  # pragma: no cover
        raise AssertionError(kind)


# ============================================================== zero-point domains
@pytest.mark.parametrize("case", ZPD_OK, ids=ids(ZPD_OK))
def test_zero_point_domains_match_torchao(case):
    domain = ZeroPointDomain[case["zero_point_domain"]]
    block, tdt, x = tuple(case["block_size"]), DT(case["target_dtype"]), X(case)
    kw = {"eps": None if case["eps"] is None else float.fromhex(case["eps"])}
    zdt = None if case["zero_point_dtype"] is None else DT(case["zero_point_dtype"])
    if domain is ZeroPointDomain.FLOAT:
        s, z = qp._choose_qparams_affine_tinygemm(x, MappingType[case["mapping_type"]], block, tdt,
                                                  *_bounds(case), zero_point_dtype=zdt, **kw)
    else:
        s, z = qp.choose_qparams_affine(x, MappingType[case["mapping_type"]], block, tdt, *_bounds(case),
                                        zero_point_dtype=zdt, preserve_zero=case["preserve_zero"],
                                        zero_point_domain=domain, **kw)
    assert_same(s, T(case["scale"]), "scale")
    if case["zero_point"] is None:
        assert z is None
    else:
        assert_same(z, T(case["zero_point"]), "zero_point")
    q = qp.quantize_affine(x, block, s, z, tdt, *_bounds(case), zero_point_domain=domain)
    assert_same(q, T(case["q"]), "q")
    dq = qp.dequantize_affine(q, block, s, z, tdt, *_bounds(case), zero_point_domain=domain)
    assert_same(dq, T(case["dq"]), "dq")
    if "dq_out" in case:
        out = qp.dequantize_affine(q, block, s, z, tdt, *_bounds(case), zero_point_domain=domain,
                                   output_dtype=DT(case["dq_output_dtype"]))
        assert_same(out, T(case["dq_out"]), "dq_out")


def test_zero_point_domain_float_rejects_symmetric():
    (case,) = [c for c in GOLDEN["zero_point_domains"] if c["id"] == "FLOAT/float32/SYMMETRIC_rejected"]
    with pytest.raises(ValueError, match="only supported for MappingType.ASYMMETRIC"):
        qp.choose_qparams_affine(X(case), MappingType.SYMMETRIC, (1, 16), torch.int32, 0, 15,
                                 preserve_zero=False, zero_point_domain=ZeroPointDomain.FLOAT)
    with pytest.raises(ValueError, match="ASYMMETRIC"):
        qp._choose_qparams_affine_tinygemm(X(case), MappingType.SYMMETRIC, (1, 16), torch.int32, 0, 15)


# ============================================================== fake quantize
@pytest.mark.parametrize("case", GOLDEN["fake_quantize"], ids=ids(GOLDEN["fake_quantize"]))
def test_fake_quantize_matches_torchao(case):
    domain = ZeroPointDomain[case["zero_point_domain"]]
    block, qdt, x = tuple(case["block_size"]), DT(case["quant_dtype"]), X(case)
    if domain is ZeroPointDomain.FLOAT:
        s, z = qp._choose_qparams_affine_tinygemm(x, MappingType[case["mapping_type"]], block, qdt, *_bounds(case))
    else:
        s, z = qp.choose_qparams_affine(x, MappingType[case["mapping_type"]], block, qdt, *_bounds(case),
                                        zero_point_domain=domain)
    assert_same(s, T(case["scale"]), "scale")
    if case["zero_point"] is None:
        assert z is None
    else:
        assert_same(z, T(case["zero_point"]), "zero_point")
    fq = qp._fake_quantize_affine(x, block, s, z, qdt, *_bounds(case), zero_point_domain=domain)
    assert_same(fq, T(case["fq"]), "fq")
    fq2, mask = qp._fake_quantize_affine_cachemask(x, block, s, z, qdt, *_bounds(case), zero_point_domain=domain)
    assert case["cachemask_fq_equal"] and torch.equal(fq2, fq)
    # torchao's mask tests the clamped code and is always all true; quanta's marks the clamped codes
    assert case["cachemask_mask_all_true"]
    qmin, qmax = qp._get_and_check_qmin_qmax(qdt, *_bounds(case))
    sx = _expand(s, list(x.shape), block)
    if domain is ZeroPointDomain.FLOAT:
        code = torch.round((x - (_expand(z, list(x.shape), block) - sx * ((qmax + qmin + 1) / 2))) / sx)
    else:
        code = torch.round(x * (1.0 / sx)) + (0 if z is None else _expand(z, list(x.shape), block))
    assert torch.equal(mask, (code >= qmin) & (code <= qmax))


# ============================================================== float8
def _f8_scale(case):
    if case.get("static"):
        return T(case["scale"])
    return qp._choose_scale_float8(X(case), case["block_size"], DT(case["float8_dtype"]))


@pytest.mark.parametrize("case", F8_OK, ids=ids(F8_OK))
def test_float8_matches_torchao(case):
    fdt = DT(case["float8_dtype"])
    s = _f8_scale(case)
    assert_same(s, T(case["scale"]), "scale")
    q = qp._quantize_affine_float8(X(case), s, fdt)
    assert_same(q, T(case["q"]), "q")
    dq = qp._dequantize_affine_float8(q, s)
    if "dq" in case:
        assert_same(dq, T(case["dq"]), "dq")
    else:
        want = T(case["q"]).to(torch.float32) * _expand(T(case["scale"]), list(q.shape),
                                                         [n // m for n, m in zip(q.shape, s.shape)]
                                                         if s.dim() else list(q.shape))
        assert_same(dq, want, "dq")
    if "dq_out" in case:
        assert_same(qp._dequantize_affine_float8(q, s, DT(case["dq_output_dtype"])), T(case["dq_out"]), "dq_out")


@pytest.mark.parametrize("case", F8_BAD, ids=ids(F8_BAD))
def test_float8_torchao_faults_are_fixed(case):
    kind = FLOAT8_FAULTS[case["id"]]
    fdt, x = DT(case["float8_dtype"]), X(case)
    if kind == "zero_block":  # torchao: scale 0, codes and dequantized values NaN
        assert bool(torch.isnan(T(case["q"]).float()).all())
        s = qp._choose_scale_float8(x, case["block_size"], fdt)
        assert torch.equal(s, torch.ones(2, 1))
        q = qp._quantize_affine_float8(x, s, fdt)
        assert q.dtype == fdt and bool((q.float() == 0).all())
        assert torch.equal(torch.signbit(q.float()), torch.signbit(x))  # -0.0 stays -0.0
        assert bool((qp._dequantize_affine_float8(q, s) == 0).all())
    elif kind == "non_finite_input":  # torchao: scale NaN / inf, the whole block NaN
        with pytest.raises(ValueError, match="NaN or inf"):
            qp._choose_scale_float8(x, case["block_size"], fdt)
    elif kind == "scale_underflow":  # amax / max underflows to 0 in the input dtype: torchao as a zero scale
        s = qp._choose_scale_float8(x, case["block_size"], fdt)
        want = T(case["scale"])
        assert float(want[1]) == 0 and float(s[1]) == 1
        assert_same(s[:1], want[:1], "scale of the row without underflow")
        q = qp._quantize_affine_float8(x, s, fdt)
        assert_same(q[:1], T(case["q"])[:1], "q of the row without underflow")
        dq = qp._dequantize_affine_float8(q, s)
        assert not bool(torch.isnan(dq).any())
        assert bool(((dq[1] - x[1].float()).abs() <= x[1].float().abs().max()).all())
    elif kind == "zero_scale":  # torchao: x / 0 -> +-max codes, 0 / 0 -> NaN
        s = T(case["scale"])
        q = qp._quantize_affine_float8(x, s, fdt)
        assert bool((q[0].float() == 0).all())
        assert_same(q[1:], T(case["q"])[1:], "row with a nonzero scale")
        assert not bool(torch.isnan(qp._dequantize_affine_float8(q, s)).any())
    else:  # pragma: no cover
        raise AssertionError(kind)


# ============================================================== fpx
@pytest.mark.parametrize("case", GOLDEN["fpx_encode"], ids=ids(GOLDEN["fpx_encode"]))
def test_fpx_encode_matches_torchao_except_nan(case):
    x, e, m = X(case), case["ebits"], case["mbits"]
    with pytest.raises(ValueError, match="NaN"):  # torchao: a silent finite code
        qp._f32_to_floatx_unpacked(x, e, m)
    keep = ~torch.isnan(x)
    codes = qp._f32_to_floatx_unpacked(x[keep], e, m)
    assert_same(codes, T(case["codes"])[keep], "codes")
    assert_same(qp._floatx_unpacked_to_f32(codes, e, m), T(case["roundtrip"])[keep], "roundtrip")


@pytest.mark.parametrize("case", GOLDEN["fpx_decode"], ids=ids(GOLDEN["fpx_decode"]))
def test_fpx_decode_matches_torchao(case):
    assert_same(qp._floatx_unpacked_to_f32(T(case["codes"]), case["ebits"], case["mbits"]), T(case["values"]),
                "values")


@pytest.mark.parametrize("case", GOLDEN["fpx_affine"], ids=ids(GOLDEN["fpx_affine"]))
def test_fpx_affine_matches_torchao(case):
    x, e, m = X(case), case["ebits"], case["mbits"]
    s = qp._choose_qparams_affine_floatx(x, e, m)
    assert_same(s, T(case["scale"]), "scale")
    codes = qp._quantize_affine_floatx(x, s, e, m)
    assert_same(codes, T(case["codes"]), "codes")
    assert_same(qp._dequantize_affine_floatx(codes, s, e, m), T(case["dq"]), "dq")
    if "dq_out" in case:
        assert_same(qp._dequantize_affine_floatx(codes, s, e, m, DT(case["dq_output_dtype"])), T(case["dq_out"]),
                    "dq_out")


# ============================================================== AffineQuantizedTensor constructors
# The tensor subclass lives in quanta.dtypes; here each recorded constructor is replayed with the
# primitives it is made of, and its stored data, scale and zero point must come out the same.
def _aqt_intx(case, x):
    a = case["args"]
    domain = ZeroPointDomain[a.get("zero_point_domain", "INT")]
    tdt = DT(a["target_dtype"])
    block = tuple(a["block_size"])
    bounds = (a.get("quant_min"), a.get("quant_max"))
    if case["constructor"] == "from_hp_to_intx_static":
        s = torch.tensor([float.fromhex(v) for v in a["scale"]], dtype=torch.float64).to(torch.float32).to(x.dtype)
        z = None if a["zero_point"] is None else torch.tensor(a["zero_point"], dtype=torch.int32)
    else:
        eps = float.fromhex(a["eps"]) if "eps" in a else None
        zdt = x.dtype if a.get("zero_point_dtype") == "input dtype" else None
        s, z = qp.choose_qparams_affine(x, MappingType[a["mapping_type"]], block, tdt, *bounds, eps,
                                        zero_point_dtype=zdt, preserve_zero=a.get("preserve_zero", True),
                                        zero_point_domain=domain)
    q = qp.quantize_affine(x, block, s, z, tdt, *bounds, zero_point_domain=domain)
    return q, s, z, block, tdt, bounds, domain


AQT_PRIMITIVE = [c for c in GOLDEN["aqt"] if "error" not in c]
AQT_ERRORS = [c for c in GOLDEN["aqt"] if "error" in c]


@pytest.mark.parametrize("case", AQT_PRIMITIVE, ids=ids(AQT_PRIMITIVE))
def test_aqt_constructors_equal_quanta_primitives(case):
    x = X(case)
    if case["constructor"].startswith("from_hp_to_floatx"):
        fdt = DT(case["args"]["target_dtype"])
        if case["constructor"] == "from_hp_to_floatx_static":
            s = torch.tensor([[float.fromhex(v) for v in r] for r in case["args"]["scale"]],
                             dtype=torch.float64).to(torch.float32)
        else:
            s = qp._choose_scale_float8(x, case["args"]["block_size"], fdt)
        q = qp._quantize_affine_float8(x, s, fdt)
        assert_same(q, T(case["plain_data"]), "plain_data")
        assert_same(s, T(case["plain_scale"]), "plain_scale", check_shape=False)
        dq = qp._dequantize_affine_float8(q, s, DT(case["dequantize_dtype"]))
        assert_same(dq, T(case["dequantize"]), "dequantize")
        return
    q, s, z, block, tdt, bounds, domain = _aqt_intx(case, x)
    assert_same(q, T(case["plain_data"]), "plain_data")
    assert_same(s, T(case["plain_scale"]), "plain_scale")
    want_z = T(case["plain_zero_point"])
    if z is None:  # the plain layout stores a zero point of zeros when there is none
        assert want_z is None or bool((want_z == 0).all())
    else:
        assert_same(z, want_z, "plain_zero_point")
    dq = qp.dequantize_affine(q, block, s, z, tdt, *bounds, output_dtype=DT(case["dequantize_dtype"]),
                              zero_point_domain=domain)
    if "dequantize" in case:
        assert_same(dq, T(case["dequantize"]), "dequantize")
    else:
        assert case["dequantize_equals_dequantize_affine"]
        assert_same(dq, _dq_formula(q, s, z, block), "dequantize")


@pytest.mark.parametrize("case", AQT_ERRORS, ids=ids(AQT_ERRORS))
def test_aqt_constructor_errors_have_working_primitives(case):
    """torchao's constructor fails; quanta's primitives for the same request work or fail clearly."""
    x = X(case)
    if case["id"].startswith("intx/") and "int4" in case["id"]:  # torchao: "copy_" not implemented for Int4
        s, z = qp.choose_qparams_affine(x, MappingType.SYMMETRIC, (1, 16), torch.int4)
        q = qp.quantize_affine(x, (1, 16), s, z, torch.int4)
        assert q.dtype == torch.int8 and int(q.min()) >= -8 and int(q.max()) <= 7
    elif case["id"].startswith("floatx/") and "int8_rejected" in case["id"]:
        with pytest.raises(ValueError, match="float8_dtype must be one of"):
            qp._choose_scale_float8(x, (1, 16), torch.int8)
    elif case["id"].startswith("fpx/"):  # torchao's tensor-core packing needs 64x64; the primitives do not
        e, m = (int(v) for v in case["id"].rsplit("/e", 1)[1].split("m"))
        (ref,) = [c for c in GOLDEN["fpx_affine"] if c["id"] == f"e{e}m{m}/{case['input']}"]
        codes = qp._quantize_affine_floatx(x, qp._choose_qparams_affine_floatx(x, e, m), e, m)
        assert_same(codes, T(ref["codes"]), "codes")
    else:  # pragma: no cover
        raise AssertionError(case["id"])


def test_every_golden_case_is_checked():
    checked = (len(AFFINE_OK) + len(AFFINE_FAULTS) + len(STATIC_OK) + len(STATIC_BAD) + len(ZPD_OK) + len(ZPD_BAD)
               + len(GOLDEN["fake_quantize"]) + len(F8_OK) + len(F8_BAD) + len(GOLDEN["fpx_encode"])
               + len(GOLDEN["fpx_decode"]) + len(GOLDEN["fpx_affine"]) + len(AQT_PRIMITIVE) + len(AQT_ERRORS))
    total = sum(len(v) for v in GOLDEN.values() if isinstance(v, list))
    assert checked == total == 335
    assert math.isclose(len(AFFINE_OK) / len(GOLDEN["affine"]), 1, abs_tol=0.25)  # faults stay the exception
