"""One module per command: the plain function each `tmt-*` entry point calls (cli.py composes
the configuration and reports errors; these do the work, with the library below them)."""
