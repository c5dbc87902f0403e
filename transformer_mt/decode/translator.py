"""Text in, text out: tokenizer + model + search, batched by length, input order restored."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from transformer_mt.config import (
    DecodeConfig,
    ModelConfig,
    Strategy,
    run_data_config,
    validate_decode,
)
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.clean import normalise, single_line
from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    Tokenizers,
    load_tokenizers,
)
from transformer_mt.decode.sampling import sample_search
from transformer_mt.decode.search import Hypothesis, beam_search, greedy_search, length_penalty
from transformer_mt.device import resolve_device
from transformer_mt.errors import CheckpointError, ConfigError, DataError, TransformerMTError
from transformer_mt.model import Transformer
from transformer_mt.train.checkpoint import load_checkpoint, resolve_checkpoint

log = logging.getLogger(__name__)


def model_from_checkpoint(state: dict, path: Path, tokenizers: Tokenizers) -> Transformer:
    """The checkpoint's model, checked against the run folder's tokenizers."""
    try:
        model_cfg = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(ModelConfig), state["model_config"])
        )
    except Exception as error:
        raise CheckpointError(f"{path}: model configuration is not valid ({error})") from None
    src_vocab_size = state.get("src_vocab_size")
    recorded = (
        f"{'shared' if src_vocab_size is None else 'separate'}, {state['vocab_size']} target pieces"
    )
    mode = "shared" if tokenizers.shared else "separate"
    beside = f"{mode}, {tokenizers.tgt.vocab_size} target pieces"
    if recorded != beside:
        raise CheckpointError(
            f"{path}: the checkpoint's vocabulary ({recorded}) does not match the "
            f"tokenizer files in its run folder ({beside})"
        )
    model = Transformer(
        model_cfg, vocab_size=int(state["vocab_size"]), src_vocab_size=src_vocab_size, pad_id=PAD_ID
    )
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise CheckpointError(
            f"{path}: weights do not fit the recorded model configuration ({error})"
        ) from None
    return model


@dataclass(frozen=True)
class Translation:
    """One entry of an n-best list."""

    text: str
    score: float  # the search's score: beam, length-penalised log-probability; else log-probability


class Translator:
    """Translate lists of sentences with a trained model."""

    def __init__(
        self,
        model: Transformer,
        tokenizers: Tokenizers,
        decode: DecodeConfig,
        device: torch.device,
        *,
        unicode_form: str | None = "NFC",
    ):
        """unicode_form: the normalisation the training data had (data.unicode_form)."""
        validate_decode(decode)
        self.model = model.to(device).eval()
        self.tokenizers, self.decode, self.device = tokenizers, decode, device
        self.unicode_form = unicode_form
        self.max_source_tokens = model.positions.shape[0] - 1  # room for EOS
        # Sampling draws from the translator's own generator: the same calls give the same output.
        self.generator = torch.Generator(device=device).manual_seed(decode.seed)

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        checkpoint: str = "last.pt",
        *,
        decode: DecodeConfig | None = None,
        device: str = "auto",
    ) -> Translator:
        """Everything comes from the run folder: tokenizers, model configuration and weights.
        A `checkpoint` that names a folder written by tmt-export gives a CTranslate2Translator."""
        run_dir = Path(run_dir)
        path = resolve_checkpoint(run_dir, checkpoint)
        if path.is_dir():
            return CTranslate2Translator.from_export(path, decode=decode, device=device)
        state = load_checkpoint(path)
        tokenizers = load_tokenizers(run_dir)
        model = model_from_checkpoint(state, path, tokenizers)
        unicode_form = run_data_config(run_dir).unicode_form
        return cls(
            model,
            tokenizers,
            decode or DecodeConfig(),
            resolve_device(device),
            unicode_form=unicode_form,
        )

    def translate(self, sentences: list[str]) -> list[str]:
        """One translation per input sentence, in input order; an empty line gives an empty line.
        Each translation is one line (a line break the model spelled in byte pieces is a space)."""
        return [
            single_line(t)
            for t in self.tokenizers.tgt.decode(self.translate_ids(self.encode(sentences)))
        ]

    def translate_nbest(self, sentences: list[str]) -> list[list[Translation]]:
        """Up to decode.nbest translations per input sentence, best first, in input order; an
        empty line gives one empty translation with score 0."""
        nbest = self.nbest_ids(self.encode(sentences))
        texts = map(
            single_line, self.tokenizers.tgt.decode([h.tokens for hyps in nbest for h in hyps])
        )
        return [[Translation(next(texts), h.score) for h in hyps] for hyps in nbest]

    def encode(self, sentences: list[str]) -> list[list[int]]:
        return self.tokenizers.src.encode(
            [normalise(s.strip(), self.unicode_form) for s in sentences]
        )

    def translate_ids(self, ids: list[list[int]]) -> list[list[int]]:
        """Target piece ids for each source's piece ids (no EOS), in input order."""
        return [hyps[0].tokens for hyps in self.nbest_ids(ids)]

    def nbest_ids(self, ids: list[list[int]]) -> list[list[Hypothesis]]:
        """Up to decode.nbest hypotheses per source's piece ids, best first, in input order."""
        outputs = [[Hypothesis([], 0.0)] for _ in ids]
        for batch in self.batches(ids):
            for index, hyps in zip(batch, self.search([ids[i] for i in batch]), strict=True):
                outputs[index] = hyps[: self.decode.nbest]
        return outputs

    def batches(self, ids: list[list[int]]) -> list[list[int]]:
        """Indices of non-empty inputs, sorted by length, grouped under decode.batch_tokens."""
        order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: len(ids[i]))
        batches, current, longest = [], [], 0
        for index in order:
            width = min(len(ids[index]), self.max_source_tokens) + 1
            if current and max(longest, width) * (len(current) + 1) > self.decode.batch_tokens:
                batches.append(current)
                current, longest = [], 0
            current.append(index)
            longest = max(longest, width)
        if current:
            batches.append(current)
        return batches

    def truncate(self, sources: list[list[int]]) -> list[list[int]]:
        """Sources cut to the model's limit (room left for EOS), with a warning if any was."""
        too_long = [s for s in sources if len(s) > self.max_source_tokens]
        if too_long:
            log.warning(
                "%d input(s) longer than %d pieces truncated", len(too_long), self.max_source_tokens
            )
        return [s[: self.max_source_tokens] for s in sources]

    def search(self, sources: list[list[int]]) -> list[list[Hypothesis]]:
        """N-best lists (best first) for one batch of sources, truncated to the model's limit."""
        src = pad_sequences(
            [np.asarray(s, dtype=np.int64) for s in self.truncate(sources)],
            PAD_ID,
            suffix=EOS_ID,
        ).to(self.device)
        cfg = self.decode
        common = {
            "max_len_a": cfg.max_len_a,
            "max_len_b": cfg.max_len_b,
            "min_len": cfg.min_len,
            "bos_id": BOS_ID,
            "eos_id": EOS_ID,
            "unk_id": UNK_ID,  # with byte fallback every character has pieces: never ' ⁇ '
        }
        if cfg.strategy == Strategy.greedy:
            return [[h] for h in greedy_search(self.model, src, **common)]
        if cfg.strategy == Strategy.sample:
            hyps = sample_search(
                self.model,
                src,
                generator=self.generator,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                **common,
            )
            return [[h] for h in hyps]
        return beam_search(
            self.model,
            src,
            beam_size=cfg.beam_size,
            alpha=cfg.length_penalty,
            stop_early=cfg.stop_early,
            **common,
        )


