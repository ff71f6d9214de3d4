"""quanta.quantsim.config: the quantsim config format, its precedence, its files and its errors."""

from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest
import torch
from torch import nn

import quanta.nn
from quanta.quantsim.config import BUILTIN_DEFAULT, DataType, QuantizerSpec, QuantSimConfig, op_types_of

CONV = ("Conv2d", "Conv")
GEMM = ("Linear", "Gemm")
BN = ("BatchNorm2d", "BatchNormalization")
LN = ("LayerNorm", "LayerNormalization")
GN = ("GroupNorm", "GroupNormalization")


def load(**sections) -> QuantSimConfig:
    return QuantSimConfig.load(sections)


def raises(match_path: str, config: dict, *, exc: type[Exception] = ValueError) -> str:
    """Load ``config``, expect ``exc`` whose message names ``match_path``; return the message."""
    with pytest.raises(exc) as info:
        QuantSimConfig.load(config)
    message = str(info.value)
    assert match_path in message, message
    return message


# -- QuantizerSpec and DataType --------------------------------------------------------------------
def test_datatype_values():
    assert DataType("int") is DataType.INT and DataType("float") is DataType.FLOAT


def test_spec_block_size_implies_per_channel():
    spec = QuantizerSpec(enabled=True, bitwidth=4, symmetric=True, dtype=None, block_size=64)
    assert spec.per_channel is True and spec.block_size == 64


def test_spec_is_frozen():
    spec = QuantizerSpec(enabled=True, bitwidth=8, symmetric=False, dtype=DataType.INT)
    with pytest.raises(AttributeError):
        spec.enabled = False  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        ({"enabled": "yes"}, TypeError, "QuantizerSpec.enabled"),
        ({"symmetric": 1}, TypeError, "QuantizerSpec.symmetric"),
        ({"bitwidth": 0}, ValueError, "QuantizerSpec.bitwidth"),
        ({"bitwidth": True}, ValueError, "QuantizerSpec.bitwidth"),
        ({"dtype": "int"}, TypeError, "QuantizerSpec.dtype"),
        ({"dtype": DataType.FLOAT, "bitwidth": 4}, ValueError, "bitwidth 8 or 16"),
        ({"block_size": 0}, ValueError, "QuantizerSpec.block_size"),
    ],
)
def test_spec_validation(kwargs, exc, text):
    base = {"enabled": True, "bitwidth": 8, "symmetric": True, "dtype": None}
    with pytest.raises(exc, match=re.escape(text)):
        QuantizerSpec(**{**base, **kwargs})


# -- the built-in default -----------------------------------------------------------------------------
def test_builtin_default_conv():
    cfg = QuantSimConfig.load()
    w = cfg.param_spec("conv", CONV, "weight")
    assert w == QuantizerSpec(enabled=True, bitwidth=None, symmetric=True, dtype=None, per_channel=True)
    assert cfg.param_spec("conv", CONV, "bias").enabled is False
    out = cfg.output_spec("conv", CONV, 0)
    assert out == QuantizerSpec(enabled=True, bitwidth=None, symmetric=False, dtype=None)
    assert cfg.input_spec("conv", CONV, 0).enabled is False


def test_builtin_default_model_input_quantized():  # as AIMET's default_config.json
    assert QuantSimConfig.load().input_spec("conv", CONV, 0, is_model_input=True).enabled is True


def test_builtin_default_batchnorm_weight_per_tensor():
    # as AIMET's default: a BatchNorm's weight is quantized per tensor, its bias not; one that follows a
    # convolution folds into it (placement turns its parameters off, see test_placement)
    cfg = QuantSimConfig.load()
    w = cfg.param_spec("bn", BN, "weight")
    assert (w.enabled, w.per_channel, w.symmetric) == (True, False, True)
    assert cfg.param_spec("bn", BN, "bias").enabled is False
    assert cfg.output_spec("bn", BN, 0).enabled is True


@pytest.mark.parametrize("op_types", [LN, GN], ids=["LayerNorm", "GroupNorm"])
def test_builtin_default_norm_weight_per_tensor(op_types):
    cfg = QuantSimConfig.load()
    w = cfg.param_spec("norm", op_types, "weight")
    assert (w.enabled, w.per_channel, w.symmetric) == (True, False, True)
    assert cfg.param_spec("norm", op_types, "bias").enabled is False


def test_builtin_default_supergroups():  # AIMET's default_config.json's, and Gemm -> Add
    assert QuantSimConfig.load().supergroups == (
        ("Conv", "Relu"), ("ConvTranspose", "Relu"), ("Conv", "Clip"), ("Add", "Relu"), ("Gemm", "Relu"),
        ("Gemm", "Add"),
    )
    assert QuantSimConfig.load().supergroup_passes == ("MatmulAdd",)


def test_builtin_default_matches_quanta_nn_defaults():
    # QuantSimConfig.load() must describe what quanta.nn builds without a config
    cfg = QuantSimConfig.load()
    conv = quanta.nn.QuantizedConv2d(3, 8, 3)
    assert (conv.param_quantizers["weight"] is not None) == cfg.param_spec("c", CONV, "weight").enabled
    assert (conv.param_quantizers["bias"] is not None) == cfg.param_spec("c", CONV, "bias").enabled
    assert conv.param_quantizers["weight"].shape == (8, 1, 1, 1)  # per channel
    assert (conv.input_quantizers[0] is not None) == cfg.input_spec("c", CONV, 0).enabled
    assert conv.output_quantizers[0].symmetric == cfg.output_spec("c", CONV, 0).symmetric


def test_load_none_is_builtin_and_config_returns_itself():
    cfg = QuantSimConfig.load()
    assert QuantSimConfig.load(None) == cfg
    assert QuantSimConfig.load(cfg) is cfg
    assert QuantSimConfig.load(BUILTIN_DEFAULT) == cfg


