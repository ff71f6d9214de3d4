"""safetensors files of quantized state dicts: round trips, atomic saves, malformed files raise ValueError."""

import json
import os

import pytest
import torch

safetensors = pytest.importorskip("safetensors")
safetensors_torch = pytest.importorskip("safetensors.torch")

from quantized_models import NAMES, X, make_model, quantized_model
from quantized_models import is_quantized as _is_quantized

from quanta.dtypes import (
    AffineQuantizedTensor,
    FloatxTensorCoreLayout,
    LinearActivationQuantizedTensor,
    UintxLayout,
    load_quantized,
    save_quantized,
)
from quanta.quantization.quant_primitives import MappingType


# ------------------------------------------------------------------ safetensors
@pytest.mark.parametrize("name", NAMES)
def test_safetensors_round_trip(name, tmp_path):
    m = quantized_model(name)
    path = tmp_path / "model.safetensors"
    save_quantized(m.state_dict(), path, metadata={"note": "hello"})
    sd = load_quantized(path)
    assert set(sd) == set(m.state_dict())
    for key, t in m.state_dict().items():
        assert type(sd[key]) is type(t), key
        if _is_quantized(t):
            assert torch.equal(sd[key].dequantize(), t.dequantize())
            assert sd[key].shape == t.shape and sd[key].dtype == t.dtype
        else:
            assert torch.equal(sd[key], t)
    fresh = make_model(seed=2)
    fresh.load_state_dict(sd, assign=True)
    assert torch.equal(fresh(X), m(X))
    with safetensors.safe_open(str(path), "pt") as f:
        assert f.metadata()["note"] == "hello"


def test_safetensors_transposed_and_3d_tensors(tmp_path):
    a = AffineQuantizedTensor.from_hp_to_intx(torch.randn(2, 4, 24), MappingType.ASYMMETRIC, (1, 2, 8), torch.uint5,
                                              _layout=UintxLayout(torch.uint5))
    b = AffineQuantizedTensor.from_hp_to_fpx(torch.randn(8, 12), FloatxTensorCoreLayout(2, 3)).t()
    lin = LinearActivationQuantizedTensor(
        AffineQuantizedTensor.from_hp_to_intx(torch.randn(32, 64), MappingType.SYMMETRIC, (1, 64), torch.int8),
        MappingType.SYMMETRIC).t()
    path = tmp_path / "x.safetensors"
    save_quantized({"a": a, "b": b, "lin": lin, "bf16": torch.ones(3, dtype=torch.bfloat16)}, path)
    back = load_quantized(path)
    assert torch.equal(back["a"].dequantize(), a.dequantize())
    assert back["b"].shape == (12, 8) and torch.equal(back["b"].dequantize(), b.dequantize())
    assert back["lin"].shape == (64, 32) and torch.equal(back["lin"].dequantize(), lin.dequantize())
    assert back["bf16"].dtype == torch.bfloat16


