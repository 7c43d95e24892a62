"""`acespec edge serve`: the edge as a local OpenAI-compatible HTTP server (Starlette).

Requests share one drafter (a sequence per concurrent generation) and one gRPC channel to
the verifier. Streaming uses server-sent events in OpenAI's chunk format ending in [DONE].
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from acespec.edge.engine import EdgeEngine, EngineConfig, Stats
from acespec.edge.openai_types import (
    ApiError,
    CompletionRequest,
    choice,
    envelope,
    new_id,
    usage,
)
from acespec.edge.text import StreamDecoder, TextCodec
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams

log = logging.getLogger(__name__)


@dataclass
class EdgeService:
    """Everything a request needs; built once per server."""

    codec: TextCodec
    drafter: object | None  # None in 'ar' mode
    connect: Callable[[], object]  # makes the grpc.aio.Channel all requests share
    model_name: str
    base: EngineConfig
    chat_template: str | None = None
    token: str | None = None
    metrics: object | None = None
    free_seqs: asyncio.Queue = field(default_factory=asyncio.Queue)
    _channel: object | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        for seq in range(1, 33):  # drafter sequences; 0 stays free for tools
            self.free_seqs.put_nowait(seq)
        self.engine = EdgeEngine(lambda: self.channel, self.codec.vocab_hash, self.drafter,
                                 self.token, owns_channels=False)

    @property
    def channel(self):
        """The shared channel, made on first use: a grpc.aio channel binds to the event loop
        it is created in, so it must be made inside the server's loop, never before it."""
        if self._channel is None:
            self._channel = self.connect()
        return self._channel

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def render_chat(self, messages: list[dict]) -> str:
        if not self.chat_template:
            raise ApiError(400, f"model {self.model_name!r} has no chat template; use "
                           "/v1/completions", "messages")
        import jinja2

        env = jinja2.Environment(undefined=jinja2.StrictUndefined)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=True, bos_token="", eos_token="")
        except jinja2.TemplateError as e:
            raise ApiError(400, f"chat template failed: {e}", "messages") from None

    def config(self, req: CompletionRequest, index: int) -> EngineConfig:
        seed = (req.seed if req.seed is not None else int(time.time_ns() % 2**31)) + index
        serve = ServeParams(SamplingParams(req.temperature, req.top_k, req.top_p),
                            send_mass=self.base.serve.send_mass, k_max=self.base.serve.k_max)
        stops = frozenset({self.codec.eos_id} - {None})
        return replace(self.base, serve=serve, seed=seed, max_tokens=req.max_tokens,
                       stop_ids=stops, max_reconnects=2, backoff_s=0.1)


class _Choice:
    """One of the n generations of a request: text with stop strings applied."""

    def __init__(self, svc: EdgeService, req: CompletionRequest, index: int):
        self.svc, self.req, self.index = svc, req, index
        self.decoder = StreamDecoder(svc.codec)
        self.text, self.sent, self.finish = "", 0, "length"
        self.stats = Stats()

    def on_tokens(self, ids, stats) -> bool:
        self.text += self.decoder.feed(ids)
        for s in self.req.stop:
            at = self.text.find(s)
            if at >= 0:
                self.text, self.finish = self.text[:at], "stop"
                return True
        return False

    def ready(self) -> str:
        """New text that can no longer turn into the start of a stop string."""
        hold = max((len(s) - 1 for s in self.req.stop), default=0)
        end = len(self.text) if self.finish == "stop" else max(self.sent, len(self.text) - hold)
        out, self.sent = self.text[self.sent:end], end
        return out

    async def run(self, prompt: list[int], queue: asyncio.Queue | None) -> None:
        seq = await self.svc.free_seqs.get()
        try:
            def cb(ids, stats):
                stop = self.on_tokens(ids, stats)
                if queue is not None:
                    queue.put_nowait((self.index, self.ready(), None))
                return stop

            out, self.stats = await self.svc.engine.generate(
                prompt, self.svc.config(self.req, self.index), cb, seq=seq)
            if self.finish != "stop":
                self.text += self.decoder.finish()
                if len(out) < self.req.max_tokens:
                    self.finish = "stop"  # end of sequence
        finally:
            if self.svc.drafter is not None and hasattr(self.svc.drafter, "drop"):
                self.svc.drafter.drop(seq)
            self.svc.free_seqs.put_nowait(seq)
            if queue is not None:
                queue.put_nowait((self.index, self.ready(), self.finish))


async def complete(svc: EdgeService, req: CompletionRequest) -> dict:
    prompt = svc.codec.encode(req.prompt)
    choices = [_Choice(svc, req, i) for i in range(req.n)]
    await asyncio.gather(*(c.run(prompt, None) for c in choices))
    u = usage(len(prompt), [c.stats for c in choices])
    _log_usage(svc, req, u)
    return envelope(req, new_id(req.chat), [choice(req, c.index, c.text, c.finish, False)
                                            for c in choices], False, u)


async def stream(svc: EdgeService, req: CompletionRequest):
    """Server-sent events: one chunk per piece of new text, then [DONE]."""
    prompt = svc.codec.encode(req.prompt)
    rid, queue = new_id(req.chat), asyncio.Queue()
    choices = [_Choice(svc, req, i) for i in range(req.n)]
    tasks = [asyncio.create_task(c.run(prompt, queue)) for c in choices]
    try:
        if req.chat:
            first = [{"index": i, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None} for i in range(req.n)]
            yield _sse(envelope(req, rid, first, True))
        done = 0
        while done < req.n:
            index, text, finish = await queue.get()
            if text or finish:
                yield _sse(envelope(req, rid, [choice(req, index, text, finish, True)], True))
            done += finish is not None
        for t in tasks:
            await t  # surfaces an error of a generation
        if req.include_usage:
            u = usage(len(prompt), [c.stats for c in choices])
            yield _sse(envelope(req, rid, [], True, u))
        _log_usage(svc, req, usage(len(prompt), [c.stats for c in choices]))
        yield "data: [DONE]\n\n"
    finally:
        for t in tasks:  # a client that went away: stop drafting and close cloud sessions
            t.cancel()


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _log_usage(svc: EdgeService, req: CompletionRequest, u: dict) -> None:
    log.info("request model=%s user=%s n=%d: %d prompt + %d completion tokens, AL %.2f, "
             "drafted %d accepted %d, wire %d B up %d B down", req.model, req.user, req.n,
             u["prompt_tokens"], u["completion_tokens"], u["mean_acceptance_length"],
             u["drafted_tokens"], u["accepted_tokens"], u["wire_bytes_up"], u["wire_bytes_down"])
    if svc.metrics:
        svc.metrics.record(u)
