"""A response's type when its server names none: the WHATWG MIME Sniffing standard's rules for
identifying an unknown MIME type (§7.1), as a browser runs them for a document it displays (the
sniff-scriptable flag set), on the body's first 1,445 bytes (its resource header).

Only what tells a page from a file is read: the HTML, XML and PDF signatures, then PostScript
and the byte order marks (text), then text or binary by the binary data bytes. The image, audio,
video and archive signatures the standard reads next give no page either (a file, whichever
type they name), and are not read.
"""

from __future__ import annotations

import re

#: the bytes of a body that are read (the standard's resource header)
HEADER_SIZE = 1445
#: supplied types that name none: sniffed as a missing one is (§8, the sniffing algorithm)
_UNKNOWN = frozenset({"", "unknown/unknown", "application/unknown", "*/*"})
_WHITESPACE = b"\t\n\x0c\r "
#: the tag-terminating bytes: one follows an HTML signature
_TAG_END = (b" ", b">")
#: the HTML signatures (upper case: matched without regard to ASCII case), each followed by a
#: tag-terminating byte, after any leading whitespace
_HTML = (b"<!DOCTYPE HTML", b"<HTML", b"<HEAD", b"<SCRIPT", b"<IFRAME", b"<H1", b"<DIV",
         b"<FONT", b"<TABLE", b"<A", b"<STYLE", b"<TITLE", b"<B", b"<BODY", b"<BR", b"<P",
         b"<!--")
#: text, whatever follows: the byte order marks (UTF-16BE, UTF-16LE, UTF-8)
_BOMS = (b"\xfe\xff", b"\xff\xfe", b"\xef\xbb\xbf")
#: the binary data bytes
_BINARY = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f]")


def names_none(content_type: str | None) -> bool:
    """The Content-Type names no type: missing, empty, not a type (no "/"), or one of the
    standard's unknown types (unknown/unknown, application/unknown, */*)."""
    essence = (content_type or "").split(";", 1)[0].strip().lower()
    return essence in _UNKNOWN or "/" not in essence


def sniffed(body: bytes) -> str:
    """The MIME type of a body whose server named none (the standard's computed type)."""
    header = body[:HEADER_SIZE]
    start = header.lstrip(_WHITESPACE)
    upper = start.upper()
    for signature in _HTML:
        if upper.startswith(signature) and upper[len(signature):len(signature) + 1] in _TAG_END:
            return "text/html"
    if start.startswith(b"<?xml"):
        return "text/xml"
    if header.startswith(b"%PDF-"):
        return "application/pdf"
    if header.startswith(b"%!PS-Adobe-"):
        return "application/postscript"
    if header.startswith(_BOMS) or _BINARY.search(header) is None:
        return "text/plain"
    return "application/octet-stream"


def content_type(header: str | None, body: bytes) -> str:
    """The type a response is handled as: its Content-Type, or the body's sniffed type when
    that names none (application/octet-stream names one: a file, as in browsers)."""
    return sniffed(body) if names_none(header) else (header or "")