# -- a user config starts from the base, not from the built-in default --------------------------------
def test_empty_user_config_is_the_base():
    # AIMET's base: a file says what it quantizes; nothing it leaves out is quantized, nothing is symmetric
    cfg = QuantSimConfig.load({})
    w = cfg.param_spec("conv", CONV, "weight")
    assert (w.enabled, w.symmetric, w.per_channel) == (False, False, False)
    assert cfg.param_spec("conv", CONV, "bias").enabled is False
    out = cfg.output_spec("conv", CONV, 0)
    assert (out.enabled, out.symmetric, out.bitwidth, out.dtype) == (False, False, None, None)
    assert cfg.input_spec("conv", CONV, 0).enabled is False
    assert cfg.supergroups == () and cfg.supergroup_passes == ()


def test_user_config_fields_missing_take_base_values():
    # AIMET's dsp_quantsim_config.json: params quantized without is_symmetric are asymmetric
    cfg = load(defaults={"ops": {"is_output_quantized": True}, "params": {"is_quantized": True}})
    w = cfg.param_spec("conv", CONV, "weight")
    assert (w.enabled, w.symmetric, w.strict_symmetric, w.unsigned_symmetric) == (True, False, False, False)
    assert cfg.param_spec("bn", BN, "weight").enabled is True  # no built-in BatchNormalization entry
    assert cfg.output_spec("conv", CONV, 0).enabled is True and cfg.input_spec("conv", CONV, 0).enabled is False


# -- each precedence level -------------------------------------------------------------------------
def test_defaults_override_base():
    cfg = load(defaults={"ops": {"is_symmetric": True, "is_output_quantized": False, "is_input_quantized": True},
                         "params": {"is_quantized": False}})
    assert cfg.output_spec("x", CONV, 0).symmetric is True
    assert cfg.output_spec("x", CONV, 0).enabled is False
    assert cfg.input_spec("x", CONV, 0).enabled is True
    assert cfg.param_spec("x", CONV, "weight").enabled is False


def test_top_level_params_override_defaults():
    cfg = load(defaults={"params": {"is_quantized": True, "bitwidth": 8}}, params={"bias": {"is_quantized": False}})
    assert cfg.param_spec("x", CONV, "bias").enabled is False
    assert cfg.param_spec("x", CONV, "weight").enabled is True
    assert cfg.param_spec("x", CONV, "bias").bitwidth == 8  # other fields still from defaults


def test_op_type_params_override_top_level_params():
    cfg = load(params={"bias": {"is_quantized": False}}, op_type={"Conv": {"params": {"bias": {"is_quantized": True}}}})
    assert cfg.param_spec("x", CONV, "bias").enabled is True
    assert cfg.param_spec("x", GEMM, "bias").enabled is False


def test_op_type_op_level_per_channel_overrides_defaults():
    cfg = load(defaults={"per_channel_quantization": True}, op_type={"Gemm": {"per_channel_quantization": False}})
    assert cfg.param_spec("fc", GEMM, "weight").per_channel is False
    assert cfg.param_spec("conv", CONV, "weight").per_channel is True


def test_op_type_params_override_op_type_op_level():
    cfg = load(op_type={"Conv": {"per_channel_quantization": False,
                                 "params": {"weight": {"per_channel_quantization": True}}}})
    assert cfg.param_spec("x", CONV, "weight").per_channel is True
    assert cfg.param_spec("x", CONV, "bias").per_channel is False


def test_op_type_overrides_defaults_for_activations():
    cfg = load(defaults={"ops": {"bitwidth": 8}}, op_type={"Softmax": {"bitwidth": 16}})
    assert cfg.output_spec("sm", ("Softmax",), 0).bitwidth == 16
    assert cfg.output_spec("x", CONV, 0).bitwidth == 8


def test_op_type_matches_any_of_the_op_types():
    cfg = load(defaults={"ops": {"is_output_quantized": True}}, op_type={"Gemm": {"is_output_quantized": False}})
    assert cfg.output_spec("fc", GEMM, 0).enabled is False
    assert cfg.output_spec("fc", ["Linear"], 0).enabled is True  # no "Gemm" among them
    assert cfg.output_spec("fc", (), 0).enabled is True


def test_earlier_op_type_name_wins():
    cfg = load(op_type={"Conv2d": {"bitwidth": 4}, "Conv": {"bitwidth": 16, "is_symmetric": True}})
    out = cfg.output_spec("x", CONV, 0)
    assert out.bitwidth == 4  # the class name comes first in op_types_of
    assert out.symmetric is True  # keys the class-name entry leaves unset still come from "Conv"
    assert cfg.output_spec("x", ("Conv", "Conv2d"), 0).bitwidth == 16


def test_module_name_overrides_op_type():
    cfg = load(op_type={"Gemm": {"is_output_quantized": True, "params": {"weight": {"bitwidth": 8}}}},
               module_name={"head": {"is_output_quantized": False, "params": {"weight": {"bitwidth": 4}}}})
    assert cfg.output_spec("head", GEMM, 0).enabled is False
    assert cfg.param_spec("head", GEMM, "weight").bitwidth == 4
    assert cfg.output_spec("body", GEMM, 0).enabled is True
    assert cfg.param_spec("body", GEMM, "weight").bitwidth == 8


def test_module_name_op_level_per_channel_applies_to_params():
    cfg = load(op_type={"Conv": {"params": {"weight": {"per_channel_quantization": True}}}},
               module_name={"stem": {"per_channel_quantization": False}})
    # module_name (op level) is above op_type.params
    assert cfg.param_spec("stem", CONV, "weight").per_channel is False


def test_module_name_params_override_module_name_op_level():
    cfg = load(module_name={"head": {"per_channel_quantization": False, "params": {"weight": {"block_size": 32}}}})
    w = cfg.param_spec("head", GEMM, "weight")
    assert (w.per_channel, w.block_size) == (True, 32)


