"""Two users of one machine: the second one's HAProxy starts although the first one's runs
left their files behind (issue 31: 86 tests failed for a second user).

What failed was Serve's HAProxy directory setup (`HAProxyApi._initialize_directories_and_
error_files`, run by the HAProxy manager at start-up) under fixed paths in /tmp that the
first user's runs had created. This test runs that very step as two throwaway unprivileged
users, first under Serve's default layout (reproducing the PermissionError) and then at the
paths the launcher chooses. A shared sticky directory stands in for /tmp, so the real
/tmp/haproxy-serve of whoever else uses the machine is never touched. That the running app
puts its files in the instance's directory is checked in tests/serve/test_front_door_served.py.

It needs root to switch users; without root it is skipped. The users are uids with no
account: setuid needs none, and nothing is added to /etc/passwd. They are switched to in a
forked child of this process rather than through `setpriv python ...`: the interpreter may
live where only its owner can read (pyenv under /root), and the child needs no new files.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ray.serve._private.haproxy import HAProxyApi, HAProxyConfig

from deployments.launch import paths as launch_paths
from deployments.launch.paths import HAPROXY_PATHS, haproxy_paths, make_instance_dir

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="switching to two other users needs root (CI runs as root)"
)
NODE_ID = "ab" * 28  # Serve scopes every path by the node id, 56 hex digits
SERVE_DEFAULT_DIR = "haproxy-serve"  # Serve's /tmp/haproxy-serve, here inside the shared dir


def _unused_uids(count: int) -> list[int]:
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    return [uid for uid in range(61000, 62000) if uid not in taken][:count]


def _start_haproxy_files(paths: dict[str, str]) -> str:
    """What Serve's HAProxy manager does with the five paths at start-up (HAProxyManager's
    `_per_node` scoping, then HAProxyApi's directory setup); the config file's path."""

    def per_node(path: str) -> str:
        directory, name = os.path.split(path)
        return os.path.join(directory, NODE_ID, name)

    config = HAProxyConfig(
        socket_path=per_node(paths["RAY_SERVE_HAPROXY_SOCKET_PATH"]),
        server_state_base=os.path.join(paths["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"], NODE_ID),
        server_state_file=per_node(paths["RAY_SERVE_HAPROXY_SERVER_STATE_FILE"]),
        metrics_socket_path=per_node(paths["RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"]),
        enable_hap_optimization=True,
    )
    config_file = per_node(paths["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"])
    return HAProxyApi(cfg=config, config_file_path=config_file).config_file_path


def serve_default_paths(shared: Path) -> dict[str, str]:
    """Serve's fixed defaults, with the shared directory in place of /tmp."""
    base = shared / SERVE_DEFAULT_DIR
    return {var: str(base / name if name else base) for var, name in HAPROXY_PATHS.items()}


def launcher_paths(shared: Path) -> dict[str, str]:
    # Nothing binds a socket here, and the shared directory is longer than /tmp.
    launch_paths.SOCKET_PATH_MAX = 4096
    instance, _ = make_instance_dir({"TMPDIR": str(shared)})
    if not instance.is_relative_to(shared):  # not in the real /tmp, a fallback
        raise RuntimeError(f"{instance} is outside {shared}")
    return haproxy_paths(instance, {})


def as_user(uid: int, step: Callable[[], dict[str, str]]) -> str:
    """Runs Serve's HAProxy file setup on the paths `step` chooses, as `uid`, in a forked
    child; the config file's path (Serve writes the file later, its directory now), or the
    error's type and text."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.umask(0o022)
            outcome = {"config": _start_haproxy_files(step())}
        except BaseException as exc:
            outcome = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(writer, json.dumps(outcome).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        outcome = json.loads(pipe.read())
    os.waitpid(child, 0)
    return outcome.get("config") or outcome["error"]


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky directory, as /tmp is."""
    path = Path(tempfile.mkdtemp(prefix="2u", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path)


def test_serves_fixed_paths_fail_the_second_user(shared: Path) -> None:
    """The failure as users met it, so the test below is known to test something."""
    first, second = _unused_uids(2)
    assert as_user(first, lambda: serve_default_paths(shared)).startswith(str(shared))
    assert as_user(second, lambda: serve_default_paths(shared)).startswith("PermissionError")


def test_the_launchers_paths_work_for_a_second_user_after_the_first(shared: Path) -> None:
    first, second = _unused_uids(2)
    # The first user's runs leave both layouts behind, as a killed launcher would.
    as_user(first, lambda: serve_default_paths(shared))
    first_config = Path(as_user(first, lambda: launcher_paths(shared)))
    assert first_config.parent.is_dir(), first_config  # else it is the error's text
    # The second user, twice: each start gets a directory of its own (the first one's,
    # its launcher gone, is swept by the second).
    configs = [Path(as_user(second, lambda: launcher_paths(shared))) for _ in range(2)]
    user_dir = shared / f"tributary-{second}"
    assert all(config.is_relative_to(user_dir) for config in configs), configs
    assert configs[0].parents[1] != configs[1].parents[1]
    assert (configs[1].parent / "500.http").is_file()
    assert user_dir.stat().st_uid == second
    assert user_dir.stat().st_mode & 0o777 == 0o700
    assert first_config.parent.is_dir()  # the second user left the first one's alone
