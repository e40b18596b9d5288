"""A Kubernetes List answer read off the socket a piece at a time: each item's bytes as they arrive.

An unpaginated list (the reflector's fallback after a paged list expired) is one answer of every
object: ~300 MB at 48,700 pods. Read whole and decoded whole it was a 2.2 GB peak. Here the body is
read in bounded pieces and split at its items' byte boundaries, so the caller decodes each item with
the decoder its pages use (the same records) and drops it before the next; what is held at a time is
one read and one item.

Where items end is found, for most of them, by msgspec: the bytes of one read up to the last place
that looks like the start of another item (`},` and the first item's opening bytes: `},{"metadata":`
in a typed list) are decoded as one array of raw values. That succeeds only where the place is the
end of an item of the list (cut inside a string or a nested object, the array is not JSON), and
costs a tenth of the scan below. Where it fails (an indented body, a nested object that opens as the
items do), each item's end is found by a regular expression that matches a bracketed value nested up
to `FAST_DEPTH` levels, strings (braces, quotes and escapes in tenant data) consumed whole: possessive
quantifiers and one alternative per leading byte keep it linear, without backtracking. A value nested
deeper takes a token-by-token scan (slower, as linear). Both only count brackets: the caller decodes
each item's bytes as JSON, which refuses a malformed one, so the body is still checked whole, piece
by piece. Each read is tried once by msgspec: linear too. The List's other members (`metadata`:
resourceVersion, continue) may come before or after `items`; they are small and decoded whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec
import orjson

READ_SIZE = 1 << 18  # what one socket read asks for
# The largest item (or other member) read: etcd refuses objects past 1.5 MiB by default. An item
# past this fails the list (ItemTooLarge) rather than be skipped: a list without it would report
# the object deleted.
MAX_ITEM = 16 << 20
# A value whose end is not found waits for at least this many more bytes before the next try, and
# for as many as it already has: each try is linear, their sum stays within twice the value's size.
# An empty buffer waits for this many too (or the body's end), however small the chunks come.
MIN_MORE = 1 << 16
FAST_DEPTH = 48  # nesting the regular expression follows; deeper values take the token scan

_NOT_WS = re.compile(rb'[^ \t\r\n]')
_STR = rb'"(?:[^"\\]++|\\.)*+"'


def _nested(depth: int) -> re.Pattern[bytes]:
    inner = _STR + rb'|[^\[\]{}"]++'
    pattern = rb'[\[{](?:' + inner + rb')*+[\]}]'
    for _ in range(depth - 1):
        pattern = rb'[\[{](?:' + inner + rb'|' + pattern + rb')*+[\]}]'
    return re.compile(pattern, re.S)


_VALUE = _nested(FAST_DEPTH)
_STRING = re.compile(_STR, re.S)
_SCALAR = re.compile(rb'[^,\]}\s]+')  # a number, true, false or null (the decoder checks which)
# Tokens of the slow scan: a whole string, the start of one not ended in the buffer, a bracket.
_TOKEN = re.compile(_STR + rb'|(")|[\[\]{}]', re.S)
_FIRST_KEY = re.compile(rb'\{"(?:[^"\\]|\\.){1,256}":', re.S)  # an item's opening bytes, compact
_RAW_ITEMS = msgspec.json.Decoder(list[msgspec.Raw]).decode


class ListSyntaxError(ValueError):
    """The body is not JSON (or not a List's shape where it is read here: members, items)."""


class ListTruncated(ValueError):
    """The body ended before the List did."""


class NotAList(ValueError):
    """The body is JSON but not a List: not an object, or its items not an array."""


class ItemTooLarge(ValueError):
    """An item (or member) longer than the bound; `hint` is what its first bytes name."""

    def __init__(self, limit: int, hint: str) -> None:
        super().__init__(f"an item longer than {limit} bytes" + (f" ({hint})" if hint else ""))
        self.hint = hint


def _deep_end(buf: bytes, pos: int) -> int:
    """The end of the bracketed value at `pos`, token by token; -1 when the buffer ends first."""
    open_: list[int] = []  # the closing bracket each open one wants
    for m in _TOKEN.finditer(buf, pos):
        if m.group(1) is not None:
            return -1  # a string the buffer ends in
        c = buf[m.start()]
        if c == 34:  # '"'
            continue
        if c == 123 or c == 91:  # '{' '['
            open_.append(c + 2)  # '}' is '{' + 2, ']' is '[' + 2
        elif not open_ or open_.pop() != c:
            raise ListSyntaxError(f"{chr(c)!r} closes no {'object' if c == 125 else 'array'}")
        elif not open_:
            return m.end()
    return -1


def _name_hint(head: bytes) -> str:
    m = re.search(rb'"name"\s*:\s*("(?:[^"\\]|\\.){0,253}")', head)
    if m is None:
        return ""
    try:
        return f"name {orjson.loads(m.group(1))!r}"
    except orjson.JSONDecodeError:
        return ""


class ListBody:
    """The items of one List answer, from `chunks` (the body's bytes in pieces, as read).

    Iterate `items()` for each item's bytes in order; after it, `members` holds the List's other
    members decoded (metadata, kind, apiVersion). Raises ListSyntaxError, ListTruncated, NotAList,
    ItemTooLarge; whatever `chunks` raises (a cut connection) passes through.
    """

    def __init__(self, chunks: Iterator[bytes], *, max_item: int | None = None) -> None:
        self._chunks = chunks
        self._max = MAX_ITEM if max_item is None else max_item
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._fresh = False  # bytes arrived since the last try of a run of items (`_run`)
        self.members: dict[str, Any] = {}
        self.bytes_read = 0

    # --- the buffer -----------------------------------------------------------------------------

    def _more(self, at_least: int) -> bool:
        """Reads until `at_least` bytes past the position are buffered or the body ends; False when
        nothing was added. Consumed bytes are dropped; pieces are joined once."""
        have = before = len(self._buf) - self._pos
        pieces = [self._buf[self._pos:]] if have else []
        while have < at_least and not self._eof:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._eof = True
                break
            if chunk:
                self._fresh = True
                pieces.append(chunk)
                have += len(chunk)
                self.bytes_read += len(chunk)
        self._buf = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self._pos = 0
        return have > before

    def _skip_ws(self) -> int:
        """The next byte that is not whitespace (consumed up to it); -1 at the end of the body."""
        while True:
            buf = self._buf
            if self._pos < len(buf):
                if buf[self._pos] not in b" \t\r\n":  # (most calls: no whitespace at all)
                    return buf[self._pos]
                m = _NOT_WS.search(buf, self._pos)
                if m is not None:
                    self._pos = m.start()
                    return buf[self._pos]
            self._pos = len(buf)
            if not self._more(MIN_MORE):  # (not 1: small chunks would leave msgspec one item a try)
                return -1

    def _expect(self, allowed: bytes, what: str) -> int:
        c = self._skip_ws()
        if c < 0:
            raise ListTruncated(f"the body ended where {what} was expected")
        if c not in allowed:
            at = self.bytes_read - len(self._buf) + self._pos
            raise ListSyntaxError(f"{bytes([c])!r} where {what} was expected (byte {at})")
        self._pos += 1
        return c

    def _value(self) -> bytes:
        """The next JSON value's bytes (after whitespace), read as far as needed."""
        if self._skip_ws() < 0:
            raise ListTruncated("the body ended where a value was expected")
        tries = 0
        while True:
            buf, pos = self._buf, self._pos
            c = buf[pos]
            end = -1
            if c == 123 or c == 91:
                m = _VALUE.match(buf, pos)
                if m is not None:
                    end = m.end()
                elif tries or self._eof:  # not only cut by the read (as most are): maybe deeper
                    end = _deep_end(buf, pos)
            elif c == 34:
                m = _STRING.match(buf, pos)
                end = m.end() if m is not None else -1
            else:
                m = _SCALAR.match(buf, pos)
                if m is None:
                    raise ListSyntaxError(f"{bytes([c])!r} where a value was expected")
                if m.end() < len(buf) or self._eof:
                    end = m.end()
            if end >= 0:
                if end - pos > self._max:
                    raise ItemTooLarge(self._max, _name_hint(buf[pos:pos + 4096]))
                self._pos = end
                return buf[pos:end]
            have = len(buf) - pos
            if have > self._max:
                raise ItemTooLarge(self._max, _name_hint(buf[pos:pos + 4096]))
            if self._eof:
                raise ListTruncated(f"the body ended inside a value ({have} bytes of it read)")
            tries += 1
            self._more(have + max(have, MIN_MORE))  # (nothing more: the body's end, tried once more)

    def _key(self) -> str:
        raw = self._value()
        if raw[:1] != b'"':
            raise ListSyntaxError("an object key that is not a string")
        key = orjson.loads(raw)  # a complete string: escapes resolved as the decoder would
        assert isinstance(key, str)
        return key

    # --- the List -------------------------------------------------------------------------------

    def items(self) -> Iterator[bytes]:
        c = self._skip_ws()
        if c < 0:
            raise ListSyntaxError("an empty body")
        if c != 123:  # not an object: small or broken; decoded whole to say which
            raw = self._value()
            if self._skip_ws() >= 0:
                raise ListSyntaxError("data after the first value")
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise ListSyntaxError(str(e)) from e
            raise NotAList(f"expected an object, got {type(value).__name__}")
        self._pos += 1
        seen_items = False
        if self._skip_ws() == 125:  # '}': an empty object
            self._pos += 1
        else:
            while True:
                key = self._key()
                self._expect(b":", "':'")
                if key == "items":
                    if seen_items:
                        raise ListSyntaxError("a second items member")
                    seen_items = True
                    yield from self._items()
                else:
                    raw = self._value()
                    try:
                        self.members[key] = orjson.loads(raw)
                    except orjson.JSONDecodeError as e:
                        raise ListSyntaxError(f"member {key!r}: {e}") from e
                if self._expect(b",}", "',' or '}'") == 125:
                    break
        if self._skip_ws() >= 0:  # only whitespace may follow
            raise ListSyntaxError("data after the List")

    def _items(self) -> Iterator[bytes]:
        c = self._skip_ws()
        if c == 110:  # n: null, as an empty list
            raw = self._value()
            if raw != b"null":
                raise ListSyntaxError(f"items is {raw[:20]!r}")
            return
        if c != 91:
            if c < 0:
                raise ListTruncated("the body ended where items were expected")
            raw = self._value()
            raise NotAList(f"items is {raw[:20]!r}, not an array")
        self._pos += 1
        if self._skip_ws() == 93:  # ']'
            self._pos += 1
            return
        start = b""  # `},` and the first item's opening bytes: where another item may start
        while True:
            run = self._run(start) if start and self._fresh else None
            if run:
                yield from run
            else:
                data = self._value()
                if not start:
                    m = _FIRST_KEY.match(data)
                    start = b"}," + m.group() if m is not None else b""
                yield data
            if self._expect(b",]", "',' or ']' after an item") == 93:
                return

    def _run(self, start: bytes) -> list[bytes]:
        """The items from the position up to the last place in the buffer where `start` may begin
        another, if the bytes up to there are a sequence of JSON values; else none (the scan decides)."""
        self._fresh = False
        buf, pos = self._buf, self._pos
        cut = buf.rfind(start, pos)
        if cut < 0:
            return []
        try:
            raws = _RAW_ITEMS(b"[" + buf[pos:cut + 1] + b"]")
        except msgspec.DecodeError:
            return []  # cut inside a string or a nested object (or not JSON): item by item
        items = [bytes(r) for r in raws]
        if any(len(x) > self._max for x in items):
            return []  # the scan names it
        self._pos = cut + 1
        return items
