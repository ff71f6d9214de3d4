"""AIMET encodings of a QuantizationSimModel: names, export -> apply bit identity, validation."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from quantsim_models import W4_BLOCK_CONFIG, SmallCNN, TransformerBlock

from quanta.encodings.affine import AffineEncoding
from quanta.export import (
    EncodingsVersion,
    apply_encodings,
    export_encodings,
    read_encodings,
    sim_encodings,
    tensor_names,
)
from quanta.quantsim import QuantSimConfig, QuantizationSimModel

V061, V100, V200 = EncodingsVersion.V0_6_1, EncodingsVersion.V1_0_0, EncodingsVersion.V2_0_0
ALL_VERSIONS = [V061, V100, V200]



def _models():
    torch.manual_seed(0)
    cnn = SmallCNN().eval()
    torch.manual_seed(1)
    mlp = TransformerBlock().eval()
    g = torch.Generator().manual_seed(2)
    return {
        "cnn": (cnn, torch.randn(4, 3, 16, 16, generator=g)),
        "mlp": (mlp, torch.randn(4, 6, 32, generator=g)),
    }


MODELS = _models()

def _norms_at_default_width() -> dict:
    cfg = QuantSimConfig.load().to_dict()
    for op in ("LayerNormalization", "RMSNormalization"):
        cfg["op_type"][op].pop("bitwidth")
    return cfg


# name -> QuantizationSimModel kwargs
RECIPES = {
    "w8a8": {},
    "w4_block_a16": {"config_file": W4_BLOCK_CONFIG, "default_output_bw": 16},
    "a16": {"default_output_bw": 16},
    "float16": {"default_data_type": float, "default_output_bw": 16, "default_param_bw": 16},
    # the norms at the default's 16 bits would be float16, which AIMET's 2.0.0 format (the only one with
    # float8) cannot write: this recipe keeps every activation in float8
    "float8": {"default_data_type": float, "default_output_bw": 8, "default_param_bw": 8,
               "config_file": _norms_at_default_width()},
}

# (recipe, version) pairs the version cannot hold, and the words the write error must contain
UNREPRESENTABLE = {
    ("w4_block_a16", V061): "per-block",
    ("float8", V061): "2.0.0",
    ("float8", V100): "2.0.0",
    ("float16", V200): "float16",
}


def _sim(model_key: str, recipe: str) -> QuantizationSimModel:
    model, x = MODELS[model_key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return QuantizationSimModel(model, x, **RECIPES[recipe])


def _calibrated(model_key: str, recipe: str) -> QuantizationSimModel:
    sim = _sim(model_key, recipe)
    x = MODELS[model_key][1]
    sim.compute_encodings(lambda m: m(x), progress=False)
    return sim


def _assert_same_encodings(a: QuantizationSimModel, b: QuantizationSimModel) -> None:
    ea, eb = a.get_encodings(), b.get_encodings()
    assert ea.keys() == eb.keys()
    for name in ea:
        assert ea[name] == eb[name], name


# ---------------------------------------------------------------------------- naming
def test_tensor_names_follow_the_contract():
    sim = _sim("mlp", "w4_block_a16")
    names = tensor_names(sim)
    assert names["qkv.weight"] == "qkv.param_quantizers.weight"
    assert names["qkv.output.0"] == "qkv.output_quantizers.0"
    assert "qkv.bias" not in names  # disabled by the config
    assert set(names.values()) == {n for n, _ in sim.named_quantizers()}


def test_sim_encodings_splits_activations_and_params():
    sim = _calibrated("cnn", "w8a8")
    acts, params = sim_encodings(sim)
    assert "conv1.weight" in params and "fc.weight" in params
    assert all(".output." in n or ".input." in n for n in acts)
    assert isinstance(params["conv1.weight"], AffineEncoding)
    assert params["conv1.weight"].scale.shape == (16, 1, 1, 1)


def test_sim_encodings_skips_uninitialised_quantizers():
    acts, params = sim_encodings(_sim("cnn", "w8a8"))
    assert acts == {} and params == {}


# ---------------------------------------------------------------------------- bit identity
@pytest.mark.parametrize("version", ALL_VERSIONS, ids=lambda v: v.value)
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("model_key", list(MODELS))
def test_export_apply_is_bit_identical(tmp_path, model_key, recipe, version):
    sim = _calibrated(model_key, recipe)
    path = tmp_path / "model.encodings"
    if (recipe, version) in UNREPRESENTABLE:
        with pytest.raises(ValueError, match=UNREPRESENTABLE[(recipe, version)]):
            export_encodings(sim, path, version)
        assert not path.exists()
        return
    export_encodings(sim, path, version)
    assert json.loads(path.read_text())["version"] == version.value
    fresh = _sim(model_key, recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "one ulp off" RuntimeWarning from set_encodings
        apply_encodings(fresh, path, partial=False)
    x = MODELS[model_key][1]
    with torch.no_grad():
        assert torch.equal(fresh.model(x), sim.model(x))
    _assert_same_encodings(sim, fresh)


def test_block_recipe_really_is_per_block_and_16_bit():
    sim = _calibrated("mlp", "w4_block_a16")
    acts, params = sim_encodings(sim)
    assert params["fc1.weight"].block_size == (1, 8) and params["fc1.weight"].qmin == -8
    assert acts["fc1.output.0"].qmax == 65535


def test_apply_accepts_a_parsed_file_and_a_dict(tmp_path):
    sim = _calibrated("cnn", "w8a8")
    path = tmp_path / "e.json"
    export_encodings(sim, path, V100)
    for source in (read_encodings(path), json.loads(path.read_text())):
        fresh = _sim("cnn", "w8a8")
        apply_encodings(fresh, source)
        _assert_same_encodings(sim, fresh)


def test_export_writes_quantizer_args_and_symmetric_flags(tmp_path):
    sim = _calibrated("cnn", "w8a8")
    export_encodings(sim, tmp_path / "a.json", V100)
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["quantizer_args"]["quant_scheme"] == "min_max"  # aimet-torch 2.x's name
    assert doc["quantizer_args"]["is_symmetric"] is True
    assert doc["quantizer_args"]["per_channel_quantization"] is True
    entries = {e["name"]: e for e in doc["param_encodings"] + doc["activation_encodings"]}
    assert entries["conv1.weight"]["is_sym"] is True and entries["conv1.weight"]["enc_type"] == "PER_CHANNEL"
    assert entries["relu1.output.0"]["is_sym"] is False
    export_encodings(sim, tmp_path / "b.json", V061)
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["quantizer_args"]["is_symmetric"] == "True"
    assert len(doc["param_encodings"]["conv1.weight"]) == 16


# ---------------------------------------------------------------------------- validation
def _doc(sim: QuantizationSimModel, version=V100) -> dict:
    from quanta.export import encodings_to_dict

    acts, params = sim_encodings(sim)
    return encodings_to_dict(acts, params, version)


def _entry(doc: dict, name: str) -> dict:
    return next(e for e in doc["param_encodings"] + doc["activation_encodings"] if e["name"] == name)


def test_bad_entry_changes_nothing():
    sim = _calibrated("cnn", "w8a8")
    doc = _doc(sim)
    fc = _entry(doc, "fc.weight")
    fc["scale"], fc["offset"] = fc["scale"][:-1], fc["offset"][:-1]  # 9 channels for a 10-channel layer
    fresh = _calibrated("cnn", "w8a8")
    with torch.no_grad():
        for _, q in fresh.named_quantizers():  # make fresh differ from sim
            q.max.mul_(2)
    before = fresh.get_encodings()
    with pytest.raises(ValueError, match=r"'fc\.weight', key 'scale': 9 scale\(s\), the quantizer needs 10"):
        apply_encodings(fresh, doc)
    after = fresh.get_encodings()
    assert all(before[k] == after[k] for k in before)


def test_bitwidth_mismatch_names_the_layer_and_key():
    doc = _doc(_calibrated("mlp", "a16"))
    with pytest.raises(ValueError, match=r"encoding '.*output\.0', key 'bw': bitwidth 16 differs"):
        apply_encodings(_sim("mlp", "w8a8"), doc)
    doc2 = _doc(_calibrated("mlp", "a16"), V200)
    with pytest.raises(ValueError, match=r"key 'output_dtype'"):
        apply_encodings(_sim("mlp", "w8a8"), doc2)


def test_per_block_file_into_per_channel_sim_is_an_error():
    doc = _doc(_calibrated("mlp", "w4_block_a16"))
    fresh = _sim("mlp", "w4_block_a16")
    apply_encodings(fresh, doc)  # the same recipe loads
    wrong = _sim("mlp", "a16")
    with pytest.raises(ValueError, match=r"key 'bw'|key 'block_size'|key 'scale'"):
        apply_encodings(wrong, doc, strict=False)


def test_symmetry_mismatch_is_an_error():
    doc = _doc(_calibrated("cnn", "w8a8"))
    _entry(doc, "relu1.output.0")["is_sym"] = True
    with pytest.raises(ValueError, match=r"'relu1\.output\.0', key 'is_sym'"):
        apply_encodings(_sim("cnn", "w8a8"), doc)


def test_strict_rejects_unknown_names_and_partial_requires_all(tmp_path):
    sim = _calibrated("cnn", "w8a8")
    doc = _doc(sim)
    extra = dict(_entry(doc, "fc.weight"), name="nope.weight")
    doc["param_encodings"].append(extra)
    with pytest.raises(ValueError, match=r"nope\.weight.*strict=False"):
        apply_encodings(_sim("cnn", "w8a8"), doc)
    fresh = _sim("cnn", "w8a8")
    apply_encodings(fresh, doc, strict=False)
    _assert_same_encodings(sim, fresh)

    doc["param_encodings"] = [e for e in doc["param_encodings"] if e["name"] != "fc.weight"]
    apply_encodings(_sim("cnn", "w8a8"), doc, strict=False)  # partial=True: fine
    with pytest.raises(ValueError, match=r"partial=False.*fc\.weight"):
        apply_encodings(_sim("cnn", "w8a8"), doc, strict=False, partial=False)


def test_quanta_quantizer_names_get_a_hint():
    doc = _doc(_calibrated("cnn", "w8a8"))
    _entry(doc, "fc.weight")["name"] = "fc.param_quantizers.weight"
    with pytest.raises(ValueError, match=r"names are '<module>\.input\.<i>'"):
        apply_encodings(_sim("cnn", "w8a8"), doc)


def test_disabled_quantizer_is_an_error_when_strict():
    fresh = _sim("mlp", "w8a8")  # biases are not quantized by the default config
    assert "qkv.bias" not in tensor_names(fresh)
    bias = {"name": "qkv.bias", "dtype": "INT", "enc_type": "PER_CHANNEL", "bw": 8, "is_sym": True,
            "scale": [0.01] * 96, "offset": [-128] * 96}
    doc = {"version": "1.0.0", "activation_encodings": [], "param_encodings": [bias]}
    with pytest.raises(ValueError, match=r"disabled in the model: qkv\.bias"):
        apply_encodings(fresh, doc)
    apply_encodings(fresh, doc, strict=False)


def test_int_entry_for_float_quantizer_is_an_error():
    doc = _doc(_calibrated("cnn", "w8a8"))
    with pytest.raises(ValueError, match=r"key 'dtype': an integer encoding"):
        apply_encodings(_sim("cnn", "float16"), doc, strict=False)
    fdoc = _doc(_calibrated("cnn", "float16"))
    with pytest.raises(ValueError, match=r"key 'dtype': a float encoding"):
        apply_encodings(_sim("cnn", "w8a8"), fdoc, strict=False)


def test_float8_scale_goes_back_bit_for_bit():
    sim = _calibrated("mlp", "float8")
    doc = _doc(sim, V200)
    fresh = _sim("mlp", "float8")
    apply_encodings(fresh, doc)
    for (name, a), (_, b) in zip(sim.named_quantizers(), fresh.named_quantizers()):
        assert torch.equal(a.get_scale(), b.get_scale()), name


def test_requires_grad_and_allow_overwrite():
    sim = _calibrated("cnn", "w8a8")
    fresh = _sim("cnn", "w8a8")
    apply_encodings(fresh, _doc(sim), requires_grad=False, allow_overwrite=False)
    q = fresh.model.get_submodule("fc").param_quantizers["weight"]
    assert not q.min.requires_grad and not q.max.requires_grad
    x = MODELS["cnn"][1]
    fresh.compute_encodings(lambda m: m(x * 3), progress=False)
    _assert_same_encodings(sim, fresh)  # frozen: not recalibrated


def test_apply_rejects_bad_flags():
    with pytest.raises(TypeError, match="strict"):
        apply_encodings(_sim("cnn", "w8a8"), {"version": "2.0.0", "encodings": []}, strict="yes")


@pytest.mark.parametrize("fmt_name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1"])
def test_float_maxval_reproduces_any_written_scale(fmt_name):
    from quanta.export.sim_encodings import _maxval_for_scale
    from quanta.grids.float import PRESETS

    fmt = PRESETS[fmt_name]
    maxval = torch.rand(50000, generator=torch.Generator().manual_seed(4)) * 100 + 1e-6
    scale = maxval / fmt.max  # as FloatQuantizeDequantize.get_scale computes it
    assert torch.equal(_maxval_for_scale(scale, fmt) / fmt.max, scale)
