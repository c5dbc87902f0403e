"""tmt-export format=transformers (the optional `hf` extra: HF_REQUIREMENT): our model as a folder
that `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load with no code of
ours, with a model card (README.md).

How our model maps onto transformers' Marian (models/marian/modeling_marian.py):

- the same blocks: post-LN (Marian has no pre-LN option and no final LayerNorm, so a model with
  model.norm_first=true is refused), ReLU, embeddings scaled by sqrt(d_model), sinusoidal
  positions from 0, no LayerNorm on the embeddings; dropout rates as ours;
- sinusoidal positions: ours put sin at even and cos at odd dimensions, Marian's table (computed
  when the model is built, never stored) sin in the first half and cos in the second. Every
  weight is written with its model dimension in Marian's order (`marian_order`: our dimensions
  0, 2, 4, ..., then 1, 3, 5, ...), which is an exact equivalence: the residual stream is then
  the same vector in another order everywhere, and LayerNorm (statistics over all dimensions,
  elementwise gain and bias), attention (dot products over the dimension; heads are split on the
  projections' other side) and the output projection do not depend on the order;
- projections: our fused Q|K|V rows (self-attention) and K|V rows (cross-attention) split into
  q_proj, k_proj, v_proj; Marian's attention biases (ours have none) and final_logits_bias are
  zeros;
- embeddings: one shared vocabulary is one matrix for the encoder, the decoder and the output
  (share_encoder_decoder_embeddings); with separate vocabularies (data.shared_vocab=false) the
  encoder has its own (vocab_size) and the decoder's (decoder_vocab_size) is tied to the output;
- tokens: source.spm and target.spm are our SentencePiece model(s); vocab.json (and, separate,
  target_vocab.json) maps every piece to our id, so MarianTokenizer's ids are ours (byte-fallback
  pieces included); it ends sources with </s> as our Translator does; decoding starts from <s>
  (decoder_start_token_id: our BOS, where Marian's own models start from <pad>);
- search (generation_config.json): our defaults (decode.*): beam 4, alpha 0.6, PAD, UNK and BOS
  never generated, early_stopping "never" (our exact stopping rule), EOS forced at the limit.

What Marian's generate cannot do as ours: the length penalty (transformers divides a beam
hypothesis's log-probability by length ** alpha, we by GNMT's ((5 + length) / 6) ** alpha, so
beam outputs can differ; greedy ones cannot) and the per-sentence length limit (ours:
decode.max_len_a * source length + max_len_b, with positions for any length; there: one
max_length, the model's max_positions, which is also Marian's position table: MarianTokenizer
with truncation=True keeps max_positions - 1 source pieces and </s>, and a longer input without
truncation is an index error in its position embedding).
MarianTokenizer does not apply data.unicode_form (our Translator normalises inputs first, e.g.
to NFC). The model card says so. And Marian's position table is computed in float64 where ours
is float32: values in [-1, 1] differ by 5e-7 over 50 positions (d_model 16), 9e-6 over 256 (64),
6e-5 over 1024 (512), the float32 rounding of ours.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from transformer_mt.config import DecodeConfig, ModelConfig
from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_PIECES,
    UNK_ID,
    Tokenizer,
    Tokenizers,
    vocabulary,
)
from transformer_mt.decode.loading import EXPORT_INFO, EXPORTED
from transformer_mt.errors import TransformerMTError
from transformer_mt.export import check_exportable
from transformer_mt.files import replacing_folder
from transformer_mt.model import DecoderLayer, EncoderLayer, Transformer

log = logging.getLogger(__name__)
FORMAT = "transformer_mt-transformers/1"
"""The format tag of the export's transformer_mt.json (its provenance, and the mark that a new
export may replace the folder)."""
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
SOURCE_VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"
"""MarianTokenizer's file names (its VOCAB_FILES_NAMES)."""
HF_REQUIREMENT, HF_TORCH_REQUIREMENT = "transformers>=5.17", "torch>=2.6"
"""The `hf` extra of pyproject.toml (a test holds them equal): the oldest versions tested
together; transformers 5 turns its PyTorch models off below torch 2.6."""


