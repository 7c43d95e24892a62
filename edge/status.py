"""What `acespec edge generate` shows on a terminal: the answer, with unverified text (local
offline mode) dimmed and rewritten in place as it is settled, and a live one-line status."""

from __future__ import annotations

import sys
import time

from acespec.edge.session.offline import LinkDown, LinkEvent, LinkUp
from acespec.edge.shown import Append, Confirm, Op, Replace, ShownText, SpanMirror
from acespec.edge.text import StreamDecoder

SAVE, RESTORE, CLEAR_BELOW, DIM, PLAIN = "\0337", "\0338", "\033[J", "\033[2m", "\033[0m"


class LiveStatus:
    """A one-line live status on stderr (only on a terminal)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.t0, self.shown = time.perf_counter(), False
        self.link = ""  # what the link is doing, while it is not up

    def note(self, e: LinkEvent, offline: str) -> None:
        if isinstance(e, LinkDown):
            self.link = " | link DOWN: " + ("answering locally, unverified"
                                            if offline == "local" else "waiting")
        elif isinstance(e, LinkUp):
            self.link = ""

    def show(self, stats) -> None:
        if not self.enabled:
            return
        n = max(stats.tokens, 1)
        rate = stats.tokens / max(time.perf_counter() - self.t0, 1e-9)
        al = stats.tokens / stats.rounds if stats.rounds else 0.0
        rtt = f"{1000 * sorted(stats.round_trips)[len(stats.round_trips) // 2]:.0f} ms" \
            if stats.round_trips else "-"
        unverified = f" | {stats.unverified_tokens} unverified" if stats.unverified_tokens else ""
        sys.stderr.write(f"\r\033[2K  … {stats.tokens} tok | {rate:.1f} tok/s | AL {al:.2f} | "
                         f"up {stats.wire_bytes_up / n:.1f} B/tok down "
                         f"{stats.wire_bytes_down / n:.1f} B/tok | RTT {rtt}{unverified}"
                         f"{self.link}")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[2K")
            self.shown = False


class AnswerPrinter:
    """Writes an answer's ops (acespec.edge.shown) to stdout. On a terminal unverified text
    is dim, and is rewritten from where it began (a saved cursor position) when it is
    confirmed or replaced. Elsewhere (a pipe, a file) only verified text is written: what is
    written there cannot be taken back."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.verified = 0  # characters of the answer written as verified
        self.unverified = ""  # the text after them, unverified (dim on a terminal)

    def write(self, ops: list[Op]) -> None:
        for op in ops:
            if isinstance(op, Append) and op.verified:
                self.out.write(op.text)
                self.verified += len(op.text)
            elif isinstance(op, Append):
                if self.tty:
                    self.out.write((SAVE if not self.unverified else "") + DIM + op.text + PLAIN)
                self.unverified += op.text
            else:
                self._settle(op)
        self.out.flush()

    def _settle(self, op: Confirm | Replace) -> None:
        """Rewrite the unverified text from where it began: what is verified now plain, what
        is still unverified dim (acespec.edge.shown.Replace: with text, nothing shown before
        its offset is unverified; without, it cuts the unverified text back)."""
        n = (op.end if isinstance(op, Confirm) else op.offset) - self.verified
        kept, rest = self.unverified[:n], self.unverified[n:]
        if isinstance(op, Confirm):
            now, self.unverified = kept, rest
        else:
            now, self.unverified = op.text, kept
        if self.tty:
            self.out.write(RESTORE + CLEAR_BELOW)
        self.out.write(now)
        self.verified += len(now)
        if self.tty and self.unverified:
            self.out.write(SAVE + DIM + self.unverified + PLAIN)


class TerminalAnswer:
    """`edge generate`'s callbacks: the verified text as it streams and, with --offline
    local, the unverified text after it (AnswerPrinter), and the status
    line."""

    def __init__(self, codec, status: LiveStatus, offline: str, quiet: bool):
        self.decoder = StreamDecoder(codec)
        self.status, self.offline, self.quiet = status, offline, quiet
        self.text, self.mirror, self.shown = "", SpanMirror(), ShownText()
        self.printer, self.stats = AnswerPrinter(), None

    def on_tokens(self, ids, stats) -> None:
        self.mirror.verified(ids)
        self.text += self.decoder.feed(ids)
        self.stats = stats
        self._show()

    def on_event(self, e) -> None:
        self.mirror.event(e)
        self.status.note(e, self.offline)
        self._show()

    def _show(self, unverified: str | None = None) -> None:
        if self.quiet:
            return
        if unverified is None:
            unverified = self.decoder.peek(self.mirror.span)
        self.status.clear()
        self.printer.write(self.shown.update(self.text, unverified))
        if self.stats is not None:
            self.status.show(self.stats)

    def finish(self, tail: str) -> None:
        """The end: the rest of the text, and the unverified text it ended on, if any."""
        self.text += self.decoder.finish()
        self._show(tail)
        self.status.clear()
        sys.stdout.write("\n")
        if tail:
            print(f"[the verifier never came back: the last {len(tail)} characters are "
                  "unverified]", file=sys.stderr)
