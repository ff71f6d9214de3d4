"""quanta.export.onnx: a QuantizationSimModel as ONNX with QuantizeLinear/DequantizeLinear nodes.

The acceptance check: onnxruntime (CPU) runs the exported model and its output matches ``sim.model(x)``
within one step of the final output quantizer. With graph optimisations off the match is exact (or a
float-summation flip away); with them on, onnxruntime fuses DequantizeLinear -> MatMul into MatMulNBits,
whose default ``accuracy_level`` 4 quantizes activations to int8 (a runtime approximation, not the
export's), so the optimised session is checked with ``accuracy_level`` 0.
"""

from __future__ import annotations

import functools
import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from quantsim_models import SmallCNN, TransformerBlock, make_cnn_data, make_seq_data  # noqa: E402

from quanta.export.onnx import export_onnx  # noqa: E402
from quanta.quantization.affine import QuantizeDequantize  # noqa: E402
from quanta.quantization.float import FloatQuantizeDequantize  # noqa: E402
from quanta.quantsim import INTEGER_ONLY, QuantizationSimModel, QuantSimConfig  # noqa: E402

MODELS = {
    # name: (factory, calibration batch, evaluation batch (its shape is the graph's), final output quantizer)
    "cnn": (SmallCNN, make_cnn_data(16, seed=0)[0], make_cnn_data(8, seed=1)[0], "fc.output_quantizers.0"),
    "transformer": (TransformerBlock, make_seq_data(16, seed=0)[0], 1.3 * make_seq_data(4, seed=1)[0],
                    "add_1.output_quantizers.0"),
}


def _config(**params: object) -> dict:
    """INTEGER_ONLY (every tensor quantized) with ``params`` set on Gemm (Linear) weights."""
    d = _int8_everywhere()
    d["op_type"]["Gemm"] = {"params": {"weight": dict(params)}}
    return d


def _int8_everywhere() -> dict:
    """INTEGER_ONLY with the norms at the default bitwidth too: every tensor on an 8-bit grid (opset 13)."""
    d = QuantSimConfig.load(INTEGER_ONLY).to_dict()
    for op in ("LayerNormalization", "RMSNormalization"):
        d["op_type"][op].pop("bitwidth")
    return d


def _float8_weights() -> dict:
    d = _int8_everywhere()
    d["defaults"]["params"]["dtype"] = "float"
    return d


SIMS = {  # sim configurations; every tensor quantized, so the output is on a grid whose step bounds the error
    "w8a8": {"config_file": _int8_everywhere()},
    "w4_block8": {"config_file": _config(block_size=8, bitwidth=4)},
    "a16": {"default_output_bw": 16, "config_file": INTEGER_ONLY},
    "w_float8": {"config_file": _float8_weights()},
}
CASES = {  # name: (sim, export options, the minimal opset)
    "w8a8": ("w8a8", {}, 13),
    "w8a8_prequantized": ("w8a8", {"prequantize_weights": True}, 13),
    "w4_block8": ("w4_block8", {}, 21),
    "w4_block8_prequantized": ("w4_block8", {"prequantize_weights": True}, 21),
    "a16": ("a16", {}, 21),
    "w_float8": ("w_float8", {}, 19),
    "w_float8_prequantized": ("w_float8", {"prequantize_weights": True}, 19),
}


def _sim(model: str, **kwargs: object) -> tuple[QuantizationSimModel, torch.Tensor]:
    factory, calib, x, _ = MODELS[model]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # float ops kept in float (the transformer's division)
        sim = QuantizationSimModel(factory().eval(), x, **kwargs)
    sim.compute_encodings([calib], progress=False)
    return sim, x


@functools.lru_cache(maxsize=None)
def _shared_sim(model: str, config: str) -> tuple[QuantizationSimModel, torch.Tensor]:
    """A calibrated sim shared by the tests that only read it (export leaves a sim unchanged)."""
    return _sim(model, **SIMS[config])


def _step(sim: QuantizationSimModel, model: str) -> float:
    q = dict(sim.named_quantizers())[MODELS[model][3]]
    return float(q.get_scale())


