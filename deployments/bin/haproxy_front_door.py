"""Run the real HAProxy on a patched copy of the config Serve generated.

Serve writes HAProxy's config itself and execs `RAY_SERVE_HAPROXY_BINARY_PATH -db -f
<config> [-sf <pids> -x <socket>]` at start and at every reload. Two changes are made on
the way, each time, so a reload with a new config keeps them:

- **JSON errors at the front door.** What HAProxy answers by itself (a malformed request
  line, a bad Content-Length, oversized headers: 400; a slow client: 408; no live replica:
  503; ...) gets the API's error body `{"error": {"message", "type", "param", "code"}}`
  from `deployments/static/errors/<status>.http` instead of HAProxy's HTML (and Serve's
  plain-text 500 for 502/503/504, which also hid the real status). The `errorfile` lines
  go into every `defaults` section, replacing Serve's own for the same statuses.
- **JSON back-pressure.** A replica over its `max_queued_requests` answers Serve's own
  plain-text 503; each `frontend` turns a 503 that is not JSON into the API's overloaded
  error (`static/errors/backpressure.response`, with Retry-After), so a client under
  overload only ever sees the documented shape.
- **A bounded wait in front of the ingress.** Each ingress server gets a `maxconn`
  (TRIBUTARY_INGRESS_MAXCONN, default 1024 requests at once per ingress replica); past it
  HAProxy queues, and a POST that finds more than TRIBUTARY_FRONT_QUEUE (default 64)
  requests queued is refused at once with the overloaded error and Retry-After. Without
  this, at twice capacity the ingress spent its CPU accepting and refusing requests and fell
  behind its arrivals, so a backlog no deadline covered built up in front of it. HAProxy's
  queue is ordered: GETs (health, model list) and `X-Priority: realtime` go first, and
  realtime is refused only past four times the bound. `timeout queue`
  (TRIBUTARY_FRONT_QUEUE_TIMEOUT_S, default 5) is the backstop for an ingress that takes
  nothing at all. The ingress itself holds fewer requests than `maxconn`
  (`ingress.admission.max_held_requests`) and admits by predicted wait, so this queue
  only forms while the ingress cannot even accept; both bounds are kept short because
  whatever waits here, admission has not seen.
- **Refusing at the front, on the ingress's word.** Each embedding or rerank response
  carries the share of its key (route family and `X-Priority`: normal, batch or none) the
  ingress wants refused before it (`x-tributary-shed`, in thousandths, and the Retry-After
  for it); HAProxy keeps the latest per key for a few seconds, refuses that share of the
  key's POSTs at random with the API's 429 `load_shed`, and tells the ingress the share it
  applied (`x-tributary-front-shed`). A refusal here costs microseconds, where one in
  Python cost the ingress as much CPU as the model's share of two cores at 2x capacity
  (core/admission/front_shedding.py). The families and headers are
  deployments/http/front_shedding.py's; tests/parts/test_front_door_shedding.py checks they
  agree.
- **One ingress replica for realtime.** For each app named in
  TRIBUTARY_REALTIME_INGRESS (comma-separated; the launcher sets it from the app's
  `ingress.realtime_replica`), a backend with two or more ingress replicas keeps the first
  (by name) for `X-Priority: realtime` requests: the others take everything else, that one
  takes no share of the balance (`weight 0`) and a `use-server` rule sends it realtime.
  Under a flood the realtime requests then wait on an event loop of their own instead of
  behind thousands of normal ones (docs/operations.md, "A replica for realtime"). HAProxy
  ignores the rule while that replica is down, so realtime goes to the others; while
  every other is down, the rest goes to Serve's fallback proxy.
- **503 not_ready while there is no route yet.** Serve starts HAProxy before the app is
  deployed, with no app backend: every request then falls to Serve's `default_backend`,
  a plain-text 404 "Path '/healthz' not found", for the seconds until the ingress
  registers its route. A load balancer or `curl /healthz` loop reads that as "no such
  service". While the config routes to no app at all, that backend answers the API's 503
  not_ready (with Retry-After) instead; once an app route exists, Serve's 404 stands for
  paths no app serves.
- **No kernel splicing (`-dS`).** Serve's config turns on `option splice-request`, and
  with it HAProxy often misses a client's close while the request waits for its
  response, so the ingress never hears that the client left and the model computes an
  answer for nobody.

Standard library only: Serve's HAProxy actor runs this, not the app.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ERROR_DIR = Path(__file__).resolve().parents[1] / "static" / "errors"
BACKPRESSURE = ERROR_DIR / "backpressure.response"
SECTION = re.compile(r"^[A-Za-z]")  # a section keyword starts a line; its settings are indented
ERRORFILE = re.compile(r"^\s+errorfile\s+(\d{3})\s")
SERVER = re.compile(r"^\s+server\s+(\S+)\s+\S+")
# The backend Serve's frontend falls back to when no app route matches.
DEFAULT_BACKEND = "default_backend"
NOT_FOUND = re.compile(r"^\s+http-request\s+return\s+status\s+404\b")


def error_files(directory: Path = ERROR_DIR) -> dict[str, Path]:
    return {path.stem: path for path in sorted(directory.glob("[0-9][0-9][0-9].http"))}


def json_backpressure(response: Path = BACKPRESSURE) -> str:
    """A frontend rule: a 503 from a server that is not JSON becomes our overloaded error."""
    return (
        f"    http-response return errorfile {response} "
        "if { status 503 } !{ res.hdr(content-type) -m sub application/json }"
    )


@dataclass(frozen=True)
class QueueBounds:
    """How much HAProxy lets wait in front of the ingress (module docstring)."""

    ingress_maxconn: int = 1024
    queue: int = 64
    queue_timeout_s: int = 5

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> QueueBounds:
        default = cls()
        return cls(
            ingress_maxconn=_positive(
                environ, "TRIBUTARY_INGRESS_MAXCONN", default.ingress_maxconn
            ),
            queue=_positive(environ, "TRIBUTARY_FRONT_QUEUE", default.queue),
            queue_timeout_s=_positive(
                environ, "TRIBUTARY_FRONT_QUEUE_TIMEOUT_S", default.queue_timeout_s
            ),
        )


def _positive(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        sys.exit(f"{name} must be a positive integer, not {raw!r}")
    return int(raw)


REALTIME_INGRESS = "TRIBUTARY_REALTIME_INGRESS"
# Serve names an app's backend after the app.
APP_BACKEND_PREFIX = "http-"
REPLICA_PREFIX = "SERVE_REPLICA_"


def realtime_apps(environ: Mapping[str, str]) -> frozenset[str]:
    """The apps whose first ingress replica is kept for realtime (module docstring)."""
    raw = environ.get(REALTIME_INGRESS, "")
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def realtime_replica(servers: list[str]) -> list[str]:
    """A backend's server lines with its first ingress replica kept for realtime, when
    it has two or more; else as they are."""
    names = [_server_name(line) for line in servers]
    replicas = sorted(name for name in names if name and name.startswith(REPLICA_PREFIX))
    if len(replicas) < 2:
        return servers
    kept = replicas[0]
    out = [
        f"{line} weight 0" if name == kept else line
        for line, name in zip(servers, names, strict=True)
    ]
    return [*out, f"    use-server {kept} if {{ req.hdr(x-priority) -m str -i realtime }}"]


def bounded_queue(bounds: QueueBounds, response: Path = BACKPRESSURE) -> list[str]:
    """Backend rules: GETs and realtime first in HAProxy's queue; a POST refused at once
    when the queue is past its bound (realtime past four times it)."""
    realtime = "{ req.hdr(x-priority) -m str -i realtime }"
    return [
        f"    timeout queue {bounds.queue_timeout_s}s",
        "    http-request set-priority-class int(-1) if !METH_POST",
        f"    http-request set-priority-class int(-1) if {realtime}",
        f"    http-request return errorfile {response} "
        f"if METH_POST {{ queue gt {bounds.queue} }} !{realtime}",
        f"    http-request return errorfile {response} "
        f"if METH_POST {{ queue gt {4 * bounds.queue} }}",
    ]


# The ingress's names (deployments/http/front_shedding.py); this file imports nothing
# of the app's.
SHED_FAMILIES: dict[str, tuple[str, ...]] = {
    "embed": ("/", "/embed", "/v1/embed", "/v1/embeddings", "/v2/embed"),
    "rerank": ("/rerank", "/v1/rerank", "/v2/rerank"),
}
SHED_CLASSES = ("normal", "batch", "none")
SHARE_HEADER = "x-tributary-shed"
RETRY_HEADER = "x-tributary-shed-retry"
APPLIED_HEADER = "x-tributary-front-shed"
# A share older than this is not applied: the ingress that sent it may be gone, or the
# key's traffic stopped long enough that its load is unknown.
SHARE_FRESH_S = 3
FRONT_REFUSAL = json.dumps(
    {
        "error": {
            "message": "The server is shedding this class of requests; retry after the "
            "Retry-After seconds.",
            "type": "overloaded_error",
            "param": None,
            "code": "load_shed",
        }
    },
    separators=(",", ":"),
)


def front_shedding() -> list[str]:
    """Backend rules: refuse each key's published share of its POSTs, pass the share on to
    the ingress, and keep the share each response brings."""
    rules = [f"    http-request del-header {APPLIED_HEADER}"]
    rules += [f"    acl tb_{f} path {' '.join(paths)}" for f, paths in SHED_FAMILIES.items()]
    rules += [
        "    acl tb_normal req.hdr(x-priority) -m str -i normal",
        "    acl tb_batch req.hdr(x-priority) -m str -i batch",
        "    acl tb_priority_sent req.hdr(x-priority) -m found",
    ]
    keys = [(f, c, f"{f}_{c}") for f in SHED_FAMILIES for c in SHED_CLASSES]
    for family, klass, key in keys:
        which = "!tb_priority_sent" if klass == "none" else f"tb_{klass}"
        mine = f"{{ var(txn.tb_key) -m str {key} }}"
        fresh = f"{{ date(),sub(proc.tb_{key}_at) lt {SHARE_FRESH_S} }}"
        rules += [
            f"    http-request set-var(txn.tb_key) str({key}) if METH_POST tb_{family} {which}",
            f"    http-request set-var(txn.tb_p) var(proc.tb_{key}) if {mine} {fresh}",
            f"    http-request set-var(txn.tb_retry) var(proc.tb_{key}_retry) if {mine}",
        ]
    shares = "{ var(txn.tb_p) -m found }"
    rules += [
        f"    http-request return status 429 content-type application/json "
        f"string '{FRONT_REFUSAL}' hdr retry-after %[var(txn.tb_retry)] "
        f"if {shares} {{ rand(1000),sub(txn.tb_p) lt 0 }}",
        f"    http-request set-header {APPLIED_HEADER} %[var(txn.tb_p)] if {shares}",
    ]
    for _, _, key in keys:
        told = f"if {{ var(txn.tb_key) -m str {key} }} {{ res.hdr({SHARE_HEADER}) -m found }}"
        rules += [
            f"    http-response set-var(proc.tb_{key}) res.hdr({SHARE_HEADER}) {told}",
            f"    http-response set-var(proc.tb_{key}_at) date() {told}",
            f"    http-response set-var(proc.tb_{key}_retry) res.hdr({RETRY_HEADER}) {told}",
        ]
    rules += [
        f"    http-response del-header {SHARE_HEADER}",
        f"    http-response del-header {RETRY_HEADER}",
    ]
    return rules


def _sections(text: str) -> list[list[str]]:
    """The config's lines grouped by section (a keyword at the start of a line opens one);
    lines before the first section form a group of their own."""
    sections: list[list[str]] = [[]]
    for line in text.splitlines():
        if SECTION.match(line):
            sections.append([])
        sections[-1].append(line)
    return sections


def _keyword(section: list[str]) -> str:
    return section[0].split()[0] if section and SECTION.match(section[0]) else ""


def _section_name(section: list[str]) -> str:
    """What follows the keyword: a backend's name."""
    return " ".join(section[0].split()[1:]) if section else ""


