"""Typed configuration for every stage, registered with Hydra's ConfigStore.

Each YAML preset in ``transformer_mt/configs/`` names its schema in its defaults list, so a
misspelled key or a value of the wrong type fails when the config is composed, before any work
starts. Each section (DataConfig, ModelConfig, OptimConfig, TrainerConfig, DecodeConfig) has a
``validate()`` that checks what types cannot (positive sizes, ``d_model % n_heads``) and names
the key at fault. Each command's job extends RunJob (run_dir) and the shared sections it needs
(SearchJob: device and decode; CheckpointSource: checkpoint too), and its ``validate()`` checks
its sections and its own keys: the command calls it before anything is loaded or written.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transformer_mt.errors import ConfigError
from transformer_mt.launch import world_size
from transformer_mt.sweeps import register_resolvers as register_sweep_resolvers


class SourceKind(str, Enum):
    toy = "toy"
    files = "files"
    hf = "hf"


class Strategy(str, Enum):
    beam = "beam"
    greedy = "greedy"
    sample = "sample"


class UnicodeForm(str, Enum):
    NFC = "NFC"
    NFKC = "NFKC"
    NFD = "NFD"
    NFKD = "NFKD"


class InvalidUtf8(str, Enum):
    error = "error"
    replace = "replace"


class Precision(str, Enum):
    """What the model computes in (trainer.precision, decode.precision): auto, the execution
    policy's choice for the device (execution.autocast_dtype); fp32; bf16 or fp16 autocast
    (fp16: training only, with its gradient scaler)."""

    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class SdpaBackend(str, Enum):
    """A kernel F.scaled_dot_product_attention may run (torch.nn.attention.SDPBackend); auto: the
    order transformer_mt/execution.py gives the device (on CUDA flash, efficient, math); default:
    torch's own choice among them (on H100/H200 cuDNN's first, since torch 2.9)."""

    auto = "auto"
    default = "default"
    flash = "flash"
    efficient = "efficient"
    cudnn = "cudnn"
    math = "math"


class SourceLengths(str, Enum):
    """Which sentences a batch holds (trainer.source_lengths, decode.source_lengths): `equal`,
    sentences of one source length wherever a length fills at least half a batch, so that no
    attention call needs a key-padding mask (on CUDA every call can then take the flash kernel,
    which takes no mask), the sentences a length leaves over packed with their neighbours',
    padded and masked; `similar`, sentences sorted by length and padded, their padding masked;
    `auto`, the execution policy's choice for the device (execution.py). The same budgets, about
    as many batches (data/batching.one_length_batches)."""

    auto = "auto"
    equal = "equal"
    similar = "similar"


class CpuLinear(str, Enum):
    """What multiplies the linear layers (and the output projection) on the CPU, the vocabulary
    of three keys: trainer.cpu_linear and decode.cpu_linear take onednn (oneDNN's kernel) or
    torch (F.linear); decode.quantize takes int8 or int8_batch (int8 weights) or none (no int8:
    the float products decode.cpu_linear takes). The execution policy decides which of torch,
    onednn, int8 and int8_batch runs on a device (execution.py; never none)."""

    onednn = "onednn"
    torch = "torch"
    int8 = "int8"  # int8 weights, each input row quantized from its own range (int8.py)
    int8_batch = "int8_batch"  # int8 weights, one scale for a call's input (torch.ao's)
    none = "none"  # decode.quantize's: no int8 weights


FLOAT_PRODUCTS = (CpuLinear.onednn, CpuLinear.torch)
"""trainer.cpu_linear's and decode.cpu_linear's values."""
INT8_PRODUCTS = (CpuLinear.int8, CpuLinear.int8_batch)
"""decode.quantize's values, with none."""


class Weights(str, Enum):
    """Which of a checkpoint's weights decode: the exponential moving average where the run kept
    one (trainer.ema_decay), else the weights as trained (auto); or either one (raw, ema)."""

    auto = "auto"
    raw = "raw"
    ema = "ema"


class ResumeMode(str, Enum):
    auto = "auto"
    never = "never"
    force = "force"


AUTO = "auto"
"""The value of decode.length_penalty (tmt-eval) and last (tmt-average) that asks for the
setting to be chosen on the run's valid split (commands/valid_choice.py)."""
SEED_RANGE = (-(2**63), 2**64 - 1)
"""The seeds torch's random generators take (Generator.manual_seed raises outside them)."""
MAX_LENGTH_PENALTY = 10.0
"""decode.length_penalty's bound either side of 0: ((5 + length) / 6) ** alpha stays finite for
any output length a search can reach (GNMT's alpha is 0.6 to 1)."""
MAX_BEAM_SIZE = 1024
"""decode.beam_size's bound: a sentence's search holds beam_size rows, each with its own cache,
and 100,000 of them filled 24 GB before the kernel ended the process."""
TEMPERATURE_RANGE = (1e-6, 1e6)
"""decode.temperature's bounds: the log-probabilities divided by it stay finite in float32."""
MIN_VOCAB_SIZE = 4 + 256
"""Pieces every vocabulary holds: PAD, UNK, BOS, EOS and the byte-fallback pieces."""


class ExportFormat(str, Enum):
    ctranslate2 = "ctranslate2"
    transformers = "transformers"


TAG_FORM = r"<[A-Za-z0-9_.:=+-]{1,64}>"
"""A tag's form (data.tag, data.corpora.NAME.tag): an ASCII word in angle brackets, <BT>, <2de>,
<news>. SentencePiece keeps it as a control piece of its own (never split, never produced from
text), and preparation records every string of this form that the text holds, so a tag that
occurs in the text is refused without reading the text again."""
CORPUS_NAME_FORM = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
"""A corpus's name (a key of data.corpora): it names the corpus's prepared folder and its lines in
the log and history.jsonl."""


@dataclass(kw_only=True)
class CorpusConfig:
    """A training corpus beside the main one (data.corpora.NAME). A key left null is the main
    corpus's (data.*): `+data.corpora.bt.dir=bt` reads bt/train.{src_lang,tgt_lang} as data
    reads its own; only the training split is read (valid and test stay the main corpus's)."""

    source: SourceKind | None = None
    """toy, files or hf (null: data.source)."""
    dir: str | None = None
    """files: the folder holding `{split}.{lang}` (null: data.dir)."""
    split: str | None = None
    """The training split's name: file prefix or HF split (null: data.train_split)."""
    src_lang: str | None = None
    """Source language code (null: data.src_lang)."""
    tgt_lang: str | None = None
    """Target language code (null: data.tgt_lang)."""
    hf_path: str | None = None
    """hf: as data.hf_path (null: data.hf_path)."""
    hf_config: str | None = None
    """hf: as data.hf_config (null: data.hf_config)."""
    hf_revision: str | None = None
    """hf: as data.hf_revision (null: data.hf_revision)."""
    hf_data_files: dict[str, str] | None = None
    """hf: as data.hf_data_files (null: data.hf_data_files)."""
    hf_src_column: str | None = None
    """hf: as data.hf_src_column (null: data.hf_src_column)."""
    hf_tgt_column: str | None = None
    """hf: as data.hf_tgt_column (null: data.hf_tgt_column)."""
    toy_seed: int | None = None
    """toy: seed of the generated corpus (null: data.toy_seed)."""
    toy_sizes: list[int] | None = None
    """toy: [train, valid, test] sizes of the generated corpus; only train is read (null:
    data.toy_sizes)."""
    weight: float = 1.0
    """How often each of its pairs is trained on per epoch (an upsampling factor): 2, every pair
    twice; 0.5, a different random half each epoch (docs/several-corpora.md)."""
    tag: str | None = None
    """A piece put before each of its sources (TAG_FORM: <BT> for back-translation, a domain's
    name), or null: none."""


CORPUS_KEYS = tuple(field_.name for field_ in dataclasses.fields(CorpusConfig))


@dataclass(kw_only=True)
class DataConfig:
    """Where the parallel text comes from and how it is tokenized."""

    name: str = "toy"
    """Short name used in the default run folder name."""
    source: SourceKind = SourceKind.toy
    """toy: the embedded generated corpus; files: local text files; hf: a Hugging Face dataset."""
    src_lang: str = "en"
    """Source language code (file suffix, key of the HF `translation` column)."""
    tgt_lang: str = "de"
    """Target language code."""
    dir: str | None = None
    """files: folder holding `{split}.{lang}` files, one sentence per line."""
    train_split: str = "train"
    """Name of the training split (file prefix or HF split)."""
    valid_split: str = "valid"
    """Name of the validation split."""
    test_split: str = "test"
    """Name of the test split scored by `make eval`."""
    hf_path: str = "wmt/wmt14"
    """hf: dataset id on the Hugging Face hub, a local folder written by `save_to_disk`, a local
    folder of parquet / JSON files named by split, or a builder (parquet, json) that reads
    hf_data_files."""
    hf_config: str | None = "de-en"
    """hf: dataset configuration (language pair), e.g. de-en or fr-en."""
    hf_revision: str | None = None
    """hf: a branch, tag or commit of the dataset's repository (null: the newest)."""
    hf_data_files: dict[str, str] | None = None
    """hf: files per split ({train: ..., validation: ...}: local paths or hf:// URLs), read by the
    builder that hf_path names (parquet, json, csv) instead of a repository's own layout."""
    hf_src_column: str | None = None
    """hf: the source text column of a dataset with one text column per language (null: a
    `translation` column of {lang: text}, else the column named data.src_lang)."""
    hf_tgt_column: str | None = None
    """hf: the target text column (see hf_src_column)."""
    carve_valid: int = 2000
    """hf: when the dataset has no split named valid_split, this many train pairs (drawn with
    data.seed, left out of training) become the valid split."""
    toy_seed: int = 1
    """toy: seed of the generated corpus."""
    toy_sizes: list[int] = field(default_factory=lambda: [30000, 500, 500])
    """toy: number of train, valid and test pairs."""
    vocab_size: int = 8000
    """Size of the shared SentencePiece vocabulary (of each one, with shared_vocab=false)."""
    character_coverage: float = 0.9999
    """Share of the SentencePiece sample's characters that get pieces of their own; the rarest
    rest, like any character never seen, is spelled in UTF-8 byte pieces. 0.9999 keeps a noisy
    web corpus's stray scripts from taking vocabulary; 1.0 gives every seen character a piece."""
    shared_vocab: bool = True
    """True: one SentencePiece model and one embedding for both sides (the paper's). False: one
    model per side (languages with different scripts); only the decoder's input and output
    embeddings are then tied."""
    seed: int = 1
    """Seed of the SentencePiece training sample (part of the prepared data's identity; the
    trainer has its own seed, so a seed sweep shares one prepared corpus)."""
    spm_model: str | None = None
    """An existing SentencePiece model to encode with instead of training one: a .model file
    (shared vocabulary), or a folder holding spm.model, or spm.src.model and spm.tgt.model (a
    run folder). vocab_size, character_coverage and spm_sample_sentences are then unused."""
    spm_sample_sentences: int = 1_000_000
    """SentencePiece is trained on at most this many randomly sampled sentences."""
    max_tokens_per_sentence: int = 250
    """Training pairs with more pieces than this on either side are dropped."""
    max_length_ratio: float = 3.0
    """Training pairs whose longer side has more than this many times the pieces of the shorter
    side are dropped (0 disables)."""
    unicode_form: UnicodeForm | None = UnicodeForm.NFC
    """The one Unicode normalisation of the text (NFC, NFKC, NFD, NFKD, or null: none), applied to
    every sentence before tokenization, in preparation and in translation; SentencePiece adds
    none of its own."""
    dedupe: bool = False
    """Drop exact duplicate training pairs."""
    invalid_utf8: InvalidUtf8 = InvalidUtf8.error
    """Local files: 'error' stops at the first undecodable line (naming file and line);
    'replace' substitutes U+FFFD and counts the lines."""
    prepared_dir: str = "prepared"
    """Cache of prepared corpora, one folder per hash of everything that produced it."""
    num_workers: int | None = None
    """Processes that encode and binarize (null: one per CPU core this process may use)."""
    weight: float = 1.0
    """The main corpus's training weight (as data.corpora.NAME.weight): how often each of its
    pairs is trained on per epoch."""
    tag: str | None = None
    """A piece put before each of the main corpus's training sources (as data.corpora.NAME.tag),
    or null: none."""
    src_subword_alpha: float = 0.0
    """Subword regularization of the training sources (docs/training.md): each epoch trains on
    one of data.subword_samples segmentations of each source sampled by SentencePiece with this
    alpha: of a BPE model, the probability that a merge is skipped (BPE-dropout; Provilkov et
    al. 2020 use 0.1). 0: the one best segmentation. Valid and test are never sampled."""
    tgt_subword_alpha: float = 0.0
    """As data.src_subword_alpha, of the training targets."""
    subword_samples: int = 4
    """Sampled segmentations of each training sentence, drawn once into a prepared folder of
    their own (where data.*_subword_alpha > 0); each epoch picks one for each pair from (trainer
    seed, epoch)."""
    corpora: dict[str, Any] = field(default_factory=dict)
    """Training corpora beside the main one, by name, each a CorpusConfig's keys
    (docs/several-corpora.md); {}: the main corpus alone. Typed when read (`corpus_settings`):
    OmegaConf cannot add an entry to a dict of dataclasses from the command line."""

    def validate(self) -> None:
        """ConfigError naming the data.* key of the first value that cannot be."""
        _require(
            self.vocab_size > MIN_VOCAB_SIZE,
            "data.vocab_size",
            f"must be > {MIN_VOCAB_SIZE} (4 special pieces and 256 byte pieces, then the corpus's "
            f"own), got {self.vocab_size}",
        )
        _require(
            0.0 < self.character_coverage <= 1.0,
            "data.character_coverage",
            f"must be in (0, 1], got {self.character_coverage}",
        )
        _require(self.carve_valid >= 0, "data.carve_valid", f"must be >= 0, got {self.carve_valid}")
        _require(
            (self.hf_src_column is None) == (self.hf_tgt_column is None),
            "data.hf_src_column",
            "name both text columns (data.hf_src_column and data.hf_tgt_column) or neither",
        )
        _require(
            self.max_length_ratio >= 0,
            "data.max_length_ratio",
            f"must be >= 0, got {self.max_length_ratio}",
        )
        _require(
            self.max_tokens_per_sentence >= 1,
            "data.max_tokens_per_sentence",
            f"must be >= 1, got {self.max_tokens_per_sentence}",
        )
        _require(
            self.spm_sample_sentences > 0,
            "data.spm_sample_sentences",
            f"must be positive, got {self.spm_sample_sentences}",
        )
        _require(
            self.num_workers is None or self.num_workers >= 1,
            "data.num_workers",
            f"must be >= 1 or null, got {self.num_workers}",
        )
        if self.source == SourceKind.files:
            _require(self.dir is not None, "data.dir", "is required when data.source=files")
        if self.source == SourceKind.toy:
            _require(
                len(self.toy_sizes) == 3 and min(self.toy_sizes) > 0,
                "data.toy_sizes",
                f"must be three positive sizes [train, valid, test], got {self.toy_sizes}",
            )
        for side in ("src", "tgt"):
            alpha = getattr(self, f"{side}_subword_alpha")
            _require(
                0.0 <= alpha < 1.0,
                f"data.{side}_subword_alpha",
                f"must be in [0, 1) (0: no sampling), got {alpha}",
            )
        sampled = self.src_subword_alpha > 0 or self.tgt_subword_alpha > 0
        _require(
            self.subword_samples >= (2 if sampled else 1),
            "data.subword_samples",
            f"must be >= 2 where a data.*_subword_alpha is above 0 (one sample is one fixed "
            f"segmentation: no regularization), got {self.subword_samples}",
        )
        validate_weight_and_tag(self.weight, self.tag, "data")
        for name in self.corpora:
            key = f"data.corpora.{name}"
            corpus = self.corpus_settings(name)
            _require(
                re.fullmatch(CORPUS_NAME_FORM, name) is not None and name != self.name,
                key,
                f"a corpus's name is a word of letters, digits, '_', '.' and '-' other than "
                f"data.name ({self.name!r}), got {name!r}",
            )
            validate_weight_and_tag(corpus.weight, corpus.tag, key)
            dataclasses.replace(self.corpus(name), corpora={}).validate()
        for language, tag in self.language_tags.items():
            _require(
                re.fullmatch(TAG_FORM, tag) is not None,
                "data.tgt_lang" if language == self.tgt_lang else "data.corpora",
                f"a target language's code makes its tag {tag}, which must be of the form "
                f"{TAG_FORM} (letters, digits, '_', '-', ...), got {language!r}",
            )

    def corpus_settings(self, name: str) -> CorpusConfig:
        """data.corpora.NAME as a CorpusConfig; ConfigError naming the key that is not one of
        its keys or has a value of the wrong type."""
        key = f"data.corpora.{name}"
        entry = self.corpora[name]
        if isinstance(entry, CorpusConfig):
            return entry
        if not isinstance(entry, dict):
            raise ConfigError(
                f"config key '{key}': must hold a corpus's keys ({', '.join(CORPUS_KEYS)}), "
                f"got {entry!r}"
            )
        try:
            merged = OmegaConf.merge(OmegaConf.structured(CorpusConfig), entry)
            return OmegaConf.to_object(merged)
        except OmegaConfBaseException as error:
            inner = getattr(error, "full_key", None) or "?"
            reason = str(error).splitlines()[0]
            raise ConfigError(f"config key '{key}.{inner}': {reason}") from None

    def corpus(self, name: str) -> DataConfig:
        """The data configuration that reads corpus `name` of data.corpora as its training
        split: its own keys where it sets them, the main corpus's (data.*) where null."""
        corpus = self.corpus_settings(name)
        own = {
            key: value
            for key, value in dataclasses.asdict(corpus).items()
            if value is not None and key not in ("split", "weight", "tag")
        }
        if corpus.split is not None:
            own["train_split"] = corpus.split
        # carve_valid=0: its whole training split is read, none of it carved out as a valid set
        return dataclasses.replace(
            self, **own, name=name, weight=corpus.weight, tag=corpus.tag, corpora={}, carve_valid=0
        )

    @property
    def target_languages(self) -> list[str]:
        """The corpora's target languages, each once, the main corpus's first."""
        found = [self.corpus(name).tgt_lang for name in self.corpora]
        return list(dict.fromkeys([self.tgt_lang, *found]))

    @property
    def language_tags(self) -> dict[str, str]:
        """Where the corpora have several target languages, each one's tag (<2de> for de), put
        first before every source of a corpus into that language; {} for one language."""
        languages = self.target_languages
        return {lang: f"<2{lang}>" for lang in languages} if len(languages) > 1 else {}

    @property
    def tags(self) -> list[str]:
        """Every tag, each once: the target languages' (where several), then each corpus's in
        the order of the corpora (the main one first)."""
        found = [self.tag, *(self.corpus_settings(name).tag for name in self.corpora)]
        tags = [*self.language_tags.values(), *(tag for tag in found if tag is not None)]
        return list(dict.fromkeys(tags))


@dataclass(kw_only=True)
class ModelConfig:
    """The encoder-decoder's shape (paper names)."""

    name: str = "base"
    """Preset name, used in the default run folder name."""
    d_model: int = 512
    """Width of every residual stream and embedding."""
    n_heads: int = 8
    """Attention heads; d_model must be divisible by it."""
    d_ff: int = 2048
    """Inner width of the position-wise feed-forward layers."""
    n_encoder_layers: int = 6
    """Encoder depth."""
    n_decoder_layers: int = 6
    """Decoder depth."""
    dropout: float = 0.1
    """Residual and embedding dropout (P_drop in the paper)."""
    attention_dropout: float = 0.0
    """Dropout on attention weights (the paper uses none)."""
    norm_first: bool = False
    """False: the paper's post-LayerNorm blocks; True: pre-LayerNorm."""
    max_positions: int = 1024
    """Longest sequence, in pieces, the sinusoidal table covers."""

    def validate(self) -> None:
        """ConfigError naming the model.* key of the first value that cannot be."""
        for name in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, name)
            _require(value > 0, f"model.{name}", f"must be positive, got {value}")
        _require(
            self.d_model % self.n_heads == 0,
            "model.d_model",
            f"{self.d_model} is not divisible by model.n_heads={self.n_heads}",
        )
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"model.{name}", f"must be in [0, 1), got {value}")


