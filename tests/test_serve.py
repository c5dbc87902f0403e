"""tmt-serve's API through FastAPI's test clients on a tiny trained model: translations equal
the library's, n-best lists, attention, every limit and malformed input, concurrent clients, the
request's own sampling seed. (tests/test_serve_abuse.py: the server under abuse.)"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
httpx = pytest.importorskip("httpx", reason="the dev extra is not installed")

from fastapi.testclient import TestClient  # noqa: E402

from transformer_mt.commands.train import train  # noqa: E402
from transformer_mt.config import DecodeConfig, ServeJob, Strategy  # noqa: E402
from transformer_mt.data.toy import toy_pairs  # noqa: E402
from transformer_mt.decode.loading import load_translator  # noqa: E402
from transformer_mt.decode.scoring import score_pairs  # noqa: E402
from transformer_mt.decode.translator import Translator  # noqa: E402
from transformer_mt.serve.app import create_app  # noqa: E402

QUICK = ["trainer.valid_every=0", "trainer.valid_bleu_sentences=0"]
LIMITS = ServeJob(
    run_dir="unused",  # create_app reads the limits only
    decode=DecodeConfig(),
    max_request_bytes=4_000,
    max_lines=8,
    max_line_chars=200,
    max_beam_size=6,
    max_glossary_pairs=3,
    port=0,  # any free port: tmt-serve binds its address once before the model loads
)
SENTENCES = [en for en, _ in toy_pairs(16, seed=11, max_words=12)]


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    from toy_runs import TINY_TRAIN

    from transformer_mt.config import compose_job

    folder = tmp_path_factory.mktemp("serve")
    job = compose_job(
        "train",
        [*TINY_TRAIN, *QUICK, "trainer.max_steps=30", f"run_dir={folder / 'run'}"]
        + [f"data.prepared_dir={folder / 'prepared'}"],
    )
    return load_translator(train(job).parents[1], device="cpu")


@pytest.fixture(scope="module")
def client(translator) -> TestClient:
    with TestClient(create_app(translator, LIMITS)) as client:
        yield client


def with_decode(translator: Translator, **changes) -> Translator:
    decode = dataclasses.replace(translator.decode, **changes)
    return Translator(translator.backend, translator.tokenizers, decode)


def test_a_sentence_and_lines_are_translated_as_the_library_does(client, translator):
    answer = client.post("/translate", json={"text": SENTENCES[0]})
    assert answer.status_code == 200
    assert answer.json()["translations"][0]["text"] == translator.translate(SENTENCES[:1])[0]
    answer = client.post("/translate", json={"lines": SENTENCES[:4], "strategy": "greedy"})
    assert [t["text"] for t in answer.json()["translations"]] == with_decode(
        translator, strategy="greedy", beam_size=1
    ).translate(SENTENCES[:4])
    assert answer.json()["decode"]["strategy"] == "greedy"


def test_nbest_lists_best_first(client, translator):
    answer = client.post("/translate", json={"lines": SENTENCES[:3], "nbest": 3}).json()
    expected = with_decode(translator, nbest=3).translate_nbest(SENTENCES[:3])
    for served, library in zip(answer["translations"], expected, strict=True):
        assert [(e["text"], e["score"]) for e in served["nbest"]] == [
            (t.text, pytest.approx(t.score)) for t in library
        ]
        scores = [e["score"] for e in served["nbest"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_attention_rows_sum_to_one_over_the_source_pieces(client):
    answer = client.post("/translate", json={"text": SENTENCES[1], "attention": True}).json()
    attention = answer["translations"][0]["attention"]
    weights = attention["weights"]
    assert len(weights) == len(attention["target_pieces"])
    assert attention["target_pieces"][-1] == "</s>" == attention["source_pieces"][-1]
    for row in weights:
        assert len(row) == len(attention["source_pieces"])
        assert all(round(weight, 3) == weight for weight in row)  # 3 decimals
        assert sum(row) == pytest.approx(1.0, abs=0.0005 * len(row))  # each rounded by <= 0.0005
    assert attention["layer"] == 1  # the tiny model's last of 2 decoder layers
    first = client.post(
        "/translate", json={"text": SENTENCES[1], "attention": True, "attention_layer": 0}
    ).json()
    assert first["translations"][0]["attention"]["layer"] == 0


def test_word_alignments_are_the_library_s(client, translator):
    answer = client.post("/translate", json={"lines": SENTENCES[:3], "alignment": True}).json()
    expected = translator.translate_nbest(SENTENCES[:3], alignment=translator.alignment_layer(None))
    served = [t["alignment"] for t in answer["translations"]]
    assert served == [[list(pair) for pair in nbest[0].alignment] for nbest in expected]
    for translation, pairs in zip(answer["translations"], served, strict=True):
        targets = sorted(target for _, target in pairs)
        assert targets == list(range(len(translation["text"].split())))  # each word one pair
    assert answer["translations"][0]["attention"] is None
    plain = client.post("/translate", json={"text": SENTENCES[0]}).json()
    assert plain["translations"][0]["alignment"] is None


def test_a_prefix_begins_each_translation_as_in_the_library(client, translator):
    prefixes = ["Der", "", "Die Frau"]
    answer = client.post("/translate", json={"lines": SENTENCES[:3], "prefix": prefixes}).json()
    texts = [t["text"] for t in answer["translations"]]
    expected = translator.translate_nbest(SENTENCES[:3], prefixes=prefixes)
    assert texts == [nbest[0].text for nbest in expected]
    assert texts[0].startswith("Der") and texts[2].startswith("Die Frau")
    one = client.post("/translate", json={"text": SENTENCES[0], "prefix": "Der"}).json()
    assert one["translations"][0]["text"] == texts[0]


def test_a_request_s_glossary_and_constraints_are_in_its_translations(client, translator):
    """SENTENCES[0]: 'They have ordered the aunt.'; SENTENCES[3]: 'Here a deep camel ...'."""
    glossary = [{"source": "AUNT", "target": "Großmutter"}, {"source": "camel", "target": "Pferd"}]
    lines = [SENTENCES[0], SENTENCES[1], SENTENCES[3]]
    answer = client.post(
        "/translate",
        json={"lines": lines, "glossary": glossary, "constraints": [[], ["Nachts Haus"], []]},
    ).json()
    texts = [t["text"] for t in answer["translations"]]
    assert "Großmutter" in texts[0] and "Nachts Haus" in texts[1] and "Pferd" in texts[2]
    assert not any(t["unmet_terms"] for t in answer["translations"])
    library = translator.translate_nbest(lines, terms=[["Großmutter"], ["Nachts Haus"], ["Pferd"]])
    assert texts == [nbest[0].text for nbest in library]


def test_a_server_glossary_refuses_greedy_requests_only_for_lines_with_its_terms(
    translator, tmp_path
):
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("aunt\tGroßmutter\n")
    served = with_decode(translator, glossary=str(glossary))
    with TestClient(create_app(served, LIMITS)) as client:
        free = client.post("/translate", json={"text": SENTENCES[1], "strategy": "greedy"})
        termed = client.post("/translate", json={"text": SENTENCES[0], "strategy": "greedy"})
        beam = client.post("/translate", json={"text": SENTENCES[0]})
    assert free.status_code == 200, free.text
    assert termed.status_code == 422 and "need beam search" in termed.text
    assert "Großmutter" in beam.json()["translations"][0]["text"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"lines": ["a"] * 9}, 422, "9 lines: the limit is 8"),
        ({"text": "x" * 201}, 422, "line 0 has 201 characters: the limit is 200"),
        ({"text": "a", "beam_size": 7}, 422, "beam_size 7: the limit is 6"),
        ({"text": "a", "lines": ["b"]}, 422, 'give either "text"'),
        ({}, 422, 'give either "text"'),
        ({"text": "a\nb"}, 422, "holds a line break"),
        ({"text": "a", "beams": 2}, 422, "the request is not valid"),
        ({"text": "a", "strategy": "nucleus"}, 422, "the request is not valid"),
        ({"text": "a", "nbest": 0}, 422, "the request is not valid"),
        ({"text": "a", "attention": True, "attention_layer": 5}, 422, "the decoder has 2 layers"),
        ({"text": "a", "alignment": True, "alignment_layer": -3}, 422, "'alignment_layer'"),
        ({"text": "a", "prefix": ["b"]}, 422, 'give "prefix" as a string with "text"'),
        ({"lines": ["a", "b"], "prefix": ["c"]}, 422, "1 prefixes for 2 lines"),
        ({"lines": ["a"], "prefix": ["c\nd"]}, 422, "prefix 0 holds a line break"),
        ({"lines": ["a", "b"], "constraints": [["c"]]}, 422, "1 lists of constraints for 2"),
        (
            {"text": "a dog", "strategy": "greedy", "glossary": [{"source": "dog", "target": "X"}]},
            422,
            "need beam search",
        ),
        ({"text": "a", "glossary": [{"source": " ", "target": "X"}]}, 422, "a term is empty"),
        (
            {"text": "a", "glossary": [{"source": "a", "target": "b"}] * 4},
            422,
            "4 glossary pairs: the limit is 3",
        ),
        # numbers a search cannot use: refused by their key, not a 500 (issue 59)
        ({"text": "a", "length_penalty": float("inf")}, 422, "'decode.length_penalty'"),
        ({"text": "a", "length_penalty": 1e308}, 422, "'decode.length_penalty'"),
        ({"text": "a", "strategy": "sample", "temperature": 1e-300}, 422, "'decode.temperature'"),
        ({"text": "a", "strategy": "sample", "temperature": float("inf")}, 422, "temperature"),
        ({"text": "a", "strategy": "sample", "top_p": 1e-300}, 200, ""),  # the likeliest piece
    ],
)
def test_every_limit_and_bad_setting_is_a_4xx_with_a_message(client, body, status, message):
    # json.dumps, not the client's encoder, which refuses to send Infinity
    headers = {"content-type": "application/json"}
    answer = client.post("/translate", content=json.dumps(body).encode(), headers=headers)
    assert answer.status_code == status
    said = answer.json()
    if status == 200:
        assert len(said["translations"]) == 1
        return
    assert message in " ".join([said["detail"], *(e["problem"] for e in said.get("errors", []))])


def test_a_request_over_the_size_limit_and_malformed_json(client):
    answer = client.post("/translate", json={"lines": ["word " * 39] * 30})
    assert answer.status_code == 413 and "the limit is 4000" in answer.json()["detail"]
    answer = client.post(
        "/translate", content=b'{"text": "a",', headers={"content-type": "application/json"}
    )
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["problem"].startswith("Invalid JSON")


def test_scores_are_the_library_s(client, translator):
    best = [nbest[0] for nbest in translator.translate_nbest(SENTENCES[:4])]
    pairs = [{"source": s, "target": b.text} for s, b in zip(SENTENCES, best, strict=False)]
    pairs.append({"source": "", "target": "a"})
    answer = client.post("/score", json={"pairs": pairs, "length_penalty": 0.6})
    assert answer.status_code == 200, answer.text
    scores = answer.json()["scores"]
    expected = score_pairs(translator, [p["source"] for p in pairs], [p["target"] for p in pairs])
    assert scores[-1] is None and expected[-1] is None
    for served, library in zip(scores[:-1], expected[:-1], strict=True):
        assert served == {
            "normalised": library.normalised,
            "log_prob": library.log_prob,
            "per_piece": library.per_piece,
            "pieces": library.pieces,
        }
    encoded = translator.tokenizers.tgt.encode([b.text for b in best])
    searched = translator.nbest_ids(translator.encode(SENTENCES[:4]))
    same = [ids == hyps[0].tokens for ids, hyps in zip(encoded, searched, strict=True)]
    for served, entry, spelled_alike in zip(scores, best, same, strict=False):  # the search's
        if spelled_alike:
            assert served["normalised"] == pytest.approx(entry.score, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"pairs": [{"source": "a", "target": "b"}] * 9}, "9 pairs: the limit is 8"),
        ({"pairs": [{"source": "a", "target": "x" * 201}]}, "pair's target 0 has 201 characters"),
        ({"pairs": [{"source": "a\nb", "target": "b"}]}, "pair's source 0 holds a line break"),
        ({"pairs": [{"source": "a"}]}, "the request is not valid"),
        ({"pairs": [{"source": "a", "target": "b"}], "beam_size": 2}, "the request is not valid"),
        ({"pairs": [], "length_penalty": float("inf")}, "'decode.length_penalty'"),
        ({"pairs": [{"source": "a", "target": "b"}], "tgt_lang": "fr"}, "decode.tgt_lang"),
    ],
)
def test_a_bad_scoring_request_is_a_422_with_a_message(client, body, message):
    headers = {"content-type": "application/json"}
    answer = client.post("/score", content=json.dumps(body).encode(), headers=headers)
    assert answer.status_code == 422
    said = answer.json()
    assert message in " ".join([said["detail"], *(e["problem"] for e in said.get("errors", []))])


def test_sixteen_concurrent_clients_are_all_answered_correctly(translator):
    app = create_app(translator, LIMITS)
    expected = translator.translate(SENTENCES)

    async def sixteen_at_once() -> list[str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            answers = await asyncio.gather(
                *(client.post("/translate", json={"text": s}) for s in SENTENCES)
            )
        return [a.json()["translations"][0]["text"] for a in answers]

    assert asyncio.run(sixteen_at_once()) == expected
    assert sum(app.state.batcher.batch_sizes) == 16  # every request in exactly one batch
    app.state.batcher.stop()


def test_the_page_and_health(client, translator):
    page = client.get("/")
    assert page.status_code == 200 and "<textarea" in page.text and "/translate" in page.text
    assert "https://" not in page.text  # nothing from elsewhere: no CDN
    health = client.get("/health").json()
    checkpoint = translator.origin["checkpoint"]
    assert health["status"] == "ok" and checkpoint.startswith("/")  # the loader keeps the path...
    assert health["model"] == {"checkpoint": "last.pt", "step": 30}  # ...the server shows no path
    assert checkpoint not in page.text + json.dumps(health)
    shown = dataclasses.replace(DecodeConfig(), batch_tokens=4000)  # null: the CPU's budget
    settings = json.loads(json.dumps(dataclasses.asdict(shown)))
    assert health["decode"] == settings | {"precision": "fp32 (auto)"}  # what auto chose


def test_a_sampling_request_is_decided_by_its_own_seed(client, translator):
    """The same sampling request twice gives the same text, whatever was sampled between, and
    the library's text for that seed; another seed gives another text."""

    def sampled(seed: int) -> list[str]:
        asked = {"lines": SENTENCES[:8], "strategy": "sample", "seed": seed}
        answer = client.post("/translate", json=asked)
        assert answer.status_code == 200 and answer.json()["decode"]["seed"] == seed
        return [t["text"] for t in answer.json()["translations"]]

    first = sampled(7)
    assert sampled(8) != first  # 8 sentences sampled alike by chance: negligible
    assert sampled(7) == first
    library = Translator.for_model(
        translator.backend.model,
        translator.tokenizers,
        dataclasses.replace(translator.decode, strategy=Strategy.sample, seed=7),
        translator.backend.device,
    )
    assert [n[0].text for n in library.translate_nbest(SENTENCES[:8])] == first


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])  # just outside torch's seeds
def test_a_seed_torch_cannot_take_is_refused_and_the_server_answers_the_next_request(client, seed):
    asked = {"text": SENTENCES[0], "strategy": "sample", "seed": seed}
    answer = client.post("/translate", json=asked)
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["where"] == "seed"
    assert client.post("/translate", json={"text": SENTENCES[0]}).status_code == 200
    edge = {**asked, "seed": 2**64 - 1 if seed > 0 else -(2**63)}
    assert client.post("/translate", json=edge).status_code == 200