def test_module_name_glob_and_exact():
    cfg = load(defaults={"ops": {"is_output_quantized": True}},
               module_name={"encoder.layers.*.attn": {"is_output_quantized": False}, "head": {"bitwidth": 4}})
    assert cfg.output_spec("encoder.layers.0.attn", GEMM, 0).enabled is False
    assert cfg.output_spec("encoder.layers.11.attn", GEMM, 0).enabled is False
    assert cfg.output_spec("encoder.layers.0.ffn", GEMM, 0).enabled is True
    assert cfg.output_spec("encoder.layers.0.attn.q", GEMM, 0).enabled is True  # glob matches the whole name
    assert cfg.output_spec("head", GEMM, 0).bitwidth == 4
    assert cfg.output_spec("head.0", GEMM, 0).bitwidth is None  # a plain name is not a prefix
    assert cfg.output_spec("Head", GEMM, 0).bitwidth is None  # case-sensitive


def test_module_name_later_pattern_wins():
    cfg = load(module_name={"*": {"bitwidth": 8, "is_symmetric": True}, "head": {"bitwidth": 4}})
    assert cfg.output_spec("head", GEMM, 0).bitwidth == 4
    assert cfg.output_spec("head", GEMM, 0).symmetric is True
    cfg = load(module_name={"head": {"bitwidth": 4}, "*": {"bitwidth": 8}})
    assert cfg.output_spec("head", GEMM, 0).bitwidth == 8


def test_module_name_params_override_op_type_params_of_all_names():
    cfg = load(op_type={"Conv2d": {"params": {"weight": {"bitwidth": 6}}}},
               module_name={"*": {"params": {"weight": {"bitwidth": 3}}}})
    assert cfg.param_spec("any", CONV, "weight").bitwidth == 3


def test_model_input_overrides_lower_levels():
    cfg = load(model_input={"is_input_quantized": True}, module_name={"stem": {"is_input_quantized": False}})
    assert cfg.input_spec("stem", CONV, 0, is_model_input=True).enabled is True
    assert cfg.input_spec("stem", CONV, 1, is_model_input=True).enabled is True  # every index
    assert cfg.input_spec("stem", CONV, 0).enabled is False


def test_model_input_false_turns_inputs_off():
    cfg = load(defaults={"ops": {"is_input_quantized": True}}, model_input={"is_input_quantized": False})
    assert cfg.input_spec("x", CONV, 0, is_model_input=True).enabled is False
    assert cfg.input_spec("x", CONV, 0).enabled is True


def test_model_output_on_and_off():
    on = load(defaults={"ops": {"is_output_quantized": False}}, model_output={"is_output_quantized": True})
    assert on.output_spec("head", GEMM, 0, is_model_output=True).enabled is True
    assert on.output_spec("head", GEMM, 0).enabled is False
    off = load(defaults={"ops": {"is_output_quantized": True}}, model_output={"is_output_quantized": False})
    assert off.output_spec("head", GEMM, 0, is_model_output=True).enabled is False
    assert off.output_spec("head", GEMM, 0).enabled is True


def test_empty_model_input_output_change_nothing():
    cfg = load(defaults={"ops": {"is_output_quantized": True}}, model_input={}, model_output={})
    assert cfg.input_spec("x", CONV, 0, is_model_input=True).enabled is False
    assert cfg.output_spec("x", CONV, 0, is_model_output=True).enabled is True


# -- each key --------------------------------------------------------------------------------------
def test_activation_bitwidth_dtype_symmetric():
    cfg = load(op_type={"Softmax": {"bitwidth": 16, "dtype": "float", "is_symmetric": True}})
    out = cfg.output_spec("sm", ("Softmax",), 0)
    assert (out.bitwidth, out.dtype, out.symmetric) == (16, DataType.FLOAT, True)
    assert cfg.input_spec("sm", ("Softmax",), 0).bitwidth == 16  # op-level keys apply to inputs too
    assert cfg.param_spec("sm", ("Softmax",), "weight").bitwidth is None  # ... and not to params


def test_param_bitwidth_dtype_symmetric():
    cfg = load(params={"weight": {"bitwidth": 4, "dtype": "int", "is_symmetric": False}})
    w = cfg.param_spec("x", CONV, "weight")
    assert (w.bitwidth, w.dtype, w.symmetric) == (4, DataType.INT, False)
    assert cfg.output_spec("x", CONV, 0).bitwidth is None


def test_op_level_is_symmetric_leaves_params_alone():
    cfg = load(defaults={"params": {"is_symmetric": True}}, op_type={"Conv": {"is_symmetric": False}})
    assert cfg.param_spec("x", CONV, "weight").symmetric is True
    assert cfg.output_spec("x", CONV, 0).symmetric is False


def test_per_channel_in_defaults_ops_and_defaults_params():
    assert load(defaults={"ops": {"per_channel_quantization": True}}).param_spec("x", CONV, "weight").per_channel
    assert load(defaults={"params": {"per_channel_quantization": True}}).param_spec("x", CONV, "weight").per_channel


def test_per_channel_is_not_an_activation_setting():
    cfg = load(defaults={"per_channel_quantization": True})
    assert cfg.output_spec("x", CONV, 0).per_channel is False


def test_strict_and_unsigned_symmetric_defaults_apply_everywhere():
    cfg = load(defaults={"strict_symmetric": "True", "unsigned_symmetric": "True"})
    for spec in (cfg.param_spec("x", CONV, "weight"), cfg.output_spec("x", CONV, 0), cfg.input_spec("x", CONV, 0)):
        assert (spec.strict_symmetric, spec.unsigned_symmetric) == (True, True)


def test_strict_and_unsigned_symmetric_per_op():
    cfg = load(op_type={"Conv": {"strict_symmetric": True, "unsigned_symmetric": True}})
    assert cfg.param_spec("x", CONV, "weight").strict_symmetric is True
    assert cfg.output_spec("x", CONV, 0).unsigned_symmetric is True
    assert cfg.param_spec("x", GEMM, "weight").strict_symmetric is False