@dataclass(kw_only=True)
class OptimConfig:
    """Adam with the paper's inverse-square-root warm-up schedule."""

    lr_scale: float = 1.0
    """Multiplies the paper's learning rate d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    warmup_steps: int = 4000
    """Linear warm-up length in updates."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    """Adam beta1, beta2."""
    eps: float = 1e-9
    """Adam epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW); the paper uses none."""
    clip_norm: float = 0.0
    """Clip the gradient's global L2 norm to this value; 0 disables clipping."""
    label_smoothing: float = 0.1
    """epsilon_ls, spread uniformly over the whole vocabulary."""

    def validate(self) -> None:
        """ConfigError naming the optim.* key of the first value that cannot be."""
        _require(
            self.warmup_steps > 0,
            "optim.warmup_steps",
            f"must be positive, got {self.warmup_steps}",
        )
        _require(self.lr_scale > 0, "optim.lr_scale", f"must be positive, got {self.lr_scale}")
        _require(self.clip_norm >= 0, "optim.clip_norm", f"must be >= 0, got {self.clip_norm}")
        _require(
            0.0 <= self.label_smoothing < 1.0,
            "optim.label_smoothing",
            f"must be in [0, 1), got {self.label_smoothing}",
        )
        _require(len(self.betas) == 2, "optim.betas", f"must hold two values, got {self.betas}")


