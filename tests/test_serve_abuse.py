"""tmt-serve under abuse, on a fake model whose search waits at a gate the test opens: many
clients at once (503 beyond the bound on pending work, 504 past the deadline, clients that give
up), bodies too large to read, attention too large to send. Nothing here depends on how fast the
machine is: the gate and a fake clock decide what finishes when, and waits are for conditions."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import threading

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra is not installed")
httpx = pytest.importorskip("httpx", reason="the dev extra is not installed")

from transformer_mt.config import DecodeConfig, ServeJob, Strategy  # noqa: E402
from transformer_mt.data.tokenizer import Tokenizers  # noqa: E402
from transformer_mt.decode.search import Hypothesis  # noqa: E402
from transformer_mt.decode.translator import Translator  # noqa: E402
from transformer_mt.errors import ConfigError  # noqa: E402
from transformer_mt.serve import app as serve_app  # noqa: E402
from transformer_mt.serve.app import create_app  # noqa: E402
from transformer_mt.serve.batcher import Batcher, QueuedWork  # noqa: E402

# a one-word request is 2 pieces (the word and EOS): 20 fit the bound, and each is its own batch
# port 0: any free port (tmt-serve binds its address once before the model loads).
LIMITS = ServeJob(run_dir="unused", decode=DecodeConfig(), max_pending_pieces=40, port=0)
DECODE = DecodeConfig(strategy=Strategy.greedy, beam_size=1, batch_tokens=2)


class Words:
    """A tokenizer whose pieces are the words themselves (ids given on first sight)."""

    def __init__(self):
        self.words: list[str] = []
        self.ids: dict[str, int] = {}

    def encode(self, sentences: list[str]) -> list[list[int]]:
        return [[self.id(word) for word in sentence.split()] for sentence in sentences]

    def id(self, word: str) -> int:
        if word not in self.ids:
            self.ids[word] = len(self.words)
            self.words.append(word)
        return self.ids[word]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [" ".join(self.pieces(sentence)) for sentence in ids]

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.words[i] for i in ids]


class GatedEcho:
    """A search backend that translates each source into itself once the test opens `gate`,
    and records every source it was asked to search."""

    name = "echo"
    strategies = (Strategy.beam, Strategy.greedy)
    max_source_tokens = 100
    decoder_layers = 1

    def __init__(self, words: Words):
        self.words = words
        self.gate = threading.Event()
        self.searched: list[str] = []

    def search(
        self, sources: list[list[int]], decode: DecodeConfig, policy
    ) -> list[list[Hypothesis]]:
        self.searched += self.words.decode(sources)
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        return [[Hypothesis(list(source), 0.0)] for source in sources]

    def cross_attention(self, sources, targets, layer: int) -> list[list[list[float]]]:
        pairs = zip(sources, targets, strict=True)
        return [[[1 / (len(s) + 1)] * (len(s) + 1)] * (len(t) + 1) for s, t in pairs]


class FakeClock:
    """Deadlines that pass when the test says so: `pass_deadlines` ends every sleep begun
    before it, and none begun after."""

    def __init__(self):
        self.sleeping: list[asyncio.Event] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeping.append(event := asyncio.Event())
        try:
            await event.wait()
        finally:
            if event in self.sleeping:  # a request that ended otherwise
                self.sleeping.remove(event)

    def pass_deadlines(self) -> None:
        for event in self.sleeping:
            event.set()
        self.sleeping.clear()


@pytest.fixture
def backend() -> GatedEcho:
    return GatedEcho(Words())


@pytest.fixture
def make_app(backend):
    apps = []

    def make(limits: ServeJob = LIMITS, **options):
        words = backend.words
        translator = Translator(backend, Tokenizers(words, words), DECODE, unicode_form=None)
        apps.append(app := create_app(translator, limits, **options))
        return app

    yield make
    backend.gate.set()
    for app in apps:
        app.state.batcher.stop()


def client_of(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def until(condition, what: str) -> None:
    """Wait for a condition (the limit only stops a broken test from hanging)."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def watch_pending(batcher) -> list[int]:
    """The pending pieces after every admission: the peaks of the queue."""
    peaks, submit = [], batcher.submit

    def watched(job):
        future = submit(job)
        peaks.append(batcher.pending_pieces)
        return future

    batcher.submit = watched
    return peaks