def _reference(sim: QuantizationSimModel, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return sim.model(x).as_subclass(torch.Tensor).numpy()


def _run(path: str, *inputs: torch.Tensor, optimized: bool = False) -> np.ndarray:
    so = ort.SessionOptions()
    if optimized:  # every graph optimisation but the QDQ fusions: onnxruntime 1.32's fused integer kernels
        # (DQ -> MatMul -> Add -> Q into its own integer ops) requantize with their own rounding, up to five output
        # steps from the QDQ graph on the transformer block; with the fusions off the graph matches to one step
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    else:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
    return session.run(None, feeds)[0]


def _export(sim, tmp_path, x, name="model.onnx", **kwargs) -> tuple[str, dict[str, str], object]:
    path = os.fspath(tmp_path / name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the exporters' chatter is silenced, nothing else is expected
        names = export_onnx(sim, path, x, **kwargs)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    return path, names, model


def _tensor_names(model) -> set[str]:
    names = {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    for n in model.graph.node:
        names.update(n.input)
        names.update(n.output)
    return names


def _opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


# ---------------------------------------------------------------------- the acceptance criterion
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("model", list(MODELS))
def test_onnxruntime_matches_sim_within_one_output_step(model, case, tmp_path):
    config, export_kwargs, opset = CASES[case]
    sim, x = _shared_sim(model, config)
    path, names, onnx_model = _export(sim, tmp_path, x, **export_kwargs)
    assert _opset(onnx_model) == opset  # the lowest that expresses every quantizer
    assert onnx_model.ir_version == onnx.helper.find_min_ir_version_for(list(onnx_model.opset_import))
    ref, step = _reference(sim, x), _step(sim, model)
    exact = np.abs(_run(path, x) - ref).max()
    optimized = np.abs(_run(path, x, optimized=True) - ref).max()
    # at most one code apart (1.01: the difference of two dequantized values is taken in float32); float kernels
    # differ between torch and onnxruntime (layer norm, erf, summation order), which can flip a fine 16-bit code
    assert exact <= step * 1.01, (exact, step)
    assert optimized <= step * 1.01, (optimized, step)
    assert set(names) == {n for n, _ in sim.named_quantizers()}
    assert set(names.values()) <= _tensor_names(onnx_model)


def test_default_config_keeps_the_residual_adds_in_float(tmp_path):
    """The built-in default leaves the adds' outputs unquantized: onnxruntime runs them in float.

    The output is then off a grid; its error is bounded by the steps of the quantized tensors that reach it
    unchanged through the adds (the outputs of proj and fc2, summed into the residual stream)."""
    sim, x = _sim("transformer")
    path, names, model = _export(sim, tmp_path, x)
    assert not any(n.startswith("add") for n in names)
    assert not any(n.startswith(("proj.output", "fc2.output")) for n in names)  # fused with their adds
    assert "Add" in _ops(model)
    q, m = dict(sim.named_quantizers()), dict(sim.model.named_modules())
    # proj and fc2 reach the output unquantized through the adds: a one-code difference in each of their
    # quantized inputs moves an output by at most step * (the largest absolute row sum of the weight)
    bound = sum(float(q[f"{src}.output_quantizers.0"].get_scale()) * float(m[dst].weight.abs().sum(1).max())
                for src, dst in (("matmul_1", "proj"), ("act", "fc2")))
    assert np.abs(_run(path, x) - _reference(sim, x)).max() <= bound


def test_exact_on_the_cnn_without_graph_optimisations(tmp_path):
    sim, x = _shared_sim("cnn", "w8a8")
    path, _, _ = _export(sim, tmp_path, x)
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))


def test_float_graph_matches_float_model(tmp_path):
    for model in MODELS:
        sim, x = _shared_sim(model, "w8a8")
        path, names, onnx_model = _export(sim, tmp_path, x, name=f"{model}.onnx", qdq=False)
        with torch.no_grad(), sim.quantizers_disabled():
            ref = sim.model(x).numpy()
        np.testing.assert_allclose(_run(path, x, optimized=True), ref, rtol=0, atol=1e-5)
        assert not {"QuantizeLinear", "DequantizeLinear"} & set(_ops(onnx_model))
        assert set(names.values()) <= _tensor_names(onnx_model)


def test_qdq_false_needs_no_calibration(tmp_path):
    factory, _, x, _ = MODELS["cnn"]
    sim = QuantizationSimModel(factory().eval(), x)
    _, names, _ = _export(sim, tmp_path, x, qdq=False)
    assert names["conv1.param_quantizers.weight"] == "conv1.weight"


# ---------------------------------------------------------------------- names
def test_name_map_and_graph_names(tmp_path):
    sim, x = _shared_sim("transformer", "w8a8")
    _, names, model = _export(sim, tmp_path, x)
    assert names["qkv.output_quantizers.0"] == "/qkv/Add_output_0"  # torch.onnx's name (MatMul, then Add)
    assert names["softmax.output_quantizers.0"] == "/softmax/Softmax_output_0"
    assert names["fc1.param_quantizers.weight"] == "fc1.weight"
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.op_type)
    initializers = {i.name: i for i in model.graph.initializer}
    for qname, tensor in names.items():
        assert "QuantizeLinear" in consumers[tensor], qname  # the float value the encoding applies to
        if ".param_quantizers." in qname:
            assert initializers[tensor].data_type == onnx.TensorProto.FLOAT
        else:
            assert tensor in producers or tensor in [i.name for i in model.graph.input]
    assert [i.name for i in model.graph.input] == ["x"]
    assert [o.name for o in model.graph.output] == ["output"]
    assert {"ln1.bias", "ln2.bias", "ln2.weight"} <= set(initializers)  # every parameter keeps its own name


