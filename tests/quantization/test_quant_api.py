"""quantize_ and the torchao-style configs on a small transformer block; granularities; torch.compile."""

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quanta.dtypes import (
    AffineQuantizedTensor,
    Float8Layout,
    FloatxTensorCoreLayout,
    Int4CPULayout,
    LinearActivationQuantizedTensor,
    PlainLayout,
    UintxLayout,
)
from quanta.quantization import (
    AOBaseConfig,
    Float8WeightOnlyConfig,
    FPXWeightOnlyConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    ModuleFqnToConfig,
    PerAxis,
    PerBlock,
    PerGroup,
    PerRow,
    PerTensor,
    QuantizeReport,
    quantize_,
)
from quanta.quantization import quant_primitives as P
from quanta.quantization.granularity import block_size_for
from quanta.quantization.quant_primitives import MappingType, ZeroPointDomain

LINEARS = ["q", "k", "v", "o", "fc1", "fc2", "head"]


class Block(nn.Module):
    """Embedding, pre-LayerNorm attention (q/k/v/o, matmul, softmax), GELU MLP, residuals, output head."""

    def __init__(self, vocab=64, d=128, heads=4, ff=256):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln2 = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        b, t, d = h.shape
        a = self.ln1(h)

        def split(x):
            return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(a)), split(self.k(a)), split(self.v(a))
        att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads), dim=-1)
        h = h + self.o(torch.matmul(att, v).transpose(1, 2).reshape(b, t, d))
        h = h + self.fc2(F.gelu(self.fc1(self.ln2(h))))
        return self.head(h)


def make_block(seed=0):
    torch.manual_seed(seed)
    m = Block()
    with torch.no_grad():  # Gaussian weights, as trained weights look, rather than nn.Linear's uniform init
        for mod in m.modules():
            if isinstance(mod, nn.Linear):
                mod.weight.normal_(0, mod.in_features ** -0.5)
                mod.bias.normal_(0, 0.02)
    return m


IDS = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))


def sqnr(ref, out):
    return float(10 * torch.log10(ref.pow(2).mean() / (ref - out).pow(2).mean()))


# name: (config factory, lower bound on the block's output SQNR in dB, set ~2 dB below the measured value)
CONFIGS = {
    "int8_wo": (lambda: Int8WeightOnlyConfig(), 37.5),  # measured 39.6
    "int8_wo_g32": (lambda: Int8WeightOnlyConfig(group_size=32), 40.0),  # 42.0
    "int8_dyn": (lambda: Int8DynamicActivationInt8WeightConfig(), 34.5),  # 36.9
    "int8_dyn_asym": (lambda: Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC),
                      35.5),  # 37.8
    "int4_g128": (lambda: Int4WeightOnlyConfig(group_size=128), 14.5),  # 16.6
    "int4_g32": (lambda: Int4WeightOnlyConfig(group_size=32), 16.5),  # 18.5
    "int4_uintx_g128": (lambda: Int4WeightOnlyConfig(group_size=128, layout=UintxLayout(torch.uint4)), 14.5),  # 16.6
    "int4_hqq_g128": (lambda: Int4WeightOnlyConfig(group_size=128, use_hqq=True), 15.0),  # 17.3
    "float8": (lambda: Float8WeightOnlyConfig(), 26.5),  # 28.6
    "float8_e5m2": (lambda: Float8WeightOnlyConfig(torch.float8_e5m2), 20.5),  # 22.4
    "fpx_e3m2": (lambda: FPXWeightOnlyConfig(3, 2), 20.5),  # 22.4
    "fpx_e2m2": (lambda: FPXWeightOnlyConfig(2, 2), 20.0),  # 22.1
    "intx_int4_g32": (lambda: IntxWeightOnlyConfig(torch.int4, PerGroup(32)), 15.5),  # 17.4
    "intx_int4_g128": (lambda: IntxWeightOnlyConfig(torch.int4, PerGroup(128)), 14.0),  # 16.1
    "intx_uint4_asym_g32": (lambda: IntxWeightOnlyConfig(torch.uint4, PerGroup(32), MappingType.ASYMMETRIC),
                            16.5),  # 18.4
    "intx_int8_row": (lambda: IntxWeightOnlyConfig(), 37.5),  # 39.6
    "intx_int2_g32": (lambda: IntxWeightOnlyConfig(torch.int2, PerGroup(32)), 1.0),  # 3.1
}