def test_two_hundred_clients_get_answers_refusals_and_deadlines_and_no_abandoned_work(
    backend, make_app
):
    clock = FakeClock()
    app = make_app(sleep=clock.sleep)
    batcher = app.state.batcher
    peaks = watch_pending(batcher)

    async def scenario() -> tuple[dict[str, int | str], list[str]]:
        async with client_of(app) as client:
            tasks = {
                f"w{i}": asyncio.ensure_future(client.post("/translate", json={"text": f"w{i}"}))
                for i in range(200)
            }
            # 20 admitted (one searching at the closed gate, 19 waiting), 180 refused at once
            await until(lambda: sum(t.done() for t in tasks.values()) == 180, "180 refusals")
            await until(lambda: len(backend.searched) == 1, "the first search")
            assert len(batcher.waiting) == 19 and batcher.pending_pieces == 40
            for answer in (t.result() for t in tasks.values() if t.done()):
                assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
            health = await client.get("/health")  # while the worker is stuck in a search
            assert health.status_code == 200 and health.json()["status"] == "ok"

            waiting = [text for text, t in tasks.items() if not t.done()]
            waiting.remove(backend.searched[0])
            for text in waiting[:6]:  # these clients give up
                tasks[text].cancel()
            await until(lambda: len(batcher.waiting) == 13, "the cancelled jobs leave the queue")
            assert batcher.pending_pieces == 28

            await until(lambda: len(clock.sleeping) == 14, "a deadline for each waiting client")
            clock.pass_deadlines()  # the 14 still waiting (13 queued, 1 searching) are late
            await until(lambda: all(t.done() for t in tasks.values()), "every answer")
            backend.gate.set()  # the search begun before the deadline finishes, unread
            await until(lambda: batcher.pending_pieces == 0, "an idle worker")

            later = [f"v{i}" for i in range(20)]  # within the bound and the deadline
            answers = await asyncio.gather(
                *(client.post("/translate", json={"text": text}) for text in later)
            )
        for text, answer in zip(later, answers, strict=True):
            assert answer.status_code == 200
            assert answer.json()["translations"][0]["text"] == text
        outcomes = {
            text: "gave up" if t.cancelled() else t.result().status_code
            for text, t in tasks.items()
        }
        return outcomes, later

    outcomes, later = asyncio.run(scenario())
    counts = {o: list(outcomes.values()).count(o) for o in set(outcomes.values())}
    assert counts == {503: 180, "gave up": 6, 504: 14}
    assert max(peaks) <= LIMITS.max_pending_pieces and len(peaks) == 20 + 20
    first = backend.searched[0]
    assert outcomes[first] == 504
    assert sorted(backend.searched) == sorted([first, *later])  # no abandoned job was searched


def raw_request(body_chunks, headers: dict[str, str], *, hang_up: asyncio.Event | None = None):
    """An ASGI POST /translate whose receive() hands out `body_chunks` and counts what it handed
    out, then says the client disconnected (once `hang_up` is set, if given); returns (scope,
    receive, send, record)."""
    record = {"chunks": 0, "bytes": 0, "status": None, "body": b""}
    chunks = iter(body_chunks)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/translate",
        "raw_path": b"/translate",
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }

    async def receive() -> dict:
        chunk = next(chunks, None)
        if chunk is None:
            if hang_up is not None:
                await hang_up.wait()
            return {"type": "http.disconnect"}
        record["chunks"] += 1
        record["bytes"] += len(chunk[0])
        return {"type": "http.request", "body": chunk[0], "more_body": chunk[1]}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            record["status"] = message["status"]
        else:
            record["body"] += message.get("body", b"")

    return scope, receive, send, record


JSON = {"content-type": "application/json"}


def test_a_declared_two_gigabyte_body_is_refused_before_any_of_it_is_read(make_app):
    app = make_app()
    endless = ((b"x" * 2**20, True) for _ in range(2048))
    scope, receive, send, record = raw_request(endless, {**JSON, "content-length": str(2**31)})
    asyncio.run(app(scope, receive, send))
    assert record["status"] == 413 and record["chunks"] == 0
    assert json.loads(record["body"])["detail"] == f"request of {2**31} bytes: the limit is 65536"


@pytest.mark.parametrize("declared", [None, "100"], ids=["chunked", "lying-content-length"])
def test_a_body_over_the_limit_is_refused_after_at_most_one_chunk_more(make_app, declared):
    limits = dataclasses.replace(LIMITS, max_request_bytes=4_000)
    app = make_app(limits)
    headers = JSON if declared is None else {**JSON, "content-length": declared}
    chunks = [(b"x" * 1_500, True)] * 100
    scope, receive, send, record = raw_request(chunks, headers)
    asyncio.run(app(scope, receive, send))
    assert record["status"] == 413
    assert record["bytes"] <= 4_000 + 1_500 and record["chunks"] == 3
    assert "the limit is 4000" in json.loads(record["body"])["detail"]