TRAINER_AT_LEAST_ONE = (
    "global_batch_tokens",
    "batch_tokens",
    "log_every",
    "max_nonfinite_updates",
    "agree_every",
)
"""TrainerConfig's keys whose value must be at least 1."""
TRAINER_AT_LEAST_ZERO = (
    "valid_every",
    "valid_bleu_sentences",
    "patience",
    "checkpoint_every",
    "checkpoint_every_minutes",
    "checkpoint_min_seconds",
    "keep_checkpoints",
    "loader_workers",
)
"""TrainerConfig's keys whose value must be at least 0 (0: off, or none)."""


@dataclass(kw_only=True)
class TrainerConfig:
    """The training loop: batch semantics, stopping, validation, checkpoints, logging."""

    global_batch_tokens: int = 25000
    """Tokens in one update, summed over all ranks and micro-batches: target tokens (the paper:
    about 25,000), or padded tokens with global_batch_padded. Gradient accumulation and the
    micro-batch size are derived from it."""
    batch_tokens: int = 25000
    """Most tokens one device processes at once (padded size of the longer side): a memory
    bound. With N ranks, micro-batches hold about global_batch_tokens / N / accumulation."""
    global_batch_padded: bool = False
    """True: global_batch_tokens counts padded tokens (micro-batch budgets), not target tokens."""
    max_steps: int = 100_000
    """Stop after this many updates (0: no limit)."""
    max_epochs: int = 0
    """Stop after this many passes over the training data (0: no limit)."""
    max_time_minutes: float = 0.0
    """Stop after this much training wall time (0: no limit)."""
    seed: int = 1
    """Seed of parameter init, dropout and batch order."""
    device: str = "auto"
    """auto (cuda when available, else cpu), cpu, cuda, cuda:N (torchrun: each rank's own GPU)."""
    precision: Precision = Precision.auto
    """auto (bf16 autocast on a GPU, fp32 on a CPU: execution.autocast_dtype says why), fp32,
    bf16, or fp16 (with a gradient scaler). A resume keeps what the run computed in, or reports
    the change (train/start.py)."""
    compile: str = "auto"
    """true: the model's repeated layers through torch.compile (regional compilation; padded
    lengths rounded up to a multiple of 8); false: eager; auto: off on every device until a
    measurement shows the compiled step faster there (execution.AUTO_COMPILE_OFF says why).
    A string, not an enum: Hydra hands `trainer.compile=false` over as a bool."""
    num_threads: int = 0
    """CPU threads for torch (0: torch's default)."""
    log_every: int = 50
    """Updates between log lines (stderr and the run's train.log: update, epoch, loss, nll, ppl,
    lr, gradient norm, target tokens/s, elapsed training time), TensorBoard scalars and
    progress-bar refreshes."""
    valid_every: int = 1000
    """Updates between validations (0: only at the end)."""
    valid_bleu_sentences: int = 500
    """Validation sentences translated for BLEU at each validation (0: loss only)."""
    valid_bleu_strategy: Strategy = Strategy.greedy
    """greedy, or beam (with the decode group's beam size and length penalty); either computing
    in the training step's precision, whatever decode.precision says
    (commands/train.validation_decode)."""
    patience: int = 0
    """Stop after this many validations without a better BLEU (or loss when valid BLEU is off);
    0: never stop early."""
    checkpoint_every: int = 1000
    """Updates between checkpoints (one is always written at the end)."""
    checkpoint_every_minutes: float = 10.0
    """Also write a checkpoint after this much training time since the last one (the paper
    averages checkpoints written every 10 minutes); 0: off."""
    checkpoint_min_seconds: float = 30.0
    """No checkpoint for checkpoint_every sooner than this many seconds after the previous
    checkpoint (rank 0's clock): a cadence in updates tuned on a slow device must not make a
    fast one spend its time writing checkpoints (the Multi30k CPU recipe's 50 updates are about
    a minute on 2 cores and a second on an H200). A new run's first is written (there is no
    previous one); a resumed run counts from its resume. Checkpoints for
    checkpoint_every_minutes, a new best score, a stop signal and the end are always written.
    0: every checkpoint_every."""
    keep_checkpoints: int = 5
    """How many step checkpoints to keep besides last.pt and best.pt (0: those two alone)."""
    resume: ResumeMode = ResumeMode.auto
    """auto: continue from run_dir's newest readable checkpoint when there is one (or from
    resume_from), refusing settings that change what is being trained; force: continue with
    them (the change is recorded in history.jsonl); never: refuse to start over existing
    checkpoints."""
    resume_from: str | None = None
    """A checkpoint (path) to continue from instead of run_dir's newest: its model, optimizer,
    schedule and data position."""
    init_from: str | None = None
    """Fine-tuning: a run folder (its last.pt) or a checkpoint whose model weights start this run;
    the optimizer, schedule (warm-up included) and update count start afresh, and the parent's
    SentencePiece model(s) encode this run's data (unless data.spm_model names others). Used
    by the run's first start; later starts resume the run's own checkpoints."""
    max_nonfinite_updates: int = 10
    """Updates with a non-finite gradient are skipped; stop after this many in a row. fp16 (whose
    gradient scaler skips updates by design while it lowers the loss scale) stops instead when
    the loss scale falls below 1e-4."""
    progress_bar: bool = True
    """Show a tqdm progress bar when stderr is a terminal (never in a log file)."""
    rank_timeout_minutes: float = 30.0
    """Distributed runs: a rank that waits longer than this for the others in a collective fails
    the job (a hung rank). Data preparation by rank 0 is waited for without this limit."""
    agree_every: int = 10
    """Distributed runs: updates between the ranks' agreements on stopping (a stop signal or the
    time limit on any rank, rank 0's time-based checkpoint), one host all-reduce each. A signal
    or a clock is acted on at the next agreement, at most agree_every - 1 updates late, by every
    rank at the same update. One process alone reads its own after every update."""
    loader_workers: int = 1
    """Background processes that collate batches (0: collate in the training process)."""
    sdpa_backends: list[SdpaBackend] = field(default_factory=lambda: [SdpaBackend.auto])
    """The attention kernels the training step may use, in this order of preference: [auto]
    (ours: on CUDA [flash,efficient,math], keeping cuDNN's attention out; elsewhere torch's own
    choice; transformer_mt/execution.py says why), [default] (torch's own choice everywhere: on
    H100/H200 cuDNN's first), or some of flash, efficient, cudnn, math."""
    source_lengths: SourceLengths = SourceLengths.auto
    """equal: a micro-batch holds sentences of one source length wherever that length fills half
    a batch, so that attention needs no key-padding mask (flash for every call on CUDA; on a
    WMT-sized corpus 99.5% of the target tokens, on Multi30k 85-96%: benchmarks/batch_plan.txt),
    the rest packed as similar lengths are; similar: sorted by length and padded, the padding
    masked; auto: equal on CUDA, similar elsewhere (execution.AUTO_EQUAL_SOURCES). The token
    budgets and the update's size are the same either way."""
    ema_decay: float = 0.0
    """Keep an exponential moving average of the weights (0: none), updated after every update
    as ema += (1 - d) * (weights - ema) with d = min(ema_decay, (1 + n) / (10 + n)) at its n-th
    update (the average follows the weights closely early on, when they move fast). Its weights
    are in every checkpoint beside the weights as trained, validation scores them (and best.pt
    follows their score), and tmt-eval, tmt-translate, tmt-serve, tmt-average and tmt-export use
    them unless told `weights=raw` (docs/training.md#an-exponential-moving-average)."""
    cpu_linear: CpuLinear = CpuLinear.onednn
    """How the linear layers and the loss's output projection multiply when the model trains
    in float32 on the CPU (eager): onednn (oneDNN's kernel with the weights reordered at each
    call, faster here: benchmarks/train_speed.txt; where torch has no oneDNN, as torch) or torch
    (F.linear). The two differ by float32 rounding. Not used on a GPU, under autocast or
    torch.compile."""

    def validate(self) -> None:
        """ConfigError naming the trainer.* key of the first value that cannot be (the
        attention kernels and trainer.compile as far as they can be checked without the
        device: ExecutionPolicy.for_training checks the rest)."""
        _require_at_least(1, self, "trainer", TRAINER_AT_LEAST_ONE)
        _require_at_least(0, self, "trainer", TRAINER_AT_LEAST_ZERO)
        _require(
            self.rank_timeout_minutes > 0,
            "trainer.rank_timeout_minutes",
            f"must be positive, got {self.rank_timeout_minutes}",
        )
        _require(
            self.max_steps > 0 or self.max_epochs > 0 or self.max_time_minutes > 0,
            "trainer.max_steps",
            "no stopping rule: set max_steps, max_epochs or max_time_minutes",
        )
        _require(
            self.num_threads >= 0,
            "trainer.num_threads",
            f"must be >= 0 (0: torch's default), got {self.num_threads}",
        )
        validate_sdpa_backends(self.sdpa_backends, "trainer.sdpa_backends")
        validate_cpu_linear(self.cpu_linear, "trainer.cpu_linear")
        compile_setting(self.compile)
        _require(
            0.0 <= self.ema_decay < 1.0,
            "trainer.ema_decay",
            f"must be in [0, 1) (0: no average; 0.999 averages about the last 1,000 updates), "
            f"got {self.ema_decay}",
        )
        _require(
            self.resume_from is None or self.resume != ResumeMode.never,
            "trainer.resume_from",
            "continues a run: it needs trainer.resume=auto or force, got never",
        )