def test_block_size_and_later_per_channel_false_clears_it():
    cfg = load(defaults={"params": {"block_size": 64}},
               op_type={"LayerNormalization": {"per_channel_quantization": False}})
    w = cfg.param_spec("fc", GEMM, "weight")
    assert (w.per_channel, w.block_size) == (True, 64)
    w = cfg.param_spec("ln", LN, "weight")
    assert (w.per_channel, w.block_size) == (False, None)


def test_block_size_with_per_channel_true_in_one_entry():
    cfg = load(params={"weight": {"block_size": 16, "per_channel_quantization": True}})
    assert cfg.param_spec("x", GEMM, "weight").block_size == 16


def test_hw_version_is_accepted_and_ignored():
    with_hw = load(defaults={"hw_version": "V73", "params": {"is_symmetric": True}})
    without = load(defaults={"params": {"is_symmetric": True}})
    assert with_hw.param_spec("x", CONV, "weight") == without.param_spec("x", CONV, "weight")
    assert with_hw.to_dict()["defaults"]["hw_version"] == "V73"


def test_supported_kernels_are_accepted_and_kept():
    kernels = [{"activation": {"bitwidth": 16, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}}]
    cfg = load(defaults={"supported_kernels": kernels}, op_type={"Conv": {"supported_kernels": kernels}})
    assert cfg.to_dict()["defaults"]["supported_kernels"] == kernels
    assert cfg.to_dict()["op_type"]["Conv"]["supported_kernels"] == kernels
    assert cfg.output_spec("x", CONV, 0) == QuantSimConfig.load({}).output_spec("x", CONV, 0)


def test_encoding_constraints():
    cfg = load(op_type={"Softmax": {"encoding_constraints": {"min": 0.0, "max": 1.0}}},
               module_name={"special.sm": {"encoding_constraints": {"min": -1, "max": 1}}})
    assert cfg.encoding_constraints("attn.sm", ("Softmax",)) == (0.0, 1.0)
    assert cfg.encoding_constraints("special.sm", ("Softmax",)) == (-1.0, 1.0)
    assert cfg.encoding_constraints("fc", GEMM) is None
    # an end left out (or null) is calibrated as usual (AIMET's HTP files: "Relu": {"min": 0.0})
    half = load(op_type={"Relu": {"encoding_constraints": {"min": 0.0}}, "Elu": {"encoding_constraints": {"max": None,
                                                                                                          "min": -1}}})
    assert half.encoding_constraints("r", ("ReLU", "Relu")) == (0.0, None)
    assert half.encoding_constraints("e", ("ELU", "Elu")) == (-1.0, None)
    assert half.to_dict()["op_type"]["Relu"]["encoding_constraints"] == {"min": 0.0}
    assert QuantSimConfig.load(half.to_dict()) == half


# -- AIMET's booleans and files ----------------------------------------------------------------------
def test_aimet_string_booleans_equal_json_booleans():
    strings = load(defaults={"ops": {"is_output_quantized": "False", "is_symmetric": "True"},
                             "params": {"is_quantized": "False"}, "per_channel_quantization": "True"})
    bools = load(defaults={"ops": {"is_output_quantized": False, "is_symmetric": True},
                           "params": {"is_quantized": False}, "per_channel_quantization": True})
    assert strings == bools
    assert strings.output_spec("x", CONV, 0).enabled is False
    assert strings.param_spec("x", CONV, "weight").enabled is False


AIMET_HTP_V73 = """{
  "defaults": {
    "hw_version": "V73",
    "ops": {"is_output_quantized": "True"},
    "params": {"is_quantized": "True", "is_symmetric": "True"},
    "per_channel_quantization": "True",
    "strict_symmetric": "False",
    "unsigned_symmetric": "False"
  },
  "params": {"bias": {"is_quantized": "False"}},
  "op_type": {
    "Gather": {"is_output_quantized": "False", "per_channel_quantization": "False"},
    "Gemm": {"per_channel_quantization": "False"},
    "GroupNormalization": {"per_channel_quantization": "False", "params": {"bias": {"is_quantized": "True"}}},
    "GroupNormalization": {"per_channel_quantization": "False", "params": {"bias": {"is_quantized": "True"}}},
    "LayerNormalization": {"per_channel_quantization": "False", "params": {"weight": {"is_symmetric": "False"}}},
    "BatchNormalization": {"per_channel_quantization": "False",
                           "params": {"running_mean": {"is_quantized": "False"},
                                      "running_var": {"is_quantized": "False"}}},
    "Softmax": {"encoding_constraints": {"min": 0.0, "max": 1.0}}
  },
  "supergroups": [{"op_list": ["Add", "Relu"]}, {"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
  "model_input": {"is_input_quantized": "True"},
  "model_output": {}
}"""


def test_aimet_htp_config_file(tmp_path):
    path = tmp_path / "htp_quantsim_config_v73.json"
    path.write_text(AIMET_HTP_V73)
    cfg = QuantSimConfig.load(path)
    assert cfg.param_spec("fc", GEMM, "weight").per_channel is False
    assert cfg.param_spec("conv", CONV, "weight").per_channel is True
    assert cfg.param_spec("gn", GN, "bias").enabled is True
    assert cfg.param_spec("ln", LN, "weight").symmetric is False
    assert cfg.output_spec("emb", ("Embedding", "Gather"), 0).enabled is False
    assert cfg.input_spec("conv", CONV, 0, is_model_input=True).enabled is True
    assert cfg.encoding_constraints("sm", ("Softmax",)) == (0.0, 1.0)
    assert cfg.supergroups == (("Add", "Relu"), ("Conv", "Relu"), ("Gemm", "Relu"))


