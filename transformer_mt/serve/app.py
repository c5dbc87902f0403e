"""The HTTP API and the page of `tmt-serve` (FastAPI; the `serve` extra).

    POST /translate   {"text": "..."} or {"lines": [...]}, optional decode settings
                      (strategy, beam_size, nbest, length_penalty, temperature, top_k, top_p,
                      seed), "attention": true (with "attention_layer", default the last)
                      and "alignment": true (with "alignment_layer", default the last);
                      "prefix": what each translation must begin with (a string, or a
                      list of one per line); "glossary": [{"source", "target"}] term pairs
                      and "constraints": a list of target terms per line, which each
                      translation must contain (beam search; "unmet_terms": true where
                      none met them all: translated without them)
                      -> {"translations": [{"text", "nbest": [{"text", "score"}],
                          "attention": {"source_pieces", "target_pieces", "weights", "layer"}
                          or null, "alignment": [[source word, target word], ...] or null}],
                          "decode": the settings used, "precision" as computed ("fp32
                          (auto)")}
    POST /score       {"pairs": [{"source", "target"}]}, optional "length_penalty" and "tgt_lang"
                      -> {"scores": [{"normalised", "log_prob", "per_piece", "pieces"} or
                          null for an empty source], "decode": the settings used}
                      (decode/scoring.py: the model's score of each given translation)
    GET /             a page to try it: translation, n-best list, attention heat map
    GET /health       {"status": "ok", "model": the checkpoint's file name and update,
                       "decode": the default settings, as /translate's "decode"}

Limits (the ServeJob's keys), each answered with a message saying what was exceeded: a body
other than application/json (415); the request's size (413, before reading more than the
limit plus one chunk); lines, characters of a line, the beam, source pieces, attention cells
(422); pending work over its bound (503 with Retry-After); no answer within the deadline (504).
Malformed JSON or unknown fields: 422 with what is wrong. There is no authentication: see the
README before binding beyond 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib.resources
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from transformer_mt.config import SEED_RANGE, DecodeConfig, ServeJob, Strategy
from transformer_mt.decode.glossary import Glossary
from transformer_mt.decode.scoring import PairScore
from transformer_mt.decode.translator import AttentionMap, Translator
from transformer_mt.errors import ConfigError
from transformer_mt.serve.batcher import Batcher, Busy, QueuedWork, Result

RETRY_AFTER_S = 1
"""What a 503 tells the client to wait: about one batch's time on a CPU (benchmarks/serve.txt),
after which the queue has moved on."""
CLIENT_GONE = 499  # nginx's status for a client that closed the connection; nobody receives it


class Refused(Exception):
    """A request answered with an error status and a message, raised where the problem is
    found; the app turns it into the JSON answer {"detail": message, **details}."""

    def __init__(self, status: int, message: str, *, headers: dict | None = None, **details):
        super().__init__(message)
        self.status, self.message, self.headers, self.details = status, message, headers, details

    def response(self) -> JSONResponse:
        body = {"detail": self.message, **self.details}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class GlossaryPair(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(max_length=200)
    target: str = Field(max_length=200)


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    lines: list[str] | None = None
    strategy: Literal["beam", "greedy", "sample"] | None = None
    beam_size: int | None = Field(default=None, ge=1)
    nbest: int | None = Field(default=None, ge=1)
    length_penalty: float | None = Field(default=None, ge=0.0)
    temperature: float | None = Field(default=None, gt=0.0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    tgt_lang: str | None = Field(default=None, max_length=64)
    attention: bool = False
    attention_layer: int = -1
    alignment: bool = False
    alignment_layer: int | None = None
    prefix: str | list[str] | None = None
    glossary: list[GlossaryPair] | None = None
    constraints: list[list[str]] | None = None


class ScoredPair(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str
    target: str


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pairs: list[ScoredPair]
    length_penalty: float | None = Field(default=None, ge=0.0)
    tgt_lang: str | None = Field(default=None, max_length=64)


async def refused_response(_: Request, refused: Refused) -> JSONResponse:
    return refused.response()  # async: Starlette would run a plain function in a thread


def create_app(
    translator: Translator,
    limits: ServeJob,
    *,
    sleep: Callable[[float], Awaitable] = asyncio.sleep,
) -> FastAPI:
    """The application around one Translator (loaded once, by the caller), which answers every
    request with the request's own decode settings. `limits`: the ServeJob whose max_* keys and
    request_timeout_s bound each request (its decode settings are the translator's defaults).
    `sleep`: how a request's deadline is awaited (tests pass a fake clock)."""
    app = FastAPI(title="transformer_mt", docs_url=None, redoc_url=None)
    batcher = Batcher(translator, max_pending_pieces=limits.max_pending_pieces)
    app.state.batcher = batcher
    app.router.add_event_handler("shutdown", batcher.stop)
    app.add_exception_handler(Refused, refused_response)
    page = importlib.resources.files("transformer_mt.serve").joinpath("static/index.html")

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page.read_text(encoding="utf-8")

    @app.get("/health")
    def health() -> dict:
        return {
            "status": "ok",
            "model": model_record(translator.origin),
            "decode": translator.settings_record(),
            "target_languages": translator.target_languages,
        }

    async def queued(request: Request, work: QueuedWork) -> Response:
        try:
            answer = batcher.submit(work)
        except Busy as busy:
            raise Refused(503, str(busy), headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        body = await answered(request, answer, limits.request_timeout_s, sleep)
        return Response(body, media_type="application/json")

    @app.post("/translate")
    async def translate(request: Request) -> Response:
        body = await read_body(request, limits)
        return await queued(request, admitted_work(body, translator, limits))

    @app.post("/score")
    async def score(request: Request) -> Response:
        body = await read_body(request, limits)
        return await queued(request, admitted_scoring(body, translator, limits))

    return app


async def read_body(request: Request, limits: ServeJob) -> bytes:
    """The JSON body, read chunk by chunk and refused (413) once over max_request_bytes, so a
    large or endless upload costs at most the limit plus one chunk (Starlette's request.body()
    would hold all of it first); a declared Content-Length over the limit is refused before
    anything is read."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise Refused(415, f"Content-Type {media_type or 'missing'}: send application/json")
    limit, declared = limits.max_request_bytes, request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"request of {int(declared)} bytes: the limit is {limit}")
    chunks, size = [], 0
    try:
        async with contextlib.aclosing(request.stream()) as stream:
            async for chunk in stream:
                size += len(chunk)
                if size > limit:
                    raise Refused(413, f"request of more than {limit} bytes: the limit is {limit}")
                chunks.append(chunk)
    except ClientDisconnect:
        raise Refused(CLIENT_GONE, "the client closed the connection") from None
    return b"".join(chunks)


def admitted_work(body: bytes, translator: Translator, limits: ServeJob) -> QueuedWork:
    """The work a request asks for, its lines encoded (once: the worker translates these ids),
    or Refused (422) saying what is wrong with it."""
    asked = parsed(TranslateRequest, body)
    lines = request_lines(asked, limits)
    try:
        decode = requested_decode(translator, asked, limits)
        ids = translator.encode(lines, decode)  # after the tag of decode.tgt_lang
    except ConfigError as error:
        raise Refused(422, str(error)) from None
    prefixes = request_prefixes(asked, lines, limits)
    if prefixes is not None:
        prefixes = translator.encode_prefixes(prefixes)
    terms = request_terms(asked, lines, decode, translator, limits)
    pieces = sum(len(s) + 1 for s in ids) + sum(map(len, prefixes or []))
    if pieces > limits.max_pending_pieces:
        raise Refused(422, f"{pieces} source pieces: the limit is {limits.max_pending_pieces}")
    if asked.attention or asked.alignment:
        check_attention_cells(ids, decode, translator.max_source_tokens, limits)
    layer = asked.attention_layer if asked.attention else None
    try:
        aligned = translator.alignment_layer(asked.alignment_layer) if asked.alignment else None
    except ConfigError as error:
        raise Refused(422, str(error)) from None
    render = functools.partial(answer_bytes, decode=translator.settings_record(decode))
    return QueuedWork(
        ids,
        decode,
        layer,
        pieces,
        render,
        alignment_layer=aligned,
        prefixes=prefixes,
        terms=terms,
    )


def request_terms(
    asked: TranslateRequest,
    lines: list[str],
    decode: DecodeConfig,
    translator: Translator,
    limits: ServeJob,
) -> list[list[list[int]]] | None:
    """Each line's target terms, encoded: its "constraints" (a list of terms per line) and the
    terms of the request's "glossary" whose source term occurs in it (Translator.line_terms);
    Refused (422) saying what is wrong."""
    if asked.constraints is not None and len(asked.constraints) != len(lines):
        raise Refused(
            422,
            f"{len(asked.constraints)} lists of constraints for {len(lines)} lines: give one "
            "per line",
        )
    if asked.glossary is not None and len(asked.glossary) > limits.max_glossary_pairs:
        raise Refused(
            422, f"{len(asked.glossary)} glossary pairs: the limit is {limits.max_glossary_pairs}"
        )
    try:
        glossary = None
        if asked.glossary is not None:
            pairs = [(pair.source, pair.target) for pair in asked.glossary]
            glossary = Glossary.of_pairs(pairs, translator.unicode_form)
        # the server's glossary (translator.decode's) unless the request has its own
        terms = translator.line_terms(lines, translator.decode, asked.constraints, glossary)
        if terms is not None and decode.terms_refusal() is not None:
            raise ConfigError(decode.terms_refusal())
    except ConfigError as error:
        raise Refused(422, str(error)) from None
    return terms


def request_prefixes(
    asked: TranslateRequest, lines: list[str], limits: ServeJob
) -> list[str] | None:
    """Each line's target prefix ("prefix": a string with "text", a list of one per line with
    "lines"), or None; Refused (422) saying what is wrong."""
    if asked.prefix is None:
        return None
    if isinstance(asked.prefix, str) != (asked.text is not None):
        raise Refused(
            422, 'give "prefix" as a string with "text", or as a list of one per line with "lines"'
        )
    prefixes = [asked.prefix] if isinstance(asked.prefix, str) else asked.prefix
    if len(prefixes) != len(lines):
        raise Refused(422, f"{len(prefixes)} prefixes for {len(lines)} lines: give one per line")
    checked_lines(prefixes, limits, "prefix")
    return prefixes


def parsed(model: type[BaseModel], body: bytes):
    """The request's JSON as `model`, or Refused (422) saying what is wrong with it."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        errors = [
            {"where": ".".join(map(str, e["loc"])) or "body", "problem": e["msg"]}
            for e in error.errors(include_url=False, include_context=False)
        ]
        raise Refused(422, "the request is not valid", errors=errors) from None


