"""Export to transformers: the folder that `tmt-export format=transformers` writes loads with
MarianMTModel and MarianTokenizer alone (in another process, which imports nothing of ours) and
translates as our model does. Skipped only where transformers is not installed (`make install`
installs it with the `hf` extra)."""

import dataclasses
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_mt import cli
from transformer_mt.commands.evaluate import evaluate
from transformer_mt.commands.export import export
from transformer_mt.config import (
    DataConfig,
    DecodeConfig,
    ExportFormat,
    ExportJob,
    ModelConfig,
    Strategy,
    compose_job,
    config_dict,
)
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizers, train_tokenizer
from transformer_mt.data.toy import toy_pairs
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.search import length_penalty
from transformer_mt.decode.translator import Translator
from transformer_mt.errors import ConfigError, TransformerMTError
from transformer_mt.export.transformers import (
    ModelCard,
    evaluation,
    export_model,
    marian_order,
)
from transformer_mt.model import Transformer, sinusoidal_table
from transformer_mt.run_dir import RunDir

transformers = pytest.importorskip("transformers")

BIN = Path(sys.executable).parent
# What a user of the folder runs, in a process that imports transformers and torch only.
HF_SIDE = """
import contextlib, io, json, re, sys
import torch
from transformers import MarianMTModel, MarianTokenizer

torch.set_num_threads(1)
folder, request = sys.argv[1], json.load(sys.stdin)
tokenizer = MarianTokenizer.from_pretrained(folder)
model = MarianMTModel.from_pretrained(folder).eval()
batch = tokenizer(request["sentences"], return_tensors="pt", padding=True, truncation=True)
with torch.no_grad():
    greedy = model.generate(**batch, num_beams=1)
    beam = model.generate(  # generation_config.json's search: beam 4
        **batch, num_return_sequences=4, output_scores=True, return_dict_in_generate=True
    )
    logits = model(
        input_ids=torch.tensor([request["source"]]),
        decoder_input_ids=torch.tensor([request["target_prefix"]]),
    ).logits[0]
readme = open(f"{folder}/README.md", encoding="utf-8").read()
snippet = re.search(r"```python\\n(.*?)```", readme, re.S).group(1)
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    exec(snippet, {})
json.dump({
    "input_ids": [tokenizer(s)["input_ids"] for s in request["sentences"]],
    "greedy": tokenizer.batch_decode(greedy, skip_special_tokens=True),
    "beam": tokenizer.batch_decode(beam.sequences, skip_special_tokens=True),
    "beam_scores": beam.sequences_scores.tolist(),
    # Generated tokens, EOS included (the length in the penalty): the first EOS's index.
    "beam_lengths": [row.tolist().index(model.config.eos_token_id) for row in beam.sequences],
    "logits": logits.tolist(),
    "snippet_lines": len(snippet.strip().splitlines()),
    "snippet_printed": printed.getvalue(),
    "ours_imported": sorted(m for m in sys.modules if m.startswith("transformer_mt")),
}, sys.stdout)
"""


def run_hf_side(folder: Path, request: dict) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", HF_SIDE, str(folder)],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