def test_json_file_str_and_pathlike(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"op_type": {"Conv": {"bitwidth": 4}}}))
    assert QuantSimConfig.load(str(path)) == QuantSimConfig.load(path)
    assert QuantSimConfig.load(path).output_spec("x", CONV, 0).bitwidth == 4


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".YAML"])
def test_yaml_file(tmp_path, suffix):
    path = tmp_path / f"cfg{suffix}"
    path.write_text(
        "defaults:\n"
        "  ops: {is_output_quantized: 'True'}\n"
        "  params: {is_quantized: true, is_symmetric: 'True'}\n"
        "module_name:\n"
        "  'encoder.*.attn':\n"
        "    is_output_quantized: false\n"
        "    params:\n"
        "      weight: {block_size: 32, bitwidth: 4}\n"
    )
    cfg = QuantSimConfig.load(path)
    assert cfg.output_spec("encoder.0.attn", GEMM, 0).enabled is False
    assert cfg.param_spec("encoder.0.attn", GEMM, "weight").block_size == 32


def test_yaml_without_pyyaml_says_how_to_install(tmp_path, monkeypatch):
    path = tmp_path / "cfg.yaml"
    path.write_text("defaults: {}\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError
    with pytest.raises(ImportError, match=re.escape("pip install quanta[yaml]")):
        QuantSimConfig.load(path)


def test_yaml_is_read_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ValueError, match="invalid YAML at line 1"):
        QuantSimConfig.load(path)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "cfg.txt"
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"unsupported file suffix '\.txt'; use \.json, \.yaml or \.yml"):
        QuantSimConfig.load(path)


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        QuantSimConfig.load(path)


def test_malformed_json_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "defaults": {\n    "ops": {"is_output_quantized": "True",}\n  }\n}\n')
    with pytest.raises(ValueError) as info:
        QuantSimConfig.load(path)
    assert str(path) in str(info.value) and "line 3" in str(info.value)


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("defaults:\n  ops: {is_output_quantized: True\n")
    with pytest.raises(ValueError) as info:
        QuantSimConfig.load(path)
    assert str(path) in str(info.value) and re.search(r"line \d+", str(info.value))


def test_content_error_in_file_names_file_and_key_path(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"op_type": {"Conv": {"bitwidth": "eight"}}}))
    with pytest.raises(ValueError) as info:
        QuantSimConfig.load(path)
    expected = "config['op_type']['Conv']['bitwidth']: expected an integer in [1, 32], got 'eight'"
    assert str(info.value) == f"{path}: {expected}"


def test_empty_yaml_file_is_an_error(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ValueError, match="config: expected a mapping"):
        QuantSimConfig.load(path)


# -- mappings, copies, round trips -------------------------------------------------------------------
def test_mapping_is_copied():
    raw = {"op_type": {"Conv": {"bitwidth": 4}}, "supergroups": [{"op_list": ["Conv", "Relu"]}]}
    cfg = QuantSimConfig.load(raw)
    raw["op_type"]["Conv"]["bitwidth"] = 2
    raw["supergroups"][0]["op_list"].append("Add")
    assert cfg.output_spec("x", CONV, 0).bitwidth == 4
    assert cfg.supergroups == (("Conv", "Relu"),)


FULL = {
    "defaults": {
        "ops": {"is_output_quantized": "True", "is_input_quantized": "False", "is_symmetric": "False",
                "bitwidth": 8, "dtype": "int"},
        "params": {"is_quantized": "True", "is_symmetric": "True", "bitwidth": 8},
        "strict_symmetric": "False",
        "unsigned_symmetric": "True",
        "per_channel_quantization": "True",
        "hw_version": "V73",
    },
    "params": {"bias": {"is_quantized": "False"}},
    "op_type": {
        "Conv": {"per_channel_quantization": "False", "params": {"weight": {"bitwidth": 4}}},
        "Softmax": {"bitwidth": 16, "dtype": "float", "encoding_constraints": {"min": 0, "max": 1}},
        "BatchNormalization": {"params": {"weight": {"is_quantized": "False"}, "bias": {"is_quantized": "False"}}},
    },
    "module_name": {"encoder.layers.*.attn": {"is_output_quantized": "False"},
                    "head": {"params": {"weight": {"block_size": 32}}}},
    "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
    "model_input": {"is_input_quantized": "True"},
    "model_output": {"is_output_quantized": "True"},
}


@pytest.mark.parametrize("source", [None, {}, FULL, BUILTIN_DEFAULT], ids=["builtin", "empty", "full", "BUILTIN"])
def test_round_trip(source):
    cfg = QuantSimConfig.load(source)
    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d
    again = QuantSimConfig.load(d)
    assert again == cfg and again.to_dict() == d


def test_to_dict_is_normalised():
    d = QuantSimConfig.load(FULL).to_dict()
    assert d["defaults"]["ops"] == {"is_output_quantized": True, "is_input_quantized": False, "is_symmetric": False,
                                    "bitwidth": 8, "dtype": "int"}
    assert d["defaults"]["per_channel_quantization"] is True
    assert d["op_type"]["Softmax"]["encoding_constraints"] == {"min": 0.0, "max": 1.0}
    assert list(d) == ["defaults", "params", "op_type", "module_name", "supergroups", "supergroup_pass_list",
                       "model_input", "model_output"]
    assert QuantSimConfig.load({}).to_dict()["model_input"] == {}


def test_to_dict_keeps_module_name_order():
    d = load(module_name={"b": {"bitwidth": 4}, "a": {"bitwidth": 8}}).to_dict()
    assert list(d["module_name"]) == ["b", "a"]


def test_to_dict_returns_a_fresh_copy():
    cfg = QuantSimConfig.load(FULL)
    cfg.to_dict()["op_type"]["Conv"]["params"]["weight"]["bitwidth"] = 2
    assert cfg.param_spec("x", CONV, "weight").bitwidth == 4


def test_equality_and_repr():
    assert QuantSimConfig.load({}) != QuantSimConfig.load()
    assert QuantSimConfig.load({}) != {}
    expected = "QuantSimConfig(op_type=['Conv'], module_name=[], supergroups=0)"
    assert repr(QuantSimConfig.load({"op_type": {"Conv": {}}})) == expected