def test_save_quantized_argument_errors(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(TypeError):
        save_quantized([torch.ones(2)], path)
    with pytest.raises(TypeError):
        save_quantized({"a": [1, 2]}, path)
    with pytest.raises(ValueError):
        save_quantized({"a::b": torch.ones(2)}, path)
    with pytest.raises(ValueError):
        save_quantized({"a": torch.ones(2)}, path, metadata={"quanta": "{}"})
    with pytest.raises(ValueError):
        save_quantized({"a": torch.ones(2)}, path, metadata={"n": 1})
    assert not path.exists()


def test_failed_save_leaves_previous_file(tmp_path, monkeypatch):
    m = quantized_model("int8_wo")
    path = tmp_path / "model.safetensors"
    save_quantized(m.state_dict(), path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        save_quantized(quantized_model("fp6").state_dict(), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.safetensors"]  # no temporary file left behind
    monkeypatch.undo()
    fresh = make_model(seed=1)
    fresh.load_state_dict(load_quantized(path), assign=True)
    assert torch.equal(fresh(X), m(X))


def test_failed_partial_write_leaves_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    save_quantized({"a": torch.ones(3)}, path)
    before = path.read_bytes()
    real = safetensors_torch.save_file

    def half_write(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(10)
        raise OSError("interrupted")

    monkeypatch.setattr(safetensors.torch, "save_file", half_write)
    with pytest.raises(OSError):
        save_quantized({"b": torch.zeros(5)}, path)
    assert path.read_bytes() == before


# ------------------------------------------------------------------ malformed files: always ValueError
def _read(path):
    with safetensors.safe_open(str(path), "pt") as f:
        names = list(f.keys())
        return {k: f.get_tensor(k) for k in names}, dict(f.metadata())


def _write(path, tensors, header):
    safetensors_torch.save_file(tensors, str(path), metadata=header)


@pytest.fixture
def valid_file(tmp_path):
    """A valid file with one tensor of each layout family and a dynamic-activation tensor."""
    m = quantized_model("int4_uintx_g32")
    state = dict(m.state_dict())
    state["f8"] = AffineQuantizedTensor.from_hp_to_floatx(torch.randn(16, 32), (1, 32), torch.float8_e4m3fn)
    state["fp6"] = AffineQuantizedTensor.from_hp_to_fpx(torch.randn(16, 32), FloatxTensorCoreLayout(3, 2))
    state["i4cpu"] = quantized_model("int4_cpu_g32")[0].weight
    state["dyn"] = quantized_model("int8_dyn_asym")[0].weight
    path = tmp_path / "valid.safetensors"
    save_quantized(state, path)
    load_quantized(path)  # sanity
    return path


def _mutated(tmp_path, valid_file, fn):
    tensors, header = _read(valid_file)
    desc = json.loads(header["quanta"])
    out = fn(tensors, header, desc)
    if isinstance(out, tuple) and len(out) == 3 and isinstance(out[0], dict):
        tensors, header, desc = out
    header = dict(header)
    if desc is not None:
        header["quanta"] = desc if isinstance(desc, str) else json.dumps(desc)
    path = tmp_path / "bad.safetensors"
    _write(path, tensors, header)
    return path


def _drop(d, key):
    del d[key]


def _set(d, keys, value):
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value


MUTATIONS = {
    "json_syntax": lambda t, h, d: (t, h, "{not json"),
    "json_not_object": lambda t, h, d: (t, h, "[1, 2]"),
    "json_empty": lambda t, h, d: (t, h, ""),
    "unknown_layout": lambda t, h, d: _set(d, ["0.weight", "layout", "type"], "FancyLayout"),
    "layout_list_type": lambda t, h, d: _set(d, ["0.weight", "layout", "type"], ["UintxLayout"]),
    "layout_not_object": lambda t, h, d: _set(d, ["0.weight", "layout"], "UintxLayout"),
    "layout_bad_sub_dtype": lambda t, h, d: _set(d, ["0.weight", "layout", "dtype"], "int8"),
    "layout_wrong_for_impl": lambda t, h, d: _set(d, ["f8", "layout"], {"type": "PlainLayout"}),
    "unknown_impl": lambda t, h, d: _set(d, ["0.weight", "impl"], "os.system"),
    "unknown_dtype": lambda t, h, d: _set(d, ["0.weight", "dtype"], "float128"),
    "integer_dtype": lambda t, h, d: _set(d, ["0.weight", "dtype"], "int8"),
    "dtype_not_str": lambda t, h, d: _set(d, ["0.weight", "dtype"], 7),
    "unknown_domain": lambda t, h, d: _set(d, ["0.weight", "zero_point_domain"], "DOUBLE"),
    "shape_mismatch": lambda t, h, d: _set(d, ["0.weight", "shape"], [64, 64]),
    "negative_shape": lambda t, h, d: _set(d, ["0.weight", "shape"], [-64, 128]),
    "shape_strings": lambda t, h, d: _set(d, ["0.weight", "shape"], ["64", "128"]),
    "block_not_tiling": lambda t, h, d: _set(d, ["0.weight", "block_size"], [1, 48]),
    "block_zero": lambda t, h, d: _set(d, ["0.weight", "block_size"], [0, 32]),
    "block_wrong_rank": lambda t, h, d: _set(d, ["0.weight", "block_size"], [32]),
    "quant_min_str": lambda t, h, d: _set(d, ["0.weight", "quant_min"], "0"),
    "transposed_int": lambda t, h, d: _set(d, ["0.weight", "transposed"], 1),
    "state_missing": lambda t, h, d: _set(d, ["0.weight", "state"], {}),
    "state_extra": lambda t, h, d: _set(d, ["0.weight", "state"], {"last_dim": 128, "evil": 1}),
    "last_dim_wrong": lambda t, h, d: _set(d, ["0.weight", "state", "last_dim"], 64),
    "tensors_unknown_name": lambda t, h, d: _set(d, ["0.weight", "tensors"], ["packed", "scale", "bogus"]),
    "tensors_unhashable": lambda t, h, d: _set(d, ["0.weight", "tensors"], [{"a": 1}]),
    "tensors_not_list": lambda t, h, d: _set(d, ["0.weight", "tensors"], "packed"),
    "int4cpu_group": lambda t, h, d: _set(d, ["i4cpu", "state", "group_size"], 16),
    "int4cpu_storage_shape": lambda t, h, d: _set(d, ["i4cpu", "state", "storage_shape"], [32, 128]),
    "dyn_act_mapping": lambda t, h, d: _set(d, ["dyn", "act_mapping_type"], "SYMMETRIC_NO_CLIPPING_ERR"),
    "dyn_weight_missing": lambda t, h, d: _drop(d["dyn"], "weight"),
    "description_not_object": lambda t, h, d: _set(d, ["0.weight"], 42),
    "wrong_type_tag": lambda t, h, d: _set(d, ["0.weight", "type"], "Tensor"),
    "format_missing": lambda t, h, d: _drop(h, "format"),
    "version_future": lambda t, h, d: h.update(version="99"),
    "missing_tensor": lambda t, h, d: _drop(t, "0.weight::scale"),
    "missing_packed": lambda t, h, d: _drop(t, "0.weight::packed"),
    "extra_tensor": lambda t, h, d: t.update({"0.weight::extra": torch.ones(2)}),
    "extra_orphan": lambda t, h, d: t.update({"nobody::scale": torch.ones(2)}),
    "packed_wrong_shape": lambda t, h, d: t.update({"0.weight::packed": t["0.weight::packed"][:, :-1].contiguous()}),
    "packed_wrong_dtype": lambda t, h, d: t.update({"0.weight::packed": t["0.weight::packed"].to(torch.int16)}),
    "scale_wrong_shape": lambda t, h, d: t.update({"0.weight::scale": t["0.weight::scale"][:-1].contiguous()}),
    "zero_point_wrong_shape": lambda t, h, d: t.update({"0.weight::zero_point": torch.zeros(3)}),
    "float8_wrong_dtype": lambda t, h, d: t.update({"f8::float8_data": t["f8::float8_data"].float()}),
    "fpx_packed_short": lambda t, h, d: t.update({"fp6::packed": t["fp6::packed"][:, :5].contiguous()}),
    "int4cpu_codes_shape": lambda t, h, d: t.update({"i4cpu::codes": torch.zeros(64, 32, dtype=torch.uint8)}),
    "int4cpu_codes_dtype": lambda t, h, d: t.update({"i4cpu::codes": t["i4cpu::codes"].to(torch.int16)}),
    "int4cpu_scale_int": lambda t, h, d: t.update({"i4cpu::scale": t["i4cpu::scale"].to(torch.int32)}),
    "int4cpu_zero_shape": lambda t, h, d: t.update({"i4cpu::zero": t["i4cpu::zero"][:, :3].contiguous()}),
    "int4cpu_codes_missing": lambda t, h, d: _drop(t, "i4cpu::codes"),
    "int4cpu_state_shape_3d": lambda t, h, d: _set(d, ["i4cpu", "state", "storage_shape"], [64, 128, 1]),
    "col_sums_wrong": lambda t, h, d: t.update({"dyn::weight_col_sums": torch.zeros(3, dtype=torch.int32)}),
    "col_sums_dtype": lambda t, h, d: t.update({"dyn::weight_col_sums": t["dyn::weight_col_sums"].float()}),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_malformed_file_raises_value_error(mutation, tmp_path, valid_file):
    path = _mutated(tmp_path, valid_file, MUTATIONS[mutation])
    with pytest.raises(ValueError):
        load_quantized(path)


UNUSABLE = {
    "scale_int": lambda t, h, d: t.update({"0.weight::scale": t["0.weight::scale"].to(torch.int32)}),
    "zero_point_float8": lambda t, h, d: t.update({"0.weight::zero_point": t["0.weight::zero_point"].to(
        torch.float8_e4m3fn)}),
    "plain_key_shadows_quantized": lambda t, h, d: t.update({"0.weight": torch.zeros(64, 128)}),
}


@pytest.mark.parametrize("mutation", list(UNUSABLE))
def test_unusable_file_is_rejected_at_load(mutation, tmp_path, valid_file):
    path = _mutated(tmp_path, valid_file, UNUSABLE[mutation])
    try:
        sd = load_quantized(path)
    except ValueError:
        return
    # it loaded: then the described tensor must be quantized and usable
    assert _is_quantized(sd["0.weight"])
    sd["0.weight"].dequantize()
    torch.nn.functional.linear(torch.randn(2, 128), sd["0.weight"])


def test_inverted_code_range_is_a_value_error(tmp_path, valid_file):
    fn = lambda t, h, d: (_set(d, ["0.weight", "quant_min"], 15), _set(d, ["0.weight", "quant_max"], 0))
    path = _mutated(tmp_path, valid_file, fn)
    with pytest.raises(ValueError):
        sd = load_quantized(path)
        sd["0.weight"].dequantize()


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    yield path


@pytest.fixture
def small_file(tmp_path):
    """One small tensor of every storage kind (fast to rewrite many times)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 32, generator=g)
    state = {
        "plain": AffineQuantizedTensor.from_hp_to_intx(w, MappingType.ASYMMETRIC, (1, 8), torch.int8),
        "uintx": AffineQuantizedTensor.from_hp_to_intx(w, MappingType.SYMMETRIC, (1, 8), torch.int3,
                                                       _layout=UintxLayout(torch.int3)).t(),
        "f8": AffineQuantizedTensor.from_hp_to_floatx(w, (4, 8), torch.float8_e5m2),
        "fp6": AffineQuantizedTensor.from_hp_to_fpx(w, FloatxTensorCoreLayout(3, 2)),
        "i4cpu": quantized_model("int4_cpu_g32")[2].weight,
        "dyn": LinearActivationQuantizedTensor(
            AffineQuantizedTensor.from_hp_to_intx(w, MappingType.SYMMETRIC, (1, 32), torch.int8),
            MappingType.ASYMMETRIC),
    }
    path = tmp_path / "small.safetensors"
    save_quantized(state, path)
    assert set(load_quantized(path)) == set(state)
    return path


def test_fuzzed_descriptions_raise_only_value_error(tmp_path, small_file):
    """Every field of every description replaced by odd JSON values: loading succeeds or raises ValueError."""
    tensors, header = _read(small_file)
    desc = json.loads(header["quanta"])
    odd = [None, True, -1, 0, 10**12, 1.5, "x", "int8", "<delete>"]
    failures = []
    path = tmp_path / "fuzz.safetensors"
    for leaf in list(_leaves(desc)):
        if not leaf:
            continue
        for value in odd:
            d = json.loads(header["quanta"])
            parent = d
            for k in leaf[:-1]:
                parent = parent[k]
            if value == "<delete>":
                parent.pop(leaf[-1])
            else:
                parent[leaf[-1]] = value
            _write(path, tensors, {**header, "quanta": json.dumps(d)})
            try:
                load_quantized(path)
            except ValueError:
                pass
            except Exception as e:  # noqa: BLE001 - collecting every other type
                failures.append((leaf, value, type(e).__name__, str(e)[:100]))
    assert not failures, failures[:10]


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, b"\xff" * 64, b"{}", b"hello world, not a tensor file",
                                     bytes(range(256)) * 4,
                                     (8).to_bytes(8, "little") + b'{"a":1}',
                                     (10**15).to_bytes(8, "little") + b"{}"], ids=range(8))
def test_random_bytes_raise_value_error(content, tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        load_quantized(path)


def test_random_byte_files_fuzz(tmp_path):
    g = torch.Generator().manual_seed(0)
    path = tmp_path / "junk.safetensors"
    for _ in range(100):
        n = int(torch.randint(0, 200, (1,), generator=g))
        path.write_bytes(bytes(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).tolist()))
        with pytest.raises(ValueError):
            load_quantized(path)


def test_truncated_and_plain_safetensors_files(tmp_path, valid_file):
    data = valid_file.read_bytes()
    for cut in (8, 100, len(data) // 2, len(data) - 1):
        path = tmp_path / f"cut{cut}.safetensors"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            load_quantized(path)
    plain = tmp_path / "plain.safetensors"
    safetensors_torch.save_file({"a": torch.ones(2)}, str(plain))  # a safetensors file, not a quanta one
    with pytest.raises(ValueError):
        load_quantized(plain)


def test_missing_file_is_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_quantized(tmp_path / "nope.safetensors")
