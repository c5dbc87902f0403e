"""tmt-serve: load the model once, then answer HTTP requests (transformer_mt/serve/app.py) until
stopped."""

from __future__ import annotations

import logging

from transformer_mt.config import ServeJob
from transformer_mt.decode.loading import load_translator
from transformer_mt.errors import TransformerMTError

log = logging.getLogger(__name__)


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
    translator = load_translator(  # the one Translator of the server's lifetime
        job.run_dir, job.checkpoint, decode=job.decode, device=job.device
    )
    log.info("serving %s on http://%s:%d/", job.run_dir, job.host, job.port)
    uvicorn.run(
        create_app(translator, job),
        host=job.host,
        port=job.port,
        log_level="warning",
        limit_concurrency=job.max_connections,  # beyond it uvicorn answers 503 itself
    )
