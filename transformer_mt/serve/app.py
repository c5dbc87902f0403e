"""The HTTP API and the page of `tmt-serve` (FastAPI; the `serve` extra).

    POST /translate   {"text": "..."} or {"lines": [...]}, optional decode settings
                      (strategy, beam_size, nbest, length_penalty, temperature, top_k, top_p,
                      seed) and "attention": true (with "attention_layer", default the last)
                      -> {"translations": [{"text", "nbest": [{"text", "score"}],
                          "attention": {"source_pieces", "target_pieces", "weights", "layer"}
                          or null}], "decode": the settings used}
    GET /             a page to try it: translation, n-best list, attention heat map
    GET /health       {"status": "ok", "model": which checkpoint}

Limits (ServeJob): the request's size (413), the number of lines and the characters of a line
(422); malformed JSON or unknown fields: 422 with what is wrong.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.resources
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from transformer_mt.config import DecodeConfig, Strategy, validate_decode
from transformer_mt.decode.translator import Translator
from transformer_mt.errors import ConfigError
from transformer_mt.serve.batcher import Batcher


@dataclasses.dataclass(frozen=True)
class Limits:
    max_request_bytes: int = 65_536
    max_lines: int = 64
    max_line_chars: int = 1_000
    max_beam_size: int = 16


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
    seed: int | None = None
    attention: bool = False
    attention_layer: int = -1


def problem(status: int, message: str, **details) -> JSONResponse:
    return JSONResponse({"detail": message, **details}, status_code=status)


def create_app(translator: Translator, limits: Limits = Limits()) -> FastAPI:
    """The application around one loaded model (loaded once, by the caller)."""
    app = FastAPI(title="transformer_mt", docs_url=None, redoc_url=None)
    batcher = Batcher(translator)
    app.state.batcher = batcher
    app.router.add_event_handler("shutdown", batcher.stop)
    page = importlib.resources.files("transformer_mt.serve").joinpath("static/index.html")

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page.read_text(encoding="utf-8")

    @app.get("/health")
    def health() -> dict:
        return {
            "status": "ok",
            "model": translator.origin,
            "decode": decode_record(translator.decode),
        }

    @app.post("/translate")
    async def translate(request: Request):
        body = await request.body()
        if len(body) > limits.max_request_bytes:
            return problem(
                413, f"request of {len(body)} bytes: the limit is {limits.max_request_bytes}"
            )
        try:
            asked = TranslateRequest.model_validate_json(body)
        except ValidationError as error:
            errors = [
                {"where": ".".join(map(str, e["loc"])) or "body", "problem": e["msg"]}
                for e in error.errors(include_url=False, include_context=False)
            ]
            return problem(422, "the request is not valid", errors=errors)
        lines, refused = request_lines(asked, limits)
        if refused:
            return problem(422, refused)
        try:
            decode = requested_decode(translator.decode, asked, limits)
            Translator(translator.backend, translator.tokenizers, decode)  # checks the strategy
        except ConfigError as error:
            return problem(422, str(error))
        layer = asked.attention_layer if asked.attention else None
        future = batcher.submit(lines, decode, layer)
        try:
            results = await asyncio.wrap_future(future)
        except ConfigError as error:
            return problem(422, str(error))
        return {
            "translations": [
                {
                    "text": nbest[0].text,
                    "nbest": [{"text": t.text, "score": t.score} for t in nbest],
                    "attention": dataclasses.asdict(attended) if attended else None,
                }
                for nbest, attended in results
            ],
            "decode": decode_record(decode),
        }

    return app


def request_lines(asked: TranslateRequest, limits: Limits) -> tuple[list[str], str | None]:
    """The lines to translate, or why the request is refused."""
    if (asked.text is None) == (asked.lines is None):
        return [], 'give either "text" (one sentence) or "lines" (a list of sentences)'
    lines = [asked.text] if asked.text is not None else asked.lines
    if len(lines) > limits.max_lines:
        return [], f"{len(lines)} lines: the limit is {limits.max_lines} per request"
    for number, line in enumerate(lines):
        if len(line) > limits.max_line_chars:
            return [], (
                f"line {number} has {len(line)} characters: the limit is {limits.max_line_chars}"
            )
        if "\n" in line or "\r" in line:
            return [], f"line {number} holds a line break: send each sentence as its own line"
    return lines, None


DECODE_FIELDS = ("beam_size", "nbest", "length_penalty", "temperature", "top_k", "top_p", "seed")


def requested_decode(default: DecodeConfig, asked: TranslateRequest, limits: Limits):
    """The server's decode settings with the request's own; ConfigError when they are not
    possible."""
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
        )
        if getattr(asked, name) is not None
    }
    if asked.strategy is not None:
        changes["strategy"] = Strategy(asked.strategy)
    decode = dataclasses.replace(default, **changes)
    if decode.beam_size > limits.max_beam_size:
        raise ConfigError(f"beam_size {decode.beam_size}: the limit is {limits.max_beam_size}")
    validate_decode(decode)
    return decode


def decode_record(decode: DecodeConfig) -> dict:
    return {
        name: (value.value if isinstance(value, Strategy) else value)
        for name, value in dataclasses.asdict(decode).items()
    }
