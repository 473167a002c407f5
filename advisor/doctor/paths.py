"""Checks of the user's paths: the data directory is readable, the checkpoint directory writable.
Nothing is written except a uniquely named temp file (or directory) that is deleted at once."""

from __future__ import annotations

import errno
import os
import shlex
import tempfile
from pathlib import Path

from .checks import FAIL, PASS, WARN, Check


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_data(data: str) -> Check:
    """Check 6a: the data directory exists, is a directory, can be listed, has an entry, and its first regular
    file can be read (one byte). The same path must exist on every node (pitfall 18)."""
    path = Path(os.path.abspath(data))
    same = "pass the dataset directory as it is on this node (the same path on every node)"
    found = _nearest_existing(path)
    if found != path:
        if not found.is_dir():
            return Check("data", FAIL, f"{path}: not a directory ({found} is a file)", same)
        return Check("data", FAIL, f"{path} does not exist", f"{same}; mount or copy the data there")
    if not path.is_dir():
        return Check("data", FAIL, f"{path}: not a directory", "pass the directory that holds the data files")
    chmod = f"make it readable for this user (chmod -R u+rX {shlex.quote(str(path))}) or fix the path"
    try:
        with os.scandir(path) as it:
            entries = [e for _, e in zip(range(1001), it)]
        first = next((e for e in entries if e.is_file()), None)
        if first is not None:
            with open(first.path, "rb") as fh:
                fh.read(1)
    except OSError as err:
        return Check("data", FAIL, f"{path} is not readable ({err.filename or path}: {err.strerror or err})", chmod)
    if not entries:
        return Check("data", WARN, f"{path} is empty", "copy or mount the dataset there before training")
    count = "1000+ entries" if len(entries) > 1000 else f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    return Check("data", PASS, f"{path}: readable, {count}")


def _can_create(directory: Path, as_dir: bool) -> OSError | None:
    """Create and delete a uniquely named temp file (or directory) in ``directory``; ``None`` on success,
    else the error. ``mkstemp``/``mkdtemp`` use O_EXCL, so nothing existing is ever overwritten."""
    try:
        if as_dir:
            os.rmdir(tempfile.mkdtemp(prefix=".advisor-doctor-", dir=directory))
        else:
            fd, name = tempfile.mkstemp(prefix=".advisor-doctor-", dir=directory)
            try:
                os.write(fd, b"advisor doctor write test\n")
            finally:
                os.close(fd)
                os.unlink(name)
        return None
    except OSError as err:
        return err


def check_ckpt_dir(ckpt_dir: str) -> Check:
    """Check 6b: the checkpoint directory is writable (``os.access`` and a real create/delete, because root
    passes ``os.access`` on read-only mounts), or it is missing but its parent is writable (WARN)."""
    path = Path(os.path.abspath(ckpt_dir))
    quoted = shlex.quote(str(path))
    found = _nearest_existing(path)
    if found.exists() and not found.is_dir():
        where = "" if found == path else f" ({found} is a file)"
        return Check(
            "ckpt-dir",
            FAIL,
            f"{path}: not a directory{where}",
            "pass a directory path (the same on every node); no file may stand in its way",
        )
    target = path if found == path else path.parent
    if found not in (path, path.parent):
        return Check(
            "ckpt-dir",
            FAIL,
            f"neither {path} nor its parent exists (nearest existing: {found})",
            f"create it on every node (mkdir -p {quoted}) or fix the path",
        )
    err = _can_create(target, as_dir=target != path)
    if err is not None:
        reason = f"creating a test {'directory' if target != path else 'file'}: {err.strerror or err}"
    elif not os.access(target, os.W_OK | os.X_OK):
        reason = "os.access says no write permission"
    else:
        reason = None
    if reason is not None:
        what = "" if target == path else f"does not exist and its parent {target} "
        if err is not None and err.errno == errno.EROFS:
            fix = "the file system is mounted read-only: pick a path on a writable disk, the same on every node"
        elif err is not None and err.errno not in (errno.EACCES, errno.EPERM):
            # /proc, /sys and the like refuse new entries whatever the permissions: chmod cannot help
            fix = "this file system does not take new files: pick a path on a disk, the same on every node"
        else:
            fix = (
                f"chmod u+w {shlex.quote(str(target))} (or chown it to this user), check the mount is read-write, "
                "or pick a writable path"
            )
        return Check("ckpt-dir", FAIL, f"{path} {what}is not writable ({reason})", fix)
    if target != path:
        return Check(
            "ckpt-dir",
            WARN,
            f"{path} does not exist; its parent is writable, so it will be created",
            f"create it now on every node (mkdir -p {quoted}) so all ranks see the same path",
        )
    return Check("ckpt-dir", PASS, f"{path} is writable (created and deleted a temp file)")
