"""Where one launcher's HAProxy files live: a directory of the user's and the instance's own.

Serve's HAProxy manager writes its config, admin and metrics sockets and server state under
fixed paths in /tmp/haproxy-serve/ (ray/serve/_private/constants.py), scoped only by Ray's
node id. The first user's runs leave that directory owned by them, and every other user's
HAProxy then fails at start-up with a PermissionError (86 failed tests for a second user of
one machine). The launcher points all five paths into

    <tmp>/tributary-<uid>/<6 random hex digits>/     (both levels mode 0700)

where <tmp> is $TMPDIR, else /tmp: the first where the sockets' paths are short enough
(below; $XDG_RUNTIME_DIR, /run/user/<uid>, would be the natural place but is already too
long for them). The instance's directory goes when the launcher stops cleanly; one left
by a launcher that died is swept by the next launch of the same user (its lock is free).
Paths the operator set in the environment are kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

# Serve's variable -> the file's name in the instance's directory ("" is the directory).
# The sockets' names are short because their paths must fit in a socket address (below).
HAPROXY_PATHS = {
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
    "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": "",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
    # Where HAProxy sends one log line per request, which Serve reads for its metrics.
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "log.sock",
}
SOCKETS = ("admin.sock", "log.sock")
# Set for the HAProxy wrapper (bin/haproxy_front_door.py), whose temporary files go there too.
INSTANCE_DIR_VARIABLE = "TRIBUTARY_INSTANCE_DIR"
# Serve puts each file one directory deeper, named by the node id (56 hex digits), and
# HAProxy refuses a socket path longer than 97 bytes ("socket path ... too long (max 97)":
# sun_path's 108 less room for the temporary name it binds first).
NODE_ID_CHARS = 56
SOCKET_PATH_MAX = 97
INSTANCE_NAME_BYTES = 3  # 6 hex digits: short, and unique among one user's instances
LOCK_NAME = ".lock"


class InstanceDirError(RuntimeError):
    pass


def bases(environ: Mapping[str, str]) -> list[Path]:
    """Where a user's directory may go, best first, without repeats."""
    found = [environ.get("TMPDIR", ""), tempfile.gettempdir(), "/tmp"]
    unique = dict.fromkeys(Path(b) for b in found if b)
    return list(unique)


def longest_socket_path(instance: Path) -> int:
    longest = max(len(name) for name in SOCKETS)
    return len(os.fsencode(instance)) + 1 + NODE_ID_CHARS + 1 + longest


def private_dir(path: Path) -> bool:
    """Creates `path` (mode 0700) if missing; whether it is now a real directory that this
    user owns and nobody else may enter. A world-writable /tmp lets anyone create the
    name first, so an existing one is checked, never trusted."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return True


def new_locked_dir(parent: Path) -> tuple[Path, int]:
    """A new directory with a short random name (mkdtemp's are longer), and its held lock.
    It is made and locked under a dot-name that sweeps pass over, then renamed: a launcher
    sweeping at the same moment never sees it unlocked."""
    while True:
        name = secrets.token_hex(INSTANCE_NAME_BYTES)
        staging, path = parent / f".{name}", parent / name
        try:
            staging.mkdir(mode=0o700)
        except FileExistsError:
            continue
        lock = hold_lock(staging)
        if not path.exists():  # rename would replace an empty directory
            staging.rename(path)
            return path, lock
        remove_instance_dir(staging, lock)


def hold_lock(directory: Path) -> int:
    """A lock held as long as this process lives (the descriptor is not inherited by the
    processes it starts): the sign that the directory is in use."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def sweep_abandoned(user_dir: Path) -> list[Path]:
    """Removes the instance directories whose launcher is gone (their lock is free)."""
    swept = []
    for child in user_dir.iterdir():
        lock = child / LOCK_NAME
        hidden = child.name.startswith(".")  # being made (new_locked_dir)
        if hidden or child.is_symlink() or not child.is_dir() or not lock.is_file():
            continue
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue  # removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live launcher's
        else:
            shutil.rmtree(child, ignore_errors=True)
            swept.append(child)
        finally:
            os.close(fd)
    return swept


def make_instance_dir(environ: Mapping[str, str]) -> tuple[Path, int]:
    """A new directory for this launcher and the descriptor of its lock; the first base
    where the user's own directory is usable and the sockets' paths fit."""
    uid = os.geteuid()
    refused: list[str] = []
    for base in bases(environ):
        user_dir = base / f"tributary-{uid}"
        if longest_socket_path(user_dir / ("x" * 2 * INSTANCE_NAME_BYTES)) > SOCKET_PATH_MAX:
            refused.append(f"{base}: too long for a socket path")
            continue
        try:
            if not private_dir(user_dir):
                refused.append(f"{user_dir}: not a directory of uid {uid} alone")
                continue
            sweep_abandoned(user_dir)
            return new_locked_dir(user_dir)
        except OSError as exc:
            refused.append(f"{user_dir}: {exc.strerror or exc}")
    raise InstanceDirError(
        "no private directory for HAProxy's files ("
        + "; ".join(refused)
        + "): set TMPDIR to a short directory, or set the RAY_SERVE_HAPROXY_* paths"
    )


def haproxy_paths(instance: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """Serve's HAProxy paths inside `instance`, for each one the operator did not set."""
    chosen = {
        variable: str(instance / name if name else instance)
        for variable, name in HAPROXY_PATHS.items()
        if variable not in environ
    }
    return {**chosen, INSTANCE_DIR_VARIABLE: str(instance)}


def needs_instance_dir(environ: Mapping[str, str]) -> bool:
    return any(variable not in environ for variable in HAPROXY_PATHS)


def remove_instance_dir(instance: Path, lock_fd: int) -> None:
    shutil.rmtree(instance, ignore_errors=True)
    os.close(lock_fd)
