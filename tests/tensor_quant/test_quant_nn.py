"""pytorch_quantization's quantized modules (quanta.tensor_quant.nn) and quant_modules.initialize/deactivate."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quanta.tensor_quant import QuantDescriptor, fake_tensor_quant, quant_modules
from quanta.tensor_quant import nn as quant_nn


def _fq(x, amax, bits=8):
    return fake_tensor_quant(x, amax, num_bits=bits, unsigned=False, narrow_range=False)


@pytest.fixture(autouse=True)
def _restore_defaults():
    saved = {c: (c.__dict__.get("default_quant_desc_input"), c.__dict__.get("default_quant_desc_weight"))
             for c in (quant_nn.QuantLinear, quant_nn.QuantConv2d, quant_nn.QuantMaxPool2d)}
    yield
    for c, (i, w) in saved.items():
        for name, v in (("default_quant_desc_input", i), ("default_quant_desc_weight", w)):
            if v is None:
                if name in c.__dict__:
                    delattr(c, name)
            else:
                setattr(c, name, v)
    quant_modules.deactivate()


def test_quant_linear_is_linear_on_fake_quantized_input_and_weight():
    torch.manual_seed(0)
    layer = quant_nn.QuantLinear(16, 8)
    x = torch.randn(4, 16)
    w = layer.weight.detach()
    expected = F.linear(_fq(x, x.abs().max()), _fq(w, w.abs().amax(1, keepdim=True)), layer.bias)
    assert torch.equal(layer(x), expected)
    assert isinstance(layer, nn.Linear) and quant_nn.Linear is quant_nn.QuantLinear


def test_quant_conv2d_quantizes_the_weight_per_output_channel():
    torch.manual_seed(0)
    conv = quant_nn.QuantConv2d(3, 4, 3, padding=1, padding_mode="circular")
    x = torch.randn(2, 3, 8, 8)
    w = conv.weight.detach()
    ref = nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular")
    ref.load_state_dict({"weight": _fq(w, w.abs().amax((1, 2, 3), keepdim=True)), "bias": conv.bias.detach()})
    assert torch.equal(conv(x), ref(_fq(x, x.abs().max())))


def test_quant_conv_transpose_takes_output_size():
    torch.manual_seed(0)
    conv = quant_nn.QuantConvTranspose2d(3, 4, 3, stride=2)
    x = torch.randn(1, 3, 5, 5)
    w = conv.weight.detach()
    expected = F.conv_transpose2d(_fq(x, x.abs().max()), _fq(w, w.abs().amax((1, 2, 3), keepdim=True)), conv.bias,
                                  stride=2, output_padding=1)
    assert torch.equal(conv(x, output_size=[12, 12]), expected)


@pytest.mark.parametrize("cls,base,args,shape", [
    (quant_nn.QuantMaxPool1d, nn.MaxPool1d, (2,), (1, 3, 8)),
    (quant_nn.QuantAvgPool2d, nn.AvgPool2d, (2,), (1, 3, 8, 8)),
    (quant_nn.QuantAdaptiveAvgPool3d, nn.AdaptiveAvgPool3d, ((2, 2, 2),), (1, 2, 4, 4, 4)),
])
def test_pooling_runs_on_the_fake_quantized_input(cls, base, args, shape):
    x = torch.randn(*shape)
    pool = cls(*args, quant_desc_input=QuantDescriptor(num_bits=4))
    assert isinstance(pool, base) and not hasattr(pool, "weight_quantizer")
    assert torch.equal(pool(x), base(*args)(_fq(x, x.abs().max(), bits=4)))


def test_descriptors_from_keywords_and_class_defaults():
    layer = quant_nn.QuantLinear(4, 2, quant_desc_input=QuantDescriptor(num_bits=4),
                                 quant_desc_weight=QuantDescriptor(num_bits=6, axis=0))
    assert layer.input_quantizer.num_bits == 4 and layer.weight_quantizer.num_bits == 6
    quant_nn.QuantLinear.set_default_quant_desc_input(QuantDescriptor(num_bits=5, unsigned=True))
    later = quant_nn.QuantLinear(4, 2)
    assert later.input_quantizer.num_bits == 5 and later.input_quantizer.unsigned
    assert quant_nn.QuantConv2d(1, 1, 1).input_quantizer.num_bits == 8  # another class keeps its own


@pytest.mark.parametrize("kwargs,error,match", [
    ({"quant_desc_bias": QuantDescriptor()}, TypeError, "unused keyword"),
    ({"quant_desc_input": 8}, TypeError, "QuantDescriptor"),
    ({"quant_desc_weight": QuantDescriptor(fake_quant=False)}, ValueError, "fake quantization"),
])
def test_bad_descriptors_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        quant_nn.QuantLinear(4, 2, **kwargs)
    with pytest.raises(TypeError, match="QuantDescriptor"):
        quant_nn.QuantConv2d.set_default_quant_desc_weight("per-channel")


def test_the_calibration_loop_sets_static_amax():
    torch.manual_seed(0)
    model = nn.Sequential(quant_nn.QuantConv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), quant_nn.QuantLinear(4 * 6 * 6, 5))
    quantizers = [m for m in model.modules() if isinstance(m, quant_nn.TensorQuantizer)]
    data = [torch.randn(2, 3, 8, 8) * (i + 1) for i in range(3)]
    for q in quantizers:
        q.disable_quant()
        q.enable_calib()
    with torch.no_grad():
        for x in data:
            model(x)
    for q in quantizers:
        q.load_calib_amax()
        q.enable_quant()
        q.disable_calib()
    assert torch.equal(model[0].input_quantizer.amax, torch.stack([x.abs().max() for x in data]).max())
    w = model[3].weight.detach()
    assert torch.equal(model[3].weight_quantizer.amax.flatten(), w.abs().amax(1))
    state = model.state_dict()
    assert "0._input_quantizer._amax" in state and "3._weight_quantizer._amax" in state
    fresh = copy.deepcopy(model)
    assert torch.equal(fresh(data[0]), model(data[0]))


def test_quant_modules_swaps_torch_nn_and_back():
    float_linear = torch.nn.Linear
    quant_modules.initialize()
    try:
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 2))
        assert [type(m).__name__ for m in model] == ["QuantConv2d", "QuantMaxPool2d", "Flatten", "QuantLinear"]
        # torch's own keywords still work on the replaced classes (third-party code passes them)
        assert nn.Linear(2, 2, bias=False, dtype=torch.float64).weight.dtype == torch.float64
        assert nn.Conv1d(1, 1, 1, device="cpu", dtype=torch.float64).weight.dtype == torch.float64
        with pytest.raises(RuntimeError, match="already active"):
            quant_modules.initialize()
    finally:
        quant_modules.deactivate()
    assert torch.nn.Linear is float_linear and type(nn.Linear(2, 2)) is float_linear
    quant_modules.deactivate()  # a second time does nothing


def test_quant_modules_options_and_context_manager():
    with quant_modules.initialize(float_module_list=["Linear"]):
        assert type(nn.Linear(2, 2)).__name__ == "Linear" and type(nn.Conv1d(1, 1, 1)).__name__ == "QuantConv1d"
    assert nn.Conv1d.__name__ == "Conv1d"

    class MyQuantLinear(quant_nn.QuantLinear):
        pass
    with pytest.raises(ZeroDivisionError):
        with quant_modules.initialize(custom_quant_modules=[(torch.nn, "Linear", MyQuantLinear)]):
            assert type(nn.Linear(2, 2)) is MyQuantLinear
            1 / 0
    assert nn.Linear.__name__ == "Linear"  # restored on the exception too
    with pytest.raises(ValueError, match="Dropout"):
        quant_modules.initialize(float_module_list=["Dropout"])
    with pytest.raises(TypeError, match="custom_quant_modules"):
        quant_modules.initialize(custom_quant_modules=[("torch.nn", "Linear", MyQuantLinear)])
    assert nn.Linear.__name__ == "Linear"


def _calibrated_cnn() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(quant_nn.QuantConv2d(3, 8, 3), nn.ReLU(), quant_nn.QuantMaxPool2d(2), nn.Flatten(),
                          quant_nn.QuantLinear(8 * 3 * 3, 5)).eval()
    quantizers = [m for m in model.modules() if isinstance(m, quant_nn.TensorQuantizer)]
    for q in quantizers:
        q.disable_quant()
        q.enable_calib()
    with torch.no_grad():
        for i in range(4):
            model(torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(i)))
    for q in quantizers:
        q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()
    return model


def test_onnx_export_in_tensorrt_form_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    from quanta.tensor_quant.onnx_export import export_onnx, fb_fake_quant

    model = _calibrated_cnn()
    path = tmp_path / "cnn.onnx"
    export_onnx(model, (torch.randn(1, 3, 8, 8),), path, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    graph = onnx.load(path).graph
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"})
    qs = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert len(qs) == 5  # three inputs, two weights
    for n in qs:
        assert (consts[n.input[2]] == 0).all() and consts[n.input[2]].dtype.name == "int8"  # symmetric int8
    per_channel = [n for n in qs if consts[n.input[1]].size > 1]
    assert len(per_channel) == 2 and all(a.i == 0 for n in per_channel for a in n.attribute if a.name == "axis")
    x = torch.randn(3, 3, 8, 8)
    got = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    with torch.no_grad(), fb_fake_quant():
        expected = model(x)
    np_expected = expected.numpy()
    assert abs(got - np_expected).max() < 1e-5
    with torch.no_grad():  # quanta's own fake quantization: the same up to a rare one-step rounding difference
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0.05)


def test_onnx_export_refuses_what_it_cannot_write(tmp_path):
    from quanta.tensor_quant.onnx_export import export_onnx

    path = tmp_path / "m.onnx"
    path.write_text("old")
    model = nn.Sequential(quant_nn.QuantLinear(4, 2))  # never calibrated: dynamic amax
    with pytest.raises(ValueError, match="0._input_quantizer: no calibrated amax"):
        export_onnx(model, (torch.randn(1, 4),), path)
    with pytest.raises(ValueError, match="opset_version"):
        export_onnx(_calibrated_cnn(), (torch.randn(1, 3, 8, 8),), path, opset_version=12)
    with pytest.raises(TypeError, match="args"):
        export_onnx(_calibrated_cnn(), torch.randn(1, 3, 8, 8), path)
    assert path.read_text() == "old" and not quant_nn.TensorQuantizer.use_fb_fake_quant


@pytest.mark.parametrize("method,kwargs", [("percentile", {"percentile": 99.9}), ("mse", {}), ("entropy", {})])
def test_histogram_calibration_through_the_modules(method, kwargs):
    torch.manual_seed(0)
    desc = QuantDescriptor(num_bits=8, calib_method="histogram")
    layer = quant_nn.QuantLinear(32, 8, quant_desc_input=desc)
    layer.input_quantizer.disable_quant()
    layer.input_quantizer.enable_calib()
    data = torch.randn(512, 32)
    data[0, 0] = 40.0  # an outlier that max calibration would take as the range
    layer(data)
    layer.input_quantizer.load_calib_amax(method, **kwargs)
    layer.input_quantizer.disable_calib()
    layer.input_quantizer.enable_quant()
    amax = float(layer.input_quantizer.amax)
    assert 1.0 < amax < 40.0  # each method clips the outlier
    x = torch.randn(4, 32)
    w = layer.weight.detach()
    expected = F.linear(_fq(x, torch.tensor(amax)), _fq(w, w.abs().amax(1, keepdim=True)), layer.bias)
    assert torch.equal(layer(x), expected)


def test_resnet_built_under_quant_modules_exports_and_runs_in_onnxruntime(tmp_path):
    """transformers' ResNet (torchvision's architecture) built under quant_modules.initialize(), BatchNorm settled
    on data, calibrated with max, exported in TensorRT's Q/DQ form: onnxruntime gives the simulated logits to
    within one output step."""
    ort = pytest.importorskip("onnxruntime")
    transformers = pytest.importorskip("transformers")
    from quanta.tensor_quant.onnx_export import export_onnx, fb_fake_quant

    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                    layer_type="basic", num_labels=10)
    torch.manual_seed(0)
    with quant_modules.initialize():
        model = transformers.ResNetForImageClassification(cfg)
    assert nn.Conv2d.__name__ == "Conv2d"
    convs = [m for m in model.modules() if isinstance(m, quant_nn.QuantConv2d)]
    assert len(convs) == len([m for m in model.modules() if isinstance(m, nn.Conv2d)]) > 4
    assert isinstance(model.classifier[1], quant_nn.QuantLinear)
    g = torch.Generator().manual_seed(1)
    quantizers = [m for m in model.modules() if isinstance(m, quant_nn.TensorQuantizer)]
    for q in quantizers:
        q.disable()
    model.train()
    with torch.no_grad():  # settle BatchNorm on data (random init makes activations vanish otherwise)
        for _ in range(6):
            model(torch.randn(8, 3, 32, 32, generator=g))
    model.eval()
    for q in quantizers:
        q.enable()
        q.disable_quant()
        q.enable_calib()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 3, 32, 32, generator=g))
    for q in quantizers:
        q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()

    class Logits(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(pixel_values=x).logits

    wrapped = Logits(model).eval()
    path = tmp_path / "resnet.onnx"
    export_onnx(wrapped, (torch.randn(1, 3, 32, 32),), path, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    x = torch.randn(4, 3, 32, 32, generator=g)
    got = torch.from_numpy(ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0])
    with torch.no_grad(), fb_fake_quant():
        sim = wrapped(x)
    step = float(model.classifier[1].input_quantizer.amax) / 127 * float(model.classifier[1].weight.abs().sum(1).max())
    assert float((got - sim).abs().max()) <= step
    assert float((got - sim).abs().max()) < 1e-4 * float(sim.abs().max()) + 1e-5


def test_fp8_quantizers_export_as_float8_qdq(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from quanta.tensor_quant.onnx_export import export_onnx, fb_fake_quant

    fp8 = QuantDescriptor(num_bits=(4, 3))
    fp8_w = QuantDescriptor(num_bits=(4, 3), axis=0)
    torch.manual_seed(0)
    model = nn.Sequential(quant_nn.QuantConv2d(3, 8, 3, quant_desc_input=fp8, quant_desc_weight=fp8_w), nn.ReLU(),
                          nn.Flatten(), quant_nn.QuantLinear(8 * 6 * 6, 5, quant_desc_input=fp8,
                                                             quant_desc_weight=fp8_w)).eval()
    quantizers = [m for m in model.modules() if isinstance(m, quant_nn.TensorQuantizer)]
    for q in quantizers:
        q.disable_quant()
        q.enable_calib()
    with torch.no_grad():
        model(torch.randn(8, 3, 8, 8))
    for q in quantizers:
        q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()
    path = tmp_path / "fp8.onnx"
    with pytest.raises(ValueError, match="FP8 needs opset_version >= 19"):
        export_onnx(model, (torch.randn(1, 3, 8, 8),), path)
    export_onnx(model, (torch.randn(1, 3, 8, 8),), path, opset_version=19, input_names=["x"],
                dynamic_axes={"x": {0: "batch"}})
    graph = onnx.load(path).graph
    qs = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert len(qs) == 4
    zero_types = {n.attribute[0].t.data_type for n in graph.node if n.op_type == "Constant"
                  and n.output[0] in {q.input[2] for q in qs}}
    assert zero_types == {onnx.TensorProto.FLOAT8E4M3FN}
    x = torch.randn(3, 3, 8, 8)
    got = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    with torch.no_grad(), fb_fake_quant():
        expected = model(x)
    assert abs(got - expected.numpy()).max() < 1e-5
    with torch.no_grad():  # quanta's own FP8 fake quantization (x * 448/amax, / scale): the same up to rounding
        torch.testing.assert_close(model(x), expected, rtol=0.07, atol=1e-3)