DECODE_PRECISIONS = (Precision.auto, Precision.fp32, Precision.bf16)
"""decode.precision's values (fp16 is training's, with its gradient scaler)."""


class BatchShape(str, Enum):
    """How beam search's batch is laid out step by step (decode.batch_shape)."""

    auto = "auto"
    shrinking = "shrinking"
    fixed = "fixed"


@dataclass(kw_only=True)
class DecodeConfig:
    """Search settings used by eval and translate."""

    strategy: Strategy = Strategy.beam
    """beam, greedy, or sample (one random draw per sentence, e.g. for back-translation)."""
    beam_size: int = 4
    """Hypotheses kept per sentence."""
    nbest: int = 1
    """Translations per sentence returned by Translator.translate_nbest, best first (beam: at
    most beam_size; greedy and sample give one)."""
    # Any, not `float | str`: OmegaConf 2.3 has no unions; validate() names the key.
    length_penalty: Any = 0.6
    """GNMT alpha: scores are divided by ((5 + length) / 6) ** alpha. tmt-eval also takes auto:
    alpha chosen by valid BLEU from commands/valid_choice.py's LENGTH_PENALTY_GRID (and
    LENGTH_PENALTY_BEYOND while the grid's largest wins)."""
    stop_early: bool = False
    """Beam search: end a sentence as soon as beam_size hypotheses have finished (fairseq's and
    CTranslate2's rule: 25-31% less decoding time on Multi30k, benchmarks/decode.txt; but a
    confident model can collect short endings before its best hypothesis finishes). False:
    tensor2tensor's exact rule, which goes on while a live hypothesis could still beat a
    finished one. CTranslate2 models always stop early."""
    max_len_a: float = 1.0
    """Maximum output length = max_len_a * source length + max_len_b (in pieces)."""
    max_len_b: int = 50
    """See max_len_a."""
    min_len: int = 0
    """No EOS before this many output pieces (EOS not counted); the maximum length wins where
    the two conflict. 0: no minimum (the paper's)."""
    temperature: float = 1.0
    """sample: log-probabilities are divided by it before drawing (< 1 sharper, > 1 flatter)."""
    top_k: int = 0
    """sample: draw from the k most probable pieces only (0: from all)."""
    top_p: float = 1.0
    """sample: draw from the smallest set of most probable pieces whose probability reaches
    top_p (nucleus sampling; 1.0: from all)."""
    seed: int = 1
    """sample: seed of the translator's own random generator (the global RNG is not used)."""
    batch_tokens: int | None = None
    """Source tokens per decoding batch; null (the default): the device's own
    (execution.DECODE_BATCH_TOKENS): 4,000 on the CPU (and MPS, and a CTranslate2 export), 16,384
    on CUDA. The CUDA default is provisional, not measured yet, and sized for a large GPU (an
    H200): `make gpu-check`'s decoding part times a few budgets on a GPU, and this default follows
    what it measures. On a smaller GPU that runs out of memory while decoding, lower this key."""
    batch_shape: BatchShape = BatchShape.auto
    """Beam search's batch from step to step. shrinking: a sentence that is done leaves the
    batch, decided on the host after every step (one copy from the device per step). fixed:
    every row stays to the batch's end (a done sentence's rows go on, masked: nothing they find
    is kept), in a KV cache preallocated for rows x the batch's longest output, so that every
    step has the same shapes; which sentences are done is decided on the device and read every
    decode.check_every steps. auto: fixed on CUDA, shrinking elsewhere
    (execution.ExecutionPolicy.for_decoding; on the CPU the shrinking batch computes fewer rows
    and waits for nothing). Both find the same hypotheses, up to float rounding (not with
    decode.quantize=int8_batch, whose outputs depend on the batch). Greedy search
    and sampling leave the batch row by row on every device."""
    source_lengths: SourceLengths = SourceLengths.auto
    """As trainer.source_lengths, for the search's batches: equal, sources of one length wherever
    a length fills half of decode.batch_tokens, so that the encoder and the cross-attention need
    no key-padding mask (flash on CUDA; a test set of 1,000 to 3,000 sentences rarely has that
    many of one length at CUDA's 16,384 tokens); similar: sorted by length and padded, the
    padding masked; auto: equal on CUDA, similar elsewhere (execution.AUTO_EQUAL_SOURCES). The
    decoder's own attention needs no mask either way (it reads the positions written so far).
    Both find the same translations, up to float rounding."""
    check_every: int = 4
    """batch_shape=fixed: steps between two reads of whether every sentence is done. Each read
    waits for the device; after the batch's last sentence is done, at most check_every - 1 steps
    are computed for nothing. Provisional on CUDA until `make gpu-check`'s decoding part
    measures it; the shrinking search reads every step."""
    sdpa_backends: list[SdpaBackend] = field(default_factory=lambda: [SdpaBackend.auto])
    """The attention kernels our model's searches may use, as trainer.sdpa_backends ([auto]: our
    order for the device; [default]: torch's own choice); a CTranslate2 export has its own. On
    the CPU the decoder's steps (one query row each) use none: model.attend_few_queries."""
    precision: Precision = Precision.auto
    """What our model computes in while it searches: auto (bf16 autocast on CUDA, fp32 on every
    CPU, so that a translation does not depend on the sentences batched with it; fp32 with
    decode.quantize=int8), fp32, or bf16 (autocast, on any device: faster on a CPU that
    multiplies bf16 natively, slower on others, and on the CPU a sentence's translation then
    depends on the sentences batched with it, in a file and in the server alike, as with
    decode.quantize=int8_batch; execution.autocast_dtype says why). fp32 on
    CUDA multiplies matrices in TF32 (torch.backends.cuda.matmul.allow_tf32, which tmt-eval,
    tmt-translate and tmt-serve turn on with device.prepare_process: 10-bit mantissa inputs,
    float32 sums). It holds inside an enclosing autocast too. A CTranslate2 export computes in
    its own type (auto only)."""
    glossary: str | None = None
    """A glossary file (a source term, a tab and a target term a line: decode/glossary.py):
    wherever a source term occurs in a sentence, its translation must contain the target term
    (lexically constrained beam search, decode/constraints.py); beam search only. A sentence
    whose terms cannot all be met within its length limit is translated without them, and
    marked (docs/using-a-model.md#glossaries)."""
    tgt_lang: str | None = None
    """The language to translate into, for a model trained into several (data.corpora with other
    target languages): its tag goes before every source (docs/several-corpora.md). null: the
    model's one target language; a model of several refuses null and any language it was not
    trained into."""
    quantize: CpuLinear = CpuLinear.none
    """int8: our model's linear layers and its output projection (the shared embedding) with
    int8 weights, quantized when the model is loaded (the checkpoint is unchanged), their inputs
    quantized row by row, each hypothesis's token from its own range: a sentence's translation
    never depends on the sentences batched with it. int8_batch: the same weights, the inputs
    quantized with one scale for the whole batch (PyTorch's dynamic quantization, fbgemm's
    kernel): a sentence's translation depends on the sentences batched with it (in a file, in
    the server). Either on the CPU only, in fp32 (not with decode.precision=bf16), each member
    of an ensemble alike (execution.decoding_copy). none: the weights as trained."""
    cpu_linear: CpuLinear = CpuLinear.onednn
    """How our model's linear layers multiply when it searches in float32 on the CPU: onednn
    (with weights reordered once for oneDNN's prepacked product, in a copy made at the first such
    call: faster decoding, benchmarks/decode.txt; where torch has no oneDNN, as torch) or torch
    (F.linear on the weights as they are). The two differ by float32 rounding, so a near-tie may
    rank the other way. Not used on a GPU, in bf16, or with decode.quantize=int8."""

    def __post_init__(self) -> None:
        # A number is a float however it was written (`decode.length_penalty=1` composes to 1).
        if isinstance(self.length_penalty, int) and not isinstance(self.length_penalty, bool):
            self.length_penalty = float(self.length_penalty)

    def validate(self) -> None:
        """ConfigError naming the decode.* key of the first value that cannot be (the attention
        kernels as far as they can be checked without the device: ExecutionPolicy.for_decoding
        checks the rest). length_penalty=auto is tmt-eval's (EvalJob.validate)."""
        alpha = self.length_penalty
        _require(
            alpha != AUTO,
            "decode.length_penalty",
            "auto (alpha chosen on the valid split) is for tmt-eval only; give a number here",
        )
        _require(
            isinstance(alpha, float),
            "decode.length_penalty",
            f"must be a number (or auto, for tmt-eval), got {alpha!r}",
        )
        _require(
            math.isfinite(alpha) and abs(alpha) <= MAX_LENGTH_PENALTY,
            "decode.length_penalty",
            f"must be a finite number in [-{MAX_LENGTH_PENALTY:g}, {MAX_LENGTH_PENALTY:g}] (the "
            f"paper's 0.6; beyond that the penalty overflows), got {alpha}",
        )
        _require(self.beam_size >= 1, "decode.beam_size", f"must be >= 1, got {self.beam_size}")
        _require(
            self.beam_size <= MAX_BEAM_SIZE,
            "decode.beam_size",
            f"must be <= {MAX_BEAM_SIZE} (each sentence searches beam_size rows at once, and "
            f"their memory grows with the beam), got {self.beam_size}",
        )
        _require(
            self.batch_tokens is None or self.batch_tokens > 0,
            "decode.batch_tokens",
            f"must be positive (or null: the device's default), got {self.batch_tokens}",
        )
        _require_at_least(1, self, "decode", ("check_every", "max_len_b"))
        _require(
            math.isfinite(self.max_len_a) and self.max_len_a >= 0,
            "decode.max_len_a",
            f"must be a finite number >= 0, got {self.max_len_a}",
        )
        _require(self.min_len >= 0, "decode.min_len", f"must be >= 0, got {self.min_len}")
        _require(self.nbest >= 1, "decode.nbest", f"must be >= 1, got {self.nbest}")
        if self.strategy == Strategy.beam:  # greedy and sample give one, whatever nbest says
            _require(
                self.nbest <= self.beam_size,
                "decode.nbest",
                f"must be <= decode.beam_size={self.beam_size}, got {self.nbest}",
            )
        self._validate_sampling()
        if self.glossary is not None and self.terms_refusal() is not None:
            raise ConfigError(f"config key 'decode.glossary': {self.terms_refusal()}")
        _require(
            self.precision in DECODE_PRECISIONS,
            "decode.precision",
            f"{self.precision.value} is for training (with its gradient scaler); decoding takes "
            f"{', '.join(p.value for p in DECODE_PRECISIONS)}",
        )
        validate_cpu_linear(self.cpu_linear, "decode.cpu_linear")
        _require(
            self.quantize in (CpuLinear.none, *INT8_PRODUCTS),
            "decode.quantize",
            f"{self.quantize.value} is not a quantization: give none, int8 or int8_batch "
            "(decode.cpu_linear chooses between onednn and torch)",
        )
        _require(
            self.quantize == CpuLinear.none or self.precision != Precision.bf16,
            "decode.precision",
            "bf16 cannot run int8 weights (decode.quantize=int8 computes in fp32): give auto or "
            "fp32, or decode.quantize=none",
        )
        validate_sdpa_backends(self.sdpa_backends, "decode.sdpa_backends")

    def terms_refusal(self) -> str | None:
        """Why these settings cannot search with target terms (a glossary, constraints), or
        None: dynamic beam allocation needs beam search, and a beam of two at least (with one,
        it could only write the terms first)."""
        if self.strategy != Strategy.beam:
            strategy = Strategy(self.strategy).value
            return f"target terms need beam search, not decode.strategy={strategy}"
        if self.beam_size < 2:
            return "target terms need decode.beam_size >= 2 (with one, the terms would come first)"
        return None

    def _validate_sampling(self) -> None:
        _require(
            TEMPERATURE_RANGE[0] <= self.temperature <= TEMPERATURE_RANGE[1],
            "decode.temperature",
            f"must be in [{TEMPERATURE_RANGE[0]:g}, {TEMPERATURE_RANGE[1]:g}] (the "
            f"log-probabilities are divided by it in float32), got {self.temperature}",
        )
        _require(self.top_k >= 0, "decode.top_k", f"must be >= 0 (0: off), got {self.top_k}")
        _require(
            0.0 < self.top_p <= 1.0, "decode.top_p", f"must be in (0, 1] (1: off), got {self.top_p}"
        )
        _require(
            SEED_RANGE[0] <= self.seed <= SEED_RANGE[1],
            "decode.seed",
            f"must be in [-2^63, 2^64 - 1] (torch's generators), got {self.seed}",
        )