def test_names_are_torch_onnx_names_and_weights_state_dict_names(tmp_path):
    sim_encodings = pytest.importorskip("quanta.export.sim_encodings")
    sim, x = _shared_sim("cnn", "w8a8")
    _, names, _ = _export(sim, tmp_path, x)
    assert set(names) == set(sim_encodings.tensor_names(sim).values())  # every quantizer
    assert {t: q for t, q in sim_encodings.tensor_names(sim).items() if ".param_quantizers." in q} == \
        {t: q for q, t in names.items() if ".param_quantizers." in q}
    assert names["relu1.output_quantizers.0"] == "/relu1/Relu_output_0"  # as AIMET's export names it
    assert names["fc.output_quantizers.0"] == "/fc/Gemm_output_0"


def test_nested_modules_are_named_by_their_path(tmp_path):
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.act = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.fc(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    x = torch.randn(4, 8)
    sim = QuantizationSimModel(Net().eval(), x)
    sim.compute_encodings([x], progress=False)
    _, names, _ = _export(sim, tmp_path, x)
    # what torch.onnx names the original model's tensors: layers.0's forward calls its act
    assert names["layers.0.act.output_quantizers.0"] == "/layers.0/act/Relu_output_0"
    assert names["layers.1.act.output_quantizers.0"] == "/layers.1/act/Relu_output_0"


def test_prequantized_weights_are_integer_initializers(tmp_path):
    sim, x = _shared_sim("transformer", "w4_block8")
    _, names, model = _export(sim, tmp_path, x, prequantize_weights=True)
    inits = {i.name: i for i in model.graph.initializer}
    assert inits["fc1.weight"].data_type == onnx.TensorProto.INT4
    assert len(inits["fc1.weight"].raw_data) == 128 * 32 // 2  # two codes per byte
    # AIMET's rule: an 8-bit LayerNorm weight is asymmetric (unsigned codes), as in aimet-torch 2.42
    assert inits["ln1.weight"].data_type == onnx.TensorProto.UINT8
    weights = {t for q, t in names.items() if ".param_quantizers." in q}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear":
            assert n.input[0] not in weights
        if n.op_type == "DequantizeLinear" and n.input[0] == "fc1.weight":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            assert attrs == {"axis": 1, "block_size": 8}


def test_prequantized_codes_equal_the_quantizer_codes(tmp_path):
    from onnx import numpy_helper

    sim, x = _shared_sim("cnn", "w8a8")
    _, _, model = _export(sim, tmp_path, x, prequantize_weights=True)
    stored = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "conv2.weight"))
    q = sim.model.conv2.param_quantizers["weight"]
    codes = torch.round(q(sim.model.conv2.weight).as_subclass(torch.Tensor) / q.get_scale())
    assert stored.dtype == np.int8
    np.testing.assert_array_equal(stored, codes.detach().numpy().astype(np.int8))