def _storage_kind(w):
    if isinstance(w, LinearActivationQuantizedTensor):
        return "dynamic", w.original_weight_tensor.tensor_impl.get_layout()
    return "weight-only", w.tensor_impl.get_layout()


EXPECTED_LAYOUT = {
    "int8_wo": PlainLayout(), "int8_wo_g32": PlainLayout(), "int8_dyn": PlainLayout(), "int8_dyn_asym": PlainLayout(),
    "int4_g128": Int4CPULayout(), "int4_g32": Int4CPULayout(), "int4_uintx_g128": UintxLayout(torch.uint4),
    "int4_hqq_g128": Int4CPULayout(), "float8": Float8Layout(), "float8_e5m2": Float8Layout(),
    "fpx_e3m2": FloatxTensorCoreLayout(3, 2), "fpx_e2m2": FloatxTensorCoreLayout(2, 2),
    "intx_int4_g32": UintxLayout(torch.int4), "intx_int4_g128": UintxLayout(torch.int4),
    "intx_uint4_asym_g32": UintxLayout(torch.uint4), "intx_int8_row": PlainLayout(),
    "intx_int2_g32": UintxLayout(torch.int2),
}


@pytest.fixture(scope="module")
def reference():
    model = make_block()
    with torch.no_grad():
        return model, model(IDS)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_config_on_a_transformer_block(name, reference):
    ref_model, ref = reference
    factory, bound = CONFIGS[name]
    model = copy.deepcopy(ref_model)
    float_bytes = sum(model.get_parameter(f"{n}.weight").numel() * 4 for n in LINEARS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every Linear fits: no skip warning, no fallback warning
        report = quantize_(model, factory())
        with torch.no_grad():
            out = model(IDS)
    assert isinstance(report, QuantizeReport)
    assert report.quantized == LINEARS and report.skipped == {}
    assert type(model.emb.weight) is nn.Parameter  # the default filter takes nn.Linear only
    kinds = set()
    q_bytes = 0
    for n in LINEARS:
        w = model.get_submodule(n).weight
        assert isinstance(w, nn.Parameter) and not w.requires_grad
        assert isinstance(w, (AffineQuantizedTensor, LinearActivationQuantizedTensor))
        kind, layout = _storage_kind(w)
        kinds.add(kind)
        assert layout == EXPECTED_LAYOUT[name], (n, layout)
        q_bytes += w.storage_nbytes
    assert kinds == {"dynamic" if "dyn" in name else "weight-only"}
    assert q_bytes < float_bytes / 2.5  # at most ~8.x bits a weight, with scales
    assert out.shape == ref.shape and out.dtype == ref.dtype
    value = sqnr(ref, out)
    assert value >= bound, f"{name}: SQNR {value:.2f} dB < {bound} dB"


def test_sqnr_orders_as_the_formats_do(reference):
    ref_model, ref = reference

    def run(cfg):
        m = copy.deepcopy(ref_model)
        quantize_(m, cfg)
        with torch.no_grad():
            return sqnr(ref, m(IDS))

    int8, fp8, fp6, int4 = (run(c) for c in (Int8WeightOnlyConfig(), Float8WeightOnlyConfig(),
                                             FPXWeightOnlyConfig(3, 2), Int4WeightOnlyConfig(group_size=128)))
    assert int8 > fp8 > fp6 > int4
    assert run(Int4WeightOnlyConfig(group_size=128, use_hqq=True)) > int4 + 0.2  # HQQ helps (+0.7 dB measured)


# ------------------------------------------------------------------ the stored numbers are quant_primitives'
def test_int8_weight_only_numerics():
    lin = nn.Linear(64, 32)
    w = lin.weight.detach().clone()
    quantize_(lin, Int8WeightOnlyConfig())
    s, zp = P.choose_qparams_affine(w, MappingType.SYMMETRIC, (1, 64), torch.int8, eps=torch.finfo(torch.float32).eps)
    q = P.quantize_affine(w, (1, 64), s, zp, torch.int8)
    assert torch.equal(lin.weight.tensor_impl.get_plain()[0], q)
    assert torch.equal(lin.weight.dequantize(), P.dequantize_affine(q, (1, 64), s, zp, torch.int8))


def test_int4_weight_only_numerics():
    lin = nn.Linear(128, 32)
    w = lin.weight.detach().clone()
    quantize_(lin, Int4WeightOnlyConfig(group_size=64, layout=UintxLayout(torch.uint4)))
    s, zp = P.choose_qparams_affine(w, MappingType.ASYMMETRIC, (1, 64), torch.uint4, 0, 15, eps=1e-6,
                                    zero_point_dtype=torch.float32, preserve_zero=False,
                                    zero_point_domain=ZeroPointDomain.FLOAT)
    q = P.quantize_affine(w, (1, 64), s, zp, torch.uint4, 0, 15, zero_point_domain=ZeroPointDomain.FLOAT)
    expected = P.dequantize_affine(q, (1, 64), s, zp, torch.uint4, 0, 15, zero_point_domain=ZeroPointDomain.FLOAT)
    assert torch.equal(lin.weight.dequantize(), expected)
    cpu = nn.Linear(128, 32)
    cpu.weight = nn.Parameter(w.clone())
    quantize_(cpu, Int4WeightOnlyConfig(group_size=64))
    assert torch.equal(cpu.weight.tensor_impl.get_plain()[0].to(torch.uint8), q)  # same codes in the kernel layout


def test_fpx_and_float8_numerics():
    lin = nn.Linear(32, 16)
    w = lin.weight.detach().clone()
    quantize_(lin, FPXWeightOnlyConfig(3, 2))
    s = P.choose_qparams_affine_fpx(w, 3, 2)
    assert torch.equal(lin.weight.dequantize(), P.dequantize_affine_fpx(P.quantize_affine_fpx(w, s, 3, 2), s, 3, 2))
    lin8 = nn.Linear(32, 16)
    w8 = lin8.weight.detach().clone()
    quantize_(lin8, Float8WeightOnlyConfig())
    s8 = P.choose_qparams_affine_float8(w8, (1, 32), torch.float8_e4m3fn)
    q8 = P.quantize_affine_float8(w8, s8, torch.float8_e4m3fn)
    assert torch.equal(lin8.weight.dequantize(), P.dequantize_affine_float8(q8, s8))


# ------------------------------------------------------------------ selection
def test_filter_fn_selects_modules():
    model = make_block()
    seen = []

    def only_mlp(module, fqn):
        seen.append(fqn)
        return isinstance(module, nn.Linear) and fqn.startswith("fc")

    report = quantize_(model, Int8WeightOnlyConfig(), filter_fn=only_mlp)
    assert report.quantized == ["fc1", "fc2"]
    assert "emb" in seen and "" in seen  # every module, the root included, is offered
    assert isinstance(model.fc1.weight, AffineQuantizedTensor)
    assert type(model.q.weight) is nn.Parameter and not isinstance(model.q.weight, AffineQuantizedTensor)


def test_embedding_can_be_quantized_with_a_filter():
    model = make_block()
    ref = model.emb(IDS).detach()
    report = quantize_(model, IntxWeightOnlyConfig(torch.int4, PerGroup(32)),
                       filter_fn=lambda m, fqn: isinstance(m, nn.Embedding))
    assert report.quantized == ["emb"]
    w = model.emb.weight
    assert isinstance(w, AffineQuantizedTensor)
    out = model.emb(IDS)
    assert torch.equal(out, F.embedding(IDS, w.dequantize()))
    assert sqnr(ref, out) > 15


def test_module_fqn_to_config():
    model = make_block()
    cfg = ModuleFqnToConfig({"_default": Int8WeightOnlyConfig(), "fc1": Int4WeightOnlyConfig(group_size=128),
                             "head": None, "emb": Float8WeightOnlyConfig()})
    report = quantize_(model, cfg)
    assert sorted(report.quantized) == sorted(["q", "k", "v", "o", "fc1", "fc2", "emb"])
    assert model.fc1.weight.tensor_impl.get_layout() == Int4CPULayout()
    assert model.q.weight.tensor_impl.get_layout() == PlainLayout()
    assert model.emb.weight.tensor_impl.get_layout() == Float8Layout()  # named: selected despite the filter
    assert not isinstance(model.head.weight, AffineQuantizedTensor)  # None: kept in float
    assert model(IDS).shape == (2, 16, 64)


def test_module_fqn_to_config_without_default_and_errors():
    model = make_block()
    report = quantize_(model, ModuleFqnToConfig({"v": Int8WeightOnlyConfig()}))
    assert report.quantized == ["v"]
    with pytest.raises(ValueError, match="nope"):
        quantize_(make_block(), ModuleFqnToConfig({"nope": Int8WeightOnlyConfig()}))
    with pytest.raises(TypeError):
        ModuleFqnToConfig({"q": "int8"})


# ------------------------------------------------------------------ layers that cannot take a config
class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.good = nn.Linear(128, 32)
        self.ragged = nn.Linear(96, 32)  # 96 is not a multiple of 64
        self.narrow = nn.Linear(128, 24)  # any out_features: the int4 CPU kernel takes it
        self.emb = nn.Embedding(10, 128)
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return self.good(x)


def test_unfit_layers_are_reported_and_warned():
    model = Odd()
    with pytest.warns(UserWarning, match="kept in float") as rec:
        report = quantize_(model, Int4WeightOnlyConfig(group_size=64))
    assert report.quantized == ["good", "narrow"]
    assert set(report.skipped) == {"ragged"}
    assert "64" in report.skipped["ragged"] and "96" in report.skipped["ragged"]
    text = str(rec[0].message)
    assert "ragged" in text and "narrow" not in text
    assert not isinstance(model.ragged.weight, AffineQuantizedTensor)
    assert isinstance(model.narrow.weight, AffineQuantizedTensor)
    assert "ragged" in str(report) and "quantized 2 layer" in str(report)


def test_dynamic_config_reports_embedding_and_conv():
    model = Odd()
    with pytest.warns(UserWarning, match="kept in float"):
        report = quantize_(model, Int8DynamicActivationInt8WeightConfig(),
                           filter_fn=lambda m, fqn: isinstance(m, (nn.Linear, nn.Embedding, nn.Conv2d)))
    assert {"emb", "conv"} <= set(report.skipped)
    assert "Linear" in report.skipped["emb"]
    assert isinstance(model.good.weight, LinearActivationQuantizedTensor)
    assert type(model.emb.weight) is nn.Parameter


def test_strict_raises_without_changing_the_model():
    model = Odd()
    before = {n: p for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match="ragged"):
        quantize_(model, Int4WeightOnlyConfig(group_size=64), strict=True)
    after = dict(model.named_parameters())
    assert all(after[n] is p for n, p in before.items())
    assert not any(isinstance(p, AffineQuantizedTensor) for p in model.parameters())


def test_already_quantized_layers_are_reported():
    model = make_block()
    quantize_(model, Int8WeightOnlyConfig())
    first = model.q.weight
    with pytest.warns(UserWarning, match="already quantized"):
        report = quantize_(model, Int4WeightOnlyConfig(group_size=128))
    assert report.quantized == [] and set(report.skipped) == set(LINEARS)
    assert model.q.weight is first
    with pytest.raises(ValueError):
        quantize_(model, Int8WeightOnlyConfig(), strict=True)


def test_modules_without_weight_are_reported_when_selected():
    model = make_block()
    with pytest.warns(UserWarning):
        report = quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: fqn in ("q", ""))
    assert report.quantized == ["q"]
    assert "" in report.skipped  # the root Block has no weight