def test_a_client_that_hangs_up_while_waiting_is_never_translated(backend, make_app):
    """uvicorn goes on running the handler of a client that has gone; the handler hears the
    disconnect and the job leaves the queue."""
    app = make_app()
    batcher = app.state.batcher

    async def scenario() -> int:
        async with client_of(app) as client:
            first = asyncio.ensure_future(client.post("/translate", json={"text": "first"}))
            await until(lambda: backend.searched == ["first"], "the first search")
            body = json.dumps({"text": "gone"}).encode()
            hang_up = asyncio.Event()
            scope, receive, send, _ = raw_request([(body, False)], JSON, hang_up=hang_up)
            handler = asyncio.ensure_future(app(scope, receive, send))
            await until(lambda: len(batcher.waiting) == 1, "the second job waits")
            hang_up.set()
            await asyncio.wait_for(handler, timeout=30)  # a limit for a broken server only
            assert not batcher.waiting and batcher.pending_pieces == 2  # the first one's
            backend.gate.set()
            return (await first).status_code

    assert asyncio.run(scenario()) == 200
    assert backend.searched == ["first"]


def test_a_body_that_is_not_json_is_refused(make_app, open_gate):
    app = make_app()

    async def post(headers: dict) -> httpx.Response:
        async with client_of(app) as client:
            return await client.post("/translate", content=b'{"text": "a"}', headers=headers)

    for headers, shown in [({"content-type": "text/plain"}, "text/plain"), ({}, "missing")]:
        answer = asyncio.run(post(headers))
        assert answer.status_code == 415
        assert answer.json()["detail"] == f"Content-Type {shown}: send application/json"
    answer = asyncio.run(post({"content-type": "application/json; charset=utf-8"}))
    assert answer.status_code == 200


@pytest.fixture
def open_gate(backend):
    backend.gate.set()


def test_attention_over_the_cell_cap_is_refused_before_decoding(
    backend, make_app, open_gate, monkeypatch
):
    # DecodeConfig's max_len_a=1, max_len_b=50: a line of n words may give (n + 1) x (n + 50)
    limits = dataclasses.replace(LIMITS, max_attention_cells=11 * 60)
    app = make_app(limits)
    writers, write = [], serve_app.answer_bytes

    def answer_bytes(results, decode):
        writers.append(threading.current_thread().name)
        return write(results, decode)

    monkeypatch.setattr(serve_app, "answer_bytes", answer_bytes)

    async def post(words: int) -> httpx.Response:
        text = " ".join(f"a{i}" for i in range(words))
        async with client_of(app) as client:
            return await client.post("/translate", json={"text": text, "attention": True})

    refused = asyncio.run(post(11))  # 12 x 61 cells
    assert refused.status_code == 422 and "the limit is 660" in refused.json()["detail"]
    assert backend.searched == []  # refused before any search
    answer = asyncio.run(post(10))  # 11 x 60: at the cap
    assert answer.status_code == 200
    weights = answer.json()["translations"][0]["attention"]["weights"]
    assert weights == [[0.091] * 11] * 11  # 1/11, rounded to 3 decimals
    assert writers == ["translate"]  # the answer was written by the worker thread


def test_one_translator_answers_every_setting_and_each_request_is_encoded_once(
    backend, make_app, open_gate, monkeypatch
):
    """Concurrent requests with other decode settings than the server's (beam sizes, n-best,
    attention, a length penalty) and one this model cannot do (sampling): no Translator is
    built after the server's own, and each admitted request's lines are tokenized once."""
    built, init = [], Translator.__init__

    def counted(self, *args, **kwargs):
        built.append(self)
        init(self, *args, **kwargs)

    encoded, encode = [], backend.words.encode
    monkeypatch.setattr(Translator, "__init__", counted)
    monkeypatch.setattr(backend.words, "encode", lambda s: encoded.append(s) or encode(s))
    app = make_app()
    asked = [
        {"text": "a b"},
        {"text": "a b", "strategy": "beam", "beam_size": 3},
        {"lines": ["c", "d e"], "strategy": "beam", "beam_size": 2, "nbest": 2},
        {"text": "f", "attention": True},
        {"text": "g", "length_penalty": 1.0},
        {"text": "h", "strategy": "sample"},
    ]

    async def scenario() -> list[httpx.Response]:
        async with client_of(app) as client:
            return await asyncio.gather(*(client.post("/translate", json=body) for body in asked))

    answers = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200] * 5 + [422]
    assert "sample is not available with a echo model" in answers[-1].json()["detail"]
    assert [t["text"] for t in answers[2].json()["translations"]] == ["c", "d e"]
    assert len(built) == 1  # make_app's
    assert sorted(map(tuple, encoded)) == [("a b",), ("a b",), ("c", "d e"), ("f",), ("g",)]


def test_a_limit_that_is_not_above_zero_is_refused_by_its_key():
    for key in ("max_pending_pieces", "request_timeout_s", "max_attention_cells"):
        with pytest.raises(ConfigError, match=f"config key '{key}': must be > 0, got 0"):
            dataclasses.replace(LIMITS, **{key: 0}).validate()
    LIMITS.validate()


