"""One generation of a request as its reader sees it: the verified text with stop strings
applied, and in local offline mode the unverified text after it and how it was settled
(acespec.edge.shown); what /health says of the link; the stream chunks all of that becomes.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field
from typing import Protocol

from acespec.edge.api.logprobs import Echo, Scored, logprobs_field
from acespec.edge.api.openai_types import CompletionRequest, choice
from acespec.edge.api.structured import tool_calls
from acespec.edge.session import EdgeEngine, EngineConfig, Stats
from acespec.edge.session.offline import LinkDown, LinkEvent, LinkUp
from acespec.edge.shown import Append, Confirm, Op, Replace, ShownText, SpanMirror
from acespec.edge.text import StreamDecoder, TextCodec

FAILED = "failed"  # in place of a finish reason: the generation raised


@dataclass(frozen=True)
class Note:
    """A line for the stream's reader that is not text: an SSE comment."""

    text: str


@dataclass(frozen=True)
class WithLogprobs:
    """Verified text to append, and its tokens' logprobs (the choice's `logprobs` field)."""

    text: str
    logprobs: dict


@dataclass(frozen=True)
class ToolCalls:
    """The answer's tool calls, in OpenAI's form (the stream's last delta)."""

    calls: list


@dataclass
class LinkBoard:
    """The verifier link as /health tells it: which generations are waiting out an outage
    (or answering locally), since when, and why."""

    down: dict[int, tuple[float, str]] = field(default_factory=dict)  # id -> (time, reason)

    def note(self, key: int, e: LinkEvent) -> None:
        if isinstance(e, LinkDown):
            self.down.setdefault(key, (time.time(), e.reason))
        elif isinstance(e, LinkUp):
            self.down.pop(key, None)

    def state(self) -> dict:
        if not self.down:
            return {"link": "up"}
        since, reason = min(self.down.values())
        return {"link": "down", "down_s": round(time.time() - since, 1), "reason": reason,
                "generations_waiting": len(self.down)}


class Service(Protocol):
    """What an answer uses of the server's service (acespec.edge.api.service.EdgeService):
    its request's session config, the engine, a drafter sequence, the text codec, the link
    board."""

    codec: TextCodec
    engine: EdgeEngine
    link: LinkBoard

    def config(self, req: CompletionRequest, index: int) -> EngineConfig: ...

    async def acquire(self) -> int: ...

    def free_seq(self, seq: int) -> None: ...

    def branch_seq(self, seq: int) -> list[int]: ...


