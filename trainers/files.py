"""Atomic writes: a crash or a kill never leaves a half-written report behind."""

from __future__ import annotations

import json
import os
import tempfile


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to a temporary file beside ``path`` and renames it into place."""
    _write(path, text, "w")


def write_bytes(path: str, data: bytes) -> None:
    """`write_text` for bytes (a figure's PNG)."""
    _write(path, data, "wb")


def _write(path, content, mode):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode, **({"newline": ""} if mode == "w" else {})) as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json(path: str, value, **kwargs) -> None:
    """``json.dump`` of ``value`` (indent 2 unless given), atomically."""
    kwargs.setdefault("indent", 2)
    write_text(path, json.dumps(value, **kwargs))