@dataclass(kw_only=True)
class RunJob:
    """What every command works on: a run folder. Each command's job extends it with its own
    sections, and its validate() checks them."""

    run_dir: str
    """The run folder: tmt-train writes its config, tokenizer, checkpoints, logs and scores
    there; the other commands read them from it."""

    def validate(self) -> None:
        """ConfigError naming the key of the first value that cannot be (what the types cannot
        say), before anything is loaded or written."""


@dataclass(kw_only=True)
class TrainJob(RunJob):
    """`tmt-train`: everything one training run needs."""

    data: DataConfig
    model: ModelConfig
    optim: OptimConfig
    trainer: TrainerConfig
    decode: DecodeConfig
    """The search of validation BLEU (trainer.valid_bleu_strategy picks greedy or beam)."""

    def validate(self) -> None:
        for section in (self.model, self.decode, self.data, self.optim, self.trainer):
            section.validate()
        max_sentence = self.data.max_tokens_per_sentence
        _require(
            self.trainer.batch_tokens >= max_sentence + 2,
            "trainer.batch_tokens",
            f"{self.trainer.batch_tokens} cannot hold one sentence of "
            f"data.max_tokens_per_sentence={max_sentence} pieces plus BOS/EOS",
        )
        _require(
            max_sentence + 2 <= self.model.max_positions,
            "data.max_tokens_per_sentence",
            f"{max_sentence} + BOS/EOS exceeds model.max_positions={self.model.max_positions}",
        )


