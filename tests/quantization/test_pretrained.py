"""quantize_pretrained / load_pretrained: a transformers checkpoint directory quantized one block at a time."""

from __future__ import annotations

import gc
import json
import os
import weakref

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from quanta.dtypes import (  # noqa: E402
    AffineQuantizedTensor,
    LinearActivationQuantizedTensor,
    WeightTensorWithLinearActivationScaleMetadata,
)
from quanta.quantization import (  # noqa: E402
    GPTQConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    SmoothQuantConfig,
    quantize_sequential,
)
from quanta.quantization import pretrained  # noqa: E402
from quanta.quantization.pretrained import load_pretrained, quantize_pretrained  # noqa: E402

VOCAB = 300


def _checkpoint(path, *, layers=3, tie=False, dtype=torch.float32, shard="100KB"):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                   tie_word_embeddings=tie)
    transformers.LlamaForCausalLM(cfg).to(dtype).save_pretrained(path, max_shard_size=shard)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:  # stands for the tokenizer files
        json.dump({"model_max_length": 64}, f)
    return path


def _data(n=3):
    return [torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(i)) for i in range(n)]


@pytest.mark.parametrize("config", [GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32)),
                                    SmoothQuantConfig(Int8DynamicActivationInt8WeightConfig())],
                         ids=["gptq-int4", "smoothquant-w8a8"])
@pytest.mark.parametrize("tie,dtype", [(False, torch.float32), (True, torch.bfloat16)], ids=["f32", "tied-bf16"])
def test_streaming_gives_what_quantize_sequential_gives_in_memory(tmp_path, config, tie, dtype):
    src = _checkpoint(tmp_path / "src", tie=tie, dtype=dtype)
    dst = tmp_path / "dst"
    report = quantize_pretrained(src, dst, config, _data(), progress=False)
    in_memory = transformers.LlamaForCausalLM.from_pretrained(src).eval()
    expected = quantize_sequential(in_memory, config, _data(), progress=False)
    assert report.quantized == expected.quantized and report.scale_folded_into == expected.scale_folded_into
    assert report.output_mse == expected.output_mse
    model = load_pretrained(dst)
    attention = model.model.layers[2].self_attn
    if isinstance(config, GPTQConfig):
        assert isinstance(attention.o_proj.weight, AffineQuantizedTensor)
    else:  # q/k/v scales folded into the input norm; o_proj's input has no such op: its scale is in the weight
        assert isinstance(attention.q_proj.weight, LinearActivationQuantizedTensor)
        assert isinstance(attention.o_proj.weight, WeightTensorWithLinearActivationScaleMetadata)
    x = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        assert torch.equal(model(x).logits, in_memory(x).logits)
    out = model.generate(x[:1, :4], max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 7)


def test_the_output_directory(tmp_path):
    src = _checkpoint(tmp_path / "src")
    dst = tmp_path / "dst"
    quantize_pretrained(src, dst, GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32)), _data(),
                        progress=False)
    files = sorted(os.listdir(dst))
    assert files == ["config.json", "generation_config.json", "model-block-00000.safetensors",
                     "model-block-00001.safetensors", "model-block-00002.safetensors", "model-rest.safetensors",
                     "model.safetensors.index.json", "tokenizer_config.json"]
    cfg = json.loads((dst / "config.json").read_text())
    q = cfg["quantization_config"]
    assert q["quant_method"] == "quanta" and q["algorithm"] == "GPTQ"
    assert q["config"]["base_config"] == {"type": "Int4WeightOnlyConfig", "group_size": 32, "layout": "Int4CPULayout()",
                                          "use_hqq": False, "zero_point_domain": None, "set_inductor_config": True,
                                          "preserve_zero": None}
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["model.layers.1.mlp.up_proj.weight"] == "model-block-00001.safetensors"
    assert index["weight_map"]["lm_head.weight"] == "model-rest.safetensors"
    assert not [d for d in os.listdir(tmp_path) if d.startswith(".quanta-")]  # no temporary left


