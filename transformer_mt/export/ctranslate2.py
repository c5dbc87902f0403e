"""tmt-export format=ctranslate2 (the optional `export` extra: ctranslate2>=4): our model as a
CTranslate2 model folder, which decode/ctranslate2_backend.py's search backend runs.

The weights are placed in ctranslate2's model specification (`ctranslate2.specs.TransformerSpec`),
as CTranslate2's own converters for fairseq and OpenNMT-py fill it, then validated, optionally
quantized and saved by CTranslate2. How our model maps onto it:

- post-LN (the paper's) or pre-LN blocks: the spec's `pre_norm`; pre-LN stacks end with the final
  LayerNorms, post-LN stacks have none;
- sinusoidal positions: passed as our table (sin at even, cos at odd dimensions), since
  CTranslate2's built-in one is [sin | cos]. A fixed table of model.max_positions rows, which is
  the export's length limit (ours grows to any length): the backend cuts longer sources to
  max_positions - 1 pieces, with a warning, and outputs to max_positions - 1 pieces + EOS;
- embeddings scaled by sqrt(d_model): the spec's `scale_embeddings`; one shared matrix for the
  encoder, decoder and output projection (CTranslate2 stores it once, as aliases);
- fused projections: our Q|K|V rows are the self-attention's fused linear, our K|V rows the
  cross-attention's; no attention biases (the spec's biases are optional);
- tokens: the SentencePiece pieces in id order, <pad> renamed <blank>
  (`ctranslate2_backend.ctranslate2_vocabulary`); sources end with </s> (`add_source_eos`).

The folder also holds the SentencePiece model(s) and transformer_mt.json (normalisation, length
limit, provenance), so that `load_translator(run_dir, "ctranslate2")` (decode/loading.py) and
`tmt-translate checkpoint=ctranslate2` translate with it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from transformer_mt.data.tokenizer import Tokenizers
from transformer_mt.decode.ctranslate2_backend import ctranslate2_vocabulary, import_ctranslate2
from transformer_mt.decode.loading import EXPORT_INFO, EXPORTED
from transformer_mt.errors import ConfigError
from transformer_mt.export import check_exportable
from transformer_mt.files import replacing_folder
from transformer_mt.model import DecoderLayer, EncoderLayer, Transformer

log = logging.getLogger(__name__)
FORMAT = "transformer_mt-ctranslate2/1"


def export_model(
    model: Transformer,
    tokenizers: Tokenizers,
    output: Path,
    *,
    unicode_form: str | None,
    quantization: str | None = None,
    provenance: dict | None = None,
) -> Path:
    """Save `model` with its tokenizers as a CTranslate2 model folder at `output`, replacing it.

    unicode_form: the normalisation the training data had; quantization: CTranslate2's weight
    type (None keeps float32)."""
    ctranslate2 = import_ctranslate2()
    accepted = ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES
    if quantization is not None and quantization not in accepted:
        raise ConfigError(
            f"config key 'quantization': {quantization} is not one of CTranslate2's "
            f"({', '.join(accepted)}) or null"
        )
    spec = transformer_spec(model)
    spec.register_source_vocabulary(ctranslate2_vocabulary(tokenizers.src))
    spec.register_target_vocabulary(ctranslate2_vocabulary(tokenizers.tgt))
    spec.config.add_source_eos = True  # our sources end with EOS; outputs start from <s>
    for file in tokenizers.files:
        spec.register_file(str(file))
    spec.validate()
    spec.optimize(quantization=quantization)
    info = {
        "format": FORMAT,
        "max_positions": model.cfg.max_positions,  # the table's length: the export's limit
        "unicode_form": unicode_form,
        "quantization": quantization,
        **(provenance or {}),
    }
    output = Path(output)
    with replacing_folder(output, marker=EXPORT_INFO, what=EXPORTED) as temporary:
        spec.save(str(temporary))
        (temporary / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    log.info("exported CTranslate2 model (%s weights) to %s", quantization or "float32", output)
    return output


def transformer_spec(model: Transformer):
    """Our model's weights in a ctranslate2.specs.TransformerSpec (not yet validated)."""
    check_exportable(model, "CTranslate2's TransformerSpec")
    specs = import_ctranslate2().specs
    cfg = model.cfg
    spec = specs.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm_first,
        activation=specs.Activation.RELU,
    )
    spec.config.layer_norm_epsilon = model.encoder[0].attn_block.norm.eps
    # (max_positions, D): sin at even, cos at odd dims; rows past it (grown by a long sentence
    # decoded before the export) left out, so that the limit is the configuration's.
    positions = model.positions[: cfg.max_positions].cpu().numpy()
    source_table = model.embed if model.src_embed is None else model.src_embed
    spec.encoder.embeddings[0].weight = weight(source_table)
    spec.encoder.position_encodings.encodings = positions
    spec.decoder.embeddings.weight = weight(model.embed)
    spec.decoder.position_encodings.encodings = positions
    spec.decoder.projection.weight = weight(model.embed)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder, strict=True):
        set_encoder_layer(layer_spec, layer)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder, strict=True):
        set_decoder_layer(layer_spec, layer)
    if cfg.norm_first:
        set_layer_norm(spec.encoder.layer_norm, model.encoder_norm)
        set_layer_norm(spec.decoder.layer_norm, model.decoder_norm)
    return spec


def set_encoder_layer(spec, layer: EncoderLayer) -> None:
    set_linear(spec.self_attention.linear[0], layer.self_attn.qkv)  # fused Q|K|V rows
    set_linear(spec.self_attention.linear[1], layer.self_attn.out)
    set_layer_norm(spec.self_attention.layer_norm, layer.attn_block.norm)
    set_feed_forward(spec.ffn, layer)


def set_decoder_layer(spec, layer: DecoderLayer) -> None:
    set_linear(spec.self_attention.linear[0], layer.self_attn.qkv)  # fused Q|K|V rows
    set_linear(spec.self_attention.linear[1], layer.self_attn.out)
    set_layer_norm(spec.self_attention.layer_norm, layer.self_block.norm)
    set_linear(spec.attention.linear[0], layer.cross_attn.q)
    set_linear(spec.attention.linear[1], layer.cross_attn.kv)  # fused K|V rows
    set_linear(spec.attention.linear[2], layer.cross_attn.out)
    set_layer_norm(spec.attention.layer_norm, layer.cross_block.norm)
    set_feed_forward(spec.ffn, layer)


def set_feed_forward(spec, layer: EncoderLayer | DecoderLayer) -> None:
    set_linear(spec.linear_0, layer.ffn.inner)
    set_linear(spec.linear_1, layer.ffn.outer)
    set_layer_norm(spec.layer_norm, layer.ffn_block.norm)


def set_linear(spec, linear) -> None:
    spec.weight = weight(linear)
    if linear.bias is not None:
        spec.bias = linear.bias.detach().cpu().numpy()


def set_layer_norm(spec, norm) -> None:
    spec.gamma = weight(norm)
    spec.beta = norm.bias.detach().cpu().numpy()


def weight(module):
    return module.weight.detach().cpu().float().numpy()
