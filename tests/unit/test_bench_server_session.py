"""bench/server.py starts the launcher in a process group of its own, inside the caller's
session: a last-resort kill of the group hits only the server, and Linux's per-session
scheduling groups do not weigh the whole server as one process against its load generator."""

import os
from pathlib import Path

from bench.server import launch, stop_like_ctrl_c

STANDS_IN = "import time\ntime.sleep(60)\n"


def test_the_server_runs_in_a_group_of_its_own_inside_the_callers_session(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "deployments" / "launch").mkdir(parents=True)
    (root / "deployments" / "__init__.py").write_text("")
    (root / "deployments" / "launch" / "__init__.py").write_text("")
    (root / "deployments" / "launch" / "__main__.py").write_text(STANDS_IN)
    config = {"http_options": {"port": 8000}, "applications": []}
    server = launch(config, tmp_path, [], metrics_port=9, root=root)
    try:
        assert os.getpgid(server.process.pid) == server.process.pid
        assert os.getpgid(server.process.pid) != os.getpgid(0)
        assert os.getsid(server.process.pid) == os.getsid(0)
    finally:
        assert stop_like_ctrl_c(server.process, timeout_s=20) == set()
    assert server.process.returncode is not None