# ---------------------------------------------------------------------- opsets
def test_per_channel_int4_without_blocks_needs_opset_21(tmp_path):
    d = QuantSimConfig.load().to_dict()
    d["defaults"]["params"]["bitwidth"] = 4
    sim, x = _sim("cnn", config_file=d)
    path, _, model = _export(sim, tmp_path, x)
    assert _opset(model) == 21
    assert np.abs(_run(path, x) - _reference(sim, x)).max() <= _step(sim, "cnn")


def test_opset_override(tmp_path):
    sim, x = _shared_sim("transformer", "w8a8")
    for opset in (17, 21):
        path, _, model = _export(sim, tmp_path, x, name=f"o{opset}.onnx", opset=opset)
        assert _opset(model) == opset
        assert ("LayerNormalization" in _ops(model)) == (opset >= 17)
        assert np.abs(_run(path, x) - _reference(sim, x)).max() <= _step(sim, "transformer")


def test_opset_too_low_names_the_quantizer(tmp_path):
    sim, x = _shared_sim("cnn", "w4_block8")
    with pytest.raises(ValueError, match=r"opset 19 is too low: fc\.param_quantizers\.weight \(int4 per-block\) "
                                         r"needs opset 21"):
        export_onnx(sim, tmp_path / "m.onnx", MODELS["cnn"][2], opset=19)
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("opset", [12, 24, 13.0, True])
def test_bad_opset(opset, tmp_path):
    sim, x = _shared_sim("cnn", "w8a8")
    with pytest.raises((ValueError, TypeError), match="opset"):
        export_onnx(sim, tmp_path / "m.onnx", x, opset=opset)


# ---------------------------------------------------------------------- granularities and grids
def test_conv_transpose_weights_quantize_along_axis_1(tmp_path):
    model = nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2), nn.ReLU(), nn.ConvTranspose2d(6, 4, 3, groups=2))
    x = torch.randn(2, 4, 5, 5)
    sim = QuantizationSimModel(model.eval(), x)
    sim.compute_encodings([x], progress=False)
    path, _, onnx_model = _export(sim, tmp_path, x, prequantize_weights=True)
    axes = {n.input[0]: [onnx.helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"]
            for n in onnx_model.graph.node if n.op_type == "DequantizeLinear"}
    assert axes["0.weight"] == axes["2.weight"] == [1]
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))


def test_narrow_grids_are_clamped_like_the_sim(tmp_path):
    # strict symmetric [-127, 127] everywhere (weights and symmetric activations) and 6-bit activations on int8:
    # outside the calibrated range the sim clamps to the grid, QuantizeLinear alone only to the type
    d = QuantSimConfig.load().to_dict()
    d["defaults"]["strict_symmetric"] = True
    d["defaults"]["ops"]["is_symmetric"] = True
    d["op_type"]["Gemm"] = {"bitwidth": 6}
    sim, x = _sim("cnn", config_file=d)
    q = dict(sim.named_quantizers())["fc.output_quantizers.0"]
    assert (q.qmin, q.qmax) == (-31, 31)
    big = 3 * x  # far outside the calibrated ranges
    path, _, model = _export(sim, tmp_path, big)
    np.testing.assert_array_equal(_run(path, big), _reference(sim, big))
    # one per activation quantizer (the model input's too); the weights are inside their ranges
    assert _ops(model).count("Clip") == 6


def test_narrow_weight_grid_is_clamped_only_when_needed(tmp_path):
    d = QuantSimConfig.load().to_dict()
    d["defaults"]["strict_symmetric"] = True
    sim, x = _sim("cnn", config_file=d)
    with torch.no_grad():
        sim.model.fc.weight[0, 0] = -5.0  # below -127.5 steps: int8 would keep -128, the grid clamps to -127
    path, _, model = _export(sim, tmp_path, x)
    assert (_ops(model).count("Max"), _ops(model).count("Min")) == (1, 1)
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))