def test_one_float_block_in_memory_at_a_time(tmp_path, monkeypatch):
    src = _checkpoint(tmp_path / "src", layers=4)
    alive: list[weakref.ref] = []
    real = pretrained.calibrate_block

    def watched(block, name, *args, **kwargs):
        gc.collect()
        assert [r for r in alive if r() is not None] == [], f"an earlier block is still alive at {name}"
        alive.append(weakref.ref(block))
        return real(block, name, *args, **kwargs)
    monkeypatch.setattr(pretrained, "calibrate_block", watched)
    quantize_pretrained(src, tmp_path / "dst", GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32)), _data(),
                        progress=False)
    assert len(alive) == 4


def test_a_failed_run_leaves_the_old_output_intact(tmp_path, monkeypatch):
    src = _checkpoint(tmp_path / "src")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "old.txt").write_text("previous run")
    real = pretrained.save_quantized
    calls = []

    def failing(state, path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(state, path, *a, **k)
    monkeypatch.setattr(pretrained, "save_quantized", failing)
    with pytest.raises(OSError, match="disk full"):
        quantize_pretrained(src, dst, GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32)), _data(),
                            progress=False)
    assert os.listdir(dst) == ["old.txt"]
    assert not [d for d in os.listdir(tmp_path) if d.startswith(".quanta-")]
    monkeypatch.setattr(pretrained, "save_quantized", real)
    quantize_pretrained(src, dst, Int4WeightOnlyConfig(group_size=32), _data(), progress=False)  # replaced whole
    assert "old.txt" not in os.listdir(dst) and isinstance(
        load_pretrained(dst).model.layers[0].mlp.up_proj.weight, AffineQuantizedTensor)


def test_bad_arguments(tmp_path):
    src = _checkpoint(tmp_path / "src")
    cfg = GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32))
    with pytest.raises(ValueError, match="differ"):
        quantize_pretrained(src, src, cfg, _data(), progress=False)
    with pytest.raises(ValueError, match="not a directory"):
        quantize_pretrained(tmp_path / "nope", tmp_path / "dst", cfg, _data(), progress=False)
    with pytest.raises(ValueError, match="empty"):
        quantize_pretrained(src, tmp_path / "dst", cfg, [], progress=False)
    with pytest.raises(TypeError, match="config"):
        quantize_pretrained(src, tmp_path / "dst", "gptq", _data(), progress=False)
    with pytest.raises(ValueError, match="model.layers.9"):
        quantize_pretrained(src, tmp_path / "dst", cfg, _data(), blocks=["model.layers.9"], progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        quantize_pretrained(tmp_path / "empty", tmp_path / "dst", cfg, _data(), progress=False)
    assert not (tmp_path / "dst").exists()
    with pytest.raises(ValueError, match="quant_method"):
        load_pretrained(src)  # a float checkpoint


def test_a_missing_tensor_is_named(tmp_path):
    src = _checkpoint(tmp_path / "src", shard="10GB")
    from safetensors.torch import load_file, save_file

    state = load_file(src / "model.safetensors")
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.layers.1.mlp.down_proj.weight"):
        quantize_pretrained(src, tmp_path / "dst", Int4WeightOnlyConfig(group_size=32), _data(), progress=False)
    assert not (tmp_path / "dst").exists()


ARCHITECTURES = {  # transformers 5 saves GPT-NeoX's lm_head as "embed_out": the checkpoint's names are renamed
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4)),
    "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16)),
    "falcon": lambda: transformers.FalconForCausalLM(transformers.FalconConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)),
    "bert": lambda: transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4)),
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_other_architectures_stream_like_they_run_in_memory(tmp_path, arch):
    torch.manual_seed(0)
    ARCHITECTURES[arch]().save_pretrained(tmp_path / "src")
    config = GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32))
    report = quantize_pretrained(tmp_path / "src", tmp_path / "dst", config, _data(2), progress=False)
    model = load_pretrained(tmp_path / "dst")
    in_memory = type(model).from_pretrained(tmp_path / "src").eval()
    assert quantize_sequential(in_memory, config, _data(2), progress=False).quantized == report.quantized
    x = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        a, b = model(x), in_memory(x)
    assert torch.equal(a[0], b[0])
