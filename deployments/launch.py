"""Run a Serve config in the foreground on a Ray instance of its own.

`make serve` and the serve tests both start Tributary through this module, so the tests
exercise exactly what a user runs. It sets the process-level switches that must be in
place before Ray starts (they are inherited by the Serve controller and every replica),
then hands over to `serve run`. Ctrl-C makes `serve run` shut Serve down, and the Ray
instance it started goes with it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Set before Ray starts: a local instance of our own (never someone else's cluster), no
# usage reporting (no internet here), and the Serve options that measured best on a
# small machine (docs/benchmarks.md explains each).
RAY_ENVIRONMENT = {
    "RAY_ADDRESS": "local",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def main(argv: list[str]) -> None:
    config = argv[0] if argv else "serve_config.yaml"
    if not Path(config).is_file():
        sys.exit(f"no such Serve config: {config}")
    for key, value in RAY_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    serve = Path(sys.executable).with_name("serve")
    os.execv(serve, [str(serve), "run", config, *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
