"""The soak's split of a process's resident memory by kind of mapping
(tests/reliability/memory_map.py): the kinds of smaps' mapping lines, and this process's own
/proc read with mappings the test makes itself."""

from __future__ import annotations

import mmap
import os
import sys
import tempfile

import pytest

from deployments.core.process_status import status_kib
from tests.reliability.memory_map import KINDS, _kind, rss_by_kind

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
MIB = 1 << 20


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("55df6e39c000-55df6fc92000 rw-p 00000000 00:00 0          [heap]", "heap"),
        ("7f8050000000-7f8050355000 rw-p 00000000 00:00 0 ", "arenas"),  # on 64 MiB, 3 MiB
        ("7f8050000000-7f8054000000 rw-p 00000000 00:00 0 ", "arenas"),  # a whole 64 MiB
        ("7f8050000000-7f8054001000 rw-p 00000000 00:00 0 ", "other anonymous"),  # longer
        ("7f7e46653000-7f7e46e54000 rw-p 00000000 00:00 0 ", "other anonymous"),  # off 64 MiB
        ("7ffed6bae000-7ffed6bcf000 rw-p 00000000 00:00 0          [stack]", "stacks"),
        ("7fed49000000-7fed5d5e5000 r-xp 00000000 08:01 12 /usr/lib/libc.so.6", "files"),
        ("7ffed6bf0000-7ffed6bf2000 r-xp 00000000 00:00 0          [vdso]", "other anonymous"),
    ],
)
def test_a_mapping_line_names_its_kind(line: str, kind: str) -> None:
    assert _kind(line) == kind


@linux_only
def test_the_kinds_add_up_to_the_resident_size() -> None:
    kinds = rss_by_kind(os.getpid())
    rss_kib = status_kib("VmRSS")
    assert kinds is not None and rss_kib is not None
    assert set(kinds) == set(KINDS)
    assert kinds["files"] > 1  # the interpreter and its libraries
    # Read a moment apart, so allow the test's own allocations between them.
    assert abs(sum(kinds.values()) - rss_kib / 1024) < 16


@linux_only
def test_mappings_the_test_makes_show_under_their_kinds() -> None:
    before = rss_by_kind(os.getpid())
    # Private (a shared one shows as /dev/zero), and longer than an arena can be, so never
    # taken for one wherever the kernel puts it; a byte written on every page makes it resident.
    anonymous = mmap.mmap(-1, 65 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, 65 * MIB, mmap.PAGESIZE):
        anonymous[offset] = 1
    with tempfile.TemporaryFile() as file:
        file.write(b"y" * (32 * MIB))
        file.flush()
        mapped = mmap.mmap(file.fileno(), 32 * MIB, access=mmap.ACCESS_READ)
        assert mapped[::4096].count(b"y") == 32 * MIB // 4096  # every page read: resident
        after = rss_by_kind(os.getpid())
        mapped.close()
    anonymous.close()
    assert before is not None and after is not None
    assert 60 < after["other anonymous"] - before["other anonymous"] < 75
    assert 30 < after["files"] - before["files"] < 40


def test_a_process_that_is_gone_has_no_figures() -> None:
    assert rss_by_kind(2**22 + 1) is None  # above Linux's pid_max limit