def _server_name(line: str) -> str | None:
    server = SERVER.match(line)
    return server.group(1) if server else None


def routes_to_an_app(sections: list[list[str]]) -> bool:
    """Whether any frontend sends requests to a backend of Serve's by its rules (Serve
    writes one `use_backend` line per app route) rather than only to its default."""
    return any(
        line.split()[:1] == ["use_backend"]
        for section in sections
        if _keyword(section) == "frontend"
        for line in section[1:]
    )


def patch_config(
    text: str,
    errors: dict[str, Path],
    bounds: QueueBounds | None = None,
    realtime: frozenset[str] = frozenset(),
) -> str:
    """`text` with our errorfile lines in each `defaults` section, and any errorfile line
    there for one of the same statuses dropped (HAProxy would keep the last one); the
    JSON back-pressure rule in each `frontend`; in each backend with servers, the
    bounded queue and a `maxconn` on every server, and for the apps in `realtime` an
    ingress replica kept for realtime; and while no app has a route, our 503 not_ready
    from Serve's `default_backend` in place of its 404."""
    bounds = bounds or QueueBounds()
    realtime_backends = {f"{APP_BACKEND_PREFIX}{app}" for app in realtime}
    ours = [f"    errorfile {status} {path}" for status, path in errors.items()]
    sections = _sections(text)
    starting = not routes_to_an_app(sections) and "503" in errors
    out: list[str] = []
    for section in sections:
        keyword = _keyword(section)
        head, body = section[:1], section[1:]
        if starting and keyword == "backend" and _section_name(section) == DEFAULT_BACKEND:
            # In place of Serve's unconditional `return status 404` (HAProxy warns about a
            # rule after an unconditional return).
            kept = [line for line in body if not NOT_FOUND.match(line)]
            out += [*head, f"    http-request return errorfile {errors['503']}", *kept]
        elif keyword == "defaults":
            kept = [
                line for line in body if not ((m := ERRORFILE.match(line)) and m.group(1) in errors)
            ]
            out += head + ours + kept
        elif keyword == "frontend":
            out += [*head, json_backpressure(), *body]
        elif keyword == "backend" and any(SERVER.match(line) for line in body):
            servers = [_with_maxconn(line, bounds.ingress_maxconn) for line in body]
            if _section_name(section) in realtime_backends:
                servers = realtime_replica(servers)
            out += head + front_shedding() + bounded_queue(bounds) + servers
        else:
            out += section
    return "\n".join(out) + "\n"


