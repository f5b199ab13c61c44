"""Where a process's resident memory lies, by the kind of mapping that holds it
(/proc/<pid>/smaps), so that a soak tells growth in the allocator's arenas (what C code and
Python's large objects malloc) from mapped files or blocks mapped on their own.

- `heap`: glibc's main arena (the one grown with brk).
- `arenas`: anonymous mappings that start on a 64 MiB boundary and span at most that: glibc's
  arenas for the other threads.
- `files`: mapped files (libraries, model weights read through mmap).
- `stacks`: the main thread's stack.
- `other anonymous`: the rest: blocks malloc mapped on their own, threads' stacks, what
  runtimes and Ray map for themselves.
"""

from __future__ import annotations

from pathlib import Path

ARENA_BYTES = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit Linux
KINDS = ("heap", "arenas", "files", "stacks", "other anonymous")


def rss_by_kind(pid: int) -> dict[str, float] | None:
    """MiB resident in each kind of mapping; None when the process is gone or unreadable."""
    kib = dict.fromkeys(KINDS, 0)
    kind = "other anonymous"
    try:
        with Path(f"/proc/{pid}/smaps").open() as smaps:
            for line in smaps:
                if line.startswith("Rss:"):
                    kib[kind] += int(line.split()[1])
                elif _is_mapping_line(line):
                    kind = _kind(line)
    except OSError:
        return None
    return {name: round(value / 1024, 1) for name, value in kib.items()}


def _is_mapping_line(line: str) -> bool:
    first = line.split(" ", 1)[0]
    return "-" in first and not first.endswith(":")


def _kind(line: str) -> str:
    fields = line.split()
    name = fields[5] if len(fields) > 5 else ""
    if name == "[heap]":
        return "heap"
    if name.startswith("[stack"):
        return "stacks"
    if name.startswith("/"):
        return "files"
    if name:
        return "other anonymous"  # [vdso], [vvar], [anon:...]
    start, end = (int(address, 16) for address in fields[0].split("-"))
    if start % ARENA_BYTES == 0 and end - start <= ARENA_BYTES:
        return "arenas"
    return "other anonymous"
