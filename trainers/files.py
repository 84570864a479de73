"""Atomic writes (a crash or a kill never leaves a half-written report behind) and folder locks
(two processes never write one run's or one report's files at once), on local paths and on any
file system TensorFlow reads (``gs://``, ``s3://``, ``hdfs://``, ``ram://``: a path with a scheme),
which goes through ``tf.io.gfile``: only such a path imports TensorFlow."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import warnings


def is_remote(path) -> bool:
    """Whether ``path`` names a file system of TensorFlow's (it has a scheme, like ``gs://``)."""
    return "://" in str(path)


def absolute(path: str) -> str:
    """``path`` made absolute, unless it names a file system of TensorFlow's (already absolute)."""
    return path if is_remote(path) else os.path.abspath(path)


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def listdir(path: str) -> list[str]:
    """The names in the folder ``path`` (without a trailing ``/``, which object stores add)."""
    return [n.rstrip("/") for n in _gfile().listdir(path)] if is_remote(path) else os.listdir(path)


def makedirs(path: str) -> None:
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def read_text(path: str) -> str:
    """The text of ``path``; FileNotFoundError when there is none, on every file system."""
    if not is_remote(path):
        with open(path) as f:
            return f.read()
    if not exists(path):
        raise FileNotFoundError(path)
    with _gfile().GFile(path) as f:
        return f.read()


def replace(source: str, path: str) -> None:
    """Moves ``source`` onto ``path`` (atomic on a local file system; an object store copies)."""
    if is_remote(path):
        _gfile().rename(source, path, overwrite=True)
    else:
        os.replace(source, path)


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to a temporary file beside ``path`` and renames it into place."""
    _write(path, text, "w")


def write_bytes(path: str, data: bytes) -> None:
    """`write_text` for bytes (a figure's PNG)."""
    _write(path, data, "wb")


def _write(path, content, mode):
    if is_remote(path):
        tmp = f"{path}.{secrets.token_hex(4)}.tmp"
        try:
            makedirs(path.rsplit("/", 1)[0])
            with _gfile().GFile(tmp, mode) as f:
                f.write(content)
            replace(tmp, path)
        except BaseException:
            if exists(tmp):
                _gfile().remove(tmp)
            raise
        return
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


class Busy(RuntimeError):
    """Another process holds the folder's lock (`held` with ``wait=False``)."""


@contextlib.contextmanager
def held(folder: str, wait: bool = True, what: str = "writing into"):
    """Holds an exclusive lock on ``folder`` (``flock`` on the folder itself: released on exit,
    or by the system however the process ends). Another process waits for it, or with ``wait``
    False raises `Busy` at once, saying what the holder is doing (``what``). Without ``fcntl``
    (Windows) nothing is locked, nor (with a warning) on a file system that cannot lock a folder,
    nor on TensorFlow's (``gs://``: object stores have no locks; a study's oracle gives a run one
    worker)."""
    if is_remote(folder):
        makedirs(folder)
        yield
        return
    try:
        import fcntl
    except ImportError:
        yield
        return
    os.makedirs(folder, exist_ok=True)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise Busy(f"Another process is {what} {folder} (it holds the folder's lock): wait for it to end "
                       f"or stop it, or use another folder.") from None
        except OSError as error:  # a file system without flock on folders (NFS, some FUSE mounts)
            warnings.warn(f"{folder} cannot be locked here ({error}): nothing stops a second process "
                          f"from writing into it at the same time.", stacklevel=3)
        yield
    finally:
        os.close(descriptor)


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
