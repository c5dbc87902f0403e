"""CTranslate2 (the optional `export` extra: ctranslate2>=4): our model as a CTranslate2 model
folder, and the search backend that translates with one.

The weights are placed in ctranslate2's model specification (`ctranslate2.specs.TransformerSpec`),
as CTranslate2's own converters for fairseq and OpenNMT-py fill it, then validated, optionally
quantized and saved by CTranslate2. How our model maps onto it:

- post-LN (the paper's) or pre-LN blocks: the spec's `pre_norm`; pre-LN stacks end with the final
  LayerNorms, post-LN stacks have none;
- sinusoidal positions: passed as our table (sin at even, cos at odd dimensions), since
  CTranslate2's built-in one is [sin | cos];
- embeddings scaled by sqrt(d_model): the spec's `scale_embeddings`; one shared matrix for the
  encoder, decoder and output projection (CTranslate2 stores it once, as aliases);
- fused projections: our Q|K|V rows are the self-attention's fused linear, our K|V rows the
  cross-attention's; no attention biases (the spec's biases are optional);
- tokens: the SentencePiece pieces in id order, <pad> renamed <blank>, so CTranslate2's
  <blank> <unk> <s> </s> are our ids 0-3; sources end with </s> (`add_source_eos`), outputs
  start from <s>.

The folder also holds the SentencePiece model(s) and transformer_mt.json (normalisation, length
limit, provenance), so that `Translator.from_run(run_dir, "ctranslate2")` and
`tmt-translate checkpoint=ctranslate2` translate with it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from transformer_mt.config import DecodeConfig, Strategy
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer, Tokenizers, load_tokenizers
from transformer_mt.decode.search import Hypothesis, length_penalty
from transformer_mt.decode.translator import Translator
from transformer_mt.device import resolve_device
from transformer_mt.errors import CheckpointError, ConfigError, DataError, TransformerMTError
from transformer_mt.files import replacing_folder
from transformer_mt.model import DecoderLayer, EncoderLayer, Transformer

log = logging.getLogger(__name__)
FORMAT = "transformer_mt-ctranslate2/1"
EXPORT_INFO = "transformer_mt.json"
"""Written by tmt-export into every folder it writes (beside CTranslate2's files: what translating
needs besides the model): the mark of a folder that a new export may replace."""
EXPORTED = "a model folder written by tmt-export"
SPECIAL_PIECES = ["<pad>", "<unk>", "<s>", "</s>"]
"""SentencePiece's spelling of our PAD, UNK, BOS, EOS (ids 0-3)."""
CTRANSLATE2_SPECIALS = ["<blank>", "<unk>", "<s>", "</s>"]
"""CTranslate2's padding, unknown, start and end tokens, at our ids PAD, UNK, BOS, EOS (0-3)."""
RANKING_PENALTY = 1e-6
"""The length penalty CTranslate2's beam search is given; ours (GNMT) is applied afterwards. Not
0, which would change its stopping rule; this small, it ranks finished hypotheses by
log-probability where it keeps the best beam_size of more (when several finish in its last
step), closer to fairseq's rule (the first beam_size to finish) than its length ** alpha, which
favours long ones."""