@dataclass(frozen=True)
class ModelCard:
    """Where the model comes from, for its README.md (commands/export.py reads the run folder)."""

    checkpoint: str
    """The checkpoint exported."""
    step: int
    """The update it was written at."""
    train_seconds: float | None
    """Training time up to that update (its progress; None: not recorded, e.g. averaged)."""
    corpus: str
    """The training corpus, in words (sources.corpus_identity)."""
    data: dict
    """The run's data settings (DataConfig), as plain values."""
    test_scores: dict | None
    """scores.test.json as tmt-eval wrote it, or None: the run was not evaluated."""


def import_transformers():
    """The transformers module, or an error saying in one line how to install it or why it cannot
    use this torch (transformers 5 turns its PyTorch models off below torch 2.6)."""
    try:
        import transformers
    except ImportError:
        raise TransformerMTError(
            'transformers is not installed: pip install -e ".[hf]" (or pip install '
            f'"{HF_REQUIREMENT}") in this environment'
        ) from None
    if not transformers.utils.is_torch_available():
        raise TransformerMTError(
            f"transformers {transformers.__version__} cannot use torch {torch.__version__} (it "
            f'turns its PyTorch models off for this version): pip install "{HF_REQUIREMENT}" '
            f'"{HF_TORCH_REQUIREMENT}" in this environment'
        )
    return transformers


