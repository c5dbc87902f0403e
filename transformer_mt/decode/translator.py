"""Text in, text out: tokenizer + a search backend, batched by length, input order restored.

The Translator prepares text the same way whatever runs the search: normalisation, tokenizer,
batches under decode.batch_tokens; our model takes sources of any length, an export's backend
may have a limit (CTranslate2's: its position table), to which sources are cut with a warning.
The decode settings are an argument of each call (the Translator keeps defaults for calls that
pass none), so one Translator serves requests with any settings, but decode.quantize, which is
chosen when the model is loaded. Each call's settings are checked and its execution policy built
once (`prepared`: execution.ExecutionPolicy.for_decoding), which batches the call's sentences and
runs each batch's search. The backend turns one batch of source piece ids into n-best lists:
`ModelSearch` runs our model with decode/search.py and decode/sampling.py as the policy says
(decode.precision, sdpa_backends, cpu_linear, quantize), on the CPU with the policy's copies of it
(ExecutionPolicy.with_kernels: oneDNN's prepacked float32 weights; int8);
`ctranslate2_backend.CTranslate2Search` runs a model written by tmt-export.
decode/loading.py builds a Translator from a run folder or an export.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from transformer_mt import execution
from transformer_mt.config import (
    DECODE_PRECISIONS,
    CpuLinear,
    DecodeConfig,
    Precision,
    Strategy,
    config_dict,
)
from transformer_mt.data.batching import pack, pad_sequences
from transformer_mt.data.clean import normalise, single_line
from transformer_mt.data.tags import TargetLanguages
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizers
from transformer_mt.decode.alignment import AttentionMap, word_alignment
from transformer_mt.decode.constraints import Terms, beyond_search, word_end_pieces
from transformer_mt.decode.glossary import Glossary
from transformer_mt.decode.sampling import sample_search
from transformer_mt.decode.search import (
    NO_TOKEN,
    WORD_NEXT,
    Ensemble,
    Hypothesis,
    as_ensemble,
    beam_search,
    fixed_shape_beam_search,
    greedy_search,
    teacher_forced_log_probs,
    word_start_pieces,
)
from transformer_mt.errors import ConfigError
from transformer_mt.execution import ExecutionPolicy, decode_batch_tokens
from transformer_mt.model import Transformer

log = logging.getLogger(__name__)


class SearchBackend(Protocol):
    """What runs the search for a Translator. Two attributes may be left out (`backend_offers`):
    precisions, the decode.precision values it offers (without it: auto only), and quantize,
    the decode.quantize it was built with, the same for every call (without it: none)."""

    name: str
    strategies: tuple[Strategy, ...]  # the decode strategies it offers
    max_source_tokens: int | None  # longest source it takes, in pieces (EOS not counted); None: any

    def search(
        self,
        sources: list[list[int]],
        decode: DecodeConfig,
        policy: ExecutionPolicy,
        prefixes: list[list[int]] | None = None,
        terms: list[list[list[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """N-best lists (best first, EOS dropped) for one batch of sources that fit, searched as
        the call's execution policy says (a backend with kernels of its own may pass it over);
        prefixes: the target pieces each output must begin with ([]: none; search.WORD_NEXT
        last: the next piece begins a word, search.word_start_pieces); terms: each
        source's target terms (pieces), which its outputs must contain (a source whose terms
        no hypothesis meets: searched without them, Hypothesis.unmet_terms). ConfigError from a
        backend that cannot."""
        ...

    def reseed(self, seed: int) -> None:
        """Sample from `seed` afresh (tmt-serve does it before each sampling request); a backend
        without Strategy.sample has nothing to reseed."""
        ...


def backend_offers(backend: SearchBackend) -> tuple[tuple[Precision, ...], CpuLinear]:
    """The backend's decode.precision values and the decode.quantize it was built with, with
    SearchBackend's defaults for a backend that leaves them out."""
    return (
        getattr(backend, "precisions", (Precision.auto,)),
        getattr(backend, "quantize", CpuLinear.none),
    )


