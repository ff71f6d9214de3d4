"""Small random-config models of transformers' own classes, as a user passes them to QuantizationSimModel.

``ZOO`` maps a name to ``(factory, make_inputs(batch, length), output key)``: ``factory()`` builds the model
(transformers' defaults, attention implementation included), ``make_inputs`` gives the keyword arguments a user
passes (token ids and mask, ``use_cache=False`` for decoders, ``decoder_input_ids``, pixels, a waveform or mel
features) at any batch size and length, and the key names the output the SQNR is measured on. :func:`build`
seeds, builds, settles the BatchNorm statistics on data (random initialisation alone leaves them at their
defaults, and activations vanish or explode) and returns the model in eval mode; :func:`simulate` passes it to
``QuantizationSimModel`` as a user would (default config, W8A8) and calibrates it, at shapes other than the
dummy input's (:data:`DUMMY`, :data:`CALIBRATION`, :data:`EVALUATION`).

>>> model, inputs, key = build("llama")
>>> sorted(inputs(2, 5))
['attention_mask', 'input_ids', 'use_cache']
>>> tuple(model(**inputs(2, 5))[key].shape)
(2, 5, 100)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers as T

from quanta.quantsim import QuantizationSimModel

Inputs = Callable[[int, int], dict[str, Any]]
VOCAB = 100
IMAGE = 32  # pixels a side
DUMMY = (2, 8)  # (batch, length) of the dummy input the sim captures with
CALIBRATION = (4, 8, 10)  # 4 batches of (batch, length)
EVALUATION = (4, 12)  # held-out inputs the output SQNR is measured on


def _tokens(batch: int, length: int) -> dict[str, Any]:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length - 2:] = 0  # some padding: the mask path is exercised
    return {"input_ids": torch.randint(0, VOCAB, (batch, length)), "attention_mask": mask}


def _decoder(batch: int, length: int) -> dict[str, Any]:
    return {**_tokens(batch, length), "use_cache": False}


def _seq2seq(batch: int, length: int) -> dict[str, Any]:
    return {**_tokens(batch, length), "decoder_input_ids": torch.randint(0, VOCAB, (batch, length)),
            "use_cache": False}


def _pixels(batch: int, length: int) -> dict[str, Any]:
    return {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE)}


def _audio(batch: int, length: int) -> dict[str, Any]:  # a waveform: 400 samples + 40 per frame
    return {"input_values": torch.randn(batch, 400 + 40 * length)}


def _mel(batch: int, length: int) -> dict[str, Any]:
    # Whisper's encoder takes exactly 2 * max_source_positions frames (it raises otherwise): only the batch varies
    return {"input_features": torch.randn(batch, 16, 16)}


def _whisper_encoder() -> torch.nn.Module:
    cfg = T.WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                          max_source_positions=8, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                          decoder_start_token_id=0)
    return T.WhisperModel(cfg).get_encoder()


_ENCODER = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64}
_DECODER = {**_ENCODER, "num_key_value_heads": 2}  # grouped-query attention: 2 key/value heads for 4 query heads
_SPECIAL = {"bos_token_id": 0, "eos_token_id": 0}  # inside the small vocabulary
_VIT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "image_size": IMAGE, "patch_size": 8}

ZOO: dict[str, tuple[Callable[[], torch.nn.Module], Inputs, str]] = {
    # encoders
    "bert": (lambda: T.BertModel(T.BertConfig(**_ENCODER)), _tokens, "last_hidden_state"),
    "roberta": (lambda: T.RobertaModel(T.RobertaConfig(**_ENCODER)), _tokens, "last_hidden_state"),
    "distilbert": (lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                                                                hidden_dim=64)), _tokens, "last_hidden_state"),
    "albert": (lambda: T.AlbertModel(T.AlbertConfig(**_ENCODER, embedding_size=16)), _tokens, "last_hidden_state"),
    "electra": (lambda: T.ElectraModel(T.ElectraConfig(**_ENCODER, embedding_size=16)), _tokens,
                "last_hidden_state"),
    "deberta_v2": (lambda: T.DebertaV2Model(T.DebertaV2Config(**_ENCODER)), _tokens, "last_hidden_state"),
    # decoders: rotary embeddings and grouped-query attention (llama ... qwen3), learned positions (gpt2, opt)
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                    **_SPECIAL)), _decoder, "logits"),
    "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(**_DECODER)), _decoder, "logits"),
    "mistral": (lambda: T.MistralForCausalLM(T.MistralConfig(**_DECODER, head_dim=8)), _decoder, "logits"),
    "qwen2": (lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**_DECODER)), _decoder, "logits"),
    "qwen3": (lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**_DECODER, head_dim=8)), _decoder, "logits"),  # q/k norms
    "phi": (lambda: T.PhiForCausalLM(T.PhiConfig(**_ENCODER, **_SPECIAL)), _decoder, "logits"),  # partial rotary
    "phi3": (lambda: T.Phi3ForCausalLM(T.Phi3Config(**_DECODER, pad_token_id=0, **_SPECIAL)), _decoder, "logits"),
    "gemma": (lambda: T.GemmaForCausalLM(T.GemmaConfig(**_DECODER, head_dim=8)), _decoder, "logits"),
    "opt": (lambda: T.OPTForCausalLM(T.OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32)),
            _decoder, "logits"),
    "gpt_neox": (lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**_ENCODER)), _decoder, "logits"),
    "falcon": (lambda: T.FalconForCausalLM(T.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                          num_attention_heads=4)), _decoder, "logits"),
    # encoder-decoders (decoder_input_ids given)
    "t5": (lambda: T.T5Model(T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)),
           _seq2seq, "last_hidden_state"),
    "bart": (lambda: T.BartModel(T.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                                              encoder_attention_heads=4, decoder_attention_heads=4,
                                              encoder_ffn_dim=64, decoder_ffn_dim=64)), _seq2seq,
             "last_hidden_state"),
    # vision transformers
    "vit": (lambda: T.ViTModel(T.ViTConfig(**_VIT)), _pixels, "last_hidden_state"),
    "deit": (lambda: T.DeiTModel(T.DeiTConfig(**_VIT)), _pixels, "last_hidden_state"),
    "dinov2": (lambda: T.Dinov2Model(T.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                    mlp_ratio=2, image_size=IMAGE, patch_size=8)), _pixels,
               "last_hidden_state"),  # layer scale
    "clip_vision": (lambda: T.CLIPVisionModel(T.CLIPVisionConfig(**_VIT)), _pixels, "last_hidden_state"),
    "swin": (lambda: T.SwinModel(T.SwinConfig(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1],
                                              num_heads=[2, 2], window_size=4)), _pixels, "last_hidden_state"),
    "segformer": (lambda: T.SegformerModel(T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                             hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                                             patch_sizes=[7, 3], strides=[4, 2],
                                                             mlp_ratios=[2, 2])), _pixels, "last_hidden_state"),
    "mobilevit": (lambda: T.MobileViTModel(T.MobileViTConfig(image_size=IMAGE, hidden_sizes=[16, 24, 32],
                                                             neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])), _pixels,
                  "last_hidden_state"),
    # convolutional networks
    "convnext": (lambda: T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)),
                 _pixels, "last_hidden_state"),
    "resnet": (lambda: T.ResNetModel(T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                    layer_type="basic")), _pixels, "last_hidden_state"),
    "regnet": (lambda: T.RegNetModel(T.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                    groups_width=8)), _pixels, "last_hidden_state"),
    "mobilenet_v2": (lambda: T.MobileNetV2Model(T.MobileNetV2Config(image_size=IMAGE, depth_multiplier=0.35)),
                     _pixels, "last_hidden_state"),
    "efficientnet": (lambda: T.EfficientNetModel(T.EfficientNetConfig(
        image_size=IMAGE, width_coefficient=0.5, depth_coefficient=1.0, kernel_sizes=(3, 5), in_channels=(32, 16),
        out_channels=(16, 24), strides=(1, 2), num_block_repeats=(1, 2), expand_ratios=(1, 4), hidden_dim=640)),
        _pixels, "last_hidden_state"),  # depthwise convolutions, squeeze-excitation, SiLU
    # speech
    "wav2vec2": (lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                          intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                                          conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                                          num_conv_pos_embedding_groups=4)), _audio,
                 "last_hidden_state"),
    "whisper_encoder": (_whisper_encoder, _mel, "last_hidden_state"),
}


def build(name: str, seed: int = 0) -> tuple[torch.nn.Module, Inputs, str]:
    """The model in eval mode with its BatchNorm statistics settled on data: each BatchNorm reset (statistics,
    and weight 1 / bias 0) and accumulated as a cumulative average over 4 training-mode batches of 8."""
    factory, inputs, key = ZOO[name]
    torch.manual_seed(seed)
    model = factory()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for bn in norms:
            bn.momentum = None
            bn.reset_parameters()  # MobileViT draws its BatchNorm weights ~N(0, 0.02): activations vanish
        model.train()
        with torch.no_grad():
            for _ in range(4):
                model(**inputs(8, 8))
    return model.eval(), inputs, key


@dataclass
class Simulated:
    """A zoo model, its calibrated simulation and what building the simulation warned about."""

    model: torch.nn.Module
    inputs: Inputs
    key: str
    sim: QuantizationSimModel
    warnings: list[str]


def simulate(name: str) -> Simulated:
    """:func:`build`, then ``QuantizationSimModel(model, inputs(*DUMMY))`` with every default, calibrated on
    :data:`CALIBRATION` batches (seeded)."""
    model, inputs, key = build(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = QuantizationSimModel(model, inputs(*DUMMY))
    batches, batch, length = CALIBRATION
    torch.manual_seed(1)
    sim.compute_encodings([inputs(batch, length) for _ in range(batches)], progress=False)
    return Simulated(model, inputs, key, sim, [str(w.message) for w in caught])
