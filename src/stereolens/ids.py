"""Stable identifiers. Never Python's hash(): it is salted per process."""

from __future__ import annotations

import hashlib


def stable_id(*parts: object, length: int = 16) -> str:
    """A hex id from the sha256 of the parts joined by a unit separator."""
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