@dataclass(kw_only=True)
class SearchJob(RunJob):
    """A command that translates with a run's model: on which device, with which search."""

    device: str = "auto"
    """auto (cuda when torch can use it, else mps, else cpu), cpu, cuda, cuda:N, mps."""
    decode: DecodeConfig
    """The search (tmt-serve: its defaults, which a request may change for itself)."""
    weights: Weights = Weights.auto
    """Which weights of a checkpoint: auto (the moving average where the run kept one,
    trainer.ema_decay; else the weights as trained), raw (the weights as trained) or ema."""

    def validate(self) -> None:
        self.decode.validate()


@dataclass(kw_only=True)
class CheckpointSource(SearchJob):
    """A command that translates with checkpoints of a run: tmt-eval, tmt-translate, tmt-serve."""

    # Any, not `str | list[str]`: OmegaConf 2.3 has no unions; decode/loading.py names the key.
    checkpoint: Any = "last.pt"
    """Checkpoint file name inside run_dir/checkpoints, or a path; or a folder written by
    tmt-export (e.g. ctranslate2), to translate with CTranslate2.
    Several, as a list (checkpoint=[a.pt,b.pt]; of this run or of other runs with the same
    tokenizer files): their ensemble translates (the mean of their probabilities)."""


@dataclass(kw_only=True)
class EvalJob(CheckpointSource):
    """`tmt-eval`: translate a split of the run's data and score it."""

    split: str = "test"
    """test, valid, or train: which split of the run's data to translate."""
    valid_sentences: int = 1000
    """decode.length_penalty=auto: alpha is chosen on the first this many sentences of the
    run's valid split (all of it when shorter)."""

    def validate(self) -> None:
        """decode.length_penalty may be auto here: alpha chosen on the valid split, for beam
        search, when another split is scored."""
        if self.decode.length_penalty != AUTO:
            super().validate()
            return
        if self.decode.strategy != Strategy.beam:
            raise ConfigError(
                "config key 'decode.length_penalty': auto chooses beam search's alpha, which "
                f"decode.strategy={self.decode.strategy.value} does not use; give a number"
            )
        if self.split == "valid":
            raise ConfigError(
                "config key 'decode.length_penalty': auto chooses alpha on the valid split, "
                "which split=valid would then score: a score tuned on its own sentences; give a "
                "number, or score another split (split=test)"
            )
        dataclasses.replace(self.decode, length_penalty=0.0).validate()  # the rest of it


@dataclass(kw_only=True)
class TranslateJob(CheckpointSource):
    """`tmt-translate`: stdin (or a file) to stdout (or a file), flushed after each batch."""

    input: str | None = None
    """File to translate, one sentence per line, UTF-8 (null: standard input)."""
    output: str | None = None
    """File to write (null: standard output), beside it first and renamed into place once every
    line is translated (a failure leaves the previous file). With decode.nbest > 1 each line is
    'input line number (from 0) ||| translation ||| F0= score ||| score', best first (the n-best
    format Moses' and Marian's rerankers read)."""
    attention: str | None = None
    """A file to write, per input line, the cross-attention behind its best translation as one
    JSON line: {"line", "source_pieces", "target_pieces", "weights" (rows: target pieces,
    columns: source pieces, each row summing to 1), "layer"}; weights null for an empty line.
    `make plot-attention` draws one of them."""
    attention_layer: int = -1
    """Which decoder layer's cross-attention (averaged over its heads); negative: from the last."""
    alignment: str | None = None
    """A file to write, per input line, the word alignment of its best translation: `i-j` pairs
    (source word i, target word j, from 0, words split at spaces) separated by spaces, the form
    fast_align and Moses write; an empty line for an empty input line (decode/alignment.py)."""
    alignment_layer: int | None = None
    """Which decoder layer's cross-attention aligns the words (negative: from the last); null:
    the last layer (benchmarks/alignment.txt measures each layer)."""
    input_prefixes: bool = False
    """Each input line is a source, a tab, and a target prefix that its translation must begin
    with (the search goes on from it; split at the line's last tab; a line without a tab has
    none): autocompletion, interactive translation. The output is the whole translation, the
    prefix included."""


