"""Key names shown to an operator the way redis-cli shows them, and read
back: a name that could change the terminal (ESC, BEL, CR, NUL, a bidi
override), forge a table row (a newline) or is not UTF-8 is printed
quoted, `"a\\x1bb"`, with redis-cli's escapes (\\n \\r \\t \\a \\b \\" \\\\,
\\xHH for any other byte); `quote` then `unquote` gives the same bytes."""

from __future__ import annotations

import os

_NAMED = {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
          7: "\\a", 8: "\\b"}
_UNESCAPE = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b"}


def _plain(text: str) -> bool:
    """Shown as it is: printable, no space, quote or backslash (no escape needed to read it back)."""
    return text.isprintable() and not any(c in text for c in ' "\'\\') and bool(text)


def quote(name: bytes) -> str:
    """The name as redis-cli would show it: as it is when that is safe and
    unambiguous, else in double quotes with every other byte escaped."""
    try:
        text = name.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None and _plain(text):
        return text
    out = ['"']
    i = 0
    while i < len(name):
        byte = name[i]
        if byte in _NAMED:
            out.append(_NAMED[byte])
            i += 1
            continue
        if 0x20 < byte < 0x7F or byte == 0x20:
            out.append(chr(byte))
            i += 1
            continue
        # A printable non-ASCII character stays readable; anything else (a
        # control, a format character, a byte that is not UTF-8) is \xHH.
        char, size = _utf8_char(name, i)
        if char is not None and char.isprintable():
            out.append(char)
            i += size
            continue
        out.append(f"\\x{byte:02x}")
        i += 1
    out.append('"')
    return "".join(out)


def _utf8_char(data: bytes, i: int) -> tuple:
    for size in (2, 3, 4):
        try:
            return data[i : i + size].decode(), size
        except UnicodeDecodeError:
            continue
    return None, 1


def unquote(arg: str) -> bytes:
    """A key as the operator typed it: the quoted form `quote` prints (or
    redis-cli's, double or single quotes) read back to its bytes; anything
    else taken literally (with the bytes the shell gave)."""
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "\"'":
        parsed = _parse(arg[1:-1], arg[0])
        if parsed is not None:
            return parsed
    return os.fsencode(arg)


def _parse(body: str, mark: str) -> "bytes | None":
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c == mark:
            return None  # an unescaped quote inside: not the quoted form
        if c != "\\" or i + 1 == len(body):
            out += os.fsencode(c)
            i += 1
            continue
        nxt = body[i + 1]
        if mark == "'":
            out += b"'" if nxt == "'" else os.fsencode(c + nxt)
            i += 2
        elif nxt == "x" and len(body) >= i + 4 and _hex(body[i + 2 : i + 4]):
            out.append(int(body[i + 2 : i + 4], 16))
            i += 4
        else:
            out += os.fsencode(_UNESCAPE.get(nxt, nxt))
            i += 2
    return bytes(out)


def _hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


def printable(text: str) -> str:
    """A message for the terminal: every character that is not printable
    (a newline, ESC, ...) as \\xHH of its UTF-8 bytes, the rest as it is."""
    return "".join(c if c.isprintable() else "".join(f"\\x{b:02x}" for b in c.encode("utf-8", "surrogateescape"))
                   for c in text)