def test_full_example_resolves():
    cfg = QuantSimConfig.load(FULL)
    assert cfg.param_spec("c", CONV, "weight") == QuantizerSpec(
        enabled=True, bitwidth=4, symmetric=True, dtype=None, per_channel=False, unsigned_symmetric=True)
    assert cfg.param_spec("head", GEMM, "weight").block_size == 32
    sm = cfg.output_spec("attn.sm", ("Softmax",), 0)
    assert (sm.bitwidth, sm.dtype) == (16, DataType.FLOAT)


# -- validation errors: one per case, each naming the key path -------------------------------------
def test_error_bitwidth_not_int():
    msg = raises("config['op_type']['Conv']['bitwidth']", {"op_type": {"Conv": {"bitwidth": "eight"}}})
    assert msg == "config['op_type']['Conv']['bitwidth']: expected an integer in [1, 32], got 'eight'"


@pytest.mark.parametrize("bad", [0, 33, True, 8.0, None])
def test_error_bitwidth_out_of_range_or_type(bad):
    raises("config['params']['weight']['bitwidth']: expected an integer in [1, 32]",
           {"params": {"weight": {"bitwidth": bad}}})


def test_error_bitwidth_in_defaults_ops():
    raises("config['defaults']['ops']['bitwidth']", {"defaults": {"ops": {"bitwidth": -1}}})


@pytest.mark.parametrize("bad", [0, -4, "32", True])
def test_error_block_size(bad):
    raises("config['module_name']['head']['params']['weight']['block_size']: expected a positive integer",
           {"module_name": {"head": {"params": {"weight": {"block_size": bad}}}}})


def test_error_block_size_with_per_channel_false():
    raises("config['params']['weight']['block_size']: block quantization is per output channel",
           {"params": {"weight": {"block_size": 32, "per_channel_quantization": False}}})


def test_error_dtype():
    raises("config['defaults']['params']['dtype']: expected 'int' or 'float', got 'fp8'",
           {"defaults": {"params": {"dtype": "fp8"}}})


def test_error_float_dtype_bitwidth_in_one_entry():
    raises("config['op_type']['Softmax']['bitwidth']: dtype 'float' supports bitwidth 8 or 16, got 4",
           {"op_type": {"Softmax": {"dtype": "float", "bitwidth": 4}}})


def test_error_float_dtype_bitwidth_across_entries_at_resolution():
    cfg = load(defaults={"ops": {"dtype": "float"}}, op_type={"Softmax": {"bitwidth": 4}})
    assert cfg.output_spec("x", CONV, 0).dtype is DataType.FLOAT
    with pytest.raises(ValueError, match=r"output 0 of module 'sm'.*bitwidth 4.*8 or 16"):
        cfg.output_spec("sm", ("Softmax",), 0)


@pytest.mark.parametrize("bad", ["true", "yes", 1, 0, None])
def test_error_boolean(bad):
    raises("config['op_type']['Conv']['is_output_quantized']: expected true/false or the string 'True'/'False'",
           {"op_type": {"Conv": {"is_output_quantized": bad}}})


def test_error_boolean_in_defaults():
    raises("config['defaults']['strict_symmetric']", {"defaults": {"strict_symmetric": "on"}})


def test_error_unknown_top_level_key():
    msg = raises("config: unknown key 'op_types' (did you mean 'op_type'?)", {"op_types": {}})
    assert ("allowed keys: defaults, model_input, model_output, module_name, op_type, params, supergroup_pass_list, "
            "supergroups") in msg


def test_error_unknown_op_key_typo():
    msg = raises("config['op_type']['Conv']: unknown key 'is_output_quantised' (did you mean 'is_output_quantized'?)",
                 {"op_type": {"Conv": {"is_output_quantised": "False"}}})
    assert "allowed keys:" in msg and "is_output_quantized" in msg


def test_error_unknown_defaults_key():
    raises("config['defaults']: unknown key 'op'", {"defaults": {"op": {}}})


def test_error_params_not_allowed_in_defaults_ops():
    raises("config['defaults']['ops']: unknown key 'params'", {"defaults": {"ops": {"params": {}}}})


def test_error_unknown_param_key():
    msg = raises("config['op_type']['Conv']['params']['weight']: unknown key 'is_output_quantized'",
                 {"op_type": {"Conv": {"params": {"weight": {"is_output_quantized": True}}}}})
    assert ("allowed keys: bitwidth, block_format, block_grouping, block_size, decompressed_bw, dtype, is_quantized, "
            "is_symmetric, per_channel_quantization") in msg


def test_error_block_size_not_an_op_level_key():
    raises("config['module_name']['head']: unknown key 'block_size'", {"module_name": {"head": {"block_size": 32}}})


def test_error_supported_kernels_not_in_module_name():
    raises("config['module_name']['head']: unknown key 'supported_kernels'",
           {"module_name": {"head": {"supported_kernels": [{}]}}})


def test_error_unknown_model_input_key():
    raises("config['model_input']: unknown key 'is_output_quantized'", {"model_input": {"is_output_quantized": True}})


def test_error_unknown_model_output_key():
    raises("config['model_output']: unknown key 'is_input_quantized'", {"model_output": {"is_input_quantized": True}})


def test_error_model_input_value():
    raises("config['model_input']['is_input_quantized']", {"model_input": {"is_input_quantized": "TRUE"}})


def test_error_top_level_not_a_mapping(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=re.escape(f"{path}: config: expected a mapping (JSON object), got list")):
        QuantSimConfig.load(path)


def test_error_section_not_a_mapping():
    raises("config['op_type']: expected a mapping (JSON object), got list", {"op_type": ["Conv"]})


def test_error_op_entry_not_a_mapping():
    raises("config['op_type']['Conv']: expected a mapping (JSON object), got str", {"op_type": {"Conv": "False"}})


def test_error_param_entry_not_a_mapping():
    raises("config['params']['bias']: expected a mapping", {"params": {"bias": False}})