def test_tmt_serve_loads_nothing_with_a_bad_limit_and_passes_its_connection_limit(monkeypatch):
    import uvicorn

    from transformer_mt.commands import serve as command

    ran, loaded = {}, []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: ran.update(options))
    monkeypatch.setattr(command, "load_translator", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(serve_app, "create_app", lambda translator, limits: "app")
    with pytest.raises(ConfigError, match="max_connections"):
        command.serve(dataclasses.replace(LIMITS, max_connections=0))
    assert loaded == []
    command.serve(dataclasses.replace(LIMITS, max_connections=7))
    assert ran["limit_concurrency"] == 7 and ran["host"] == "127.0.0.1"


class SamplingEcho(GatedEcho):
    """GatedEcho that also samples, reseeding a torch generator as our model's search does."""

    strategies = (Strategy.beam, Strategy.greedy, Strategy.sample)

    def reseed(self, seed: int) -> None:
        torch.Generator().manual_seed(seed)


@pytest.fixture
def serve_loading_nothing(monkeypatch):
    """tmt-serve's command with no model to load and no uvicorn to run: the models it would
    load, and the options uvicorn.run would get, are recorded."""
    import uvicorn

    from transformer_mt.commands import serve as command

    loaded, ran = [], {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: ran.update(options))
    monkeypatch.setattr(command, "load_translator", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(serve_app, "create_app", lambda translator, limits: "app")
    return command.serve, loaded, ran


def test_a_host_that_does_not_resolve_or_a_port_in_use_is_refused_before_the_model_loads(
    serve_loading_nothing,
):
    """Review t6, C11: host=no.such.host.invalid failed after the model had loaded, with
    uvicorn's words and no key named."""
    serve, loaded, ran = serve_loading_nothing
    with pytest.raises(ConfigError, match="config key 'host': 'no.such.host.invalid' does not"):
        serve(dataclasses.replace(LIMITS, host="no.such.host.invalid"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"config key 'port': {port} is in use on 127.0"):
            serve(dataclasses.replace(LIMITS, port=port))
    assert loaded == [] and ran == {}


@pytest.mark.parametrize("host,level", [("127.0.0.1", "INFO"), ("0.0.0.0", "WARNING")])
def test_the_server_says_at_start_that_slow_clients_need_a_proxy(
    serve_loading_nothing, caplog, host, level
):
    """Review t6, C7: uvicorn has no timeout for a request that arrives incompletely (its
    timeout_keep_alive runs only between requests), so clients that send half a request hold
    the connection slots. serving.md says a reverse proxy must time them out, and so does the
    server's log at start: a warning where it listens beyond this machine."""
    serve, _, ran = serve_loading_nothing
    with caplog.at_level(logging.INFO, logger="transformer_mt"):
        serve(dataclasses.replace(LIMITS, host=host, max_connections=7))
    (said,) = [r for r in caplog.records if "does not time out a request" in r.getMessage()]
    assert said.levelname == level
    assert "max_connections=7" in said.getMessage() and "reverse proxy" in said.getMessage()
    assert ran["host"] == host


def test_a_request_whose_reseed_fails_gets_the_error_and_the_worker_answers_the_next(backend):
    """Past the request's checks (as a bug in them would let it), a seed torch refuses fails
    that request only: the worker thread lives on and translates the next one."""
    backend = SamplingEcho(backend.words)
    backend.gate.set()
    translator = Translator(backend, Tokenizers(backend.words, backend.words), DECODE)
    batcher = Batcher(translator, max_pending_pieces=40)

    def work(decode: DecodeConfig) -> QueuedWork:
        return QueuedWork(translator.encode(["a b"]), decode, None, 3, lambda r: r[0][0].text)

    overflowing = dataclasses.replace(DECODE, strategy=Strategy.sample, seed=2**64)
    try:
        bad = batcher.submit(work(overflowing))
        # The limits only keep a broken worker from hanging the test run.
        with pytest.raises(ValueError, match="Overflow"):
            bad.result(timeout=60)
        assert batcher.submit(work(DECODE)).result(timeout=60) == "a b"
        assert batcher.worker.is_alive()
    finally:
        batcher.stop()


def test_the_batch_sizes_kept_are_bounded(backend):
    """A server answers requests for months: it remembers the sizes of its last 1,000 batches,
    not of every one."""
    backend.gate.set()
    translator = Translator(backend, Tokenizers(backend.words, backend.words), DECODE)
    batcher = Batcher(translator, max_pending_pieces=40)
    try:
        for _ in range(1200):  # one after another: each its own batch
            work = QueuedWork(translator.encode(["a"]), DECODE, None, 2, lambda r: r[0][0].text)
            assert batcher.submit(work).result(timeout=60) == "a"
        assert list(batcher.batch_sizes) == [1] * 1000
    finally:
        batcher.stop()
