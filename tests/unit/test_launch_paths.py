"""deployments.launch.paths: every launcher gets a private directory of its user's and its
own for Serve's HAProxy files, paths the operator set are kept, a directory someone else
planted is not used, and one a dead launcher left is swept. Two real users of one machine:
test_launch_two_users.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.launch import paths as launch_paths
from deployments.launch.paths import (
    HAPROXY_PATHS,
    INSTANCE_DIR_VARIABLE,
    InstanceDirError,
    haproxy_paths,
    make_instance_dir,
    needs_instance_dir,
    remove_instance_dir,
    sweep_abandoned,
)

REAL_SOCKET_PATH_MAX = launch_paths.SOCKET_PATH_MAX


@pytest.fixture
def base(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory for the users' directories. Nothing binds a socket here, so the length
    bound is lifted (a test's directory is longer than /tmp) but where it is tested."""
    monkeypatch.setattr(launch_paths, "SOCKET_PATH_MAX", 4096)
    path = Path(tempfile.mkdtemp(prefix="lp", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_each_instance_gets_a_private_directory_under_the_users_own(base: Path) -> None:
    environ = {"TMPDIR": str(base)}
    first, first_lock = make_instance_dir(environ)
    second, second_lock = make_instance_dir(environ)
    user_dir = base / f"tributary-{os.geteuid()}"
    assert first.parent == second.parent == user_dir
    assert first != second
    assert _mode(user_dir) == _mode(first) == 0o700
    paths = haproxy_paths(first, {})
    assert set(paths) == {*HAPROXY_PATHS, INSTANCE_DIR_VARIABLE}
    assert paths["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] == str(first / "haproxy.cfg")
    assert paths["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] == str(first)
    remove_instance_dir(first, first_lock)
    remove_instance_dir(second, second_lock)
    assert not first.exists() and not second.exists()


def test_an_operators_paths_win() -> None:
    mine = {"RAY_SERVE_HAPROXY_SOCKET_PATH": "/srv/haproxy/admin.sock"}
    chosen = haproxy_paths(Path("/run/x"), mine)
    assert "RAY_SERVE_HAPROXY_SOCKET_PATH" not in chosen
    assert needs_instance_dir(mine)
    assert not needs_instance_dir(dict.fromkeys(HAPROXY_PATHS, "/srv/haproxy/x"))


def test_a_planted_user_directory_is_passed_over(base: Path) -> None:
    """Anyone may create names in /tmp: a symlink (or a directory of another user) where the
    user's directory should be is never followed; the next base is used."""
    planted, fallback = base / "p", base / "f"
    planted.mkdir()
    fallback.mkdir()
    (planted / f"tributary-{os.geteuid()}").symlink_to(base)
    bases = [planted, fallback]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch_paths, "bases", lambda environ: bases)
        instance, lock = make_instance_dir({})
        assert instance.parent == fallback / f"tributary-{os.geteuid()}"
        remove_instance_dir(instance, lock)
        bases.pop()
        with pytest.raises(InstanceDirError, match="not a directory of uid"):
            make_instance_dir({})


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_a_user_directory_another_user_owns_is_passed_over(base: Path) -> None:
    (base / "p").mkdir()
    squatted = base / "p" / f"tributary-{os.geteuid()}"
    squatted.mkdir(mode=0o700)
    os.chown(squatted, 61999, 61999)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch_paths, "bases", lambda environ: [base / "p"])
        with pytest.raises(InstanceDirError, match="not a directory of uid"):
            make_instance_dir({})
    assert list(squatted.iterdir()) == []


def test_an_open_user_directory_of_ones_own_is_closed(base: Path) -> None:
    user_dir = base / f"tributary-{os.geteuid()}"
    user_dir.mkdir()
    user_dir.chmod(0o755)
    instance, lock = make_instance_dir({"TMPDIR": str(base)})
    assert _mode(user_dir) == 0o700
    remove_instance_dir(instance, lock)


def test_a_base_too_long_for_haproxys_socket_paths_is_skipped(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch_paths, "SOCKET_PATH_MAX", REAL_SOCKET_PATH_MAX)
    instance, lock = make_instance_dir({"TMPDIR": str(base)})
    assert not instance.is_relative_to(base)  # /tmp/lp<8 characters> is too long already
    assert launch_paths.longest_socket_path(instance) <= REAL_SOCKET_PATH_MAX
    assert REAL_SOCKET_PATH_MAX == 97  # HAProxy's "socket path ... too long (max 97)"
    remove_instance_dir(instance, lock)


def test_a_dead_launchers_directory_is_swept_a_live_ones_kept(base: Path) -> None:
    environ = {"TMPDIR": str(base)}
    live, live_lock = make_instance_dir(environ)
    dead, dead_lock = make_instance_dir(environ)
    os.close(dead_lock)  # as its launcher's death would
    (dead / "haproxy.cfg").write_text("left behind")
    (live.parent / "notes").write_text("not an instance")
    (live.parent / "bare").mkdir()  # no lock: not an instance's
    (live.parent / ".being-made").mkdir()  # new_locked_dir's before the rename
    (live.parent / ".being-made" / ".lock").touch()
    assert sweep_abandoned(live.parent) == [dead]
    assert live.is_dir() and not dead.exists()
    assert (live.parent / "bare").is_dir() and (live.parent / ".being-made").is_dir()
    remove_instance_dir(live, live_lock)
