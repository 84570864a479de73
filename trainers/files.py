"""Atomic writes: a crash or a kill never leaves a half-written report behind."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to a temporary file beside ``path`` and renames it into place."""
    _write(path, text, "w")


def write_bytes(path: str, data: bytes) -> None:
    """`write_text` for bytes (a figure's PNG)."""
    _write(path, data, "wb")


def _write(path, content, mode):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = _new_file_beside(path)
    try:
        with os.fdopen(fd, mode, **({"newline": ""} if mode == "w" else {})) as f:
            f.write(content)
        _keep_permissions(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _new_file_beside(path: str) -> tuple[int, str]:
    """A new temporary file in ``path``'s folder, made as ``open`` makes a file (0o666 less the
    umask, and the folder's default ACL), not as ``tempfile.mkstemp`` does (0o600, which would
    hide a report or an exported model's metadata from the other users of a machine)."""
    directory, name = os.path.split(os.path.abspath(path))
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_BINARY", 0)
    while True:
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def _keep_permissions(path: str, tmp: str) -> None:
    """Gives ``tmp`` the permissions of the ``path`` it replaces, where there is one: a rewritten
    file keeps them. A file system without permissions (FAT, some network shares) keeps its own."""
    try:
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
    except OSError:
        pass


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
