"""Watch lines straight off an HTTP/1.1 chunked body, as many per read as have arrived.

The API server writes each watch event as its own chunk, and urllib3's `stream()` yields chunk by
chunk: one event per read, so one hand-off to the controller's loop (a queue put and a thread
wake-up, the largest single cost of a burst) per event. Reading the socket in large pieces and
undoing the chunk framing here hands over every event that has arrived at once.

Hostile-input rules: chunk-size lines and lines without a newline are bounded, framing errors
name what was wrong, and nothing partial is yielded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

READ_SIZE = 1 << 18  # one read takes what the socket holds, up to this
# What a read asks for after one that brought little (a quiet watch: an event now and then). A read
# allocates what it asks for before it waits (BufferedReader.read1), so each idle watch would hold
# READ_SIZE while it waits; the first read that brings this much asks for READ_SIZE again.
IDLE_READ_SIZE = 1 << 14
MAX_SIZE_LINE = 4096  # "<hex>[;extensions]\r\n": far below this
MAX_LINE = 64 << 20  # one watch event; etcd refuses objects past ~1.5 MiB, a Kubernetes List far more


class FramingError(ValueError):
    """The body is not valid chunked transfer coding, or a line is past MAX_LINE."""


class StreamEnded(Exception):
    """The connection ended before the last chunk; `partial` bytes of an event were dropped."""

    def __init__(self, partial: int) -> None:
        super().__init__(f"{partial} bytes of a partial event dropped" if partial else "no partial event")
        self.partial = partial


def chunked_lines(read: Callable[[int], bytes], *, max_line: int = MAX_LINE) -> Iterator[list[bytes]]:
    """Non-empty lines of a chunked body, a list per read; returns after the last chunk.

    `read(n)` returns what has arrived, at most n bytes, b"" at end of stream (`read1`).

    Each read is de-framed where it lies: an event whose chunk arrived whole is one copy (its
    slice), and only what a read ends in the middle of is carried over: a chunk's payload into
    `body`, a chunk-size line or CRLF cut short (a few bytes) into `pending`.
    """
    pending = b""  # the start of a chunk-size line, or of the CRLF after a chunk, cut by the last read
    body = bytearray()  # de-framed bytes of lines not yet complete
    left = 0  # payload bytes still to come in the current chunk
    crlf = False  # the CRLF that ends a chunk's payload is still to come
    ask = READ_SIZE  # (a watch that opens has its backlog waiting; a streaming list, its objects)
    while True:
        data = read(ask)
        ask = READ_SIZE if len(data) >= IDLE_READ_SIZE else IDLE_READ_SIZE
        if not data:
            raise StreamEnded(len(body.strip()))
        raw = pending + data if pending else data
        pos, end, last = 0, len(raw), False
        lines: list[bytes] = []
        find = raw.find
        while pos < end:
            if left:
                take = min(left, end - pos)
                body += raw[pos:pos + take]
                pos += take
                left -= take
                if not left:
                    crlf = True
                    if body[-1:] == b"\n":  # the line(s) it completes go out now, in order
                        lines.extend(line for line in bytes(body).split(b"\n") if line.strip())
                        body.clear()
            elif crlf:
                if end - pos < 2:
                    break
                if not raw.startswith(b"\r\n", pos):
                    raise FramingError("chunk not followed by CRLF")
                pos += 2
                crlf = False
            else:
                eol = find(b"\r\n", pos, pos + MAX_SIZE_LINE)
                if eol < 0:
                    if end - pos >= MAX_SIZE_LINE:
                        raise FramingError(f"chunk-size line longer than {MAX_SIZE_LINE} bytes")
                    break
                size_text = raw[pos:eol].split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise FramingError(f"chunk size {size_text[:20]!r} is not hexadecimal") from None
                if size < 0:
                    raise FramingError(f"negative chunk size {size_text[:20]!r}")
                pos = eol + 2
                if size == 0:
                    last = True
                    break
                stop = pos + size
                if (not body and stop + 2 <= end and raw[stop - 1] == 10 and raw.startswith(b"\r\n", stop)
                        and find(b"\n", pos, stop - 1) < 0):
                    # The API server's framing: one whole event per chunk, all arrived. One copy.
                    line = raw[pos:stop - 1]
                    if line.strip():
                        lines.append(line)
                    pos = stop + 2
                else:
                    left = size
        pending = raw[pos:] if pos < end and not last else b""
        cut = body.rfind(b"\n")
        if cut >= 0:
            lines.extend(line for line in bytes(body[:cut]).split(b"\n") if line.strip())
            del body[:cut + 1]
        del data, raw, find  # (not held while the lines are handled and the next read waits)
        if lines:
            yield lines
        if len(body) > max_line:
            raise FramingError(f"an event longer than {max_line} bytes")
        if last:
            # Trailers (none from the API server) and the final CRLF are not read: the caller
            # closes the connection rather than reuse it.
            if body.strip():
                raise StreamEnded(len(body.strip()))
            return
