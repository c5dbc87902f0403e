"""With the default decode settings a sentence's translation does not depend on the sentences
translated with it: in the library (a file at once, each line alone, small batches) and in the
server (each line alone, the lines in one request, concurrent requests). Issue 66's reliability
review found decode.precision=auto searching in bf16 on a CPU that multiplies it natively,
where 2 of 100 toy test sentences changed when translated alone; the tests run as on such a CPU
(the detection answers yes), whatever this machine is, so they check the default anywhere.
Translations equal to the character, and scores up to float32's rounding (SUM_ORDER)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import torch

from transformer_mt import execution
from transformer_mt.commands.evaluate import evaluate
from transformer_mt.config import DecodeConfig, Precision, ServeJob, compose_job
from transformer_mt.data.sources import read_pairs
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.translator import Translator, describe_precision
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.run_dir import RunDir

SENTENCES = 40  # of the learned run's test split: enough to meet bf16's changes, a few seconds
SUM_ORDER = 2.0**-16
"""Relative tolerance of a score between two batch shapes in fp32: the batch changes only the
order of float32 sums (2^-24 of relative rounding each, a few dozen roundings deep, far under
2^-16), where bf16, rounding to 8 bits (2^-8), moves scores by 1e-3 and more."""


@pytest.fixture
def bf16_cpu(monkeypatch):
    """As on a CPU that multiplies bf16 natively (AVX512-BF16, AMX, Arm's BF16)."""
    monkeypatch.setattr(execution, "cpu_multiplies_bf16", lambda: True)
    describe_precision.cache_clear()
    yield
    describe_precision.cache_clear()


def test_search_settings_of_the_cpu_compute_in_fp32_by_default(bf16_cpu):
    """What the tests below check end to end, as the policy decides it: auto is fp32 on the
    CPU (bf16 by name stays), bf16 on CUDA."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert ExecutionPolicy.for_decoding(DecodeConfig(), cpu).dtype is None
    bf16 = DecodeConfig(precision=Precision.bf16)
    assert ExecutionPolicy.for_decoding(bf16, cpu).dtype == torch.bfloat16
    assert ExecutionPolicy.for_decoding(DecodeConfig(), cuda).dtype == torch.bfloat16


def test_bf16_by_name_is_logged_as_depending_on_the_batch(bf16_cpu, learned_run, caplog):
    """decode.precision=bf16 is said to depend on batch mates when the model is loaded (so
    tmt-serve says it when it starts), as decode.quantize=int8_batch is; auto is not."""
    with caplog.at_level("WARNING", logger="transformer_mt.decode.translator"):
        load_translator(learned_run, device="cpu")
        assert "depends on the sentences" not in caplog.text
        load_translator(learned_run, device="cpu", decode=DecodeConfig(precision=Precision.bf16))
    assert "decode.precision=bf16: the search computes in bf16 (on this CPU faster" in caplog.text
    assert "depends on the sentences translated with it" in caplog.text


def best(nbest_lists) -> list[tuple[str, float]]:
    return [(nbest[0].text, nbest[0].score) for nbest in nbest_lists]


def assert_same(found: list[tuple[str, float]], expected: list[tuple[str, float]], how: str):
    texts = [text for text, _ in found]
    assert texts == [text for text, _ in expected], how
    for (_, score), (_, wanted) in zip(found, expected, strict=True):
        assert score == pytest.approx(wanted, rel=SUM_ORDER, abs=0), how


def test_a_file_alone_and_in_small_batches_translates_alike(bf16_cpu, learned_run):
    translator = load_translator(learned_run, device="cpu")
    sources = [s for s, _ in read_pairs(RunDir(learned_run).data_config(), "test")][:SENTENCES]
    whole = best(translator.translate_nbest(sources))
    assert len({text for text, _ in whole}) > SENTENCES // 2  # the model translates: not trivial
    alone = [best(translator.translate_nbest([source]))[0] for source in sources]
    assert_same(alone, whole, "each line alone against the file")
    small = dataclasses.replace(translator.decode, batch_tokens=64)
    assert_same(best(translator.translate_nbest(sources, decode=small)), whole, "batch_tokens=64")
    assert translator.settings_record()["precision"] == "fp32 (auto)"


def test_the_servers_answers_do_not_depend_on_the_requests_batched_with_them(bf16_cpu, learned_run):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    httpx = pytest.importorskip("httpx", reason="the dev extra is not installed")
    from transformer_mt.serve.app import create_app

    translator: Translator = load_translator(learned_run, device="cpu")
    sources = [s for s, _ in read_pairs(RunDir(learned_run).data_config(), "test")][:SENTENCES]
    app = create_app(translator, ServeJob(run_dir="unused", decode=DecodeConfig()))

    def answered(answer) -> list[tuple[str, float]]:
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["decode"]["precision"] == "fp32 (auto)"  # what ran, not the setting alone
        return [(t["text"], t["nbest"][0]["score"]) for t in body["translations"]]

    async def served() -> tuple[list, list, list]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            alone = [
                answered(await client.post("/translate", json={"text": s}))[0] for s in sources
            ]
            together = answered(await client.post("/translate", json={"lines": sources}))
            concurrent = await asyncio.gather(
                *(client.post("/translate", json={"text": s}) for s in sources)
            )
            health = (await client.get("/health")).json()
        assert health["decode"]["precision"] == "fp32 (auto)"
        return alone, together, [answered(a)[0] for a in concurrent]

    alone, together, concurrent = asyncio.run(served())
    app.state.batcher.stop()
    assert max(app.state.batcher.batch_sizes) > 1  # concurrent requests were batched together
    assert_same(together, alone, "the lines of one request against each line alone")
    assert_same(concurrent, alone, "concurrent requests against each line alone")


@pytest.mark.parametrize(("precision", "recorded"), [("auto", "fp32 (auto)"), ("bf16", "bf16")])
def test_scores_record_what_the_search_computed_in(bf16_cpu, one_update_run, precision, recorded):
    """scores.SPLIT.json's decode settings say what ran (with auto: what auto chose), not the
    setting alone."""
    job = compose_job("eval", [f"run_dir={one_update_run}", f"decode.precision={precision}"])
    evaluate(job)
    scores = json.loads((one_update_run / "scores.test.json").read_text())
    assert scores["decode"]["precision"] == recorded