def test_low_bit_activations_and_unsigned_symmetric_weights(tmp_path):
    sim, x = _sim("cnn", default_output_bw=4)
    q = sim.model.conv1.param_quantizers["weight"]
    sim.model.conv1.param_quantizers["weight"] = w = QuantizeDequantize(q.shape, 8, symmetric=False)
    w.set_range(-0.5, 0.4)
    sim.model.fc.output_quantizers[0] = a = QuantizeDequantize((), qmin=-3, qmax=3, symmetric=True)  # 3-bit
    a.set_range(-1, 1)
    path, _, model = _export(sim, tmp_path, x)
    zero_points = {i.name: i.data_type for i in model.graph.initializer if i.name.endswith("_zero_point")}
    assert zero_points["/relu1/Relu_output_0_zero_point"] == onnx.TensorProto.UINT4
    assert zero_points["conv1.weight_zero_point"] == onnx.TensorProto.UINT8
    assert zero_points["/fc/Gemm_output_0_zero_point"] == onnx.TensorProto.INT4
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))


def test_float16_and_float8_activations(tmp_path):
    # a few codes of the output's format apart at most: float kernels (layer norm, erf, softmax) differ between
    # torch and onnxruntime in the last bits, which flips an occasional float16 rounding (exactness of the casts
    # themselves: test_scaled_bfloat16_and_per_channel_float8)
    for bw, op, rtol in ((16, "Cast", 2.0**-8), (8, "QuantizeLinear", 2.0**-3)):
        sim, x = _sim("transformer", default_data_type=float, default_output_bw=bw, default_param_bw=8)
        path, _, model = _export(sim, tmp_path, x, name=f"f{bw}.onnx")
        assert op in _ops(model)
        assert _opset(model) == 19
        np.testing.assert_allclose(_run(path, x), _reference(sim, x), rtol=rtol, atol=0)


def test_scaled_bfloat16_and_per_channel_float8(tmp_path):
    sim, x = _sim("cnn")
    sim.model.relu1.output_quantizers[0] = bf = FloatQuantizeDequantize(dtype=torch.bfloat16)
    bf.set_range(float(bf.format.max) / 3)  # scale 1/3: Div, Clip, Cast, Cast, Mul
    fq = FloatQuantizeDequantize(dtype=torch.float8_e5m2, shape=(10, 1))
    fq.set_range(torch.rand(10, 1) + 0.1)
    sim.model.fc.param_quantizers["weight"] = fq
    path, _, model = _export(sim, tmp_path, x)
    assert {"Div", "Mul", "Cast"} <= set(_ops(model))
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))


def test_multihead_attention(tmp_path):
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(16, 4, batch_first=True)
            self.fc = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.mha(x, x, x)[0])

    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    sim = QuantizationSimModel(Attn().eval(), x)
    sim.compute_encodings([x], progress=False)
    path = os.fspath(tmp_path / "m.onnx")
    with pytest.warns(UserWarning, match=r"quantizers mha\.output_quantizers\.1 do not reach the model's outputs"):
        names = export_onnx(sim, path, x)  # the attention weights, which the model drops
    onnx.checker.check_model(onnx.load(path), full_check=True)
    assert "mha.output_quantizers.1" not in names
    assert names["mha.param_quantizers.in_proj_weight"] == "mha.in_proj_weight"
    assert names["mha.output_quantizers.0"].startswith("/mha/")  # the last op of the attention
    np.testing.assert_allclose(_run(path, x), _reference(sim, x), rtol=0, atol=1e-6)


def test_module_called_twice_quantizes_both_tensors(tmp_path):
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.fc(x)))

    x = torch.randn(4, 8)
    sim = QuantizationSimModel(Twice().eval(), x)
    sim.compute_encodings([x], progress=False)
    path, names, model = _export(sim, tmp_path, x)
    assert names["fc.output_quantizers.0"] == "/fc/Gemm_output_0"  # the first call
    assert {"/fc/Gemm_output_0", "/fc_1/Gemm_output_0"} <= _tensor_names(model)
    # the weight once, fc's output twice, relu's output, and fc's input quantizer (the model input's, AIMET's
    # default) on both calls: one module, one set of quantizers, calibrated on what both calls read
    assert _ops(model).count("QuantizeLinear") == 6
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))


