"""Small random-config models of transformers' own classes, as a user passes them to QuantizationSimModel.

Each entry: ``name -> (factory, make_inputs(batch, length), output key)``; ``make_inputs`` gives the keyword
inputs (token ids and mask, pixels, or a waveform). BatchNorm statistics are settled on data first
(:func:`build`): random initialisation alone leaves them at their defaults and activations vanish.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers as T

Inputs = Callable[[int, int], dict[str, Any]]


def _tokens(batch: int, length: int) -> dict[str, Any]:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length - 2:] = 0
    return {"input_ids": torch.randint(0, 100, (batch, length)), "attention_mask": mask}


def _decoder(batch: int, length: int) -> dict[str, Any]:
    return {**_tokens(batch, length), "use_cache": False}


def _seq2seq(batch: int, length: int) -> dict[str, Any]:
    return {**_tokens(batch, length), "decoder_input_ids": torch.randint(0, 100, (batch, length)), "use_cache": False}


def _pixels(batch: int, length: int) -> dict[str, Any]:
    return {"pixel_values": torch.randn(batch, 3, 32, 32)}


def _audio(batch: int, length: int) -> dict[str, Any]:
    return {"input_values": torch.randn(batch, 400 + 40 * length)}


def _mel(batch: int, length: int) -> dict[str, Any]:  # Whisper's encoder takes a fixed 16-frame window here
    return {"input_features": torch.randn(batch, 16, 16)}


def _whisper_encoder() -> torch.nn.Module:
    cfg = T.WhisperConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                          max_source_positions=8, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                          decoder_start_token_id=0)
    return T.WhisperModel(cfg).get_encoder()


ZOO: dict[str, tuple[Callable[[], torch.nn.Module], Inputs, str]] = {
    "bert": (lambda: T.BertModel(T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=64)), _tokens,
             "last_hidden_state"),
    "distilbert": (lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4,
                                                                hidden_dim=64)), _tokens, "last_hidden_state"),
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                    bos_token_id=0, eos_token_id=0)), _decoder, "logits"),
    "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, num_key_value_heads=2,
                                                       intermediate_size=64)), _decoder, "logits"),
    "qwen2": (lambda: T.Qwen2ForCausalLM(T.Qwen2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, num_key_value_heads=2,
                                                       intermediate_size=64)), _decoder, "logits"),
    "t5": (lambda: T.T5Model(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)),
           _seq2seq, "last_hidden_state"),
    "vit": (lambda: T.ViTModel(T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=64, image_size=32, patch_size=8)), _pixels,
            "last_hidden_state"),
    "clip_vision": (lambda: T.CLIPVisionModel(T.CLIPVisionConfig(hidden_size=32, intermediate_size=64,
                                                                 num_hidden_layers=2, num_attention_heads=4,
                                                                 image_size=32, patch_size=8)), _pixels,
                    "last_hidden_state"),
    "swin": (lambda: T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                              num_heads=[2, 2], window_size=4)), _pixels, "last_hidden_state"),
    "convnext": (lambda: T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)),
                 _pixels, "last_hidden_state"),
    "resnet": (lambda: T.ResNetModel(T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                    layer_type="basic")), _pixels, "last_hidden_state"),
    "mobilenet_v2": (lambda: T.MobileNetV2Model(T.MobileNetV2Config(image_size=32, depth_multiplier=0.35)), _pixels,
                     "last_hidden_state"),
    "roberta": (lambda: T.RobertaModel(T.RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, intermediate_size=64)), _tokens,
                "last_hidden_state"),
    "albert": (lambda: T.AlbertModel(T.AlbertConfig(vocab_size=100, embedding_size=16, hidden_size=32,
                                                    num_hidden_layers=2, num_attention_heads=4,
                                                    intermediate_size=64)), _tokens, "last_hidden_state"),
    "electra": (lambda: T.ElectraModel(T.ElectraConfig(vocab_size=100, embedding_size=16, hidden_size=32,
                                                       num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=64)), _tokens, "last_hidden_state"),
    "deberta_v2": (lambda: T.DebertaV2Model(T.DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                              num_attention_heads=4, intermediate_size=64)), _tokens,
                   "last_hidden_state"),
    "mistral": (lambda: T.MistralForCausalLM(T.MistralConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                             num_attention_heads=4, num_key_value_heads=2,
                                                             intermediate_size=64, head_dim=8)), _decoder, "logits"),
    "phi3": (lambda: T.Phi3ForCausalLM(T.Phi3Config(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, num_key_value_heads=2,
                                                    intermediate_size=64, pad_token_id=0)), _decoder, "logits"),
    "gemma": (lambda: T.GemmaForCausalLM(T.GemmaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, num_key_value_heads=2,
                                                       intermediate_size=64, head_dim=8)), _decoder, "logits"),
    "opt": (lambda: T.OPTForCausalLM(T.OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32)),
            _decoder, "logits"),
    "gpt_neox": (lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                              num_attention_heads=4, intermediate_size=64)),
                 _decoder, "logits"),
    "falcon": (lambda: T.FalconForCausalLM(T.FalconConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                          num_attention_heads=4)), _decoder, "logits"),
    "bart": (lambda: T.BartModel(T.BartConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
                                              encoder_attention_heads=4, decoder_attention_heads=4,
                                              encoder_ffn_dim=64, decoder_ffn_dim=64)), _seq2seq,
             "last_hidden_state"),
    "whisper_encoder": (_whisper_encoder, _mel, "last_hidden_state"),
    "deit": (lambda: T.DeiTModel(T.DeiTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              intermediate_size=64, image_size=32, patch_size=8)), _pixels,
             "last_hidden_state"),
    "segformer": (lambda: T.SegformerModel(T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                             hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                                             patch_sizes=[7, 3], strides=[4, 2],
                                                             mlp_ratios=[2, 2])), _pixels, "last_hidden_state"),
    "regnet": (lambda: T.RegNetModel(T.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                    groups_width=8)), _pixels, "last_hidden_state"),
    "mobilevit": (lambda: T.MobileViTModel(T.MobileViTConfig(image_size=32, hidden_sizes=[16, 24, 32],
                                                             neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])), _pixels,
                  "last_hidden_state"),
    "wav2vec2": (lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                          intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                                          conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                                          num_conv_pos_embedding_groups=4)), _audio,
                 "last_hidden_state"),
}


def build(name: str, seed: int = 0) -> tuple[torch.nn.Module, Inputs, str]:
    """The model in eval mode with its BatchNorm statistics settled (cumulative average over 4 batches)."""
    factory, inputs, key = ZOO[name]
    torch.manual_seed(seed)
    model = factory()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for bn in norms:
            bn.momentum = None
            bn.reset_running_stats()
        model.train()
        with torch.no_grad():
            for _ in range(4):
                model(**inputs(8, 8))
    return model.eval(), inputs, key


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    noise = (ref - out).pow(2).mean().item()
    return float("inf") if noise == 0 else 10 * torch.log10(ref.pow(2).mean() / noise).item()