def admitted_scoring(body: bytes, translator: Translator, limits: ServeJob) -> QueuedWork:
    """The scores a request asks for, its pairs encoded (once), or Refused (422) saying what is
    wrong with it. Its pieces, source and target, count against max_pending_pieces."""
    asked = parsed(ScoreRequest, body)
    if len(asked.pairs) > limits.max_lines:
        raise Refused(422, f"{len(asked.pairs)} pairs: the limit is {limits.max_lines} per request")
    for side in ("source", "target"):
        checked_lines([getattr(pair, side) for pair in asked.pairs], limits, f"pair's {side}")
    changes = {
        name: getattr(asked, name)
        for name in ("length_penalty", "tgt_lang")
        if getattr(asked, name) is not None
    }
    try:
        decode = translator.checked(dataclasses.replace(translator.decode, **changes))
        ids = translator.encode([pair.source for pair in asked.pairs], decode)
    except ConfigError as error:
        raise Refused(422, str(error)) from None
    targets = translator.encode_targets([pair.target for pair in asked.pairs])
    pieces = sum(len(s) + 1 for s in ids) + sum(len(t) + 1 for t in targets)
    if pieces > limits.max_pending_pieces:
        raise Refused(422, f"{pieces} pieces: the limit is {limits.max_pending_pieces}")
    render = functools.partial(scores_bytes, decode=translator.settings_record(decode))
    return QueuedWork(ids, decode, None, pieces, render, targets=targets)