def _with_maxconn(line: str, maxconn: int) -> str:
    if not SERVER.match(line) or " maxconn " in f"{line} ":
        return line
    return f"{line} maxconn {maxconn}"


def patched_path(original: str) -> Path:
    """Beside the original (Serve's config directory) when it is writable, so one file is
    rewritten at each reload; else a private temporary file (e.g. `-f /dev/stdin`), in the
    launcher's instance directory (launch/paths.py) when there is one, so it goes with it."""
    source = Path(original)
    if source.is_file() and os.access(source.parent, os.W_OK):
        return source.with_name(f"{source.stem}.tributary{source.suffix or '.cfg'}")
    instance = os.environ.get("TRIBUTARY_INSTANCE_DIR") or None
    handle, name = tempfile.mkstemp(prefix="haproxy-tributary-", suffix=".cfg", dir=instance)
    os.close(handle)
    return Path(name)


def write_patched(original: str, errors: dict[str, Path]) -> str:
    target = patched_path(original)
    bounds = QueueBounds.from_environment(os.environ)
    text = patch_config(Path(original).read_text(), errors, bounds, realtime_apps(os.environ))
    # Written aside and renamed: a HAProxy that is starting never reads half a file.
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    temporary.write_text(text)
    temporary.replace(target)
    return str(target)


def haproxy_arguments(argv: list[str], errors: dict[str, Path]) -> list[str]:
    """Serve's arguments with every `-f <config>` pointing at a patched copy, plus -dS."""
    out = ["-dS"]
    it = iter(argv)
    for arg in it:
        if arg == "-f":
            out += ["-f", write_patched(next(it), errors)]
        else:
            out.append(arg)
    return out


def main(argv: list[str]) -> None:
    binary = os.environ.get("TRIBUTARY_HAPROXY_BINARY")
    if not binary:
        sys.exit("TRIBUTARY_HAPROXY_BINARY must name the real haproxy binary")
    arguments = haproxy_arguments(argv, error_files())
    os.execv(binary, [binary, *arguments])


if __name__ == "__main__":
    main(sys.argv[1:])