@dataclass(kw_only=True)
class BacktranslateJob(CheckpointSource):
    """`tmt-backtranslate`: monolingual text in the run's source language to a synthetic
    parallel corpus for the reverse direction (the run's translations as its sources), written
    in chunks that a rerun of the same command continues (docs/several-corpora.md)."""

    input: str
    """Monolingual text, one sentence a line, UTF-8, in the run's source language: the target
    language of the model that the corpus will train."""
    input_lang: str | None = None
    """The input's language (null: the input file's suffix, as in mono.en); must be the run's
    data.src_lang."""
    output: str
    """A folder for the corpus: `{split}.{input language}` (the input's lines) and
    `{split}.{run's target language}` (their translations), with backtranslation.json (the run,
    checkpoint, decoding settings and input that made it); `+data.corpora.NAME.dir=` it."""
    split: str = "train"
    """The corpus's split name, its files' prefix (a corpus's `split` key reads it)."""
    chunk_lines: int = 2000
    """Lines translated and written together: a kill or a full disk loses at most the chunk in
    progress. Part of what the corpus is, with sampling (each chunk draws from decode.seed and
    its number)."""

    def validate(self) -> None:
        super().validate()
        _require(self.chunk_lines >= 1, "chunk_lines", f"must be >= 1, got {self.chunk_lines}")
        _require(
            re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.split) is not None,
            "split",
            f"must be a file name prefix (letters, digits, '_', '.', '-'), got {self.split!r}",
        )


@dataclass(kw_only=True)
class ScoreJob(CheckpointSource):
    """`tmt-score`: the model's score of each given translation (docs/commands.md#tmt-score)."""

    source: str
    """The source sentences, one a line, UTF-8, in the run's source language."""
    target: str
    """Their translations, line by line (as many lines as source)."""
    output: str | None = None
    """File to write (null: standard output), beside it first and renamed into place once every
    pair is scored. One line a pair, four tab-separated fields: the length-normalised score that
    beam search ranks by (decode.length_penalty's alpha), the log-probability (the sum over the
    target's pieces and EOS), its mean per piece, and the number of pieces (EOS included). A
    pair whose source is empty is not scored: -inf, -inf, -inf, 0."""


@dataclass(kw_only=True)
class AverageJob(SearchJob):
    """`tmt-average`: the mean of a run's newest checkpoints, for eval and translate. device and
    decode are used by last=auto alone: where and how the candidates translate the valid
    sentences (a numeric length_penalty)."""

    # Any, not `int | str`: OmegaConf 2.3 has no unions; validate() names the key.
    last: Any = 5
    """How many of the newest step checkpoints to average (the paper: 5 for base, 20 for big),
    or auto: the number (1, the newest alone, included) with the best valid BLEU, from
    commands/valid_choice.py's AVERAGE_GRID and all that are kept."""
    output: str = "averaged.pt"
    """File name inside run_dir/checkpoints, or a path: a new file, or an average tmt-average
    wrote before (anything else is refused); `make eval ARGS=checkpoint=averaged.pt`."""
    valid_sentences: int = 1000
    """last=auto: each candidate translates the first this many sentences of the run's valid
    split (all of it when shorter)."""

    def validate(self) -> None:
        last = self.last
        if last == AUTO:
            super().validate()  # the search that chooses
            return
        _require(
            not isinstance(last, bool) and isinstance(last, int) and last >= 1,
            "last",
            f"must be a positive number of checkpoints or auto, got {last!r}",
        )


@dataclass(kw_only=True)
class ExportJob(RunJob):
    """`tmt-export`: a checkpoint as a CTranslate2 model folder (needs the `export` extra) or as
    a Hugging Face transformers MarianMTModel folder (needs the `hf` extra)."""

    checkpoint: str = "last.pt"
    """Checkpoint file name inside run_dir/checkpoints, or a path."""
    weights: Weights = Weights.auto
    """Which weights of the checkpoint: auto (the moving average where the run kept one,
    trainer.ema_decay; else the weights as trained), raw or ema."""
    format: ExportFormat = ExportFormat.ctranslate2
    """ctranslate2: a CTranslate2 model that tmt-eval and tmt-translate run
    (`checkpoint=ctranslate2`); transformers: a folder that transformers' MarianMTModel and
    MarianTokenizer load with `from_pretrained`, with a model card (post-LN models only)."""
    output: str | None = None
    """Folder name inside run_dir/checkpoints, or a path; replaced if it exists. null: named
    after the format (ctranslate2 or transformers). Translate with a CTranslate2 one:
    `make translate ARGS=checkpoint=ctranslate2`."""
    quantization: str | None = None
    """ctranslate2: the weight type stored: null keeps float32; or one of CTranslate2's (int8,
    int8_float32, int16, float16, bfloat16, ...). A loaded model can still compute in another
    type. transformers: only null (float32)."""

    def __post_init__(self) -> None:
        self.output = self.output or self.format.value

    def validate(self) -> None:
        _require(
            self.format != ExportFormat.transformers or self.quantization is None,
            "quantization",
            f"{self.quantization} is for format=ctranslate2; format=transformers writes float32 "
            "(null)",
        )


@dataclass(kw_only=True)
class ServeJob(CheckpointSource):
    """`tmt-serve`: an HTTP API and a page around one checkpoint (needs the `serve` extra)."""

    host: str = "127.0.0.1"
    """Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)."""
    port: int = 8000
    """Port to listen on."""
    max_request_bytes: int = 65_536
    """Larger requests are refused (HTTP 413)."""
    max_lines: int = 64
    """Sentences per request (more: HTTP 422)."""
    max_line_chars: int = 1_000
    """Characters per sentence (more: HTTP 422)."""
    max_beam_size: int = 16
    """Largest beam a request may ask for (more: HTTP 422)."""
    max_pending_pieces: int = 32_000
    """Source pieces (EOS included) of all admitted, unanswered requests (more: HTTP 503)."""
    request_timeout_s: float = 60.0
    """Seconds a request may wait for its answer (more: HTTP 504; unstarted, it is dropped)."""
    max_attention_cells: int = 1_000_000
    """Attention weights a request may ask for, bounded before decoding (more: HTTP 422)."""
    max_connections: int = 128
    """Connections and requests uvicorn takes at once (more: HTTP 503; its limit_concurrency)."""
    max_glossary_pairs: int = 1_000
    """Term pairs in a request's own glossary, each matched against each of its lines (more:
    HTTP 422)."""

    def validate(self) -> None:
        """Also: a port that exists; limits above 0 (a limit of 0 would refuse every request,
        and only under load would anyone notice); a default search that the limits admit (else
        every request that names no beam is refused)."""
        super().validate()
        _require(0 <= self.port <= 65535, "port", f"must be in [0, 65535], got {self.port}")
        for key in SERVE_LIMITS:
            value = getattr(self, key)
            _require(value > 0, key, f"must be > 0, got {value}")
        _require(
            self.decode.strategy != Strategy.beam or self.decode.beam_size <= self.max_beam_size,
            "decode.beam_size",
            f"{self.decode.beam_size} is over max_beam_size={self.max_beam_size}, so every "
            "request that names no beam_size would be refused: lower it, or raise max_beam_size",
        )


SERVE_LIMITS = (
    "max_request_bytes",
    "max_lines",
    "max_line_chars",
    "max_beam_size",
    "max_pending_pieces",
    "request_timeout_s",
    "max_attention_cells",
    "max_connections",
    "max_glossary_pairs",
)
"""The ServeJob keys that bound each request, the queue and the connections."""


def times_ranks(value: float, power: float = 1) -> float:
    """value x ranks^power, where ranks is the number of processes torchrun, Slurm's srun or
    submitit started (launch.world_size; 1 without them): the resolver
    ${tmt.times_ranks:value,power} with which trainer=scaled grows the global batch and the
    learning rate with the number of GPUs. An int value stays an int with power 1."""
    ranks = world_size(os.environ)
    if isinstance(value, int) and power == 1:
        return value * ranks
    return value * ranks**power


