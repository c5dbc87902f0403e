"""tmt-serve under load: 8 concurrent clients each sending 1-sentence requests, one after the
other, to a server on this machine (loopback only), bounded in count and time; then, with the
server stopped, the library's Translator on the same sentences, one at a time and all at once.

    make bench-serve RUN=runs/multi30k_de_en_small
    .venv/bin/python -m benchmarks.bench_serve --run runs/x --requests 400 --clients 8

Reported: requests/s, p50 / p95 latency of the server; sentences/s of the library. Decoding is
the run's default (beam 4, length penalty 0.6) in both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request

from benchmarks.browser_check import free_port, start_server
from benchmarks.measure import in_fresh_process, report_header
from transformer_mt.data.sources import read_pairs
from transformer_mt.run_dir import RunDir


def post(port: int, sentence: str) -> float:
    """One request's latency in seconds."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/translate",
        data=json.dumps({"text": sentence}).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        json.load(answer)
    return time.perf_counter() - started


def load_server(port: int, sentences: list[str], clients: int, requests: int, seconds: float):
    """(latencies, wall seconds): `clients` threads take the next sentence until `requests` are
    sent or `seconds` have passed."""
    latencies: list[float] = []
    taken = iter(range(requests))
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                index = next(taken, None)
            if index is None:
                return
            latency = post(port, sentences[index % len(sentences)])
            with lock:
                latencies.append(latency)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, time.perf_counter() - started


def percentile(values: list[float], share: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(share * 100) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", default="runs/multi30k_de_en_small", help="a trained run folder")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400, help="at most this many requests")
    parser.add_argument("--seconds", type=float, default=120.0, help="and at most this long")
    args = parser.parse_args()
    sources = [source for source, _ in read_pairs(RunDir(args.run).data_config(), "test")]
    print(
        *report_header("make bench-serve: tmt-serve under concurrent clients, beside the library"),
        sep="\n",
    )
    print(f"# model: {args.run}/checkpoints/last.pt; decoding: the run's defaults (beam 4)")
    port = free_port()
    server = start_server(args.run, port)
    try:
        post(port, sources[0])  # warm-up
        latencies, wall = load_server(port, sources, args.clients, args.requests, args.seconds)
    finally:
        server.terminate()
        server.wait(timeout=30)
    n = len(latencies)
    print(
        f"\nserver, {args.clients} clients, 1 sentence per request, {n} requests in {wall:.1f} s:"
        f" {n / wall:.1f} requests/s; latency p50 {1000 * percentile(latencies, 0.5):.0f} ms, "
        f"p95 {1000 * percentile(latencies, 0.95):.0f} ms"
    )
    one, many = in_fresh_process(time_library, args.run, sources[:n])
    print(
        f"library (Translator in one process, server stopped), the same {n} sentences: one at a "
        f"time {n / one:.1f} sentences/s; all at once (batched) {n / many:.1f} sentences/s"
    )


def time_library(run: str, sentences: list[str]) -> tuple[float, float]:
    """In a process of its own, the server stopped: the seconds of the library's Translator on
    `sentences` one at a time, then all at once (after a warm-up on 8)."""
    from transformer_mt.decode.loading import load_translator

    translator = load_translator(run, device="cpu")
    translator.translate(sentences[:8])
    started = time.perf_counter()
    for sentence in sentences:
        translator.translate([sentence])
    one = time.perf_counter() - started
    started = time.perf_counter()
    translator.translate(sentences)
    return one, time.perf_counter() - started


if __name__ == "__main__":
    main()
