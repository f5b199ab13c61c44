"""An uploaded input file, copied to the store while its size and lines are checked."""

from __future__ import annotations

from typing import IO

from deployments.config import BatchesConfig
from deployments.errors import PayloadTooLarge

CHUNK = 1024 * 1024


def copy_lines(source: IO[bytes], sink: IO[bytes], config: BatchesConfig) -> tuple[int, int]:
    """Copies `source` to `sink`; its bytes and non-blank lines. A file over
    max_file_bytes or a line over max_line_bytes is refused (413) naming the limit."""
    size = lines = 0
    line_size = 0
    line_blank = True
    while chunk := source.read(CHUNK):
        size += len(chunk)
        if size > config.max_file_bytes:
            raise PayloadTooLarge(
                f"The file is over {config.max_file_bytes} bytes, the most a file may have.",
                param="file",
                code="file_too_large",
            )
        sink.write(chunk)
        for piece in chunk.split(b"\n")[:-1] if b"\n" in chunk else ():
            line_size += len(piece)
            line_blank = line_blank and not piece.strip()
            _check_line(line_size, lines, config)
            lines += not line_blank
            line_size, line_blank = 0, True
        tail = chunk.rsplit(b"\n", 1)[-1]
        line_size += len(tail)
        line_blank = line_blank and not tail.strip()
        _check_line(line_size, lines, config)
    lines += not line_blank
    return size, lines


def _check_line(size: int, before: int, config: BatchesConfig) -> None:
    if size > config.max_line_bytes:
        raise PayloadTooLarge(
            f"Request line {before + 1} is over {config.max_line_bytes} bytes, the most a "
            "line may have.",
            param="file",
            code="line_too_large",
        )
