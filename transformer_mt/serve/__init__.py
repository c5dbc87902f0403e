"""tmt-serve: an HTTP API and a page around one trained model (the `serve` extra)."""
