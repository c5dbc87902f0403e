"""Print pip's arguments for the torch build `make install` takes: the one TORCH_CUDA names
(the first argument: cpu, cu126, cu130), else the newest CUDA build this machine's NVIDIA driver
runs (nvidia-smi's "CUDA Version"), else the CPU build where there is no nvidia-smi. Where the
driver runs no build, say which driver is needed on stderr and exit 1.

Runs before torch and the package are installed, with any Python: it reads the package's
torch_builds module from this repository, which imports the standard library only.

    python scripts/torch_index.py          # e.g. --index-url https://download.pytorch.org/whl/cu130
    python scripts/torch_index.py cu126    # --index-url https://download.pytorch.org/whl/cu126
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, not installed yet
from transformer_mt.errors import ConfigError  # noqa: E402
from transformer_mt.torch_builds import (  # noqa: E402
    detected_build,
    index_arguments,
    nvidia_smi,
    requested_build,
)


def main() -> int:
    parser = argparse.ArgumentParser(description="pip's index arguments for make install's torch")
    parser.add_argument(
        "build", nargs="?", default="", help="TORCH_CUDA: cpu, cu126 or cu130 (default: detect)"
    )
    requested = parser.parse_args().build
    try:
        build = requested_build(requested) if requested else detected_build(nvidia_smi())
    except ConfigError as error:
        print(f"make install: {error}", file=sys.stderr)
        return 1
    print(" ".join(index_arguments(build)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