class Answer:
    """One of the n generations of a request: text with stop strings applied and, in local
    offline mode, the unverified text shown after it (acespec.edge.shown)."""

    def __init__(self, svc: Service, req: CompletionRequest, index: int,
                 echo: Echo | None = None):
        self.svc, self.req, self.index, self.echo = svc, req, index, echo
        self.shift = len(echo.text) if echo is not None else 0  # text before the answer
        self.cfg = svc.config(req, index)
        self.decoder = StreamDecoder(svc.codec)
        self.text, self.sent, self.finish = "", 0, "length"
        self.stats = Stats()
        self.mirror, self.shown = SpanMirror(), ShownText()
        self.tail = ""  # unverified text the answer ended on (the verifier never came back)
        self.ids: list[int] = []  # the verified tokens, and the text's length after each
        self.ends: list[int] = []
        self.scored_sent = 0  # tokens whose logprobs the stream has carried
        self.calls: list[dict] | None = None  # the answer's tool calls (edge.api.structured)

    def on_tokens(self, ids, stats) -> bool:
        self.mirror.verified(ids)
        for t in ids:
            self.text += self.decoder.feed([t])
            self.ids.append(t)
            self.ends.append(len(self.text))
        for s in self.req.stop:
            at = self.text.find(s)
            if at >= 0:
                self.text, self.finish = self.text[:at], "stop"
                return True
        return False

    def ready(self, final: bool = False) -> str:
        """New text that can no longer turn into the start of a stop string (at the end,
        all of it)."""
        hold = max((len(s) - 1 for s in self.req.stop), default=0)
        end = len(self.text) if final or self.finish == "stop" else \
            max(self.sent, len(self.text) - hold)
        out, self.sent = self.text[self.sent:end], end
        return out

    def logprobs(self, first: int, end: int) -> dict:
        """The choice's `logprobs` field for tokens first.. whose text ends by character
        `end` of the answer (the target's, as the verifier sent them)."""
        last = bisect.bisect_right(self.ends, end, lo=first)
        starts = [self.shift + (self.ends[i - 1] if i else 0) for i in range(first, last)]
        return logprobs_field(self.req.chat, self.svc.codec.piece_fn, Scored(
            self.ids[first:last], self.stats.logprobs[first:last], starts))

    def _scored_view(self, new: str) -> list[Op]:
        """New verified text with the logprobs of the tokens it completes."""
        last = bisect.bisect_right(self.ends, self.sent, lo=self.scored_sent)
        if not new and last == self.scored_sent:
            return []
        field_ = self.logprobs(self.scored_sent, self.sent)
        self.scored_sent = last
        return [WithLogprobs(new, field_)]

    def _tools_view(self, final: bool) -> list:
        if not final:
            return []
        new = self.ready(final)
        if self.calls:
            return [ToolCalls(self.calls)]
        field_ = self.logprobs(0, self.sent) if self.req.logprobs is not None else None
        return [WithLogprobs(new, field_) if field_ else Append(new)] if new else []

    def view(self, final: bool = False) -> list[Op]:
        """What the reader must be told now: new verified text and, in local mode, changes
        to the unverified text after it (verified text held back for a stop string is shown
        as unverified meanwhile)."""
        if self.req.tools is not None:  # the answer is text or a call: known at the end
            return self._tools_view(final)
        new = self.ready(final)
        if self.req.logprobs is not None:  # (never local: the config refuses it)
            return self._scored_view(new)
        if self.cfg.offline != "local":
            return [Append(new)] if new else []
        if final:
            span = self.tail
        elif self.finish == "stop":
            span = ""
        else:
            span = self.decoder.peek(self.mirror.span)
        held = self.text[self.sent:] if span else ""
        return self.shown.update(self.text[:self.sent], held + span)

    def on_event(self, e: LinkEvent, queue: asyncio.Queue | None) -> None:
        self.mirror.event(e)
        self.svc.link.note(id(self), e)
        if queue is None:
            return
        if isinstance(e, LinkDown):
            queue.put_nowait((self.index, [Note(f"verifier unreachable ({e.reason}); "
                                                + ("answering locally, unverified"
                                                   if self.cfg.offline == "local"
                                                   else "waiting"))], None))
        elif isinstance(e, LinkUp):
            queue.put_nowait((self.index, [Note(f"verifier back after {e.down_s:.1f} s")],
                              None))
        else:
            queue.put_nowait((self.index, self.view(), None))

    async def run(self, prompt: list[int], queue: asyncio.Queue | None) -> None:
        """Generate; on a queue, report (index, ops, finish reason) as text arrives, and
        (index, [], FAILED) instead of a finish reason if the generation fails."""
        svc, finish = self.svc, FAILED
        if self.req.max_tokens == 0:  # echo alone: nothing to generate
            if queue is not None:
                queue.put_nowait((self.index, [], "length"))
            return
        seq = await svc.acquire()
        try:
            def cb(ids, stats):
                self.stats = stats  # live: streamed chunks can carry the usage so far
                stop = self.on_tokens(ids, stats)
                if queue is not None:
                    queue.put_nowait((self.index, self.view(), None))
                return stop

            out, self.stats = await svc.engine.generate(
                prompt, self.cfg, cb, seq=seq, branch_seq=svc.branch_seq(seq),
                on_event=lambda e: self.on_event(e, queue))
            if self.finish != "stop":
                self.text += self.decoder.finish()
                self.tail = svc.codec.decode(self.stats.unverified_tail)
                if len(out) + len(self.stats.unverified_tail) < self.req.max_tokens:
                    self.finish = "stop"  # end of sequence
            if self.req.tools is not None:
                self.calls = tool_calls(self.text, self.req.tools)
                self.finish = "tool_calls" if self.calls else self.finish
            finish = self.finish
        finally:
            svc.free_seq(seq)
            svc.link.down.pop(id(self), None)
            if queue is not None:
                queue.put_nowait((self.index, self.view(final=True) if finish != FAILED
                                  else [], finish))

    def extension(self) -> dict | None:
        """The final choice's `acespec` field: where unverified text starts, if it does."""
        return {"unverified_from": len(self.text)} if self.tail else None


def stream_parts(req: CompletionRequest, index: int, ops: list, finish: str | None,
           extension: dict | None) -> list[dict | Note]:
    """Stream chunks' choices (and notes) for one generation's ops. Unverified text and its
    settling carry an `acespec` field: {"unverified": true}, {"confirmed": END} (the text
    before character END is verified as shown), {"replace": {"offset", "text"}} (drop from
    character OFFSET on, append the verified TEXT); offsets count from the answer's start."""
    parts: list[dict | Note] = []
    for op in ops:
        if isinstance(op, Note):
            parts.append(op)
            continue
        if isinstance(op, ToolCalls):
            part = choice(req, index, "", None, True)
            part["delta"] = {"tool_calls": [{"index": i, **c} for i, c in enumerate(op.calls)]}
            parts.append(part)
            continue
        text = op.text if isinstance(op, (Append, WithLogprobs)) else ""
        part = choice(req, index, text, None, True)
        if isinstance(op, WithLogprobs):
            part["logprobs"] = op.logprobs
        elif isinstance(op, Append) and not op.verified:
            part["acespec"] = {"unverified": True}
        elif isinstance(op, Confirm):
            part["acespec"] = {"confirmed": op.end}
        elif isinstance(op, Replace):
            part["acespec"] = {"replace": {"offset": op.offset, "text": op.text}}
        parts.append(part)
    if finish:
        last = parts[-1] if parts else None
        if not isinstance(last, dict) or "acespec" in last:  # the finish gets its own chunk
            last = choice(req, index, "", finish, True)
            parts.append(last)
        last["finish_reason"] = finish
        if extension:
            last["acespec"] = {**last.get("acespec", {}), **extension}
    return parts
