"""Every preset composes into typed dataclasses; bad keys and values fail with the key's name."""

import dataclasses
import re

import pytest
from hydra.errors import ConfigCompositionException

from transformer_mt.config import (
    CONFIG_DIR,
    EvalJob,
    TrainJob,
    TranslateJob,
    compose_job,
)
from transformer_mt.errors import ConfigError

GROUPS = ["data", "model", "optim", "trainer", "decode"]


def presets(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group,preset", [(g, p) for g in GROUPS for p in presets(g)])
def test_every_preset_composes(group, preset):
    overrides = [f"{group}={preset}", "run_dir=/tmp/x"]
    if preset in ("files", "multi30k_files_de_en"):
        overrides.append("data.dir=/tmp/corpus")
    job = compose_job("train", overrides)
    assert isinstance(job, TrainJob)
    job.validate()


@pytest.mark.parametrize(
    "name,schema",
    [
        ("train", TrainJob),
        ("demo", TrainJob),
        ("multi30k", TrainJob),
        ("multi30k_gpu", TrainJob),
        ("eval", EvalJob),
        ("translate", TranslateJob),
    ],
)
def test_top_level_configs_compose(name, schema):
    assert isinstance(compose_job(name, ["run_dir=/tmp/x"]), schema)


def test_paper_defaults():
    job = compose_job("train", [])
    assert (job.model.d_model, job.model.n_heads, job.model.d_ff, job.model.n_encoder_layers) == (
        512,
        8,
        2048,
        6,
    )
    assert job.model.dropout == 0.1 and not job.model.norm_first
    assert (
        job.optim.betas == [0.9, 0.98] and job.optim.eps == 1e-9 and job.optim.warmup_steps == 4000
    )
    assert job.optim.label_smoothing == 0.1
    assert (job.decode.beam_size, job.decode.length_penalty, job.decode.max_len_b) == (4, 0.6, 50)
    assert job.data.vocab_size == 37000
    big = compose_job("train", ["model=big"]).model
    assert (big.d_model, big.n_heads, big.d_ff, big.dropout) == (1024, 16, 4096, 0.3)


def test_unknown_key_is_named():
    with pytest.raises(ConfigCompositionException) as error:
        compose_job("train", ["model.d_modle=7"])
    assert "d_modle" in str(error.value) + str(error.value.__cause__)


def test_wrong_type_is_named():
    with pytest.raises(ConfigCompositionException) as error:
        compose_job("train", ["model.d_model=wide"])
    assert "d_model" in str(error.value) + str(error.value.__cause__)


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.n_heads=7", "model.d_model"),
        ("trainer.batch_tokens=0", "trainer.batch_tokens"),
        ("model.dropout=1.5", "model.dropout"),
        ("optim.warmup_steps=0", "optim.warmup_steps"),
    ],
)
def test_impossible_values_name_the_key(override, key):
    job = compose_job("train", [override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        job.validate()


COMMAND_KEYS = {
    "train": "run_dir data model optim trainer decode",
    "eval": "run_dir checkpoint split device valid_sentences decode weights",
    "translate": "run_dir checkpoint device input output attention attention_layer decode "
    "alignment alignment_layer input_prefixes weights",
    "average": "run_dir last output valid_sentences device decode weights",
    "export": "run_dir checkpoint format output quantization weights",
    "serve": "run_dir checkpoint device host port max_request_bytes max_lines max_line_chars "
    "max_beam_size max_pending_pieces request_timeout_s max_attention_cells max_connections "
    "decode max_glossary_pairs weights",
}
"""The top-level keys of each command's configuration (99ece05's, and those added since): a
user's command line and an older run's config.yaml name them."""


@pytest.mark.parametrize("name", sorted(COMMAND_KEYS))
def test_each_command_takes_the_keys_it_took(name):
    job = compose_job(name, ["run_dir=/tmp/x"])
    assert sorted(field.name for field in dataclasses.fields(job)) == sorted(
        COMMAND_KEYS[name].split()
    )


@pytest.mark.parametrize(
    "name,overrides,key",
    [
        ("train", ["model.n_heads=7"], "model.d_model"),
        ("eval", ["decode.length_penalty=auto", "split=valid"], "decode.length_penalty"),
        ("translate", ["decode.beam_size=0"], "decode.beam_size"),
        ("average", ["last=0"], "last"),
        ("export", ["format=transformers", "quantization=int8"], "quantization"),
        ("serve", ["max_lines=0"], "max_lines"),
    ],
)
def test_each_job_checks_its_own_sections_naming_the_key(name, overrides, key):
    job = compose_job(name, ["run_dir=/tmp/x", *overrides])
    with pytest.raises(ConfigError, match=f"^config key '{re.escape(key)}': "):
        job.validate()