@pytest.mark.slow
def test_trained_model_translates_the_same_in_transformers(learned_run, tmp_path):
    # A copy of the session's learned toy run (400 updates): a model that writes German words.
    run_dir = Path(shutil.copytree(learned_run, tmp_path / "run"))
    data = Path(RunDir(run_dir).data_config().dir)
    evaluate(compose_job("eval", [f"run_dir={run_dir}", "device=cpu"]))  # scores.test.json
    result = subprocess.run(
        [str(BIN / "tmt-export"), "format=transformers", f"run_dir={run_dir}"],
        capture_output=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr.decode()
    folder = run_dir / "checkpoints" / "transformers"
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 0.6)

    sentences = (data / "test.en").read_text().splitlines()[:50]
    # Our search with the length limit of generation_config.json (max_length: the model's
    # max_positions, start token included; EOS forced last), where ours is a * source length + b
    # by default: outputs that reach it are then compared too.
    longest = generation["max_length"] - 1
    limit = DecodeConfig(max_len_a=0.0, max_len_b=longest, batch_tokens=10_000)
    greedy = load_translator(
        run_dir, decode=dataclasses.replace(limit, strategy=Strategy.greedy), device="cpu"
    )
    beam = load_translator(run_dir, decode=limit, device="cpu")
    ours_greedy, ours_beam = greedy.translate(sentences), beam.translate(sentences)
    assert len(set(ours_greedy)) > 25  # a model that writes words, not one repeated sentence
    source = greedy.encode(sentences[:1])[0] + [EOS_ID]
    target_prefix = [BOS_ID, *greedy.tokenizers.tgt.encode(ours_greedy[:1])[0]]
    theirs = run_hf_side(
        folder, {"sentences": sentences, "source": source, "target_prefix": target_prefix}
    )

    assert theirs["ours_imported"] == []
    assert theirs["input_ids"] == [ids + [EOS_ID] for ids in greedy.encode(sentences)]
    assert theirs["greedy"] == ours_greedy  # all 50
    nbest = list(zip(theirs["beam"], theirs["beam_scores"], theirs["beam_lengths"], strict=True))
    best = [nbest[i] for i in range(0, 200, 4)]
    same = sum(text == o for (text, _, _), o in zip(best, ours_beam, strict=True))
    print(f"beam 4: {same} of 50 outputs equal")
    # Where they differ, only the length penalty does: transformers ranks by log-probability /
    # length ** alpha, we by GNMT's / ((5 + length) / 6) ** alpha. Both searches expand the same
    # beams, so its 4 best re-ranked with ours give ours (unless 4 others beat ours under its
    # penalty, which it would then keep instead).
    alpha = DecodeConfig().length_penalty
    reranked = [
        max(nbest[i : i + 4], key=lambda h: h[1] * h[2] ** alpha / length_penalty(h[2], alpha))[0]
        for i in range(0, 200, 4)
    ]
    assert reranked == ours_beam
    # A floor, not the check (the re-ranking is): how often the penalties disagree depends on how
    # close the model's best hypotheses are (43-48 of 50 for toy_runs.LEARNING's learning rates).
    assert same >= 40
    model = greedy.backend.model
    with torch.no_grad():
        ours_logits = model(torch.tensor([source]), torch.tensor([target_prefix]))[0]
    difference = (torch.tensor(theirs["logits"]) - ours_logits).abs().max().item()
    print(f"largest logit difference: {difference:.2e}")
    # float32 sums in another order and Marian's float64 position table: about 1e-6 here.
    assert difference < 1e-4

    card = (folder / "README.md").read_text(encoding="utf-8")
    scores = json.loads((run_dir / "scores.test.json").read_text())
    assert f"Test BLEU {scores['bleu']:.2f}" in card and scores["bleu_signature"] in card
    assert "400 updates" in card and f"files in {data}" in card
    assert theirs["snippet_lines"] == 5
    assert re.fullmatch(r"\['.+'\]\n", theirs["snippet_printed"])
    config = json.loads((folder / "config.json").read_text())
    assert (config["decoder_start_token_id"], config["pad_token_id"]) == (BOS_ID, PAD_ID)


def random_model(*, norm_first: bool = False, src_vocab_size: int | None = None) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        name="t",
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        norm_first=norm_first,
        max_positions=24,
    )
    model = Transformer(cfg, vocab_size=420, src_vocab_size=src_vocab_size, pad_id=PAD_ID)
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # LayerNorms away from (1, 0)
            if "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def untrained_card() -> ModelCard:
    return ModelCard(
        checkpoint="last.pt",
        step=0,
        train_seconds=None,
        corpus="toy corpus",
        data=config_dict(DataConfig()),
        test_scores=None,
    )


@pytest.fixture(scope="module")
def separate(tmp_path_factory) -> Tokenizers:
    pairs, folder = toy_pairs(500, seed=3), tmp_path_factory.mktemp("spm")
    src = train_tokenizer([s for s, _ in pairs], folder / "spm.src.model", vocab_size=400)
    tgt = train_tokenizer([t for _, t in pairs], folder / "spm.tgt.model", vocab_size=420)
    return Tokenizers(src, tgt)