def test_error_op_params_not_a_mapping():
    raises("config['op_type']['Conv']['params']: expected a mapping", {"op_type": {"Conv": {"params": ["weight"]}}})


def test_error_non_string_param_name():
    raises("config['params']: a parameter name must be a non-empty string, got 1", {"params": {1: {}}})


def test_error_empty_op_type_name():
    raises("config['op_type']: an op type must be a non-empty string, got ''", {"op_type": {"": {}}})


def test_error_empty_module_name_pattern():
    raises("config['module_name']: a module name pattern", {"module_name": {"": {"bitwidth": 8}}})


def test_error_supergroups_not_a_list():
    raises("config['supergroups']: expected a list of {'op_list': [...]} entries", {"supergroups": {"op_list": []}})


def test_error_supergroup_entry_not_a_mapping():
    raises("config['supergroups'][0]: expected a mapping", {"supergroups": [["Conv", "Relu"]]})


def test_error_supergroup_missing_op_list():
    raises("config['supergroups'][1]: missing key 'op_list'", {"supergroups": [{"op_list": ["Conv", "Relu"]}, {}]})


def test_error_supergroup_unknown_key():
    raises("config['supergroups'][0]: unknown key 'ops'", {"supergroups": [{"ops": ["Conv", "Relu"]}]})


def test_error_supergroup_too_short():
    raises("config['supergroups'][0]['op_list']: expected a list of at least 2 op types",
           {"supergroups": [{"op_list": ["Conv"]}]})


def test_error_supergroup_op_list_is_a_string():
    raises("config['supergroups'][0]['op_list']: expected a list", {"supergroups": [{"op_list": "ConvRelu"}]})


def test_error_supergroup_op_not_a_string():
    raises("config['supergroups'][0]['op_list'][1]: expected a non-empty string, got 3",
           {"supergroups": [{"op_list": ["Conv", 3]}]})


def test_error_per_channel_set_twice_in_defaults():
    raises("config['defaults']['ops']['per_channel_quantization']: also set at "
           "config['defaults']['per_channel_quantization']; set per_channel_quantization in one place only",
           {"defaults": {"per_channel_quantization": True, "ops": {"per_channel_quantization": False}}})


def test_error_strict_symmetric_set_twice_in_defaults():
    raises("config['defaults']['ops']['strict_symmetric']: also set at config['defaults']['strict_symmetric']",
           {"defaults": {"strict_symmetric": True, "ops": {"strict_symmetric": True}}})


def test_error_hw_version_not_a_string():
    raises("config['defaults']['hw_version']: expected a non-empty string, got 73", {"defaults": {"hw_version": 73}})


def test_error_encoding_constraints_order():
    raises("config['op_type']['Softmax']['encoding_constraints']: 'min' must be below 'max'",
           {"op_type": {"Softmax": {"encoding_constraints": {"min": 1, "max": 0}}}})


def test_error_encoding_constraints_without_bounds():
    raises("config['op_type']['Softmax']['encoding_constraints']: expected 'min' and/or 'max' as a number",
           {"op_type": {"Softmax": {"encoding_constraints": {"min": None}}}})
    raises("config['op_type']['Relu']['encoding_constraints']['max']: expected a finite number or null",
           {"op_type": {"Relu": {"encoding_constraints": {"min": 0, "max": "inf"}}}})


def test_error_supported_kernels_empty():
    raises("config['defaults']['supported_kernels']: expected a non-empty list",
           {"defaults": {"supported_kernels": []}})


# -- argument validation -----------------------------------------------------------------------------
def test_load_rejects_other_sources():
    with pytest.raises(TypeError, match="source must be None"):
        QuantSimConfig.load(42)  # type: ignore[arg-type]


def test_constructor_points_to_load():
    with pytest.raises(TypeError, match=re.escape("QuantSimConfig.load(source)")):
        QuantSimConfig({})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call, exc, text",
    [
        (lambda c: c.param_spec(0, CONV, "weight"), TypeError, "module_name must be a str"),
        (lambda c: c.param_spec("x", "Conv", "weight"), TypeError, "op_types must be a sequence"),
        (lambda c: c.param_spec("x", {"Conv"}, "weight"), TypeError, "op_types must be a sequence"),
        (lambda c: c.param_spec("x", ("Conv", nn.Conv2d), "weight"), TypeError, "op_types must hold strings"),
        (lambda c: c.param_spec("x", CONV, ""), TypeError, "param_name must be a non-empty str"),
        (lambda c: c.param_spec("x", CONV, None), TypeError, "param_name must be a non-empty str"),
        (lambda c: c.input_spec("x", CONV, "0"), TypeError, "index must be an int"),
        (lambda c: c.input_spec("x", CONV, True), TypeError, "index must be an int"),
        (lambda c: c.output_spec("x", CONV, -1), ValueError, "index must be >= 0"),
        (lambda c: c.input_spec("x", CONV, 0, is_model_input="True"), TypeError, "is_model_input must be a bool"),
        (lambda c: c.output_spec("x", CONV, 0, is_model_output=1), TypeError, "is_model_output must be a bool"),
        (lambda c: c.encoding_constraints("x", "Softmax"), TypeError, "op_types must be a sequence"),
    ],
)
def test_method_argument_errors(call, exc, text):
    with pytest.raises(exc, match=re.escape(text)):
        call(QuantSimConfig.load())


def test_model_flags_are_keyword_only():
    with pytest.raises(TypeError):
        QuantSimConfig.load().input_spec("x", CONV, 0, True)  # type: ignore[misc]