def test_bad_arguments_raise_type_error():
    with pytest.raises(TypeError):
        quantize_("model", Int8WeightOnlyConfig())
    with pytest.raises(TypeError):
        quantize_(nn.Linear(16, 16), "int8")
    with pytest.raises(TypeError):
        quantize_(nn.Linear(16, 16), Int8WeightOnlyConfig)  # the class, not an instance
    with pytest.raises(TypeError):
        quantize_(nn.Linear(16, 16), Int8WeightOnlyConfig(), filter_fn=3)


def test_config_validation():
    with pytest.raises(ValueError):
        IntxWeightOnlyConfig(torch.int16)
    with pytest.raises(ValueError):
        FPXWeightOnlyConfig(0, 2)
    with pytest.raises(ValueError):
        FPXWeightOnlyConfig(5, 3)
    with pytest.raises(ValueError):  # the int4 CPU kernel takes float zero points only
        quantize_(nn.Linear(64, 32), Int4WeightOnlyConfig(group_size=32, zero_point_domain=ZeroPointDomain.INT))
    with pytest.raises(ValueError):
        quantize_(nn.Linear(64, 32), Int8DynamicActivationInt8WeightConfig(granularity=PerTensor()))
    with pytest.raises(ValueError):
        quantize_(nn.Linear(64, 32), Int8DynamicActivationInt8WeightConfig(
            act_mapping_type=MappingType.SYMMETRIC_NO_CLIPPING_ERR))
    for cfg in CONFIGS.values():
        assert isinstance(cfg[0](), AOBaseConfig)


