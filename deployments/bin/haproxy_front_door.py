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
- **No kernel splicing (`-dS`).** Serve's config turns on `option splice-request`, and
  with it HAProxy often misses a client's close while the request waits for its
  response, so the ingress never hears that the client left and the model computes an
  answer for nobody.

Standard library only: Serve's HAProxy actor runs this, not the app.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

ERROR_DIR = Path(__file__).resolve().parents[1] / "static" / "errors"
BACKPRESSURE = ERROR_DIR / "backpressure.response"
SECTION = re.compile(r"^[A-Za-z]")  # a section keyword starts a line; its settings are indented
ERRORFILE = re.compile(r"^\s+errorfile\s+(\d{3})\s")


def error_files(directory: Path = ERROR_DIR) -> dict[str, Path]:
    return {path.stem: path for path in sorted(directory.glob("[0-9][0-9][0-9].http"))}


def json_backpressure(response: Path = BACKPRESSURE) -> str:
    """A frontend rule: a 503 from a server that is not JSON becomes our overloaded error."""
    return (
        f"    http-response return errorfile {response} "
        "if { status 503 } !{ res.hdr(content-type) -m sub application/json }"
    )


def patch_config(text: str, errors: dict[str, Path]) -> str:
    """`text` with our errorfile lines in each `defaults` section, and any errorfile line
    there for one of the same statuses dropped (HAProxy would keep the last one); and the
    JSON back-pressure rule in each `frontend`."""
    ours = [f"    errorfile {status} {path}" for status, path in errors.items()]
    out: list[str] = []
    in_defaults = False
    for line in text.splitlines():
        if SECTION.match(line):
            keyword = line.split()[0]
            in_defaults = keyword == "defaults"
            out.append(line)
            if in_defaults:
                out.extend(ours)
            elif keyword == "frontend":
                out.append(json_backpressure())
            continue
        replaced = ERRORFILE.match(line)
        if in_defaults and replaced and replaced.group(1) in errors:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def patched_path(original: str) -> Path:
    """Beside the original (Serve's config directory) when it is writable, so one file is
    rewritten at each reload; else a private temporary file (e.g. `-f /dev/stdin`)."""
    source = Path(original)
    if source.is_file() and os.access(source.parent, os.W_OK):
        return source.with_name(f"{source.stem}.tributary{source.suffix or '.cfg'}")
    handle, name = tempfile.mkstemp(prefix="haproxy-tributary-", suffix=".cfg")
    os.close(handle)
    return Path(name)


def write_patched(original: str, errors: dict[str, Path]) -> str:
    target = patched_path(original)
    text = patch_config(Path(original).read_text(), errors)
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