def backend_device(backend: SearchBackend) -> torch.device:
    """The torch device a backend searches on (ours: its `device`); the CPU for the others."""
    device = getattr(backend, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


def default_batch_tokens(backend: SearchBackend) -> int:
    """decode.batch_tokens=null for this backend: the default of the device it runs on
    (execution.decode_batch_tokens, `backend_device`)."""
    return decode_batch_tokens(backend_device(backend))


@runtime_checkable
class AttentionReader(Protocol):
    """A backend that can also say where the model looked (translate_nbest's `attention`)."""

    decoder_layers: int

    def cross_attention(
        self, sources: list[list[int]], targets: list[list[int]], layer: int
    ) -> list[list[list[float]]]:
        """Per pair: decoder layer `layer`'s cross-attention, averaged over heads, of the model
        reading `target` for `source` (both without EOS): (len(target) + 1) rows of
        (len(source) + 1) weights, EOS last on both sides."""
        ...


@runtime_checkable
class TargetScorer(Protocol):
    """A backend that can also score given translations (decode/scoring.py)."""

    def target_log_probs(
        self, sources: list[list[int]], targets: list[list[int]], policy: ExecutionPolicy
    ) -> list[list[float]]:
        """Per pair: the log-probability of each of the target's pieces and then of EOS, given
        the source (both without EOS)."""
        ...


class ModelSearch:
    """Our model, or an Ensemble of ours, with our searches: beam, greedy, and sampling from its
    own generator (the same calls give the same output; the global RNG is not touched).
    Attention of an ensemble: the members' cross-attention maps averaged (as fairseq's
    EnsembleModel averages them), each member's `layer` counted in its own decoder.
    Each call searches with the members as its execution policy multiplies
    (ExecutionPolicy.with_kernels): quantize=int8 or int8_batch, int8 copies made here, when the
    model is loaded, for every call; else a float32 call on the CPU with decode.cpu_linear=onednn
    with copies whose weights are prepacked for oneDNN, made by the first such call."""

    name = "transformer_mt"
    strategies = (Strategy.beam, Strategy.greedy, Strategy.sample)
    precisions = DECODE_PRECISIONS

    def __init__(
        self,
        model: Transformer | Ensemble,
        device: torch.device,
        *,
        sampling_seed: int = 1,
        quantize: CpuLinear = CpuLinear.none,
        target_pieces: list[str] | None = None,
    ):
        """target_pieces: the target vocabulary's pieces, in id order: a target term then ends
        a word (constraints.word_end_pieces), and a prefix's WORD_NEXT is a piece that begins
        one (search.word_start_pieces); None: terms of ids alone, ending anywhere, and any piece
        after a prefix."""
        int8 = ExecutionPolicy.for_decoding(DecodeConfig(quantize=quantize), device)  # or refused
        members = as_ensemble(model).models
        for member in members:
            member.to(device).eval()
        self.ensemble, self.quantize = Ensemble(members), quantize
        if quantize != CpuLinear.none:  # chosen when the model is loaded: the policy's copies now
            describe_int8(quantize)
            self.ensemble = self.with_kernels(int8)
        self.copies: dict[CpuLinear, Ensemble] = {}  # by the policy's products: made once
        self.model, self.device = self.ensemble.models[0], device  # model: the first member
        self.max_source_tokens = None  # the model's positions grow to any length
        self.decoder_layers = min(len(member.decoder) for member in self.ensemble.models)
        self.generator = torch.Generator(device=device).manual_seed(sampling_seed)
        self.word_ends = self.word_starts = None
        if target_pieces is not None:
            size = self.model.embed.num_embeddings
            self.word_ends = word_end_pieces(target_pieces, EOS_ID, size).to(device)
            self.word_starts = word_start_pieces(target_pieces, EOS_ID, size).to(device)

    def reseed(self, seed: int) -> None:
        """Sample from `seed` afresh. The server does this before each sampling request, so
        that the request's own seed decides its output, whatever was sampled before it."""
        self.generator.manual_seed(seed)

    def search(
        self,
        sources: list[list[int]],
        decode: DecodeConfig,
        policy: ExecutionPolicy | None = None,
        prefixes: list[list[int]] | None = None,
        terms: list[list[list[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """N-best lists for one batch, searched as `policy` says (None: the call's own,
        ExecutionPolicy.for_decoding), each output beginning with its prefix's pieces and
        containing its terms (SearchBackend.search)."""
        if policy is None:
            policy = ExecutionPolicy.for_decoding(decode, self.device)
        src = pad_sequences(
            [np.asarray(s, dtype=np.int64) for s in sources], PAD_ID, suffix=EOS_ID
        ).to(self.device)
        prefix = None
        if prefixes is not None and any(prefixes):
            rows = [np.asarray(p, dtype=np.int64) for p in prefixes]
            prefix = pad_sequences(rows, NO_TOKEN).to(self.device)  # (B, P)
        common = {
            "max_len_a": decode.max_len_a,
            "max_len_b": decode.max_len_b,
            "min_len": decode.min_len,
            "bos_id": BOS_ID,
            "eos_id": EOS_ID,
            "unk_id": UNK_ID,  # with byte fallback every character has pieces: never ' ⁇ '
            # sources of one length (decode.source_lengths=equal): attention masks nothing
            "src_padded": len({len(s) for s in sources}) > 1,
            "prefix": prefix,
            "word_starts": self.word_starts,
        }
        wanted, beyond = None, []
        if terms is not None:
            beyond = [
                i
                for i, (source, sentence_terms) in enumerate(zip(sources, terms, strict=True))
                if sentence_terms
                and beyond_search(
                    sentence_terms, len(source) + 1, decode.max_len_a, decode.max_len_b
                )
            ]
            terms = [[] if i in beyond else t for i, t in enumerate(terms)]
            if any(terms):
                wanted = Terms.of_ids(terms, self.device, self.word_ends)
        with policy.forward():
            members = self.members(policy)
            fixed = policy.fixed_shape_decoding
            found = self.strategy_search(members, src, decode, common, fixed, wanted)
            unmet = [i for i, hyps in enumerate(found) if not hyps and terms and terms[i]]
            if unmet:  # translated without their terms, and marked
                rows = torch.tensor(unmet, device=self.device)
                alone = {**common, "src_padded": True}
                if prefix is not None:
                    alone["prefix"] = prefix.index_select(0, rows)
                again = self.strategy_search(
                    members, src.index_select(0, rows), decode, alone, fixed
                )
                for index, hyps in zip(unmet, again, strict=True):
                    found[index] = hyps
        for index in [*beyond, *unmet]:
            found[index] = [dataclasses.replace(h, unmet_terms=True) for h in found[index]]
        return found

    def members(self, policy: ExecutionPolicy) -> Ensemble:
        """The members that run a call under `policy`: the loaded ones (int8 copies when loaded
        with decode.quantize, whatever the call) where the policy multiplies by torch's
        products, else copies with its kernels (oneDNN's prepacked weights), made by the first
        call that asks for them."""
        if self.quantize != CpuLinear.none or policy.cpu_products == CpuLinear.torch:
            return self.ensemble
        if policy.cpu_products not in self.copies:
            self.copies[policy.cpu_products] = self.with_kernels(policy)
        return self.copies[policy.cpu_products]

    def with_kernels(self, policy: ExecutionPolicy) -> Ensemble:
        """Each member as `policy` runs it (ExecutionPolicy.with_kernels)."""
        return Ensemble([policy.with_kernels(member) for member in self.ensemble.models])

    def strategy_search(
        self,
        ensemble: Ensemble,
        src: Tensor,
        decode: DecodeConfig,
        common: dict,
        fixed_shape: bool = False,
        terms: Terms | None = None,
    ) -> list[list[Hypothesis]]:
        """decode.strategy's search of src (B, S) by `ensemble`, with the settings all of them
        take; beam search in a batch of fixed shape where the execution policy says so
        (`fixed_shape`: search.fixed_shape_beam_search), with target `terms` (beam only)."""
        if decode.strategy == Strategy.greedy:
            return [[h] for h in greedy_search(ensemble, src, **common)]
        if decode.strategy == Strategy.sample:
            hyps = sample_search(
                ensemble,
                src,
                generator=self.generator,
                temperature=decode.temperature,
                top_k=decode.top_k,
                top_p=decode.top_p,
                **common,
            )
            return [[h] for h in hyps]
        beam = {
            "beam_size": decode.beam_size,
            "alpha": decode.length_penalty,
            "stop_early": decode.stop_early,
            "nbest": decode.nbest,  # the hypotheses kept: the rule need not wait for the rest
            "terms": terms,
            **common,
        }
        if fixed_shape:
            return fixed_shape_beam_search(ensemble, src, check_every=decode.check_every, **beam)
        return beam_search(ensemble, src, **beam)

    def target_log_probs(
        self, sources: list[list[int]], targets: list[list[int]], policy: ExecutionPolicy
    ) -> list[list[float]]:
        """Per pair: the log-probability of each of the target's pieces and then of EOS, given
        the source (both without EOS), as the searches compute them under `policy` (the same
        members, kernels and precision: search.teacher_forced_log_probs)."""
        src, tgt = (
            pad_sequences([np.asarray(s, dtype=np.int64) for s in rows], PAD_ID, suffix=EOS_ID)
            for rows in (sources, targets)
        )
        with policy.forward():
            picked = teacher_forced_log_probs(
                self.members(policy),
                src.to(self.device),
                tgt.to(self.device),
                bos_id=BOS_ID,
                src_padded=len({len(s) for s in sources}) > 1,
            )
        rows = picked.float().cpu().tolist()
        return [row[: len(t) + 1] for row, t in zip(rows, targets, strict=True)]

    def cross_attention(
        self, sources: list[list[int]], targets: list[list[int]], layer: int
    ) -> list[list[list[float]]]:
        """Per pair: decoder layer `layer`'s cross-attention, averaged over heads, of the model
        reading `target` for `source` (both without EOS): (len(target) + 1) rows of
        (len(source) + 1) weights, EOS last on both sides."""
        layers = self.decoder_layers
        if not -layers <= layer < layers:
            raise ConfigError(f"attention layer {layer}: the decoder has {layers} layers")
        src = pad_sequences([np.asarray(s, dtype=np.int64) for s in sources], PAD_ID, suffix=EOS_ID)
        tgt_in = pad_sequences([np.asarray([BOS_ID, *t], dtype=np.int64) for t in targets], PAD_ID)
        src, tgt_in = src.to(self.device), tgt_in.to(self.device)
        members = self.ensemble.models
        weights = sum(member.cross_attention(src, tgt_in, layer) for member in members)
        weights = weights / len(members)  # (B, T, S): the members' mean (one: its own)
        return [
            weights[i, : len(t) + 1, : len(s) + 1].float().cpu().tolist()
            for i, (s, t) in enumerate(zip(sources, targets, strict=True))
        ]


def describe_int8(quantize: CpuLinear) -> None:
    """The log line of a search in int8: int8_batch warns that batch mates change outputs."""
    if quantize == CpuLinear.int8:
        log.info("decode.quantize=int8: the model's linear layers searching with int8 weights")
        return
    log.warning(
        "decode.quantize=int8_batch: int8 weights, and each batch's inputs quantized with one "
        "scale, so a sentence's translation depends on the sentences translated with it (in a "
        "file, or a server's batch); decode.quantize=int8 scales each row alone"
    )


@functools.cache  # once a process: validation builds a Translator at every validation
def describe_precision(precision: Precision, device: torch.device) -> None:
    """The log line of a search in bf16 on the CPU, which warns, as describe_int8 does for
    int8_batch, that batch mates change outputs: precision=auto searches in fp32 there for that
    reason (execution.autocast_dtype)."""
    if precision != Precision.bf16 or device.type != "cpu":
        return
    speed = "faster than fp32" if execution.cpu_multiplies_bf16() else "emulated, slower than fp32"
    log.warning(
        "decode.precision=bf16: the search computes in bf16 (on this CPU %s), so a sentence's "
        "translation depends on the sentences translated with it (in a file, or a server's "
        "batch); decode.precision=auto (fp32 on the CPU) does not",
        speed,
    )


@dataclass(frozen=True)
class Translation:
    """One entry of an n-best list."""

    text: str
    score: float  # the search's score: beam, length-penalised log-probability; else log-probability
    attention: AttentionMap | None = None  # the best of a list, when translate_nbest is asked
    alignment: list[tuple[int, int]] | None = None  # likewise: (source word, target word) pairs
    unmet_terms: bool = False  # its target terms could not all be met: translated without them


class Translator:
    """Translate lists of sentences, with each call's decode settings or the defaults."""

    def __init__(
        self,
        backend: SearchBackend,
        tokenizers: Tokenizers,
        decode: DecodeConfig,
        *,
        unicode_form: str | None = "NFC",
        origin: dict | None = None,
        languages: TargetLanguages | None = None,
    ):
        """decode: the settings of calls that give none; unicode_form: the normalisation the
        training data had (data.unicode_form); origin: which checkpoint (or export) translates,
        as decode/loading.py found it; languages: what it translates into (each call's
        decode.tgt_lang picks one where there are several; None: one, unnamed)."""
        self.backend, self.tokenizers = backend, tokenizers
        self.unicode_form, self.origin = unicode_form, origin
        self.languages = languages
        self.max_source_tokens = backend.max_source_tokens
        self.glossaries: dict[str, Glossary] = {}  # by path, read by the first call naming one
        self.decode = self.checked(decode)

    @classmethod
    def for_model(
        cls,
        model: Transformer | Ensemble,
        tokenizers: Tokenizers,
        decode: DecodeConfig,
        device: torch.device,
        *,
        unicode_form: str | None = "NFC",
        origin: dict | None = None,
        languages: TargetLanguages | None = None,
    ) -> Translator:
        """A Translator that searches with `model` (or an Ensemble) on `device` (sampling from
        decode.seed; int8 copies of it with decode.quantize=int8)."""
        backend = ModelSearch(
            model,
            device,
            sampling_seed=decode.seed,
            quantize=decode.quantize,
            target_pieces=tokenizers.tgt.pieces(range(tokenizers.tgt.vocab_size)),
        )
        describe_precision(decode.precision, device)
        return cls(
            backend,
            tokenizers,
            decode,
            unicode_form=unicode_form,
            origin=origin,
            languages=languages,
        )

    def checked(self, decode: DecodeConfig | None) -> DecodeConfig:
        """`decode` (None: the defaults) with decode.batch_tokens=null made the device's default
        (`default_batch_tokens`), or ConfigError naming the setting that is not possible (with
        this backend, on its device)."""
        return self.prepared(decode)[0]

    def prepared(self, decode: DecodeConfig | None) -> tuple[DecodeConfig, ExecutionPolicy]:
        """A call's settings (`checked`) and its execution policy on the backend's device, built
        once for the call: it batches the sentences and runs each batch's search."""
        decode = self.decode if decode is None else self.offered(decode)
        return decode, ExecutionPolicy.for_decoding(decode, backend_device(self.backend))

    def settings_record(self, decode: DecodeConfig | None = None) -> dict:
        """A call's settings (`checked`; None: the defaults) as plain values, as the search runs
        them, for the records of what ran (scores.SPLIT.json, the server's answers and /health):
        decode.precision is what our model computes in, with the setting that chose it ("fp32
        (auto)", "bf16"); a backend that computes in its own type (it offers auto only:
        CTranslate2's compute_type) keeps the setting."""
        decode, policy = self.prepared(decode)
        record = config_dict(decode)
        if backend_offers(self.backend)[0] != (Precision.auto,):
            chosen = decode.precision
            record["precision"] = (
                f"{policy.precision} (auto)" if chosen == Precision.auto else policy.precision
            )
        return record

    def offered(self, decode: DecodeConfig) -> DecodeConfig:
        """`checked` but for the device: what this backend offers."""
        decode.validate()
        precisions, quantize = backend_offers(self.backend)
        for key, offered in (("strategy", self.backend.strategies), ("precision", precisions)):
            if getattr(decode, key) not in offered:
                raise ConfigError(
                    f"config key 'decode.{key}': {getattr(decode, key).value} is not available "
                    f"with a {self.backend.name} model ({' or '.join(o.value for o in offered)})"
                )
        if decode.quantize != quantize:
            raise ConfigError(
                f"config key 'decode.quantize': {decode.quantize.value} is chosen when the model "
                f"is loaded; this {self.backend.name} model was loaded with {quantize.value}"
            )
        if decode.batch_tokens is None:
            decode = dataclasses.replace(decode, batch_tokens=default_batch_tokens(self.backend))
        return decode

    def translate(self, sentences: list[str], *, decode: DecodeConfig | None = None) -> list[str]:
        """One translation per input sentence, in input order; an empty line gives an empty line.
        Each translation is one line (a line break the model spelled in byte pieces is a space)."""
        terms = self.line_terms(sentences, decode)  # decode.glossary's
        ids = self.translate_ids(self.encode(sentences, decode), decode, terms)
        return [single_line(t) for t in self.tokenizers.tgt.decode(ids)]

    def translate_nbest(
        self,
        sentences: list[str],
        *,
        decode: DecodeConfig | None = None,
        attention: int | None = None,
        alignment: int | None = None,
        prefixes: list[str] | None = None,
        terms: list[list[str]] | None = None,
    ) -> list[list[Translation]]:
        """Up to decode.nbest translations per input sentence, best first, in input order; an
        empty line gives one empty translation with score 0. attention: a decoder layer (-1:
        the last) whose cross-attention behind each best translation it carries (None for an
        empty line); None: no attention. alignment: likewise, a layer whose cross-attention
        gives each best translation's word alignment (decode/alignment.py; `alignment_layer`
        chooses it). prefixes: per sentence, a text its translations begin with ("": none;
        `encode_prefixes`: one that ends in a space ends its word), the search going on from
        it; a score is
        the whole output's, as if the search had found it unprefixed. terms: per sentence,
        target terms its translations must contain, with decode.glossary's (`line_terms`)."""
        encoded = self.encode(sentences, decode)
        return self.translate_encoded(
            encoded,
            decode=decode,
            attention=attention,
            alignment=alignment,
            prefixes=None if prefixes is None else self.encode_prefixes(prefixes),
            terms=self.line_terms(sentences, decode, terms),
        )

    def line_terms(
        self,
        sentences: list[str],
        decode: DecodeConfig | None = None,
        terms: list[list[str]] | None = None,
        glossary: Glossary | None = None,
    ) -> list[list[list[int]]] | None:
        """Each sentence's target terms, encoded: `terms`' and those of the pairs of `glossary`
        (else decode.glossary's) whose source term occurs in it (decode/glossary.py), each
        once; None where there are none at all. (A line with more of them than the search
        takes is translated without them and marked: constraints.beyond_search.)"""
        decode = self.decode if decode is None else decode
        if glossary is None and decode.glossary is not None:
            glossary = self.glossary(decode.glossary)
        if glossary is None and terms is None:
            return None
        if terms is not None and len(terms) != len(sentences):
            raise ValueError(f"{len(terms)} lists of terms for {len(sentences)} sentences")
        wanted = []
        for number, sentence in enumerate(sentences):
            given = [] if terms is None else [t.strip() for t in terms[number] if t.strip()]
            matched = [] if glossary is None else glossary.terms(sentence, self.unicode_form)
            line = list(dict.fromkeys([*given, *matched]))  # each once, in order
            encoded = self.encode_targets(line) if line else []
            wanted.append([t for t in encoded if t])
        return wanted if any(wanted) else None

    def glossary(self, path: str) -> Glossary:
        """The glossary file `path`, read once (decode/glossary.py)."""
        if path not in self.glossaries:
            self.glossaries[path] = Glossary.read(path, self.unicode_form)
        return self.glossaries[path]

    def translate_encoded(
        self,
        ids: list[list[int]],
        *,
        decode: DecodeConfig | None = None,
        attention: int | None = None,
        alignment: int | None = None,
        prefixes: list[list[int]] | None = None,
        terms: list[list[list[int]]] | None = None,
    ) -> list[list[Translation]]:
        """translate_nbest for sentences (and prefixes, and terms) already encoded by `encode`
        (and `encode_prefixes`, `line_terms`): the server encodes each request once, to bound it
        when it arrives, then to translate it."""
        named = {"attention_layer": attention, "alignment_layer": alignment}
        layers = {key: layer for key, layer in named.items() if layer is not None}
        reader = self.attention_reader() if layers else None  # before the search
        for key, layer in layers.items():
            self.checked_layer(layer, reader, key)
        decode, policy = self.prepared(decode)
        nbest = self.searched(ids, decode, policy, prefixes, terms)
        translations = self.nbest_texts(nbest)
        if reader is None:
            return translations
        maps: list[AttentionMap | None] = [None] * len(ids)
        if attention is not None:
            maps = self.attention_maps(reader, ids, nbest, attention, decode, policy)
        aligned: list[list[tuple[int, int]] | None] = [None] * len(ids)
        if alignment is not None:
            read = attention is not None and (alignment - attention) % reader.decoder_layers == 0
            if not read:
                alignment_maps = self.attention_maps(reader, ids, nbest, alignment, decode, policy)
            tags = len(self.language_prefix(decode))
            aligned = [
                None if attended is None else word_alignment(attended, tags)
                for attended in (maps if read else alignment_maps)
            ]
        return [
            [dataclasses.replace(best, attention=attended, alignment=pairs), *rest]
            for (best, *rest), attended, pairs in zip(translations, maps, aligned, strict=True)
        ]

    def alignment_layer(self, layer: int | None) -> int:
        """The decoder layer whose attention aligns words: `layer`, or for None the last one
        (decode/alignment.py says why); ConfigError naming alignment_layer for one the decoder
        does not have, or a model that cannot read attention."""
        reader = self.attention_reader()
        chosen = reader.decoder_layers - 1 if layer is None else layer
        return self.checked_layer(chosen, reader, "alignment_layer") % reader.decoder_layers

    def alignments(
        self,
        sources: list[str],
        targets: list[str],
        layer: int | None = None,
        decode: DecodeConfig | None = None,
    ) -> list[list[tuple[int, int]] | None]:
        """The word alignment of each given translation (decode/alignment.word_alignment of
        decoder layer `layer`, `alignment_layer`'s choice for None), read teacher-forced over
        the target as `encode_targets` encodes it; None for an empty source."""
        if len(targets) != len(sources):
            raise ValueError(f"{len(targets)} translations for {len(sources)} sources")
        reader = self.attention_reader()
        chosen = self.alignment_layer(layer)
        decode, policy = self.prepared(decode)
        given = [[Hypothesis(ids, 0.0)] for ids in self.encode_targets(targets)]
        ids = self.encode(sources, decode)
        maps = self.attention_maps(reader, ids, given, chosen, decode, policy)
        tags = len(self.language_prefix(decode))
        return [None if found is None else word_alignment(found, tags) for found in maps]

    @staticmethod
    def checked_layer(layer: int, reader: AttentionReader, key: str = "attention_layer") -> int:
        layers = reader.decoder_layers
        if not -layers <= layer < layers:
            raise ConfigError(
                f"config key '{key}': layer {layer}, but the decoder has {layers} layers (0 to "
                f"{layers - 1}, or from the last: -1 to -{layers})"
            )
        return layer

    def nbest_texts(self, nbest: list[list[Hypothesis]]) -> list[list[Translation]]:
        texts = map(
            single_line, self.tokenizers.tgt.decode([h.tokens for hyps in nbest for h in hyps])
        )
        return [
            [Translation(next(texts), h.score, unmet_terms=h.unmet_terms) for h in hyps]
            for hyps in nbest
        ]

    def attention_reader(self) -> AttentionReader:
        """The backend, which must be able to read attention (ConfigError otherwise)."""
        if not isinstance(self.backend, AttentionReader):
            raise ConfigError(
                f"attention needs a transformer_mt checkpoint, not a {self.backend.name} model"
            )
        return self.backend

    def attention_maps(
        self,
        reader: AttentionReader,
        ids: list[list[int]],
        nbest: list[list[Hypothesis]],
        layer: int,
        decode: DecodeConfig,
        policy: ExecutionPolicy,
    ) -> list[AttentionMap | None]:
        """The cross-attention of decoder layer `layer` behind each best hypothesis, read again
        teacher-forced (None for an empty line)."""
        sources = self.cut(ids)  # as the search read them
        targets = [hyps[0].tokens for hyps in nbest]
        maps: list[AttentionMap | None] = [None] * len(ids)
        for batch in self.batches(sources, decode, policy):
            weights = reader.cross_attention(
                [sources[i] for i in batch], [targets[i] for i in batch], layer
            )
            for index, matrix in zip(batch, weights, strict=True):
                maps[index] = AttentionMap(
                    source_pieces=[*self.tokenizers.src.pieces(sources[index]), "</s>"],
                    target_pieces=[*self.tokenizers.tgt.pieces(targets[index]), "</s>"],
                    weights=matrix,
                    layer=layer % reader.decoder_layers,
                )
        return maps

    def encode(self, sentences: list[str], decode: DecodeConfig | None = None) -> list[list[int]]:
        """Each sentence's source ids as the model reads them: normalised and encoded, after the
        tag of the language asked for (decode.tgt_lang: `language_prefix`); an empty line stays
        empty (it is not translated)."""
        prefix = self.language_prefix(decode)
        ids = self.tokenizers.src.encode(
            [normalise(s.strip(), self.unicode_form) for s in sentences]
        )
        return [prefix + piece_ids if piece_ids else piece_ids for piece_ids in ids]

    def encode_prefixes(self, texts: list[str]) -> list[list[int]]:
        """Target prefixes as the search takes them: as `encode_targets` encodes them, and
        where one ends in a space (after its text), search.WORD_NEXT: the next piece begins a
        word, so the prefix's last word is not continued."""
        return [
            ids + [WORD_NEXT] if ids and text[-1:].isspace() else ids
            for text, ids in zip(texts, self.encode_targets(texts), strict=True)
        ]

    def encode_targets(self, texts: list[str]) -> list[list[int]]:
        """Target-side texts (given translations, prefixes) as the model writes them: normalised
        as the training data was (data.unicode_form) and encoded by the target tokenizer, no
        EOS."""
        return self.tokenizers.tgt.encode([normalise(t.strip(), self.unicode_form) for t in texts])

    @property
    def target_languages(self) -> list[str]:
        """The languages it translates into (decode.tgt_lang's choices where there are several;
        [] where the model does not say: an export without its run's settings)."""
        return [] if self.languages is None else self.languages.names

    def language_prefix(self, decode: DecodeConfig | None = None) -> list[int]:
        """The ids before every source of a call with `decode` (None: the defaults): the tag of
        decode.tgt_lang for a model trained into several languages; ConfigError for a language
        it was not trained into (TargetLanguages.prefix)."""
        language = (self.decode if decode is None else decode).tgt_lang
        if self.languages is None:
            return []
        return self.languages.prefix(language)

    def translate_ids(
        self,
        ids: list[list[int]],
        decode: DecodeConfig | None = None,
        terms: list[list[list[int]]] | None = None,
    ) -> list[list[int]]:
        """Target piece ids for each source's piece ids (no EOS), in input order (with each
        source's target terms: `line_terms`)."""
        return [hyps[0].tokens for hyps in self.nbest_ids(ids, decode, terms)]

    def nbest_ids(
        self,
        ids: list[list[int]],
        decode: DecodeConfig | None = None,
        terms: list[list[list[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """Up to decode.nbest hypotheses per source's piece ids, best first, in input order."""
        return self.searched(ids, *self.prepared(decode), None, terms)

    def searched(
        self,
        ids: list[list[int]],
        decode: DecodeConfig,
        policy: ExecutionPolicy,
        prefixes: list[list[int]] | None = None,
        terms: list[list[list[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """`nbest_ids` for checked settings and their policy (and each source's target prefix
        and terms; an empty source is not translated, whatever they are)."""
        for name, given in (("prefixes", prefixes), ("terms", terms)):
            if given is not None and len(given) != len(ids):
                raise ValueError(f"{len(given)} {name} for {len(ids)} sources")
        if terms is not None and any(terms) and decode.terms_refusal() is not None:
            raise ConfigError(f"config key 'decode.strategy': {decode.terms_refusal()}")
        outputs = [[Hypothesis([], 0.0)] for _ in ids]
        for batch in self.batches(ids, decode, policy):
            batch_prefixes = None if prefixes is None else [prefixes[i] for i in batch]
            batch_terms = None if terms is None else [terms[i] for i in batch]
            found = self.search(
                [ids[i] for i in batch], decode, policy, batch_prefixes, batch_terms
            )
            for index, hyps in zip(batch, found, strict=True):
                outputs[index] = hyps[: decode.nbest]
        return outputs

    def batches(
        self,
        ids: list[list[int]],
        decode: DecodeConfig | None = None,
        policy: ExecutionPolicy | None = None,
    ) -> list[list[int]]:
        """Indices of non-empty inputs, sorted by length, grouped under decode.batch_tokens
        (None: the defaults') as training groups them (data/batching.pack): of similar lengths,
        or, where the call's execution policy asks for it (decode.source_lengths), of one
        length wherever that length fills half a batch. `policy`: the call's, with `decode`
        checked (None: both made here, `prepared`)."""
        if policy is None:
            decode, policy = self.prepared(decode)
        order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: len(ids[i]))
        widths = np.array([len(s) + 1 for s in self.cut([ids[i] for i in order])], np.int64)
        lengths = widths if policy.equal_source_lengths else None
        batches = pack(np.array(order, np.int64), widths, decode.batch_tokens, lengths)
        return [batch.tolist() for batch in batches]

    def cut(self, sources: list[list[int]]) -> list[list[int]]:
        """Sources as the backend reads them: whole, or cut to its limit (room left for EOS)."""
        limit = self.max_source_tokens
        return sources if limit is None else [s[:limit] for s in sources]

    def truncate(self, sources: list[list[int]]) -> list[list[int]]:
        """`cut`, with a warning if a source was: only a backend with a limit cuts (an export's
        position table; our model takes any length)."""
        limit = self.max_source_tokens
        too_long = 0 if limit is None else sum(len(s) > limit for s in sources)
        if too_long:
            log.warning(
                "%d input(s) longer than %d pieces truncated: the limit of this %s model (its "
                "position table); a transformer_mt checkpoint translates any length",
                too_long,
                limit,
                self.backend.name,
            )
        return self.cut(sources)

    def search(
        self,
        sources: list[list[int]],
        decode: DecodeConfig,
        policy: ExecutionPolicy,
        prefixes: list[list[int]] | None = None,
        terms: list[list[list[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """N-best lists (best first) for one batch of sources, cut to the backend's limit (a
        backend is passed prefixes and terms only where some source has them)."""
        extra = {}
        if prefixes is not None and any(prefixes):
            extra["prefixes"] = prefixes
        if terms is not None and any(terms):
            extra["terms"] = terms
        return self.backend.search(self.truncate(sources), decode, policy, **extra)