def export_model(
    model: Transformer,
    tokenizers: Tokenizers,
    output: Path,
    *,
    card: ModelCard,
) -> Path:
    """Save `model` with its tokenizers and a model card as a MarianMTModel folder at
    `output`, replacing it."""
    transformers = import_transformers()
    marian = transformers.MarianMTModel(marian_config(model, tokenizers, transformers))
    marian.load_state_dict(marian_state_dict(model, marian), strict=True)
    marian.generation_config = generation_config(model.cfg.max_positions, transformers)
    output = Path(output)
    with replacing_folder(output, marker=EXPORT_INFO, what=EXPORTED) as temporary:
        with safetensors_os_errors(temporary):
            marian.save_pretrained(temporary)
        save_tokenizer(tokenizers, temporary, model.cfg.max_positions, transformers)
        readme = model_card(card, model, tokenizers, output.resolve())
        (temporary / "README.md").write_text(readme, encoding="utf-8")
        info = {"format": FORMAT, "checkpoint": card.checkpoint, "step": card.step}
        (temporary / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    log.info("exported a transformers MarianMTModel (update %d) to %s", card.step, output)
    return output


SAFETENSORS_OS_ERROR = re.compile(r"\(os error (\d+)\)")
"""How safetensors' SafetensorError quotes the OS's error of a failed write: 'Error while
serializing: I/O error: No space left on device (os error 28)'."""


@contextmanager
def safetensors_os_errors(folder: Path) -> Iterator[None]:
    """safetensors' error for a write the OS refused (a full disk: SafetensorError, not an
    OSError) as the OSError it quotes, about `folder`, so that the CLI says it in one line; any
    other SafetensorError as it is."""
    from safetensors import SafetensorError  # transformers' own dependency: the hf extra

    try:
        yield
    except SafetensorError as error:
        quoted = SAFETENSORS_OS_ERROR.search(str(error))
        if quoted is None:
            raise
        number = int(quoted.group(1))
        raise OSError(number, os.strerror(number), str(folder)) from error


def marian_config(model: Transformer, tokenizers: Tokenizers, transformers):
    """A transformers.MarianConfig of our model's shape and tokens."""
    check_exportable(model, "transformers' MarianMTModel")
    cfg = model.cfg
    if cfg.norm_first:
        raise TransformerMTError(
            "cannot export model.norm_first=true to transformers: MarianMTModel has post-LN "
            "blocks only (no pre-LN option, no final LayerNorm); format=ctranslate2 takes it"
        )
    shared = tokenizers.shared
    return marian_shape(
        cfg,
        transformers,
        vocab_size=tokenizers.tgt.vocab_size,
        src_vocab_size=None if shared else tokenizers.src.vocab_size,
    )


def marian_shape(
    cfg: ModelConfig, transformers, *, vocab_size: int, src_vocab_size: int | None = None, **more
):
    """A transformers.MarianConfig of our model's shape and recipe: post-LN, ReLU, scaled and
    tied embeddings (one table for both sides without src_vocab_size), our special tokens; `more`
    sets other MarianConfig fields (make bench's Marian baseline: attn_implementation)."""
    return transformers.MarianConfig(
        vocab_size=src_vocab_size or vocab_size,
        decoder_vocab_size=vocab_size,
        share_encoder_decoder_embeddings=src_vocab_size is None,
        tie_word_embeddings=True,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        max_position_embeddings=cfg.max_positions,
        activation_function="relu",
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        **more,
    )


def generation_config(max_positions: int, transformers):
    """Our default search (DecodeConfig) as far as transformers' generate can express it."""
    decode = DecodeConfig()
    return transformers.GenerationConfig(
        num_beams=decode.beam_size,
        length_penalty=decode.length_penalty,  # over length ** alpha, not GNMT's (module doc)
        early_stopping="never",  # decode.stop_early=false: search on while a live one can win
        max_length=max_positions,  # counts the start token: max_positions - 1 generated, as ours
        suppress_tokens=[PAD_ID, UNK_ID, BOS_ID],  # banned by our searches
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


# ---- weights -------------------------------------------------------------------------------
def marian_order(d_model: int) -> Tensor:
    """Our model dimensions in Marian's order: Marian's dimension k is our marian_order[k] (our
    sin dimensions 0, 2, 4, ... first, then our cos dimensions 1, 3, 5, ...)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_state_dict(model: Transformer, marian: nn.Module) -> dict[str, Tensor]:
    """Every entry of `marian`'s state dict, from our weights (its own position tables, which
    are not saved, and zero biases where we have none)."""
    order = marian_order(model.cfg.d_model)
    target = model.embed.weight.detach()[:, order]  # (V, D): the model dimension is the columns
    state = {
        "lm_head.weight": target,
        "model.decoder.embed_tokens.weight": target,
        "model.encoder.embed_tokens.weight": target,
        "final_logits_bias": torch.zeros_like(marian.final_logits_bias),
    }
    if model.src_embed is None:
        state["model.shared.weight"] = target
    else:
        state["model.encoder.embed_tokens.weight"] = model.src_embed.weight.detach()[:, order]
    for side in ("encoder", "decoder"):
        key = f"model.{side}.embed_positions.weight"
        state[key] = marian.state_dict()[key]
    for index, layer in enumerate(model.encoder):
        state.update(encoder_layer(f"model.encoder.layers.{index}.", layer, order))
    for index, layer in enumerate(model.decoder):
        state.update(decoder_layer(f"model.decoder.layers.{index}.", layer, order))
    return state


def encoder_layer(prefix: str, layer: EncoderLayer, order: Tensor) -> dict[str, Tensor]:
    q, k, v = layer.self_attn.qkv.weight.detach().chunk(3)  # fused Q|K|V rows
    return {
        **attention(f"{prefix}self_attn.", q, k, v, layer.self_attn.out.weight, order),
        **layer_norm(f"{prefix}self_attn_layer_norm.", layer.attn_block.norm, order),
        **feed_forward(prefix, layer, order),
    }


def decoder_layer(prefix: str, layer: DecoderLayer, order: Tensor) -> dict[str, Tensor]:
    q, k, v = layer.self_attn.qkv.weight.detach().chunk(3)  # fused Q|K|V rows
    cross = layer.cross_attn
    cross_k, cross_v = cross.kv.weight.detach().chunk(2)  # fused K|V rows
    return {
        **attention(f"{prefix}self_attn.", q, k, v, layer.self_attn.out.weight, order),
        **layer_norm(f"{prefix}self_attn_layer_norm.", layer.self_block.norm, order),
        **attention(
            f"{prefix}encoder_attn.", cross.q.weight, cross_k, cross_v, cross.out.weight, order
        ),
        **layer_norm(f"{prefix}encoder_attn_layer_norm.", layer.cross_block.norm, order),
        **feed_forward(prefix, layer, order),
    }


def attention(prefix: str, q: Tensor, k: Tensor, v: Tensor, out: Tensor, order: Tensor) -> dict:
    """q, k, v: (D, D) projections (rows: heads' dimensions, columns: the model's); out: (D, D)
    (rows: the model's). Biases: zeros."""
    weights = {"q_proj": q, "k_proj": k, "v_proj": v}
    state = {f"{prefix}{name}.weight": w.detach()[:, order] for name, w in weights.items()}
    state[f"{prefix}out_proj.weight"] = out.detach()[order]
    for name in (*weights, "out_proj"):
        state[f"{prefix}{name}.bias"] = torch.zeros(out.shape[0])
    return state


def layer_norm(prefix: str, norm: nn.LayerNorm, order: Tensor) -> dict[str, Tensor]:
    return {
        f"{prefix}weight": norm.weight.detach()[order],
        f"{prefix}bias": norm.bias.detach()[order],
    }


def feed_forward(prefix: str, layer: EncoderLayer | DecoderLayer, order: Tensor) -> dict:
    inner, outer = layer.ffn.inner, layer.ffn.outer
    return {
        f"{prefix}fc1.weight": inner.weight.detach()[:, order],  # (F, D)
        f"{prefix}fc1.bias": inner.bias.detach(),
        f"{prefix}fc2.weight": outer.weight.detach()[order],  # (D, F)
        f"{prefix}fc2.bias": outer.bias.detach()[order],
        **layer_norm(f"{prefix}final_layer_norm.", layer.ffn_block.norm, order),
    }


# ---- tokenizer and model card --------------------------------------------------------------
def save_tokenizer(tokenizers: Tokenizers, folder: Path, max_positions: int, transformers) -> None:
    """MarianTokenizer's files in `folder`: the SentencePiece model(s) and every piece's id.

    model_max_length: with truncation=True a source keeps max_positions - 1 pieces and </s>, as
    our Translator truncates."""
    shutil.copyfile(tokenizers.src.path, folder / SOURCE_SPM)
    shutil.copyfile(tokenizers.tgt.path, folder / TARGET_SPM)
    write_vocabulary(tokenizers.src, folder / SOURCE_VOCAB)
    separate = {}
    if not tokenizers.shared:
        write_vocabulary(tokenizers.tgt, folder / TARGET_VOCAB)
        separate = {"separate_vocabs": True, "target_vocab_file": str(folder / TARGET_VOCAB)}
    tokenizer = transformers.MarianTokenizer(
        str(folder / SOURCE_SPM),
        str(folder / TARGET_SPM),
        str(folder / SOURCE_VOCAB),
        pad_token=SPECIAL_PIECES[PAD_ID],
        unk_token=SPECIAL_PIECES[UNK_ID],
        bos_token=SPECIAL_PIECES[BOS_ID],  # the decoder's start: skipped by skip_special_tokens
        eos_token=SPECIAL_PIECES[EOS_ID],
        model_max_length=max_positions,
        clean_up_tokenization_spaces=False,  # the text as SentencePiece decodes it, as ours
        **separate,
    )
    tokenizer.save_pretrained(folder)


def write_vocabulary(tokenizer: Tokenizer, path: Path) -> None:
    pieces = {piece: index for index, piece in enumerate(vocabulary(tokenizer))}
    path.write_text(json.dumps(pieces, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


def model_card(
    card: ModelCard,
    model: Transformer,
    tokenizers: Tokenizers,
    folder: Path,
) -> str:
    """The folder's README.md: data, training, test score, how to load it, what differs."""
    src, tgt = card.data["src_lang"], card.data["tgt_lang"]
    cfg = model.cfg
    training_time = (
        f"{duration(card.train_seconds)} of training"
        if card.train_seconds is not None
        else "training time not recorded in the checkpoint"
    )
    vocabularies = (
        f"one shared SentencePiece vocabulary of {tokenizers.tgt.vocab_size} pieces"
        if tokenizers.shared
        else f"SentencePiece vocabularies of {tokenizers.src.vocab_size} ({src}) and "
        f"{tokenizers.tgt.vocab_size} ({tgt}) pieces"
    )
    return "\n".join(
        [
            "---",
            f"language: [{src}, {tgt}]",
            "library_name: transformers",
            "pipeline_tag: translation",
            "tags: [translation, marian, transformer_mt]",
            "---",
            f"# {src}-{tgt} Transformer (transformer_mt, as a MarianMTModel)",
            "",
            f"A Transformer ({cfg.name}: d_model {cfg.d_model}, {cfg.n_heads} heads, d_ff "
            f"{cfg.d_ff}, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, post-LN) trained "
            f"with transformer_mt and exported by `tmt-export format=transformers`; "
            f"{vocabularies}.",
            "",
            "## Training data",
            "",
            f"{card.corpus}. The run's data settings (config.yaml):",
            "",
            "```yaml",
            OmegaConf.to_yaml(card.data).rstrip(),
            "```",
            "",
            "## Training",
            "",
            f"{card.step} updates, {training_time}; checkpoint `{card.checkpoint}`.",
            "",
            "## Evaluation",
            "",
            evaluation(card),
            "",
            "## How to use it",
            "",
            "With transformers alone (once the folder is moved or uploaded, its new path or Hub "
            "id):",
            "",
            "```python",
            *usage(folder),
            "```",
            "",
            *differences(card.data["unicode_form"]),
        ]
    )


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.1f} minutes" if seconds >= 60 else f"{seconds:.0f} seconds"


def usage(folder: Path) -> list[str]:
    """Five lines of Python that translate with the folder."""
    return [
        "from transformers import MarianMTModel, MarianTokenizer",
        f'tokenizer = MarianTokenizer.from_pretrained("{folder}")',
        f'model = MarianMTModel.from_pretrained("{folder}")',
        'batch = tokenizer(["The dog sees the cat."], return_tensors="pt", padding=True, '
        "truncation=True)",
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
    ]


def evaluation(card: ModelCard) -> str:
    """The test score tmt-eval recorded, with its sacreBLEU signature, or that there is none."""
    scores = card.test_scores
    if scores is None:
        return (
            "Not evaluated: the run folder had no scores.test.json when this was exported "
            "(`make eval RUN=...`, then export again)."
        )
    scored = (scores.get("checkpoint") or {}).get("step")
    which = "" if scored in (None, card.step) else f" (scored at update {scored}, not this one)"
    decode = scores.get("decode") or {}
    return (
        f"Test BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} on {scores['sentences']} "
        f"sentences{which}, by tmt-eval with transformer_mt's own search "
        f"(decode.strategy={decode.get('strategy')}, beam_size={decode.get('beam_size')}, "
        f"length_penalty={decode.get('length_penalty')}: GNMT's)."
        f"\n\nsacreBLEU signature: `{scores['bleu_signature']}`"
    )


def differences(unicode_form: str | None) -> list[str]:
    form = unicode_form or "none"
    return [
        "## Differences from transformer_mt's own translation",
        "",
        "- Length penalty: transformers divides a beam hypothesis's log-probability by "
        "length ** alpha; transformer_mt by GNMT's ((5 + length) / 6) ** alpha (the same alpha, "
        "length_penalty in generation_config.json). Beam outputs can differ on a few sentences; "
        "greedy outputs (num_beams=1) are the same.",
        "- Length limit: one max_length (the model's max_positions, also the length of Marian's "
        "position table: truncate longer sources, as the tokenizer's truncation=True does) "
        "instead of transformer_mt's per-sentence max_len_a * source length + max_len_b (which "
        "has positions for sources of any length).",
        f"- Unicode: transformer_mt normalises inputs ({form}) before SentencePiece; "
        "MarianTokenizer does not, so give it text in that form.",
        "",
    ]
