"""AIMET encodings files (0.6.1, 1.0.0, 2.0.0): mapping, round trips, malformed input, atomic writes."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
import torch

from quanta.encodings.affine import AffineEncoding
from quanta.encodings.float import FloatEncoding
from quanta.export import encodings as E
from quanta.export import (
    EncodingDtype,
    EncodingsVersion,
    FileEncoding,
    Granularity,
    OffsetOrigin,
    encodings_to_dict,
    read_encodings,
    write_encodings,
)
from quanta.grids.affine import IntegerGrid
from quanta.grids.float import BFLOAT16, FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT16, FP4_E2M1, FP6_E3M2

V061, V100, V200 = EncodingsVersion.V0_6_1, EncodingsVersion.V1_0_0, EncodingsVersion.V2_0_0
ALL_VERSIONS = [V061, V100, V200]


def _affine(shape=(), grid=IntegerGrid(0, 255), offset=None, block_size=None, seed=0) -> AffineEncoding:
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(shape, generator=g) * 0.1 + 1e-3  # arbitrary float32 bits
    if offset is None:
        lo, hi = -grid.qmax, -grid.qmin
        offset = torch.randint(lo, hi + 1, shape, generator=g).float()
    else:
        offset = torch.full(shape, float(offset))
    return AffineEncoding(scale, offset, grid, block_size=block_size)


def _symmetric(shape=(), bits=8, seed=0, block_size=None) -> AffineEncoding:
    return _affine(shape, IntegerGrid.from_bitwidth(bits, signed=True), offset=0, block_size=block_size, seed=seed)


def _roundtrip(enc, version, *, shape=None, block_size="same", symmetric=None, param=True):
    acts, params = ({}, {"t": enc}) if param else ({"t": enc}, {})
    doc = json.loads(json.dumps(encodings_to_dict(acts, params, version)))  # through JSON text
    fe = read_encodings(doc).encodings["t"]
    shape = tuple(enc.scale.shape) if shape is None else shape
    block = enc.block_size if block_size == "same" else block_size
    if isinstance(enc, FloatEncoding):
        return fe.to_float(shape, block, enc.format)
    return fe.to_affine(shape, block, enc.grid, symmetric=symmetric)


# ---------------------------------------------------------------------------- version enum
def test_version_parse():
    assert EncodingsVersion.parse("0.6.1") is V061
    assert EncodingsVersion.parse(V200) is V200
    with pytest.raises(ValueError, match="unsupported encodings version '3.0.0'.*0.6.1, 1.0.0, 2.0.0"):
        EncodingsVersion.parse("3.0.0")


# ---------------------------------------------------------------------------- mapping, version by version
def test_0_6_1_signed_symmetric_per_channel():
    enc = AffineEncoding(torch.tensor([[0.5], [0.25]]), torch.zeros(2, 1), 8, signed=True)
    doc = encodings_to_dict({}, {"fc.weight": enc}, V061, quantizer_args={"param_bitwidth": 8})
    assert doc["version"] == "0.6.1" and doc["excluded_layers"] == [] and doc["activation_encodings"] == {}
    assert doc["quantizer_args"] == {"param_bitwidth": 8}
    assert doc["param_encodings"]["fc.weight"] == [
        {"bitwidth": 8, "dtype": "int", "is_symmetric": "True", "max": 63.5, "min": -64.0, "offset": -128,
         "scale": 0.5},
        {"bitwidth": 8, "dtype": "int", "is_symmetric": "True", "max": 31.75, "min": -32.0, "offset": -128,
         "scale": 0.25},
    ]


def test_0_6_1_unsigned_asymmetric_offset_is_quanta_offset():
    enc = AffineEncoding(torch.tensor(0.1), torch.tensor(-50.0), 8)  # zero point 50
    (entry,) = encodings_to_dict({"x": enc}, {}, V061)["activation_encodings"]["x"]
    assert entry["offset"] == -50 and entry["is_symmetric"] == "False"
    assert entry["min"] == pytest.approx(-5.0) and entry["max"] == pytest.approx(20.5)


def test_1_0_0_offsets():
    sym4 = _symmetric((3, 1), bits=4)
    asym = AffineEncoding(torch.tensor(0.1), torch.tensor(-7.0), 8)
    strict = AffineEncoding(torch.tensor([0.5]), torch.zeros(1), IntegerGrid(-127, 127))
    doc = encodings_to_dict({"a": asym}, {"w": sym4, "s": strict}, V100)
    w, s = doc["param_encodings"]
    (a,) = doc["activation_encodings"]
    assert w["offset"] == [-8, -8, -8] and w["is_sym"] is True and w["bw"] == 4 and w["enc_type"] == "PER_CHANNEL"
    assert a == {"name": "a", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 8, "is_sym": False,
                 "scale": [0.10000000149011612], "offset": [-7]}
    assert s["offset"] == [-127] and s["is_sym"] is True and s["bw"] == 8  # min = scale * offset = -127 * scale


def test_1_0_0_per_block():
    enc = _symmetric((4, 2), bits=4, block_size=(1, 8))
    (w,) = encodings_to_dict({}, {"w": enc}, V100)["param_encodings"]
    assert w["enc_type"] == "PER_BLOCK" and w["block_size"] == 8 and len(w["scale"]) == 8
    assert w["scale"] == enc.scale.reshape(-1).tolist()  # row-major: channel, then block


def test_2_0_0_entries():
    asym = AffineEncoding(torch.tensor(0.01), torch.tensor(-41.0), 8)
    sym = _symmetric((3, 1, 1, 1))
    block = _symmetric((4, 2), bits=4, block_size=(1, 8))
    u16 = AffineEncoding(torch.tensor(1e-4), torch.tensor(-30000.0), 16)
    doc = encodings_to_dict({"a": asym, "b": u16}, {"w": sym, "blk": block}, V200)
    assert set(doc) == {"producer", "version", "encodings"}
    a, b, w, blk = doc["encodings"]
    assert a == {"name": "a", "output_dtype": "uint8", "y_scale": 0.009999999776482582, "y_zero_point": 41}
    assert b["output_dtype"] == "uint16" and b["y_zero_point"] == 30000
    assert w == {"name": "w", "output_dtype": "int8", "y_scale": sym.scale.reshape(-1).tolist(), "axis": 0}
    assert "y_zero_point" not in w  # omitted when all zero
    assert blk["axis"] == 1 and blk["block_size"] == 8 and blk["output_dtype"] == "int4"
    assert blk["y_scale"] == block.scale.tolist()  # nested, the scale's shape


def test_2_0_0_float8():
    enc = FloatEncoding(torch.tensor([0.5, 0.25]), FLOAT8_E4M3FN)
    (e,) = encodings_to_dict({"x": enc}, {}, V200)["encodings"]
    assert e == {"name": "x", "output_dtype": "float8e4m3fn", "y_scale": [0.5, 0.25], "axis": 0}


def test_legacy_float_entries():
    enc = FloatEncoding(torch.tensor(1.0), FLOAT16)
    assert encodings_to_dict({"x": enc}, {}, V061)["activation_encodings"]["x"] == [{"bitwidth": 16, "dtype": "float"}]
    assert encodings_to_dict({"x": enc}, {}, V100)["activation_encodings"] == [
        {"name": "x", "dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": 16}]


def test_symmetric_flag_inferred_or_given():
    unsigned_centred = AffineEncoding(torch.tensor(0.1), torch.tensor(-128.0), 8)  # offset of a symmetric [0, 255]
    doc = encodings_to_dict({"x": unsigned_centred}, {}, V100)
    assert doc["activation_encodings"][0]["is_sym"] is True
    doc = encodings_to_dict({"x": unsigned_centred}, {}, V100, symmetric={"x": False})
    assert doc["activation_encodings"][0]["is_sym"] is False


# ---------------------------------------------------------------------------- round trips
CASES = {
    "u8_tensor": lambda: _affine(),
    "u8_offset0": lambda: _affine(offset=0),
    "s8_channel": lambda: _symmetric((16, 1, 1, 1)),
    "s8_bias": lambda: _symmetric((7,)),
    "s4_channel": lambda: _symmetric((5, 1), bits=4),
    "u16": lambda: _affine(grid=IntegerGrid(0, 65535)),
    "s16_sym": lambda: _symmetric(bits=16),
    "strict_sym": lambda: AffineEncoding(torch.tensor([[0.3], [0.2]]), torch.zeros(2, 1), IntegerGrid(-127, 127)),
    "u8_channel_asym": lambda: _affine((6, 1)),
    "s32_sym": lambda: _symmetric((3,), bits=32),
    "signed_asym": lambda: _affine((), IntegerGrid(-128, 127)),
    "u4_asym": lambda: _affine((), IntegerGrid(0, 15)),
}


@pytest.mark.parametrize("version", ALL_VERSIONS, ids=lambda v: v.value)
@pytest.mark.parametrize("case", list(CASES))
def test_affine_roundtrip_is_exact(case, version):
    enc = CASES[case]()
    back = _roundtrip(enc, version)
    assert back == enc
    assert torch.equal(back.scale, enc.scale) and back.scale.dtype == torch.float32


@pytest.mark.parametrize("version", [V100, V200], ids=lambda v: v.value)
@pytest.mark.parametrize("block", [((8, 4), (1, 16)), ((6, 4, 1, 1), (1, 8, -1, -1)), ((2, 6), (8, 1))])
def test_per_block_roundtrip(version, block):
    shape, block_size = block
    enc = _symmetric(shape, bits=4, block_size=block_size)
    assert _roundtrip(enc, version) == enc


@pytest.mark.parametrize("fmt", [FLOAT8_E4M3FN, FLOAT8_E5M2, FP4_E2M1])
def test_float_roundtrip_2_0_0(fmt):
    enc = FloatEncoding(torch.rand(4, 1) + 0.01, fmt)
    back = _roundtrip(enc, V200)
    assert back == enc


@pytest.mark.parametrize("version", [V061, V100], ids=lambda v: v.value)
@pytest.mark.parametrize("fmt", [FLOAT16, BFLOAT16, FLOAT8_E4M3FN])
def test_float_roundtrip_legacy_scale_one(version, fmt):
    enc = FloatEncoding(torch.ones(()), fmt)
    assert _roundtrip(enc, version) == enc
    # a legacy float entry has no scale: it fits any shape (scale 1 everywhere)
    assert _roundtrip(enc, version, shape=(3, 1)) == FloatEncoding(torch.ones(3, 1), fmt)


def test_float32_scales_survive_json_text():
    bits = torch.randint(0x00800000, 0x7F000000, (2000,), generator=torch.Generator().manual_seed(5))
    scale = bits.to(torch.int32).view(torch.float32).abs()  # every kind of float32 mantissa and exponent
    enc = AffineEncoding(scale, torch.zeros_like(scale), 8, signed=True)
    for version in ALL_VERSIONS:
        text = json.dumps(encodings_to_dict({}, {"w": enc}, version))
        back = read_encodings(json.loads(text)).encodings["w"]
        assert torch.equal(back.scale, scale), version


def test_read_gives_flat_scales_and_layout():
    enc = _symmetric((4, 2), bits=4, block_size=(1, 8))
    fe = read_encodings(encodings_to_dict({}, {"w": enc}, V200)).encodings["w"]
    assert fe.scale.shape == (8,) and fe.offset.shape == (8,) and fe.shape == (4, 2)
    assert (fe.axis, fe.block_size, fe.granularity) == (1, 8, Granularity.PER_BLOCK)
    assert fe.origin is OffsetOrigin.ZERO and fe.signed is True and fe.symmetric is None
    fe1 = read_encodings(encodings_to_dict({}, {"w": enc}, V100)).params["w"]
    assert fe1.origin is OffsetOrigin.GRID_MIN and fe1.symmetric is True and fe1.offset.tolist() == [-8] * 8


def test_2_0_0_entries_are_all_in_activations():
    f = read_encodings(encodings_to_dict({"a": _affine()}, {"w": _symmetric((2, 1))}, V200))
    assert set(f.activations) == {"a", "w"} and f.params == {} and set(f.encodings) == {"a", "w"}


def test_excluded_layers_and_quantizer_args_roundtrip():
    doc = encodings_to_dict({}, {}, V100, excluded_layers=["head"], quantizer_args={"activation_bitwidth": 8})
    f = read_encodings(doc)
    assert f.excluded_layers == ["head"] and f.quantizer_args == {"activation_bitwidth": 8}


# ---------------------------------------------------------------------------- what a version cannot hold
def test_write_errors_name_tensor_and_key():
    block = _symmetric((4, 2), bits=4, block_size=(1, 8))
    with pytest.raises(ValueError, match=r"encoding 'w', key 'block_size': per-block .* 0\.6\.1"):
        encodings_to_dict({}, {"w": block}, V061)
    fp8 = FloatEncoding(torch.tensor(0.01), FLOAT8_E4M3FN)
    for version in (V061, V100):
        with pytest.raises(ValueError, match=r"encoding 'x', key 'dtype': float8_e4m3fn .* write version 2\.0\.0"):
            encodings_to_dict({"x": fp8}, {}, version)
    for fmt in (FLOAT16, BFLOAT16, FP6_E3M2):
        with pytest.raises(ValueError, match=r"encoding 'x', key 'output_dtype': version 2\.0\.0 has no"):
            encodings_to_dict({"x": FloatEncoding(torch.tensor(1.0), fmt)}, {}, V200)
    six = AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), 6)
    with pytest.raises(ValueError, match=r"key 'output_dtype': no 2\.0\.0 output_dtype for the 6-bit"):
        encodings_to_dict({"x": six}, {}, V200)
    assert encodings_to_dict({"x": six}, {}, V100)["activation_encodings"][0]["bw"] == 6
    odd = AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), IntegerGrid(0, 100))
    with pytest.raises(ValueError, match=r"key 'bitwidth': grid \[0, 100\] is neither"):
        encodings_to_dict({"x": odd}, {}, V100)
    for bad in (float("nan"), -0.1, 0.0, float("inf")):
        with pytest.raises(ValueError, match=r"encoding 'x', key 'scale': scales must be finite and positive"):
            encodings_to_dict({"x": AffineEncoding(torch.tensor(bad), torch.tensor(0.0), 8)}, {}, V100)
    frac = AffineEncoding(torch.tensor(0.1), torch.tensor(-0.5), 8)
    with pytest.raises(ValueError, match=r"key 'offset': offsets must be integers"):
        encodings_to_dict({"x": frac}, {}, V100)
    two_axes = AffineEncoding(torch.rand(4, 3) + 0.1, torch.zeros(4, 3), 8, signed=True)
    with pytest.raises(ValueError, match=r"key 'scale': scale of shape \(4, 3\) varies along 2 dimensions"):
        encodings_to_dict({}, {"w": two_axes}, V200)
    with pytest.raises(ValueError, match="in both activations and params: x"):
        encodings_to_dict({"x": _affine()}, {"x": _affine()}, V100)
    with pytest.raises(ValueError, match="2.0.0 files hold only 'encodings'"):
        encodings_to_dict({}, {}, V200, excluded_layers=["a"])
    with pytest.raises(TypeError, match=r"params\['w'\] must be an AffineEncoding"):
        encodings_to_dict({}, {"w": torch.tensor(1.0)}, V100)


# ---------------------------------------------------------------------------- reading: malformed input
def _good(version: str) -> dict:
    enc, w = _affine(), _symmetric((3, 1))
    return json.loads(json.dumps(encodings_to_dict({"a": enc}, {"w": w}, version)))


def _bad(doc: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        read_encodings(doc)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="encodings file not found"):
        read_encodings(tmp_path / "nope.encodings")


def test_bad_json(tmp_path):
    p = tmp_path / "bad.encodings"
    p.write_text('{"version": "1.0.0", ')
    with pytest.raises(ValueError, match="bad.encodings is not a JSON encodings file"):
        read_encodings(p)


def test_not_an_object_and_wrong_source_type(tmp_path):
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match="top level must be a JSON object"):
        read_encodings(p)
    with pytest.raises(TypeError, match="path or a mapping"):
        read_encodings(42)


def test_loading_never_executes_code(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.encodings"
    p.write_text(f"__import__('os').system('touch {marker}')")
    with pytest.raises(ValueError, match="not a JSON encodings file"):
        read_encodings(p)
    p.write_text(json.dumps({"version": "1.0.0", "activation_encodings": [], "param_encodings": [],
                             "quantizer_args": {"__reduce__": f"os.system('touch {marker}')"}}))
    read_encodings(p)  # an odd string is just data
    assert not marker.exists()


def test_version_errors():
    doc = _good("1.0.0")
    _bad({**doc, "version": "3.0.0"}, r"key 'version': unsupported encodings version '3.0.0'")
    _bad({**doc, "version": 1.0}, r"key 'version': unsupported")
    _bad({k: v for k, v in doc.items() if k != "version"}, "key 'version' is missing")
    _bad({"format": "quanta.quantsim.encodings", "version": 1, "quantizers": {}}, "quanta save_encodings file")


def test_top_level_key_errors():
    for version, key in (("0.6.1", "param_encodings"), ("1.0.0", "activation_encodings"), ("2.0.0", "encodings")):
        doc = _good(version)
        _bad({k: v for k, v in doc.items() if k != key}, f"key '{key}' is missing")
        assert E.encodings_from_dict({**doc, "extra": 1}).extra == {"extra": 1}  # informational: kept
    _bad({**_good("1.0.0"), "activation_encodings": 3}, "'activation_encodings' must be a list")
    _bad({**_good("0.6.1"), "param_encodings": []}, "'param_encodings' must map tensor names")
    _bad({**_good("1.0.0"), "excluded_layers": "conv1"}, "'excluded_layers' must be a list of strings")
    _bad({**_good("1.0.0"), "quantizer_args": []}, "'quantizer_args' must be an object")


def _mutate(version: str, section: str, index, change) -> dict:
    doc = copy.deepcopy(_good(version))
    entry = doc[section][index]
    change(entry)
    return doc


def test_0_6_1_entry_errors():
    p = ("0.6.1", "param_encodings", "w")
    _bad(_mutate(*p, lambda e: e[0].pop("scale")), r"encoding 'w', key 'scale': missing")
    _bad(_mutate(*p, lambda e: e[1].update(scale="0.1")), r"encoding 'w', key 'scale': must be a number")
    _bad(_mutate(*p, lambda e: e[1].update(scale=float("nan"))), r"'w', key 'scale': scales must be finite")
    _bad(_mutate(*p, lambda e: e[1].update(scale=-0.1)), r"'w', key 'scale': scales must be finite and positive")
    _bad(_mutate(*p, lambda e: e[1].update(bitwidth=4)), r"'w', key 'bitwidth': channels disagree")
    _bad(_mutate(*p, lambda e: e[1].update(bitwidth=True)), r"'w', key 'bitwidth': must be an integer")
    _bad(_mutate(*p, lambda e: e[1].update(bitwidth=64)), r"'w', key 'bitwidth': must be in \[1, 32\]")
    _bad(_mutate(*p, lambda e: e[1].update(is_symmetric="yes")), r"'w', key 'is_symmetric': must be true/false")
    _bad(_mutate(*p, lambda e: e[1].update(offset=1.5)), r"'w', key 'offset': must be an integer")
    _bad(_mutate(*p, lambda e: e[1].update(dtype="fp")), r"'w', key 'dtype': must be one of 'int', 'float'")
    _bad(_mutate(*p, lambda e: e[1].update(colour="red")), r"'w', key 'colour': unknown key")
    _bad(_mutate(*p, lambda e: e[1].update(min="low")), r"'w', key 'min': must be a number")
    doc = _good("0.6.1")
    doc["param_encodings"]["w"] = []
    _bad(doc, r"encoding 'w': version 0.6.1 needs a non-empty list")
    doc["param_encodings"]["w"] = [1]
    _bad(doc, r"encoding 'w': each entry must be a JSON object")


def _entry_of(doc, name):
    for section in ("activation_encodings", "param_encodings", "encodings"):
        for i, e in enumerate(doc.get(section, [])):
            if e["name"] == name:
                return section, i
    raise KeyError(name)


def _mut(version, name, change):
    section, i = _entry_of(_good(version), name)
    return _mutate(version, section, i, change)


def test_1_0_0_entry_errors():
    _bad(_mut("1.0.0", "w", lambda e: e.pop("offset")), r"encoding 'w', key 'offset': missing")
    _bad(_mut("1.0.0", "w", lambda e: e.update(enc_type="PER_ROW")), r"'w', key 'enc_type': must be one of "
                                                                       r"PER_TENSOR, PER_CHANNEL, PER_BLOCK")
    _bad(_mut("1.0.0", "w", lambda e: e.update(enc_type="LPBQ")), r"'w', key 'block_size': missing \(a 1.0.0 LPBQ")
    _bad(_mut("1.0.0", "w", lambda e: e.update(enc_type="VECTOR")), r"'w', key 'enc_type': vector quantization")
    _bad(_mut("1.0.0", "w", lambda e: e.update(zero_point_shift=[0.5] * 3)), r"'w', key 'zero_point_shift': a zero "
                                                                               r"point shifted by half a step")
    _bad(_mut("1.0.0", "w", lambda e: e.update(offset=[-128, -128])), r"'w', key 'offset': 2 offsets for 3")
    _bad(_mut("1.0.0", "w", lambda e: e.update(scale=0.1)), r"'w', key 'scale': must be a list")
    _bad(_mut("1.0.0", "w", lambda e: e.update(scale=[])), r"'w', key 'scale': is empty")
    _bad(_mut("1.0.0", "w", lambda e: e.update(scale=[0.1, float("inf"), 0.1])), r"'w', key 'scale': scales must")
    _bad(_mut("1.0.0", "w", lambda e: e.update(scale=[0.1, 1e-50, 0.1])), r"'w', key 'scale': .*float32")
    _bad(_mut("1.0.0", "w", lambda e: e.update(is_sym="True")), r"'w', key 'is_sym': must be true or false")
    _bad(_mut("1.0.0", "w", lambda e: e.update(bw="8")), r"'w', key 'bw': must be an integer")
    _bad(_mut("1.0.0", "w", lambda e: e.update(dtype="int")), r"'w', key 'dtype': must be one of 'INT', 'FLOAT'")
    _bad(_mut("1.0.0", "w", lambda e: e.update(block_size=8)), r"'w', key 'block_size': only PER_BLOCK")
    _bad(_mut("1.0.0", "w", lambda e: e.update(enc_type="PER_BLOCK")), r"'w', key 'block_size': missing")
    _bad(_mut("1.0.0", "w", lambda e: e.update(enc_type="PER_BLOCK", block_size=0)),
         r"'w', key 'block_size': must be in \[1")
    _bad(_mut("1.0.0", "a", lambda e: e.update(scale=[0.1, 0.2], offset=[0, 0])),
         r"'a', key 'scale': a PER_TENSOR entry has one scale")
    _bad(_mut("1.0.0", "a", lambda e: e.update(per_block_int_scale=[1])), r"'a', key 'per_block_int_scale': unknown "
                                                                           r"key")
    _bad(_mut("1.0.0", "a", lambda e: e.update(name="")), r"activation_encodings\[0\]: key 'name'")
    doc = _good("1.0.0")
    doc["param_encodings"].append(doc["param_encodings"][0])
    _bad(doc, r"encoding 'w', key 'name': appears twice")
    doc = _good("1.0.0")
    doc["param_encodings"].append(dict(doc["activation_encodings"][0]))
    _bad(doc, r"encoding 'a', key 'name': in both")


def test_2_0_0_entry_errors():
    _bad(_mut("2.0.0", "w", lambda e: e.pop("y_scale")), r"encoding 'w', key 'y_scale': missing")
    _bad(_mut("2.0.0", "w", lambda e: e.pop("output_dtype")), r"encoding 'w', key 'output_dtype': missing")
    _bad(_mut("2.0.0", "w", lambda e: e.update(output_dtype="int7")), r"'w', key 'output_dtype': must be one of")
    _bad(_mut("2.0.0", "w", lambda e: e.update(output_dtype="float16")), r"no float16/bfloat16 output type")
    _bad(_mut("2.0.0", "w", lambda e: e.pop("axis")), r"'w', key 'axis': missing: 3 scales")
    _bad(_mut("2.0.0", "w", lambda e: e.update(axis="0")), r"'w', key 'axis': must be an integer")
    _bad(_mut("2.0.0", "w", lambda e: e.update(y_scale=[0.1, -0.1, 0.1])), r"'w', key 'y_scale': scales must be")
    _bad(_mut("2.0.0", "w", lambda e: e.update(y_scale=[[0.1], [0.1, 0.2]], block_size=2)),
         r"'w', key 'y_scale': nested lists must be rectangular")
    _bad(_mut("2.0.0", "w", lambda e: e.update(y_scale=[[0.1], [0.2]])), r"'w', key 'y_scale': nested scale")
    _bad(_mut("2.0.0", "w", lambda e: e.update(y_zero_point=[0, 0])), r"'w', key 'y_zero_point': shape \(2,\)")
    _bad(_mut("2.0.0", "w", lambda e: e.update(y_zero_point=[0, 0.5, 0])), r"'w', key 'y_zero_point': must be an "
                                                                          r"integer")
    _bad(_mut("2.0.0", "w", lambda e: e.update(y_zero_point=[0, 200, 0])), r"'w', key 'y_zero_point': zero points "
                                                                          r"must fit int8")
    _bad(_mut("2.0.0", "a", lambda e: e.update(block_size=4)), r"'a', key 'axis': missing: a per-block")
    _bad(_mut("2.0.0", "a", lambda e: e.update(per_channel_float_scale=[1.0])), r"'a', key 'per_block_int_scale': "
                                                                                r"missing \(an LPBQ entry")
    _bad(_mut("2.0.0", "a", lambda e: e.update(scale_bits=4)), r"'a', key 'scale_bits': unknown key")
    fdoc = {"version": "2.0.0", "encodings": [{"name": "f", "output_dtype": "float8e4m3fn", "y_scale": 0.1,
                                               "y_zero_point": 3}]}
    _bad(fdoc, r"'f', key 'y_zero_point': a float8e4m3fn encoding has no zero point")


def test_file_error_names_the_path(tmp_path):
    p = tmp_path / "m.encodings"
    p.write_text(json.dumps(_mut("1.0.0", "w", lambda e: e.update(bw=0))))
    with pytest.raises(ValueError, match=r"m\.encodings: encoding 'w', key 'bw'"):
        read_encodings(p)


# ---------------------------------------------------------------------------- FileEncoding -> quanta encoding
def _fe(version=V100, **kw) -> FileEncoding:
    base = dict(name="conv.weight", version=version, dtype=EncodingDtype.INT, bitwidth=8,
                scale=torch.tensor([0.1, 0.2]), offset=torch.tensor([-128, -128]), symmetric=True)
    base.update(kw)
    return FileEncoding(**base)


def test_to_affine_checks():
    s8 = IntegerGrid(-128, 127)
    assert _fe().to_affine((2, 1), None, s8, symmetric=True).offset.tolist() == [[0.0], [0.0]]
    with pytest.raises(ValueError, match=r"'conv.weight', key 'bw': bitwidth 8 differs from the quantizer's 4"):
        _fe().to_affine((2, 1), None, IntegerGrid(-8, 7))
    with pytest.raises(ValueError, match=r"key 'scale': 2 scale\(s\), the quantizer needs 3"):
        _fe().to_affine((3, 1), None, s8)
    # an asymmetric quantizer takes a symmetric entry (any offset on its grid): same values
    assert _fe().to_affine((2, 1), None, s8, symmetric=False).offset.tolist() == [[0.0], [0.0]]
    with pytest.raises(ValueError, match=r"key 'is_sym': the entry is symmetric but its offsets are not"):
        _fe(offset=torch.tensor([-128, -120])).to_affine((2, 1), None, s8, symmetric=False)
    with pytest.raises(ValueError, match=r"key 'offset': zero point\(s\) off the grid"):
        _fe(offset=torch.tensor([-128, 10]), symmetric=None).to_affine((2, 1), None, s8)
    with pytest.raises(ValueError, match=r"key 'offset': a symmetric quantizer on \[-128, 127\] needs quanta offset 0"):
        _fe(offset=torch.tensor([-128, -120]), symmetric=None).to_affine((2, 1), None, s8, symmetric=True)
    with pytest.raises(ValueError, match=r"key 'dtype': a float encoding"):
        _fe(dtype=EncodingDtype.FLOAT).to_affine((2, 1), None, s8)
    with pytest.raises(ValueError, match=r"key 'block_size': the quantizer is per-block"):
        _fe().to_affine((1, 2), (1, 8), s8)
    with pytest.raises(ValueError, match=r"key 'block_size': block size 4 differs from the quantizer's 8"):
        _fe(block_size=4).to_affine((1, 2), (1, 8), s8)
    with pytest.raises(ValueError, match=r"key 'block_size': a per-block entry for a per_channel quantizer"):
        _fe(block_size=4).to_affine((2, 1), None, s8)


def test_to_affine_2_0_0_checks():
    s8 = IntegerGrid(-128, 127)
    fe = _fe(V200, offset=torch.tensor([0, 0]), origin=OffsetOrigin.ZERO, symmetric=None, signed=True, axis=0)
    assert fe.to_affine((2, 1), None, s8, symmetric=True).offset.tolist() == [[0.0], [0.0]]
    assert fe.to_affine((2, 1), None, IntegerGrid(-127, 127), symmetric=True).offset.tolist() == [[0.0], [0.0]]
    with pytest.raises(ValueError, match=r"key 'output_dtype': signed 8-bit codes for a quantizer with the unsigned"):
        fe.to_affine((2, 1), None, IntegerGrid(0, 255))
    with pytest.raises(ValueError, match=r"key 'axis': axis 0 differs from the quantizer's axis 1"):
        fe.to_affine((1, 2), None, s8)
    with pytest.raises(ValueError, match=r"key 'axis': axis 5 out of range"):
        _fe(V200, origin=OffsetOrigin.ZERO, offset=torch.tensor([0, 0]), axis=5).to_affine((2, 1), None, s8)
    assert _fe(V200, origin=OffsetOrigin.ZERO, offset=torch.tensor([0, 0]), axis=-2).to_affine(
        (2, 1), None, s8).scale.shape == (2, 1)
    nested = _fe(V200, origin=OffsetOrigin.ZERO, offset=torch.zeros(4, dtype=torch.int64), scale=torch.ones(4),
                 axis=1, block_size=8, shape=(2, 2))
    with pytest.raises(ValueError, match=r"key 'y_scale': nested scale of shape \(2, 2\), the quantizer's is \(1, 4\)"):
        nested.to_affine((1, 4), (1, 8), s8)


def test_to_float_checks():
    fe = FileEncoding("x", V200, EncodingDtype.FLOAT, 8, torch.tensor([0.5]), float_format=FLOAT8_E4M3FN)
    assert fe.to_float((), None, FLOAT8_E4M3FN) == FloatEncoding(torch.tensor(0.5), FLOAT8_E4M3FN)
    with pytest.raises(ValueError, match=r"'x', key 'output_dtype': format float8_e4m3fn differs .* float8_e5m2"):
        fe.to_float((), None, FLOAT8_E5M2)
    with pytest.raises(ValueError, match=r"'x', key 'output_dtype': bitwidth 8 differs from the quantizer's 16"):
        fe.to_float((), None, FLOAT16)
    with pytest.raises(ValueError, match=r"'x', key 'output_dtype': an integer encoding for a float16 quantizer"):
        _fe(V200, name="x").to_float((), None, FLOAT16)


# ---------------------------------------------------------------------------- writing files
@pytest.mark.parametrize("version", ALL_VERSIONS, ids=lambda v: v.value)
def test_write_read_file(tmp_path, version):
    p = tmp_path / "m.encodings"
    enc = _symmetric((3, 1))
    write_encodings(p, {"a": _affine()}, {"w": enc}, version)
    f = read_encodings(p)
    assert f.version is version
    assert f.encodings["w"].to_affine((3, 1), None, enc.grid) == enc


def test_failed_write_leaves_old_file(tmp_path, monkeypatch):
    p = tmp_path / "m.encodings"
    write_encodings(p, {"a": _affine()}, {}, V100)
    before = p.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(E.json, "dumps", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        write_encodings(p, {"b": _affine(seed=3)}, {}, V200)
    monkeypatch.undo()
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.encodings"]  # no temporary file left behind
    with pytest.raises(ValueError, match="per-block"):  # an unrepresentable encoding: nothing written either
        write_encodings(p, {}, {"w": _symmetric((2, 2), bits=4, block_size=(1, 8))}, V061)
    assert p.read_bytes() == before


def test_written_file_is_plain_json_with_no_nan(tmp_path):
    p = tmp_path / "m.encodings"
    write_encodings(p, {"a": _affine()}, {"w": _symmetric((3, 1))}, V200)
    text = p.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["version"] == "2.0.0"
    assert math.isclose(json.loads(text)["encodings"][0]["y_scale"], _affine().scale.item())
