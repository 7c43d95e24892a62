"""An SSE client of `edge serve` that keeps each line with its arrival time, and a reader
that follows the `acespec` fields of --offline local (docs/offline.md)."""

from __future__ import annotations

import json
import threading
import time

import httpx


class Client(threading.Thread):
    """A streaming request; keeps every SSE line with the time it arrived."""

    def __init__(self, url: str, body: dict):
        super().__init__(daemon=True)
        self.url, self.body, self.lines = url, body, []

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=self.body,
                              timeout=120) as r:
                for line in r.iter_lines():
                    if line:
                        self.lines.append((time.monotonic(), line))
        except httpx.HTTPError as e:
            self.lines.append((time.monotonic(), f"error: {e}"))

    def chunks(self) -> list[tuple[float, dict]]:
        return [(t, json.loads(x[6:])) for t, x in self.lines if x.startswith("data: {")]

    def texts(self) -> int:
        return sum(bool(c.get("choices") and c["choices"][0]["text"]) for _, c in self.chunks())

    def wait_texts(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.texts() < n and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.texts() >= n, self.lines[-5:]


def follow(chunks: list[dict]) -> tuple[str, str]:
    """A client following the acespec fields: (verified text, unverified text after it)."""
    verified, unverified = "", ""
    for c in chunks:
        for ch in c.get("choices", []):
            ext = ch.get("acespec", {})
            if ext.get("unverified"):
                unverified += ch["text"]
            elif "confirmed" in ext:
                n = ext["confirmed"] - len(verified)
                verified, unverified = verified + unverified[:n], unverified[n:]
            elif "replace" in ext:
                n = ext["replace"]["offset"] - len(verified)
                verified, unverified = verified + ext["replace"]["text"], unverified[:n]
            else:
                assert not unverified or not ch["text"], "verified text after unverified"
                verified += ch["text"]
    return verified, unverified