def request_lines(asked: TranslateRequest, limits: ServeJob) -> list[str]:
    """The lines to translate, or Refused (422) saying why not."""
    if (asked.text is None) == (asked.lines is None):
        raise Refused(422, 'give either "text" (one sentence) or "lines" (a list of sentences)')
    lines = [asked.text] if asked.text is not None else asked.lines
    if len(lines) > limits.max_lines:
        raise Refused(422, f"{len(lines)} lines: the limit is {limits.max_lines} per request")
    checked_lines(lines, limits, "line")
    return lines


def checked_lines(lines: list[str], limits: ServeJob, what: str) -> None:
    """Refused (422) naming the first of `lines` (each a `what`) over max_line_chars or holding
    a line break."""
    for number, line in enumerate(lines):
        if len(line) > limits.max_line_chars:
            raise Refused(
                422,
                f"{what} {number} has {len(line)} characters: the limit is {limits.max_line_chars}",
            )
        if "\n" in line or "\r" in line:
            raise Refused(
                422, f"{what} {number} holds a line break: send each sentence as its own line"
            )


def check_attention_cells(
    ids: list[list[int]], decode: DecodeConfig, max_source_tokens: int | None, limits: ServeJob
) -> None:
    """Refused (422) unless the attention maps fit max_attention_cells. Known before decoding,
    so an oversized request costs nothing: the bound is, per non-empty line, (source pieces +
    EOS) x the longest output the search may write (max_len_a * source + max_len_b, EOS
    included); the maps themselves are at most that."""
    cells = 0
    for line in ids:
        if line:
            source = min(len(line), max_source_tokens or len(line))  # as the search reads it
            cells += (source + 1) * max(1, int(decode.max_len_a * source + decode.max_len_b))
    if cells > limits.max_attention_cells:
        raise Refused(
            422,
            f"attention for these lines could take {cells} weights: the limit is "
            f"{limits.max_attention_cells} (send fewer or shorter lines, or no attention)",
        )


