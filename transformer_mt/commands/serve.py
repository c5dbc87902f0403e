"""tmt-serve: load the model once, then answer HTTP requests (transformer_mt/serve/app.py) until
stopped."""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket

from transformer_mt.config import ServeJob
from transformer_mt.decode.loading import load_translator
from transformer_mt.errors import ConfigError, TransformerMTError

log = logging.getLogger(__name__)

SLOW_CLIENTS = (
    "uvicorn does not time out a request that arrives incompletely: each client that sends part "
    "of a request and stops holds one of max_connections=%d until it closes the connection; "
    "where untrusted clients reach the server, put a reverse proxy in front that times them out "
    "(nginx's client_header_timeout and client_body_timeout: docs/serving.md)"
)


def serve(job: ServeJob) -> None:
    job.validate()  # before the model loads (its limits too)
    try:
        import uvicorn

        from transformer_mt.serve.app import create_app
    except ImportError as error:
        raise TransformerMTError(
            f"tmt-serve needs the serve extra ({error.name} is missing): pip install "
            "'transformer_mt[serve]'"
        ) from error
    loopback = check_address(job.host, job.port)  # before the model loads, too
    translator = load_translator(  # the one Translator of the server's lifetime
        job.run_dir, job.checkpoint, decode=job.decode, device=job.device, weights=job.weights
    )
    log.info("serving %s on http://%s:%d/", job.run_dir, job.host, job.port)
    log.log(logging.INFO if loopback else logging.WARNING, SLOW_CLIENTS, job.max_connections)
    uvicorn.run(
        create_app(translator, job),
        host=job.host,
        port=job.port,
        log_level="warning",
        limit_concurrency=job.max_connections,  # beyond it uvicorn answers 503 itself
    )


def check_address(host: str, port: int) -> bool:
    """That `host` resolves to an address of this machine and that `port` can be bound there
    (bound once and released, as uvicorn binds it: with SO_REUSEADDR), else a ConfigError
    naming the key; whether the address is a loopback one (reachable from this machine only)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as error:
        cause = getattr(error, "strerror", None) or str(error)
        raise ConfigError(
            f"config key 'host': {host!r} does not resolve ({cause}); give an address or name of "
            "this machine: 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        ) from error
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise unbindable(host, port, error) from error
    return ipaddress.ip_address(address[0].split("%")[0]).is_loopback


def unbindable(host: str, port: int, error: OSError) -> ConfigError:
    """The line for an address the server cannot listen on, naming the key to change."""
    if error.errno == errno.EADDRINUSE:
        return ConfigError(
            f"config key 'port': {port} is in use on {host}: stop what listens there, or choose "
            "another port"
        )
    if error.errno == errno.EACCES:
        return ConfigError(
            f"config key 'port': listening on {port} needs privileges (ports below 1024): "
            "choose a port from 1024 up"
        )
    return ConfigError(
        f"config key 'host': cannot listen on {host} ({error.strerror}): give an address of this "
        "machine: 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
    )
