"""Ends one generation replica's engine thread, for the served recovery test.

    python -m tests.serve.engine_drill <gcs address> <app> <deployment>

Connects to the server's Ray (by its address: other Ray instances may run on the machine)
as a driver, prints "ready" once it holds the deployment's
handle, waits for a line on stdin, then calls `drill_engine_failure` and prints
"drilled <monotonic time before the call> <result>". A separate process: the test's own
process stays free of Ray."""

from __future__ import annotations

import sys
import time


def main(address: str, app: str, deployment: str) -> None:
    import ray
    from ray import serve

    ray.init(address=address, namespace="serve", log_to_driver=False)
    try:
        handle = serve.get_deployment_handle(deployment, app_name=app)
        handle.engine_alive.remote().result()  # the handle knows its replicas now
        print("ready", flush=True)
        sys.stdin.readline()
        began = time.monotonic()
        result = handle.drill_engine_failure.remote().result()
        print(f"drilled {began} {result}", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