def test_dynamo_exporter(tmp_path):
    pytest.importorskip("onnxscript")  # torch.onnx's dynamo exporter needs it
    sim, x = _shared_sim("cnn", "w4_block8")
    legacy, legacy_names, _ = _export(sim, tmp_path, x, name="legacy.onnx")
    path, names, model = _export(sim, tmp_path, x, dynamo=True)
    assert set(names) == set(legacy_names)  # the dynamo exporter names activations its own way ("relu_1")
    assert {q: t for q, t in names.items() if ".param_quantizers." in q} == \
        {q: t for q, t in legacy_names.items() if ".param_quantizers." in q}
    assert set(names.values()) <= _tensor_names(model)
    assert _opset(model) == 21
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))
    with pytest.raises(ValueError, match="dynamo=True exports opset 18"):
        export_onnx(sim, tmp_path / "m.onnx", x, opset=17, dynamo=True)


# ---------------------------------------------------------------------- errors and state
def test_uncalibrated_sim_names_the_quantizer(tmp_path):
    factory, _, x, _ = MODELS["cnn"]
    sim = QuantizationSimModel(factory().eval(), x)
    with pytest.raises(RuntimeError, match=r"relu1\.output_quantizers\.0.*compute_encodings"):
        export_onnx(sim, tmp_path / "m.onnx", x)


def test_bad_arguments(tmp_path):
    sim, x = _shared_sim("cnn", "w8a8")
    with pytest.raises(TypeError, match="QuantizationSimModel"):
        export_onnx(sim.model, tmp_path / "m.onnx", x)
    with pytest.raises(TypeError, match="dummy_input"):
        export_onnx(sim, tmp_path / "m.onnx", x.numpy())
    with pytest.raises(TypeError, match="dummy_input"):
        export_onnx(sim, tmp_path / "m.onnx", [x])
    with pytest.raises(TypeError, match="path"):
        export_onnx(sim, 3, x)
    with pytest.raises(ValueError, match="prequantize_weights=True needs qdq=True"):
        export_onnx(sim, tmp_path / "m.onnx", x, qdq=False, prequantize_weights=True)
    with pytest.raises(TypeError, match="qdq must be a bool"):
        export_onnx(sim, tmp_path / "m.onnx", x, qdq=1)
    with pytest.raises(TypeError):
        export_onnx(sim, tmp_path / "m.onnx", x, 13)  # options are keyword-only
    assert not (tmp_path / "m.onnx").exists()


def test_unsupported_quantizers_are_named(tmp_path):
    sim, x = _sim("cnn")
    sim.model.gap.output_quantizers[0] = wide = QuantizeDequantize((), 20)
    wide.set_range(0, 1)
    with pytest.raises(NotImplementedError, match=r"gap\.output_quantizers\.0: the grid \[0, 1048575\]"):
        export_onnx(sim, tmp_path / "m.onnx", x)
    sim.model.gap.output_quantizers[0] = FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=3, finite=True)
    with pytest.raises(NotImplementedError, match=r"gap\.output_quantizers\.0: ONNX has no type .*float6_e2m3"):
        export_onnx(sim, tmp_path / "m.onnx", x)
    export_onnx(sim, tmp_path / "m.onnx", x, qdq=False)  # the float graph is fine


