"""deployments.launch refuses a metrics port that is taken before it starts Ray (Ray
itself would fail half a minute later with an unrelated-sounding timeout)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_taken_metrics_port_is_refused_at_once_naming_the_port() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "deployments.launch", f"--metrics-port={port}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"port {port} for Ray's metrics is in use" in result.stderr
    assert "METRICS_PORT" in result.stderr