def import_ctranslate2():
    """The ctranslate2 module, or an error saying in one line how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise TransformerMTError(
            'ctranslate2 is not installed: pip install -e ".[export]" (or pip install '
            '"ctranslate2>=4") in this environment'
        ) from None
    return ctranslate2


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's pieces in id order (each piece's position in the list is its id), checked
    to start with SPECIAL_PIECES."""
    pieces = [tokenizer.processor.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    if pieces[:4] != SPECIAL_PIECES:
        raise DataError(
            f"{tokenizer.path}: pieces 0-3 are {pieces[:4]}, not {' '.join(SPECIAL_PIECES)}"
        )
    return pieces


def ctranslate2_vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's pieces in id order, SentencePiece's <pad> renamed to CTranslate2's
    <blank>."""
    return [CTRANSLATE2_SPECIALS[0], *vocabulary(tokenizer)[1:]]


class CTranslate2Search:
    """The search backend of a Translator over a model written by tmt-export, run by CTranslate2.

    The Translator prepares and batches text as for our model (same normalisation, tokenizer,
    truncation, batches); only the search differs. Greedy search gives our outputs. CTranslate2's
    beam search stops a sentence once beam_size hypotheses have finished (fairseq's rule, our
    decode.stop_early), where ours by default goes on while a live hypothesis could still beat a
    finished one (search.py): its outputs can be shorter. Its n-best list is re-ranked here with
    our GNMT penalty (see RANKING_PENALTY). Other differences: CTranslate2 has one length limit
    per call (the batch's longest; each output is then cut to its own), keeps its beams as they
    are at the limit where we force EOS, and renormalises the softmax without the banned PAD, UNK
    and BOS where we do not.
    """

    name = "CTranslate2"
    strategies = (Strategy.beam, Strategy.greedy)

    def __init__(self, engine, tokenizers: Tokenizers, *, max_positions: int):
        """engine: a ctranslate2.Translator; max_positions: the exported model's (source pieces
        + EOS, and output pieces + EOS, fit in it)."""
        self.engine = engine
        self.max_source_tokens = max_positions - 1
        self.src_pieces = ctranslate2_vocabulary(tokenizers.src)
        self.tgt_ids = {piece: i for i, piece in enumerate(ctranslate2_vocabulary(tokenizers.tgt))}

    def search(self, sources: list[list[int]], decode: DecodeConfig) -> list[list[Hypothesis]]:
        beam = decode.strategy == Strategy.beam
        lengths = torch.tensor([len(s) for s in sources])
        # Output limits in pieces, EOS included, computed as search.max_lengths computes them.
        limits = (
            (decode.max_len_a * lengths + decode.max_len_b).long().clamp(max=self.max_source_tokens)
        )
        results = self.engine.translate_batch(
            [[self.src_pieces[i] for i in s] for s in sources],
            beam_size=decode.beam_size if beam else 1,
            num_hypotheses=decode.beam_size if beam else 1,  # every finished one, to re-rank
            length_penalty=RANKING_PENALTY if beam else 0.0,
            return_scores=True,
            return_end_token=True,  # lengths count EOS, as ours do
            max_input_length=0,  # the Translator truncated them
            max_decoding_length=int(limits.max()),
            min_decoding_length=decode.min_len,
            suppress_sequences=[[piece] for piece in CTRANSLATE2_SPECIALS[:3]],  # PAD UNK BOS
        )
        alpha = decode.length_penalty if beam else 0.0
        return [
            self.hypotheses(result, limit, RANKING_PENALTY if beam else 0.0, alpha)
            for result, limit in zip(results, limits.tolist(), strict=True)
        ]

    def hypotheses(self, result, limit: int, penalty: float, alpha: float) -> list[Hypothesis]:
        """One CTranslate2 result as our n-best list: EOS dropped, at most limit - 1 pieces,
        scores GNMT-normalised with `alpha` (greedy: 0, the sum of log-probabilities), best
        first. penalty: the length penalty CTranslate2 applied."""
        hyps = []
        for pieces, score in zip(result.hypotheses, result.scores, strict=True):
            ids = [self.tgt_ids[piece] for piece in pieces]  # EOS included, as in our lengths
            log_prob = score * len(ids) ** penalty  # CTranslate2 divided it by length ** penalty
            score = log_prob / length_penalty(len(ids), alpha)
            if ids and ids[-1] == EOS_ID:
                ids.pop()
            hyps.append(Hypothesis(ids[: limit - 1], score))
        return sorted(hyps, key=lambda h: h.score, reverse=True)


def translator_from_export(
    folder: str | Path,
    *,
    decode: DecodeConfig | None = None,
    device: str = "auto",
    compute_type: str = "default",
    threads: int = 0,
) -> Translator:
    """A Translator over the model folder tmt-export wrote. compute_type: CTranslate2's (default:
    the type the weights were stored in; int8, float32, ...). threads: CPU threads (0: as many as
    torch uses)."""
    ctranslate2 = import_ctranslate2()
    folder = Path(folder)
    if (folder / "generation_config.json").is_file():
        raise CheckpointError(
            f"{folder}: a transformers model (tmt-export format=transformers): load it with "
            "transformers' MarianMTModel (its README.md shows how); tmt-translate and "
            "tmt-eval run checkpoints and CTranslate2 exports"
        )
    if not (folder / EXPORT_INFO).is_file():
        raise CheckpointError(f"{folder}: not a folder written by tmt-export (no {EXPORT_INFO})")
    info = json.loads((folder / EXPORT_INFO).read_text(encoding="utf-8"))
    target = resolve_device(device)
    try:
        engine = ctranslate2.Translator(
            str(folder),
            device=target.type,
            device_index=target.index or 0,
            compute_type=compute_type,
            intra_threads=threads or torch.get_num_threads(),
        )
    except (RuntimeError, ValueError) as error:  # e.g. its CUDA build's libraries are missing
        raise ConfigError(
            f"{folder}: CTranslate2 {ctranslate2.__version__} cannot run it on {target} "
            f"({error}); device=cpu runs it on the CPU"
        ) from error
    tokenizers = load_tokenizers(folder)
    log.info("translating with the CTranslate2 model %s (update %s)", folder, info.get("step"))
    backend = CTranslate2Search(engine, tokenizers, max_positions=int(info["max_positions"]))
    return Translator(
        backend, tokenizers, decode or DecodeConfig(), unicode_form=info["unicode_form"]
    )


# ---- export: our model as a CTranslate2 TransformerSpec ------------------------------------
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
        "max_positions": model.positions.shape[0],
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


def check_exportable(model: Transformer, target: str) -> None:
    """TransformerMTError unless `model` is our Transformer itself: a subclass may compute
    something that `target` cannot express."""
    if type(model) is not Transformer:
        raise TransformerMTError(
            f"cannot export a {type(model).__name__}: only transformer_mt.model.Transformer "
            f"maps onto {target}"
        )


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
    positions = model.positions.cpu().numpy()  # (max_positions, D): sin at even, cos at odd dims
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
