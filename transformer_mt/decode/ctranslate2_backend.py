"""CTranslate2 (the optional `export` extra: ctranslate2>=4) as a search backend: a Translator
over a model folder that tmt-export wrote (transformer_mt/export/ctranslate2.py writes it;
decode/loading.py opens it).

Tokens: the SentencePiece pieces in id order, <pad> renamed <blank>, so CTranslate2's <blank>
<unk> <s> </s> are our ids 0-3; sources end with </s> (the model's `add_source_eos`), outputs
start from <s>.
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import torch

from transformer_mt.config import CpuLinear, DecodeConfig, Precision, Strategy
from transformer_mt.data.tokenizer import EOS_ID, Tokenizer, Tokenizers, vocabulary
from transformer_mt.decode.search import Hypothesis, length_penalty
from transformer_mt.errors import ConfigError, TransformerMTError

CTRANSLATE2_SPECIALS = ["<blank>", "<unk>", "<s>", "</s>"]
"""CTranslate2's padding, unknown, start and end tokens, at our ids PAD, UNK, BOS, EOS (0-3)."""
RANKING_PENALTY = 1e-6
"""The length penalty CTranslate2's beam search is given; ours (GNMT) is applied afterwards. Not
0, which would change its stopping rule; this small, it ranks finished hypotheses by
log-probability where it keeps the best beam_size of more (when several finish in its last
step), closer to fairseq's rule (the first beam_size to finish) than its length ** alpha, which
favours long ones."""
CUBLAS12 = "libcublas.so.12"
"""The cuBLAS CTranslate2's CUDA build opens by name: CUDA 12's, which the `export-cuda` extra
installs (nvidia-cublas-cu12) and a CUDA 13 torch does not bring."""
MISSING_LIBRARY = re.compile(r"Library (\S+) is not found or cannot be loaded")
"""CTranslate2's message for a CUDA library it cannot open."""


def import_ctranslate2():
    """The ctranslate2 module, or an error saying in one line how to install it. Loads the CUDA
    12 cuBLAS of the export-cuda extra first, where it is installed (`load_cublas12`)."""
    try:
        import ctranslate2
    except ImportError:
        raise TransformerMTError(
            'ctranslate2 is not installed: pip install -e ".[export]" (or pip install '
            '"ctranslate2>=4") in this environment'
        ) from None
    load_cublas12(sys.path)
    return ctranslate2


def load_cublas12(folders: list[str]) -> Path | None:
    """Load the nvidia-cublas-cu12 wheel's libcublas.so.12 from the first of `folders` (site
    folders: sys.path) that has it, and return its path; None where none has it or it does not
    load. CTranslate2 opens the library by name when it first runs on a GPU: the dynamic loader
    then finds the one already loaded, but never the wheel's folder, which is on no search path
    (nor does torch load it: a CUDA 13 torch loads its own CUDA 13 libraries)."""
    for folder in folders:
        library = Path(folder or ".") / "nvidia" / "cublas" / "lib" / CUBLAS12
        if library.is_file():
            try:
                ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            except OSError:  # a first translation on the GPU says what is missing
                return None
            return library
    return None


def missing_library_error(error: RuntimeError, device: str) -> ConfigError | None:
    """The one-line ConfigError for CTranslate2's "Library X is not found or cannot be loaded",
    naming the library and the fix; None for any other error."""
    found = MISSING_LIBRARY.search(str(error))
    if found is None:
        return None
    library = found.group(1)
    fix = (
        'pip install -e ".[export-cuda]" (nvidia-cublas-cu12, CUDA 12\'s cuBLAS) in this '
        "environment"
        if library.startswith("libcublas")
        else "install the CUDA 12 package that brings it"
    )
    return ConfigError(
        f"CTranslate2 cannot translate on {device}: its CUDA build needs {library}, which it "
        f"cannot load (a CUDA 13 torch brings CUDA 13's libraries only): {fix}, or device=cpu "
        "runs it on the CPU"
    )


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
    precisions = (Precision.auto,)  # it computes in the compute_type it was loaded with
    quantize = CpuLinear.none  # int8: tmt-export quantization=int8, or compute_type int8

    def __init__(self, engine, tokenizers: Tokenizers, *, max_positions: int):
        """engine: a ctranslate2.Translator; max_positions: the exported model's (source pieces
        + EOS, and output pieces + EOS, fit in it)."""
        self.engine = engine
        self.max_source_tokens = max_positions - 1
        self.src_pieces = ctranslate2_vocabulary(tokenizers.src)
        self.tgt_ids = {piece: i for i, piece in enumerate(ctranslate2_vocabulary(tokenizers.tgt))}

    def reseed(self, seed: int) -> None:
        """Nothing to do: CTranslate2 models do not sample here (`strategies`)."""

    def search(
        self,
        sources: list[list[int]],
        decode: DecodeConfig,
        policy: object = None,
        prefixes: list[list[int]] | None = None,
        terms: list[list[list[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """N-best lists for one batch; `policy`, our model's execution policy, is not
        CTranslate2's (its kernels and compute_type are its own). Target prefixes and terms are
        refused: CTranslate2 scores prefixes otherwise than ours (a prefixed output scores as
        the same output found unprefixed) and has no constrained search."""
        for what, given in (("target prefixes", prefixes), ("target terms (a glossary)", terms)):
            if given is not None and any(given):
                raise ConfigError(
                    f"{what} need a transformer_mt checkpoint, not a CTranslate2 model"
                )
        beam = decode.strategy == Strategy.beam
        lengths = torch.tensor([len(s) for s in sources])
        # Output limits in pieces, EOS included, computed as search.max_lengths computes them.
        limits = (
            (decode.max_len_a * lengths + decode.max_len_b).long().clamp(max=self.max_source_tokens)
        )
        try:
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
        except RuntimeError as error:  # its CUDA build opens CUDA's libraries at the first call
            missing = missing_library_error(error, self.engine.device)
            if missing is None:
                raise
            raise missing from error
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