def test_tmt_serve_builds_one_translator_for_its_lifetime(translator, monkeypatch):
    """From start-up to shutdown, whatever decode settings the requests ask for (beam sizes,
    n-best lists, greedy, sampling with two seeds, attention, a length penalty, a refused
    setting), the Translator that tmt-serve loaded at start-up answers every one of them."""
    import uvicorn

    from transformer_mt.commands import serve as command

    built, init = [], Translator.__init__

    def counted(self, *args, **kwargs):
        built.append(self)
        init(self, *args, **kwargs)

    asked = [
        {"text": SENTENCES[0]},
        {"text": SENTENCES[0], "beam_size": 2},
        {"lines": SENTENCES[:3], "nbest": 3},
        {"lines": SENTENCES[:2], "strategy": "greedy"},
        {"text": SENTENCES[1], "strategy": "sample", "seed": 3},
        {"text": SENTENCES[1], "strategy": "sample", "seed": 4},
        {"text": SENTENCES[2], "attention": True},
        {"text": SENTENCES[2], "length_penalty": 1.0},
        {"text": SENTENCES[2], "nbest": 5, "beam_size": 4},  # refused: nbest over the beam
    ]
    statuses = []

    def run(app, **options):  # uvicorn's place: the requests, then the shutdown
        with TestClient(app) as client:
            statuses.extend(client.post("/translate", json=body).status_code for body in asked)

    monkeypatch.setattr(Translator, "__init__", counted)
    monkeypatch.setattr(uvicorn, "run", run)
    run_dir = Path(translator.origin["checkpoint"]).parents[1]
    command.serve(dataclasses.replace(LIMITS, run_dir=str(run_dir), device="cpu"))
    assert statuses == [200] * 8 + [422]
    assert len(built) == 1
