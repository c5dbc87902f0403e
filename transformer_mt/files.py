"""Files that a killed process can never leave half-written: write beside, then rename."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def write_text_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def copy_atomically(source: Path, target: Path) -> None:
    temporary = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, temporary)
    os.replace(temporary, target)
