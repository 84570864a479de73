"""Atomic writes: a crash or a kill never leaves a half-written report behind."""

from __future__ import annotations

import json
import os
import re
import stat
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
    permissions = _permissions(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode, **({"newline": ""} if mode == "w" else {})) as f:
            f.write(content)
        os.chmod(tmp, permissions)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _permissions(path: str) -> int:
    """The permissions ``path`` keeps when rewritten: its own, or for a new file what ``open``
    gives one (0o666 less the umask). A temporary file is made 0o600, which would hide a report or
    an exported model's metadata from the other users of a machine (a serving process's, say)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:  # reads it without setting it (Linux 4.7 and later)
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# A list of numbers as json.dumps lays it out with an indent: one number a line. JSON strings hold
# no raw newline, so no text inside a string matches.
_NUMBER_LIST = re.compile(r"\[\n\s*(-?[0-9][-+0-9.eE]*(?:,\n\s*-?[0-9][-+0-9.eE]*)*)\n\s*\]")


def write_json(path: str, value, inline_numbers: bool = False, **kwargs) -> None:
    """``json.dump`` of ``value`` (indent 2 unless given), atomically; with ``inline_numbers``,
    each list of numbers on one line (an attention map's rows stay readable)."""
    kwargs.setdefault("indent", 2)
    text = json.dumps(value, **kwargs)
    if inline_numbers:
        text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(n.strip() for n in m.group(1).split(",")) + "]", text)
    write_text(path, text)