def test_separate_vocabularies_are_two_tables_in_marian(separate, tmp_path):
    """The encoder's own embedding and vocab.json, the decoder's tied to the output and
    target_vocab.json; greedy outputs of a random model (at the length limit, most of them)."""
    model = random_model(src_vocab_size=400)
    folder = export_model(model, separate, tmp_path / "hf", card=untrained_card())
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    marian = transformers.MarianMTModel.from_pretrained(folder).eval()
    assert not marian.config.share_encoder_decoder_embeddings
    assert "Not evaluated" in (folder / "README.md").read_text()

    sentences = [en for en, _ in toy_pairs(6, seed=5, max_words=6)]
    decode = DecodeConfig(strategy=Strategy.greedy, max_len_a=0.0, max_len_b=23)
    ours = Translator.for_model(model, separate, decode, torch.device("cpu"))
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    assert tokenizer(sentences[0])["input_ids"] == ours.encode(sentences[:1])[0] + [EOS_ID]
    with torch.no_grad():
        generated = marian.generate(**batch, num_beams=1)
        logits = marian(**batch, decoder_input_ids=generated).logits
        expected = model(batch["input_ids"], generated)
    assert tokenizer.batch_decode(generated, skip_special_tokens=True) == ours.translate(sentences)
    assert (logits - expected).abs().max() < 1e-4
    german = [de for _, de in toy_pairs(6, seed=5, max_words=6)]
    target_ids = tokenizer(text_target=german)["input_ids"]  # target.spm and target_vocab.json
    assert target_ids == [ids + [EOS_ID] for ids in separate.tgt.encode(german)]
    assert tokenizer.batch_decode(target_ids, skip_special_tokens=True) == german


def test_a_full_disk_is_the_os_error_it_quotes_and_leaves_nothing(separate, tmp_path, monkeypatch):
    """Issue 66: on a full disk safetensors raised its own SafetensorError (not an OSError), a
    21-line traceback. Now it is the OSError it quotes, which the CLI says in its one disk-full
    line, and the folder written beside is gone. The writer raises what a full disk gave
    (safetensors 0.8 on a 64 KiB tmpfs)."""
    from safetensors import SafetensorError

    def full_disk(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    output = tmp_path / "hf"
    with pytest.raises(OSError) as full:
        export_model(random_model(src_vocab_size=400), separate, output, card=untrained_card())
    assert full.value.errno == errno.ENOSPC
    assert "the disk is full (No space left on device writing" in cli.os_error_line(full.value)
    assert list(tmp_path.iterdir()) == []


def test_marian_order_turns_our_positions_into_marians():
    """Ours: sin at even, cos at odd dimensions; Marian's: [sin | cos]."""
    d_model = 16
    marian = transformers.MarianMTModel(
        transformers.MarianConfig(
            d_model=d_model,
            max_position_embeddings=50,
            vocab_size=8,
            pad_token_id=0,
            decoder_start_token_id=0,
        )
    )
    theirs = marian.model.encoder.embed_positions.weight.detach()
    ours = sinusoidal_table(50, d_model)[:, marian_order(d_model)]
    # Ours in float32, Marian's in float64: the angle pos / 10000 ** (2i / D) is off by up to
    # pos * 2 ** -24 (3e-6 at 49) in ours.
    assert (ours - theirs).abs().max() < 1e-5


def test_pre_norm_and_quantization_are_refused_by_name(separate, tmp_path, monkeypatch):
    with pytest.raises(TransformerMTError, match="model.norm_first=true"):
        export_model(random_model(norm_first=True), separate, tmp_path, card=untrained_card())
    job = ExportJob(run_dir=str(tmp_path), format=ExportFormat.transformers, quantization="int8")
    with pytest.raises(ConfigError, match="config key 'quantization': int8 is for format=ctr"):
        export(job)
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    job = ExportJob(run_dir=str(tmp_path), format=ExportFormat.transformers)
    with pytest.raises(TransformerMTError, match=r'pip install -e "\.\[hf\]"'):
        export(job)
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    # transformers 5 with a torch older than 2.6: its PyTorch models are off.
    monkeypatch.setattr(transformers.utils, "is_torch_available", lambda: False)
    with pytest.raises(TransformerMTError, match=r"cannot use torch .*pip install \"transformers"):
        export(job)


def test_card_says_when_the_score_is_another_updates():
    scores = {
        "bleu": 27.3,
        "chrf": 55.0,
        "sentences": 3003,
        "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0",
        "checkpoint": {"checkpoint": "runs/x/checkpoints/last.pt", "step": 90_000},
        "decode": {"strategy": "beam", "beam_size": 4, "length_penalty": 0.6},
    }
    card = dataclasses.replace(untrained_card(), step=100_000, test_scores=scores)
    assert "Test BLEU 27.30" in evaluation(card)
    assert "(scored at update 90000, not this one)" in evaluation(card)
    assert "not this one" not in evaluation(dataclasses.replace(card, step=90_000))


def test_export_config_takes_the_format():
    job = compose_job("export", ["run_dir=/tmp/x", "format=transformers"])
    assert (job.format, job.output) == (ExportFormat.transformers, "transformers")