def test_failed_export_leaves_the_existing_file(tmp_path, monkeypatch):
    sim, x = _shared_sim("cnn", "w8a8")
    path = tmp_path / "m.onnx"
    path.write_bytes(b"previous")
    factory = MODELS["cnn"][0]
    with pytest.raises(RuntimeError):
        export_onnx(QuantizationSimModel(factory().eval(), x), path, x)  # uncalibrated

    def broken_save(proto, target):
        open(target, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(onnx, "save_model", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export_onnx(sim, path, x)
    assert path.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


def test_sim_is_unchanged_by_export(tmp_path):
    sim, x = _sim("transformer")
    sim.model.train()
    before = {n: id(q) for n, q in sim.named_quantizers()}
    ref = _reference(sim, x)
    _export(sim, tmp_path, x)
    assert {n: id(q) for n, q in sim.named_quantizers()} == before
    assert all(m.training for m in sim.model.modules())
    np.testing.assert_array_equal(_reference(sim, x), ref)


def test_unused_quantizers_warn(tmp_path):
    sim, x = _sim("cnn")
    sim.model.fc.input_quantizers.append(QuantizeDequantize((), 8))  # a slot forward never reaches
    sim.model.fc.input_quantizers[1].set_range(0, 1)
    with pytest.warns(UserWarning, match=r"does not use quantizers fc\.input_quantizers\.1"):
        names = export_onnx(sim, tmp_path / "m.onnx", x)
    assert "fc.input_quantizers.1" not in names


def test_model_input_quantizer_keeps_the_input_name(tmp_path):
    from quanta.quantsim import INTEGER_ONLY

    sim, x = _sim("transformer", config_file=INTEGER_ONLY)  # model input quantized, the residual add too
    path, names, model = _export(sim, tmp_path, x)
    assert [i.name for i in model.graph.input] == ["x"]
    assert names["ln1.input_quantizers.0"] == "x"  # the graph input itself, as AIMET's export names it
    assert names["add.input_quantizers.0"] == "add.input.0"  # a second quantizer of x: quanta's name
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))


def test_several_inputs_and_outputs(tmp_path):
    class TwoInTwoOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 4)
            self.b = nn.Linear(6, 4)

        def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.a(left) + self.b(right)
            return y, torch.relu(y)

    args = (torch.randn(3, 8), torch.randn(3, 6))
    sim = QuantizationSimModel(TwoInTwoOut().eval(), args)
    sim.compute_encodings([args], progress=False)
    path, names, model = _export(sim, tmp_path, args)
    assert [i.name for i in model.graph.input] == ["left", "right"]
    assert [o.name for o in model.graph.output] == ["output_0", "output_1"]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(
        None, {"left": args[0].numpy(), "right": args[1].numpy()})
    with torch.no_grad():
        want = [t.as_subclass(torch.Tensor).numpy() for t in sim.model(*args)]
    # y is a float sum (the default keeps adds, and the Linears feeding them, in float): torch's and onnxruntime's
    # Gemm may round differently; relu(y) is quantized, so a float difference flips at most one code
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-5)
    step = float(dict(sim.named_quantizers())["relu.output_quantizers.0"].get_scale())
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=step * 1.001)


def test_untraced_model(tmp_path):
    factory, calib, x, _ = MODELS["transformer"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sim = QuantizationSimModel(factory().eval(), x, trace=False)  # functional ops stay in float
    sim.compute_encodings([calib], progress=False)
    path, names, _ = _export(sim, tmp_path, x)
    assert names["fc2.output_quantizers.0"] == "/fc2/Add_output_0"
    np.testing.assert_array_equal(_run(path, x), _reference(sim, x))


def test_hf_style_encoder_with_dict_outputs(tmp_path):
    from quantsim_models import HFEncoder, make_token_data

    torch.manual_seed(0)
    ids, mask = make_token_data(16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 1.0 - mask stays in float
        sim = QuantizationSimModel(HFEncoder().eval(), (ids[:4], mask[:4]))
    sim.compute_encodings([(ids, mask)], progress=False)
    path, names, model = _export(sim, tmp_path, (ids[:4], mask[:4]))
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in model.graph.output] == ["last_hidden_state", "pooler_output"]
    assert names["layers.0.softmax.output_quantizers.0"] == "/layers.0/softmax/Softmax_output_0"
    assert names["layers.1.query.output_quantizers.0"] == "/layers.1/query/Add_output_0"
    got = _run(path, ids[:4], mask[:4])  # the first output
    with torch.no_grad():
        want = sim.model(ids[:4], mask[:4])["last_hidden_state"].numpy()
    # float kernels differ between torch and onnxruntime (layer norm), which can flip a fine 16-bit code of a
    # norm's output; in the next layer that can move an 8-bit code (query/value/fc1 read the norm), so the two
    # agree on most elements and stay far closer than the quantization noise (~30 dB to float) elsewhere
    err = got - want
    assert (err == 0).mean() > 0.8
    assert 10 * np.log10((want ** 2).mean() / (err ** 2).mean()) > 60