def register_configs() -> None:
    """Register the schemas that the YAML files in transformer_mt/configs/ extend, and the
    resolvers they use."""
    OmegaConf.register_new_resolver("tmt.times_ranks", times_ranks, replace=True)
    register_sweep_resolvers()
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainJob)
    store.store(name="eval_schema", node=EvalJob)
    store.store(name="translate_schema", node=TranslateJob)
    store.store(name="backtranslate_schema", node=BacktranslateJob)
    store.store(name="score_schema", node=ScoreJob)
    store.store(name="average_schema", node=AverageJob)
    store.store(name="export_schema", node=ExportJob)
    store.store(name="serve_schema", node=ServeJob)
    store.store(group="data", name="data_schema", node=DataConfig)
    store.store(group="model", name="model_schema", node=ModelConfig)
    store.store(group="optim", name="optim_schema", node=OptimConfig)
    store.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    store.store(group="decode", name="decode_schema", node=DecodeConfig)


CONFIG_DIR = Path(str(importlib.resources.files("transformer_mt") / "configs"))
"""The presets, shipped inside the package (a wheel installs them with it)."""


COMMAND_SCHEMAS: dict[str, type[RunJob]] = {
    "train": TrainJob,
    "eval": EvalJob,
    "translate": TranslateJob,
    "backtranslate": BacktranslateJob,
    "score": ScoreJob,
    "average": AverageJob,
    "export": ExportJob,
    "serve": ServeJob,
}
"""The schema each command's own configuration composes to (the other presets, such as demo and
multi30k, are training configurations)."""

JobT = TypeVar("JobT", bound=RunJob)


def as_job(cfg: DictConfig, schema: type[JobT]) -> JobT:
    """The typed job of a composed configuration, or ConfigError when it is another schema's or
    a value does not resolve (a missing value, an interpolation that fails)."""
    try:
        job = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as error:
        raise ConfigError(config_error_line(error)) from error
    if not isinstance(job, schema):  # a --config-name whose defaults name another schema
        raise ConfigError(
            f"the configuration composed to {type(job).__name__}, not the {schema.__name__} "
            "this command takes: check --config-name and the file's defaults list"
        )
    return job


def config_error_line(error: BaseException) -> str | None:
    """One line for a configuration that Hydra or OmegaConf refused (a value of the wrong type,
    an unknown key or preset, an override that does not parse, a value that does not resolve),
    naming the key where there is one; None for any other error."""
    cause = error.__cause__ if isinstance(error, HydraException) else None
    refused = error if isinstance(error, OmegaConfBaseException) else cause
    if isinstance(refused, OmegaConfBaseException):
        what = first_line(getattr(refused, "msg", None) or str(refused))
        if isinstance(refused.__cause__, OmegaConfBaseException):  # an interpolation's own error
            what = f"{what}: {first_line(str(refused.__cause__))}"
        key = getattr(refused, "full_key", None)
        return f"config key '{key}': {what}" if key else what
    if isinstance(error, MissingConfigException):
        choices = [name for name in error.options or [] if not name.endswith("_schema")]
        where = f"; the choices: {', '.join(choices)}" if choices else ""
        extra = EXTRAS.get(error.missing_cfg_file or "", "")
        return f"{first_line(str(error))}{where}{extra}"
    if isinstance(error, HydraException):
        return ": ".join(str(error).strip().split("\n\n")[0].splitlines())
    if isinstance(error, yaml.MarkedYAMLError):  # a preset that is no YAML: duplicate keys too
        mark = error.problem_mark
        where = f"{mark.name}:{mark.line + 1}: " if mark is not None else ""
        return f"{where}{error.problem} ({error.context or 'not YAML'})"
    return None


EXTRAS = {
    "hydra/sweeper/optuna": " (Optuna's sweeper is the sweep extra: pip install '.[sweep]')",
    "hydra/launcher/submitit_slurm": " (the submitit launcher is the slurm extra: "
    "pip install '.[slurm]')",
    "hydra/launcher/submitit_local": " (the submitit launcher is the slurm extra: "
    "pip install '.[slurm]')",
}
"""What a preset of a missing extra needs, after the line that says it is not found."""


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def config_dict(cfg) -> dict:
    """A dataclass config as plain Python values, as OmegaConf.to_container would give them
    (enum_to_str): enums as their names, nested configs as dicts, tuples as lists. What
    checkpoints, scores.SPLIT.json and the server's answers hold, safe for
    torch.load(weights_only=True); written out here because OmegaConf takes milliseconds (it
    builds and type-checks a DictConfig first), and the server writes one per answer."""
    return {f.name: plain_value(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def plain_value(value):
    if dataclasses.is_dataclass(value):
        return config_dict(value)
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [plain_value(item) for item in value]
    if isinstance(value, dict):
        return {plain_value(key): plain_value(item) for key, item in value.items()}
    return value


def compose_job(config_name: str, overrides: list[str] | None = None) -> RunJob:
    """The typed job that the configuration `config_name` composes to with these command-line
    style overrides; for tests, scripts and notebooks (the CLI uses @hydra.main)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides or []))
    return as_job(cfg, COMMAND_SCHEMAS.get(config_name, TrainJob))


# The checks of one value that the validate() methods share.


def validate_weight_and_tag(weight: float, tag: str | None, key: str) -> None:
    """ConfigError naming KEY.weight unless it is a finite number > 0, KEY.tag unless it is null
    or of TAG_FORM."""
    _require(
        isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0,
        f"{key}.weight",
        f"must be a finite number > 0 (how often each pair is trained on per epoch), got {weight}",
    )
    _require(
        tag is None or re.fullmatch(TAG_FORM, tag) is not None,
        f"{key}.tag",
        f"must be an ASCII word in angle brackets, as <BT> or <2de> (no spaces), got {tag!r}",
    )


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config key '{key}': {message}")


def _require_at_least(least: int, section: object, key: str, names: tuple[str, ...]) -> None:
    """ConfigError naming `key`.NAME for the first of `names` whose value is below `least`."""
    for name in names:
        value = getattr(section, name)
        _require(value >= least, f"{key}.{name}", f"must be >= {least}, got {value}")


def validate_sdpa_backends(backends: list[SdpaBackend], key: str) -> None:
    """ConfigError naming `key` (trainer.sdpa_backends, decode.sdpa_backends) unless it lists
    [auto], [default], or some of the kernels."""
    alone = {SdpaBackend.auto, SdpaBackend.default}
    _require(
        len(backends) >= 1 and (alone.isdisjoint(backends) or len(backends) == 1),
        key,
        f"[auto] (our order for the device), [default] (torch's own choice) or a list of "
        f"{', '.join(SDPA_KERNEL_NAMES)}, got [{','.join(backend.value for backend in backends)}]",
    )


def validate_cpu_linear(value: CpuLinear, key: str) -> None:
    """trainer.cpu_linear and decode.cpu_linear take the float products only (int8 weights are
    decode.quantize's, chosen when a model is loaded)."""
    _require(
        value in FLOAT_PRODUCTS,
        key,
        f"onednn or torch, got {value.value} (int8 weights, for decoding: decode.quantize)",
    )


CPU_SDPA_KERNELS = (SdpaBackend.flash, SdpaBackend.math)
"""The SDPA kernels torch has on the CPU (efficient and cudnn are CUDA's)."""


def validate_sdpa_device(backends: list[SdpaBackend], key: str, device_type: str) -> None:
    """ConfigError naming `key` when none of the kernels listed runs on the device (SDPA would
    fail at the first attention call: "No viable backend"); one that does not is passed over."""
    if device_type != "cpu" or SdpaBackend.auto in backends or SdpaBackend.default in backends:
        return
    _require(
        any(backend in CPU_SDPA_KERNELS for backend in backends),
        key,
        f"[{','.join(backend.value for backend in backends)}]: none of these attention kernels "
        f"runs on the CPU, which has {' and '.join(b.value for b in CPU_SDPA_KERNELS)}; add one "
        "of them, or give [auto]",
    )


SDPA_KERNEL_NAMES = [
    backend.value
    for backend in SdpaBackend
    if backend not in (SdpaBackend.auto, SdpaBackend.default)
]

COMPILE_SETTINGS = {"auto": None, "true": True, "false": False}


def compile_setting(value: object) -> bool | None:
    """trainer.compile as given (Hydra may hand over a bool or its text): True, False or None
    (auto); ConfigError naming the key for anything else."""
    text = str(value).strip().lower()
    _require(
        text in COMPILE_SETTINGS,
        "trainer.compile",
        f"{value!r} is not one of auto, true, false",
    )
    return COMPILE_SETTINGS[text]