EXPORT_INFO = "transformer_mt.json"
"""Written by tmt-export beside CTranslate2's files: what translating needs besides the model."""
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


def ctranslate2_vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's pieces in id order, SentencePiece's <pad> renamed to CTranslate2's <blank>,
    so that each piece's position in the list is its id."""
    pieces = [tokenizer.processor.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    if pieces[:4] != ["<pad>", *CTRANSLATE2_SPECIALS[1:]]:
        raise DataError(f"{tokenizer.path}: pieces 0-3 are {pieces[:4]}, not <pad> <unk> <s> </s>")
    return [CTRANSLATE2_SPECIALS[0], *pieces[1:]]


class CTranslate2Translator(Translator):
    """Translator's API over a model written by tmt-export, run by CTranslate2 (no torch model:
    Translator.__init__ is not called).

    Text is prepared and batched as Translator does (same normalisation, tokenizer, truncation,
    batches); only `search` differs. Greedy search gives our outputs. CTranslate2's beam search
    stops a sentence once beam_size hypotheses have finished (fairseq's rule), where ours goes on
    while a live hypothesis could still beat a finished one (search.py): its outputs can be
    shorter. Its n-best list is re-ranked here with our GNMT penalty (see RANKING_PENALTY). Other
    differences: CTranslate2 has one length limit per call (the batch's longest; each output is
    then cut to its own), keeps its beams as they are at the limit where we force EOS, and
    renormalises the softmax without the banned PAD, UNK and BOS where we do not.
    """

    def __init__(
        self,
        engine,
        tokenizers: Tokenizers,
        decode: DecodeConfig,
        *,
        max_positions: int,
        unicode_form: str | None = "NFC",
    ):
        """engine: a ctranslate2.Translator; max_positions: the exported model's (source pieces
        + EOS, and output pieces + EOS, fit in it)."""
        validate_decode(decode)
        if decode.strategy == Strategy.sample:
            raise ConfigError(
                "config key 'decode.strategy': sample is not available with a CTranslate2 model "
                "(greedy or beam)"
            )
        self.engine, self.tokenizers, self.decode = engine, tokenizers, decode
        self.unicode_form = unicode_form
        self.max_source_tokens = max_positions - 1
        self.src_pieces = ctranslate2_vocabulary(tokenizers.src)
        self.tgt_ids = {piece: i for i, piece in enumerate(ctranslate2_vocabulary(tokenizers.tgt))}

    @classmethod
    def from_export(
        cls,
        folder: str | Path,
        *,
        decode: DecodeConfig | None = None,
        device: str = "auto",
        compute_type: str = "default",
        threads: int = 0,
    ) -> CTranslate2Translator:
        """folder: written by tmt-export. compute_type: CTranslate2's (default: the type the
        weights were stored in; int8, float32, ...). threads: CPU threads (0: as many as torch
        uses)."""
        ctranslate2 = import_ctranslate2()
        folder = Path(folder)
        if not (folder / EXPORT_INFO).is_file():
            raise CheckpointError(
                f"{folder}: not a folder written by tmt-export (no {EXPORT_INFO})"
            )
        info = json.loads((folder / EXPORT_INFO).read_text(encoding="utf-8"))
        target = resolve_device(device)
        engine = ctranslate2.Translator(
            str(folder),
            device=target.type,
            device_index=target.index or 0,
            compute_type=compute_type,
            intra_threads=threads or torch.get_num_threads(),
        )
        return cls(
            engine,
            load_tokenizers(folder),
            decode or DecodeConfig(),
            max_positions=int(info["max_positions"]),
            unicode_form=info["unicode_form"],
        )

    def search(self, sources: list[list[int]]) -> list[list[Hypothesis]]:
        """N-best lists (best first) for one batch of sources, from CTranslate2."""
        sources = self.truncate(sources)
        cfg, beam = self.decode, self.decode.strategy == Strategy.beam
        lengths = torch.tensor([len(s) for s in sources])
        # Output limits in pieces, EOS included, computed as search.max_lengths computes them.
        limits = (cfg.max_len_a * lengths + cfg.max_len_b).long().clamp(max=self.max_source_tokens)
        results = self.engine.translate_batch(
            [[self.src_pieces[i] for i in s] for s in sources],
            beam_size=cfg.beam_size if beam else 1,
            num_hypotheses=cfg.beam_size if beam else 1,  # every finished one, to re-rank
            length_penalty=RANKING_PENALTY if beam else 0.0,
            return_scores=True,
            return_end_token=True,  # lengths count EOS, as ours do
            max_input_length=0,  # truncated above
            max_decoding_length=int(limits.max()),
            min_decoding_length=cfg.min_len,
            suppress_sequences=[[piece] for piece in CTRANSLATE2_SPECIALS[:3]],  # PAD UNK BOS
        )
        return [
            self.hypotheses(result, limit, RANKING_PENALTY if beam else 0.0)
            for result, limit in zip(results, limits.tolist(), strict=True)
        ]

    def hypotheses(self, result, limit: int, penalty: float) -> list[Hypothesis]:
        """One CTranslate2 result as our n-best list: EOS dropped, at most limit - 1 pieces,
        scores GNMT-normalised (greedy: the sum of log-probabilities), best first. penalty: the
        length penalty CTranslate2 applied."""
        alpha = self.decode.length_penalty if penalty else 0.0
        hyps = []
        for pieces, score in zip(result.hypotheses, result.scores, strict=True):
            ids = [self.tgt_ids[piece] for piece in pieces]  # EOS included, as in our lengths
            log_prob = score * len(ids) ** penalty  # CTranslate2 divided it by length ** penalty
            score = log_prob / length_penalty(len(ids), alpha)
            if ids and ids[-1] == EOS_ID:
                ids.pop()
            hyps.append(Hypothesis(ids[: limit - 1], score))
        return sorted(hyps, key=lambda h: h.score, reverse=True)