# -- op_types_of -------------------------------------------------------------------------------------
TORCH_OP_TYPES = [
    (nn.Conv1d, ("Conv1d", "Conv")), (nn.Conv2d, ("Conv2d", "Conv")), (nn.Conv3d, ("Conv3d", "Conv")),
    (nn.ConvTranspose1d, ("ConvTranspose1d", "ConvTranspose")),
    (nn.ConvTranspose2d, ("ConvTranspose2d", "ConvTranspose")),
    (nn.ConvTranspose3d, ("ConvTranspose3d", "ConvTranspose")),
    (nn.Linear, ("Linear", "Gemm")), (nn.ReLU, ("ReLU", "Relu")), (nn.GELU, ("GELU", "Gelu")),
    (nn.SiLU, ("SiLU",)), (nn.Sigmoid, ("Sigmoid",)), (nn.Tanh, ("Tanh",)), (nn.Softmax, ("Softmax",)),
    (nn.LayerNorm, ("LayerNorm", "LayerNormalization")), (nn.GroupNorm, ("GroupNorm", "GroupNormalization")),
    (nn.BatchNorm1d, ("BatchNorm1d", "BatchNormalization")), (nn.BatchNorm2d, ("BatchNorm2d", "BatchNormalization")),
    (nn.BatchNorm3d, ("BatchNorm3d", "BatchNormalization")), (nn.Embedding, ("Embedding", "Gather")),
    (nn.MultiheadAttention, ("MultiheadAttention",)),
    (nn.MaxPool1d, ("MaxPool1d", "MaxPool")), (nn.MaxPool2d, ("MaxPool2d", "MaxPool")),
    (nn.MaxPool3d, ("MaxPool3d", "MaxPool")), (nn.AvgPool1d, ("AvgPool1d", "AveragePool")),
    (nn.AvgPool2d, ("AvgPool2d", "AveragePool")), (nn.AvgPool3d, ("AvgPool3d", "AveragePool")),
    (nn.ReLU6, ("ReLU6", "Clip")), (nn.PReLU, ("PReLU", "PRelu")), (nn.LeakyReLU, ("LeakyReLU", "LeakyRelu")),
    (nn.Hardswish, ("Hardswish", "HardSwish")), (nn.InstanceNorm2d, ("InstanceNorm2d", "InstanceNormalization")),
    (nn.Dropout, ("Dropout",)), (nn.Dropout2d, ("Dropout2d", "Dropout")),
]


@pytest.mark.parametrize("cls, expected", TORCH_OP_TYPES, ids=[c.__name__ for c, _ in TORCH_OP_TYPES])
def test_op_types_of_torch_classes(cls, expected):
    assert op_types_of(cls) == expected


def test_op_types_of_instances():
    assert op_types_of(nn.Conv2d(1, 1, 1)) == ("Conv2d", "Conv")
    assert op_types_of(nn.ReLU()) == ("ReLU", "Relu")


QUANTA_OP_TYPES = [
    (quanta.nn.Add, ("Add",)), (quanta.nn.Multiply, ("Multiply", "Mul")), (quanta.nn.MatMul, ("MatMul",)),
    (quanta.nn.Concat, ("Concat",)),
    (quanta.nn.QuantizedConv2d, ("Conv2d", "Conv")), (quanta.nn.QuantizedLinear, ("Linear", "Gemm")),
    (quanta.nn.QuantizedConvTranspose1d, ("ConvTranspose1d", "ConvTranspose")),
    (quanta.nn.QuantizedBatchNorm2d, ("BatchNorm2d", "BatchNormalization")),
    (quanta.nn.QuantizedLayerNorm, ("LayerNorm", "LayerNormalization")),
    (quanta.nn.QuantizedEmbedding, ("Embedding", "Gather")), (quanta.nn.QuantizedReLU, ("ReLU", "Relu")),
    (quanta.nn.QuantizedSiLU, ("SiLU",)), (quanta.nn.QuantizedAdd, ("Add",)),
    (quanta.nn.QuantizedMultiply, ("Multiply", "Mul")), (quanta.nn.QuantizedMatMul, ("MatMul",)),
]


@pytest.mark.parametrize("cls, expected", QUANTA_OP_TYPES, ids=[c.__name__ for c, _ in QUANTA_OP_TYPES])
def test_op_types_of_quanta_classes(cls, expected):
    assert op_types_of(cls) == expected


def test_op_types_of_quantized_instance():
    assert op_types_of(quanta.nn.QuantizedConv2d(3, 8, 3)) == ("Conv2d", "Conv")


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


class MyConv(nn.Conv2d):
    pass


class QuantizedScale(quanta.nn.QuantizationMixin, Scale):
    pass


def test_op_types_of_user_classes():
    assert op_types_of(Scale) == ("Scale",)
    assert op_types_of(Scale()) == ("Scale",)
    assert op_types_of(MyConv) == ("MyConv",)  # exact type: a subclass may change what the op does
    assert op_types_of(QuantizedScale) == ("Scale",)


def test_op_types_of_rejects_non_modules():
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        op_types_of(int)
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        op_types_of("Conv2d")  # type: ignore[arg-type]


def test_op_types_of_feeds_the_config():
    cfg = QuantSimConfig.load({"op_type": {"Gemm": {"params": {"weight": {"bitwidth": 4}}}}})
    assert cfg.param_spec("fc", op_types_of(quanta.nn.QuantizedLinear(4, 4)), "weight").bitwidth == 4
    assert cfg.param_spec("fc", op_types_of(MyConv), "weight").bitwidth is None


def test_docs_example_loads():
    # docs/guides/quantsim-config.md's complete example must stay valid
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "quantsim-config.md"
    text = docs.read_text()
    block = re.search(r"<!-- example -->\s*```json\n(.*?)```", text, re.S)
    assert block is not None, "docs/guides/quantsim-config.md lost its marked example"
    cfg = QuantSimConfig.load(json.loads(block.group(1)))
    assert cfg.param_spec("head", GEMM, "weight").block_size == 32


def test_docs_builtin_default_is_the_builtin_default():
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "quantsim-config.md"
    block = re.search(r"## The built-in default.*?```json\n(.*?)```", docs.read_text(), re.S)
    assert block is not None, "docs/guides/quantsim-config.md lost its built-in default"
    assert QuantSimConfig.load(json.loads(block.group(1))) == QuantSimConfig.load()