async def answered(
    request: Request, answer: Future, timeout: float, sleep: Callable[[float], Awaitable]
) -> bytes:
    """The work's answer; Refused 504 once sleep(timeout) is over. Whatever ends the wait (the
    answer, the deadline, the client hanging up, this handler's cancellation) cancels the work,
    so work not yet started is never computed (running work is not interrupted)."""
    waiting = asyncio.wrap_future(answer)
    gone = asyncio.ensure_future(hung_up(request))
    late = asyncio.ensure_future(sleep(timeout))
    try:
        await asyncio.wait({waiting, gone, late}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        answer.cancel()
        for waiter in (waiting, gone, late):
            waiter.cancel()
    if answer.done() and not answer.cancelled():
        try:
            return answer.result()
        except ConfigError as error:  # e.g. attention from a model that has none
            raise Refused(422, str(error)) from None
    if gone.done() and not gone.cancelled():
        raise Refused(CLIENT_GONE, "the client closed the connection")
    raise Refused(504, f"no translation within {timeout:g} s: try again later, or send less")


async def hung_up(request: Request) -> None:
    """Returns once the client has disconnected. uvicorn goes on running the handler of a
    client that has gone, so the handler listens for it (after the body, the next message is
    http.disconnect, which comes when the client goes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def answer_bytes(results: Result, decode: dict) -> bytes:
    """The JSON of /translate's answer, built in the worker thread: serialising a large answer
    on the event loop would hold up /health and every other client. `decode`: the request's
    settings as the search runs them (Translator.settings_record)."""
    answer = {
        "translations": [
            {
                "text": nbest[0].text,
                "nbest": [{"text": t.text, "score": t.score} for t in nbest],
                "attention": attention_record(nbest[0].attention),
                "alignment": nbest[0].alignment,
                "unmet_terms": nbest[0].unmet_terms,
            }
            for nbest in results
        ],
        "decode": decode,
    }
    return json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def scores_bytes(results: list[PairScore | None], decode: dict) -> bytes:
    """The JSON of /score's answer (built in the worker thread, as `answer_bytes`)."""
    answer = {
        "scores": [
            None
            if pair is None
            else {
                "normalised": pair.normalised,
                "log_prob": pair.log_prob,
                "per_piece": pair.per_piece,
                "pieces": pair.pieces,
            }
            for pair in results
        ],
        "decode": decode,
    }
    return json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def attention_record(attended: AttentionMap | None) -> dict | None:
    """The map with weights rounded to 3 decimals: what a heat map can show, in a third of the
    bytes of full floats."""
    if attended is None:
        return None
    return {
        "source_pieces": attended.source_pieces,
        "target_pieces": attended.target_pieces,
        "weights": [[round(weight, 3) for weight in row] for row in attended.weights],
        "layer": attended.layer,
    }


def requested_decode(
    translator: Translator, asked: TranslateRequest, limits: ServeJob
) -> DecodeConfig:
    """The server's decode settings with the request's own; ConfigError when they are not
    possible (over max_beam_size, or not with this translator's model)."""
    changes = {
        name: getattr(asked, name)
        for name in (
            "beam_size",
            "nbest",
            "length_penalty",
            "temperature",
            "top_k",
            "top_p",
            "seed",
            "tgt_lang",
        )
        if getattr(asked, name) is not None
    }
    if asked.strategy is not None:
        changes["strategy"] = Strategy(asked.strategy)
    decode = dataclasses.replace(translator.decode, **changes)
    if decode.beam_size > limits.max_beam_size:
        raise ConfigError(f"beam_size {decode.beam_size}: the limit is {limits.max_beam_size}")
    if decode.terms_refusal() is not None:  # request_terms refuses it for lines with terms
        decode = dataclasses.replace(decode, glossary=None)
    return translator.checked(decode)


def model_record(origin: dict | None) -> dict | None:
    """Which model answers: the checkpoint's file name with its update (or format), never its
    path, which would tell every visitor where the server keeps its files (an ensemble: the
    list of its checkpoints' names)."""
    if origin is None:
        return None
    paths = origin["checkpoint"]
    names = Path(paths).name if isinstance(paths, str) else [Path(p).name for p in paths]
    return {**origin, "checkpoint": names}