def test_int4_integer_zero_point_with_packed_layout():
    lin = nn.Linear(64, 32)
    w = lin.weight.detach().clone()
    quantize_(lin, Int4WeightOnlyConfig(group_size=32, layout=UintxLayout(torch.uint4),
                                        zero_point_domain=ZeroPointDomain.INT))
    assert lin.weight.zero_point_domain is ZeroPointDomain.INT
    assert (lin.weight.dequantize() - w).abs().max() < 0.2 * w.abs().max()


def test_device_argument_and_bf16_weights():
    model = make_block().to(torch.bfloat16)
    report = quantize_(model, Int8WeightOnlyConfig(), device="cpu")
    assert report.quantized == LINEARS
    assert model.q.weight.dtype == torch.bfloat16
    out = model(IDS)
    assert out.dtype == torch.bfloat16


# ------------------------------------------------------------------ granularity
def test_block_size_for():
    shape = (8, 64)
    assert block_size_for(PerTensor(), shape) == (8, 64)
    assert block_size_for(PerAxis(0), shape) == (1, 64)
    assert block_size_for(PerAxis(1), shape) == (8, 1)
    assert block_size_for(PerAxis(-1), shape) == (8, 1)
    assert block_size_for(PerRow(), shape) == (1, 64)
    assert block_size_for(PerRow(0), shape) == (8, 1)
    assert block_size_for(PerGroup(16), shape) == (1, 16)
    assert block_size_for(PerGroup(16), (2, 3, 32)) == (1, 1, 16)
    assert block_size_for(PerBlock((4, 32)), shape) == (4, 32)
    with pytest.raises(ValueError):
        block_size_for(PerGroup(48), shape)
    with pytest.raises(ValueError):
        block_size_for(PerBlock((3, 64)), shape)
    with pytest.raises(ValueError):
        block_size_for(PerBlock((4,)), shape)
    with pytest.raises(ValueError):
        PerGroup(0)
    with pytest.raises(ValueError):
        PerGroup(True)
    with pytest.raises(TypeError):
        block_size_for("per_row", shape)
    assert PerGroup(32) == PerGroup(32) and hash(PerAxis(0)) == hash(PerAxis(0))


def test_granularities_in_configs():
    lin = nn.Linear(64, 32)
    quantize_(lin, IntxWeightOnlyConfig(torch.int4, PerBlock((8, 16))))
    assert lin.weight.block_size == (8, 16)
    lin = nn.Linear(64, 32)
    quantize_(lin, Int8WeightOnlyConfig(granularity=PerTensor()))
    assert lin.weight.block_size == (32, 64)
    with pytest.warns(UserWarning, match="48"):
        report = quantize_(nn.Linear(64, 32), IntxWeightOnlyConfig(torch.int4, PerGroup(48)))
    assert report.skipped


# ------------------------------------------------------------------ torch.compile
def _compiled_matches(config, backend="aot_eager"):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
    quantize_(model, config)
    x = torch.randn(4, 64)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_torch_compile_int8_weight_only():
    _compiled_matches(Int8WeightOnlyConfig())


def test_torch_compile_dynamic_activations():
    _compiled_matches(Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC))


def test_torch_compile_tiled_layout():
    _compiled_matches(IntxWeightOnlyConfig(torch.int4, PerGroup(32)))
