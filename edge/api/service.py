"""`acespec edge serve`: the edge as a local OpenAI-compatible HTTP server (Starlette).

Requests share one drafter and one gRPC channel to the verifier. The drafter's context is
sized for `max_concurrent` generations of `ctx_per_request` tokens each: a generation holds
one drafter sequence (and one more for its guessed branches) while it runs; the others
wait in a queue of at most `max_queue`, beyond which a request gets 503 with Retry-After,
and a request longer than `ctx_per_request` gets 400: the context is never overrun.
Streaming uses server-sent events in OpenAI's chunk format ending in [DONE].
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import jinja2

from acespec.edge.api.answer import FAILED, Answer, LinkBoard, Note, stream_parts
from acespec.edge.api.grammar_work import GrammarWork
from acespec.edge.api.logprobs import Echo, echo_of, joined
from acespec.edge.api.openai_types import (
    ApiError,
    CompletionRequest,
    choice,
    envelope,
    new_id,
    usage,
)
from acespec.edge.api.structured import Tools, tools_prompt
from acespec.edge.client import prompt_logprobs
from acespec.edge.session import EdgeEngine, EngineConfig
from acespec.edge.session.config import GROW_SEQS
from acespec.edge.text import TextCodec, chat_segments
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams

log = logging.getLogger(__name__)
KEEPALIVE_S = 1.0  # a stream silent this long gets an SSE comment (clients, proxies wait on)


@dataclass
class EdgeService:
    """Everything a request needs; built once per server."""

    codec: TextCodec
    drafter: object | None  # None in 'ar' mode
    connect: Callable[[], object]  # makes the grpc.aio.Channel all requests share
    model_name: str  # the served name responses report
    base: EngineConfig
    aliases: tuple[str, ...] = ()  # other names requests may give (edge serve --served-model-name)
    chat_template: str | None = None
    token: str | None = None
    metrics: object | None = None
    max_concurrent: int = 8  # generations at once (main sequences 1..N, then GROW_SEQS each)
    ctx_per_request: int = 2048  # most prompt + max_tokens tokens of one generation
    max_queue: int = 64  # generations waiting for a sequence
    reconnect_deadline_s: float = 30.0  # an in-flight generation rides out an outage this long
    link: LinkBoard = field(default_factory=LinkBoard)
    grammars: GrammarWork = field(default_factory=GrammarWork)  # compiles requests' grammars
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models' "created"
    free_seqs: asyncio.Queue = field(default_factory=asyncio.Queue)
    admitted: int = field(default=0, init=False)  # generations of requests in flight
    waiting: int = field(default=0, init=False)  # of which queued for a sequence
    _channel: object | None = field(default=None, init=False, repr=False)
    _stopping: asyncio.Event | None = field(default=None, init=False, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        for seq in range(1, self.max_concurrent + 1):  # drafter sequences; 0 stays for tools
            self.free_seqs.put_nowait(seq)
        self.engine = EdgeEngine(lambda: self.channel, self.codec.vocab_hash, self.drafter,
                                 self.token, owns_channels=False)

    @property
    def served_names(self) -> tuple[str, ...]:
        """The names requests may give, the reported one first."""
        return (self.model_name, *(a for a in self.aliases if a != self.model_name))

    @property
    def channel(self):
        """The shared channel, made on first use: a grpc.aio channel binds to the event loop
        it is created in, so it must be made inside the server's loop, never before it."""
        if self._channel is None:
            self._channel = self.connect()
        return self._channel

    @property
    def stopping(self) -> asyncio.Event:
        """Set when the server was asked to stop (made in the server's loop, on first use)."""
        if self._stopping is None:
            self._stopping, self._loop = asyncio.Event(), asyncio.get_running_loop()
        return self._stopping

    def begin_shutdown(self) -> None:
        """From a signal handler: open streams end now (error event, then [DONE])."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.stopping.set)

    async def verifier_ready(self, timeout_s: float = 1.0) -> bool:
        """Whether the shared channel reaches the verifier within timeout_s."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def prepared(self, req: CompletionRequest) -> CompletionRequest:
        """The request with its grammar compiled (off the event loop); ApiError 400 naming
        the field when its structure cannot be compiled, or its session cannot serve it
        (checked before any stream starts)."""
        if req.structure is not None:
            drafter = self.drafter if hasattr(self.drafter, "prepare_grammar") else None
            req = replace(req, grammar=await self.grammars.compile(req.structure, drafter))
        self.config(req, 0)
        return req

    def prompt_tokens(self, req: CompletionRequest) -> list[int]:
        """The prompt's token ids; ApiError 400 if the request cannot fit one generation's
        share of the drafter context (it would fail mid-way, or starve the others)."""
        if isinstance(req.prompt, list):  # chat: control tokens from the template only
            prompt = self.codec.encode_parts(req.prompt)
        else:  # completions: text, unless the caller asked for its control tokens
            prompt = self.codec.encode(req.prompt) if req.parse_special else \
                self.codec.encode_parts([(req.prompt, False)])
        need = len(prompt) + req.max_tokens
        if self.drafter is not None and need > self.ctx_per_request:
            param = ("messages" if req.chat else "prompt") \
                if len(prompt) >= self.ctx_per_request else "max_tokens"
            raise ApiError(400, f"this request needs {need} tokens of context ({len(prompt)} "
                           f"in the prompt + max_tokens {req.max_tokens}); this server allows "
                           f"{self.ctx_per_request} per request (edge serve "
                           "--ctx-per-request)", param, code="context_length_exceeded")
        return prompt

    def admit(self, n: int) -> Callable[[], None]:
        """Admit a request of n generations, or ApiError 503 when running and queued ones
        would exceed max_concurrent + max_queue (an idle server takes any request). Returns
        the release, to call exactly once when the request is over."""
        if self.admitted and self.admitted + n > self.max_concurrent + self.max_queue:
            raise ApiError(503, f"the server is busy: {self.admitted - self.waiting} "
                           f"generations running and {self.waiting} waiting (edge serve "
                           "--max-concurrent, --max-queue); retry shortly",
                           kind="server_error", code="server_busy", headers={"Retry-After": "1"})
        self.admitted += n
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.admitted -= n
        return release

    async def acquire(self) -> int:
        """A free drafter sequence, waiting in line for one if need be."""
        self.waiting += 1
        try:
            return await self.free_seqs.get()
        finally:
            self.waiting -= 1

    def free_seq(self, seq: int) -> None:
        """Give `seq` back (its KV and its branch sequence's freed first)."""
        if self.drafter is not None and hasattr(self.drafter, "drop"):
            self.drafter.drop(seq)
            for branch in self.branch_seq(seq):
                self.drafter.drop(branch)
        self.free_seqs.put_nowait(seq)

    def branch_seq(self, seq: int) -> list[int]:
        """Where the generation on `seq` builds its branches: its own, no one else's."""
        first = self.max_concurrent + 1 + (seq - 1) * GROW_SEQS
        return list(range(first, first + GROW_SEQS))

    def render_chat(self, messages: list[dict], tools: Tools | None = None
                    ) -> list[tuple[str, bool]]:
        """The chat prompt as (text, is_markup) pieces (edge.text.chat_segments). Tools go
        to a template that takes `tools`, else into a system message before the rest."""
        if not self.chat_template:
            raise ApiError(400, f"model {self.model_name!r} has no chat template; use "
                           "/v1/completions", "messages")
        template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(
            self.chat_template)
        extra = {}
        if tools is not None and "tools" in self.chat_template:
            extra["tools"] = [{"type": "function", "function": t} for t in tools.specs]
        elif tools is not None:
            messages = [{"role": "system", "content": tools_prompt(tools.specs)}, *messages]
        try:
            return chat_segments(lambda msgs: template.render(
                messages=msgs, add_generation_prompt=True, bos_token="", eos_token="",
                **extra), messages)
        except (jinja2.TemplateError, ValueError) as e:
            raise ApiError(400, f"chat template failed: {e}", "messages") from None

    def config(self, req: CompletionRequest, index: int) -> EngineConfig:
        seed = (req.seed if req.seed is not None else int(time.time_ns() % 2**31)) + index
        sampling = req.sampling or self.base.sampling  # 'exact': the edge decides
        coupled = sampling == "coupled"
        serve = ServeParams(SamplingParams(req.temperature, req.top_k, req.top_p, coupled),
                            send_mass=self.base.serve.send_mass, k_max=self.base.serve.k_max)
        serve = replace(serve, sampling=replace(serve.sampling, penalties=req.penalties,
                                                grammar=req.grammar))
        stops = frozenset() if req.ignore_eos else self.codec.stop_ids
        try:
            return replace(self.base, serve=serve, seed=seed,
                           max_tokens=max(1, req.max_tokens),  # 0 (echo): never generated
                           sampling=sampling, offline=req.offline or self.base.offline,
                           stop_ids=stops, backoff_s=0.1, logprobs=req.logprobs,
                           reconnect_deadline_s=self.reconnect_deadline_s)
        except ValueError as e:  # logprobs, not served in this session's mode
            raise ApiError(400, str(e), "logprobs") from None


async def echo(svc: EdgeService, req: CompletionRequest, prompt: list[int]) -> Echo | None:
    """What `echo` puts before each answer: the prompt and, with logprobs, its tokens'
    (the verifier scores the prompt in one pass)."""
    if not req.echo:
        return None
    entries = None if req.logprobs is None else await prompt_logprobs(
        svc.channel, prompt, req.logprobs, svc.codec.vocab_hash, svc.token, svc.engine.client_id)
    return echo_of(svc.codec.piece_fn, req.prompt, prompt, entries, svc.codec.bos_id)


async def complete(svc: EdgeService, req: CompletionRequest, prompt: list[int]) -> dict:
    echoed = await echo(svc, req, prompt)
    choices = [Answer(svc, req, i, echoed) for i in range(req.n)]
    tasks = [asyncio.create_task(c.run(prompt, None)) for c in choices]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:  # one failed, or the request was cancelled: stop the others too
            t.cancel()
    u = usage(len(prompt), [c.stats for c in choices])
    _log_usage(svc, req, u)
    return envelope(req, new_id(req.chat), [_final(req, c) for c in choices], False, u)


def _final(req: CompletionRequest, c: Answer) -> dict:
    before = c.echo.text if c.echo is not None else ""
    part = choice(req, c.index, before + c.text + c.tail, c.finish, False)
    if c.calls:
        part["message"] = {"role": "assistant", "content": None, "tool_calls": c.calls}
    if req.logprobs is not None:
        part["logprobs"] = c.logprobs(0, len(c.text))
        if c.echo is not None:
            part["logprobs"] = joined(c.echo.logprobs, part["logprobs"])
    if c.extension():
        part["acespec"] = c.extension()
    return part


async def stream(svc: EdgeService, req: CompletionRequest, prompt: list[int],
                 echoed: Echo | None):
    """Server-sent events: one chunk per piece of new text, then [DONE]. A generation that
    fails sends no finish chunk: its error surfaces here (the caller makes it an error event).
    With continuous_usage every chunk carries the usage so far (vLLM's continuous_usage_stats);
    with include_usage a last chunk, with no choices, carries the request's. `echoed`: what
    echo(...) made of the prompt, before the stream started (its errors are the request's)."""
    rid, queue = new_id(req.chat), asyncio.Queue()
    choices = [Answer(svc, req, i, echoed) for i in range(req.n)]
    tasks = [asyncio.create_task(c.run(prompt, queue)) for c in choices]

    def chunk(parts: list[dict]) -> str:
        so_far = usage(len(prompt), [c.stats for c in choices]) if req.continuous_usage else None
        return _sse(envelope(req, rid, parts, True, so_far))

    try:
        if req.chat:
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                          "finish_reason": None} for i in range(req.n)])
        if echoed is not None:
            yield chunk([{**choice(req, i, echoed.text, None, True),
                          "logprobs": echoed.logprobs} for i in range(req.n)])
        done = 0
        while done < req.n:
            item = await next_or_stop(queue, svc.stopping, KEEPALIVE_S)
            if item is None:
                yield ": keep-alive\n\n"
                continue
            index, ops, finish = item
            if finish == FAILED:
                await tasks[index]  # raises the generation's error
                raise RuntimeError("a generation failed without an error")  # unreachable
            for part in stream_parts(req, index, ops, finish, choices[index].extension()):
                yield f": {part.text}\n\n" if isinstance(part, Note) else chunk([part])
            done += finish is not None
        for t in tasks:
            await t
        u = usage(len(prompt), [c.stats for c in choices])
        if req.include_usage:
            yield _sse(envelope(req, rid, [], True, u))
        _log_usage(svc, req, u)
        yield "data: [DONE]\n\n"
    finally:
        for t in tasks:  # a client that went away: stop drafting and close cloud sessions
            t.cancel()


class ShuttingDown(Exception):
    """The server was asked to stop while this request ran."""


async def next_or_stop(queue: asyncio.Queue, stop: asyncio.Event,
                       timeout: float | None = None):
    """The next item of `queue`, None after `timeout` s without one, or ShuttingDown once
    `stop` is set."""
    if stop.is_set():
        raise ShuttingDown
    get, halt = asyncio.ensure_future(queue.get()), asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({get, halt}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        halt.cancel()
    if get not in done:
        get.cancel()
        if halt in done:
            raise ShuttingDown
        return None
    return get.result()


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _log_usage(svc: EdgeService, req: CompletionRequest, u: dict) -> None:
    """One line per request (INFO: `acespec -v edge serve`), with the caller's user,
    safety_identifier and metadata when it sent them, as ASCII JSON (no character of theirs
    can break the line)."""
    said = {"user": req.user and _clip(req.user),
            "safety_identifier": req.safety_identifier and _clip(req.safety_identifier),
            "metadata": req.metadata}
    who = "".join(f" {k}={json.dumps(v, separators=(',', ':'))}"
                  for k, v in said.items() if v)
    log.info("request model=%s%s n=%d: %d prompt + %d completion tokens, AL %.2f, "
             "drafted %d accepted %d, wire %d B up %d B down", req.model, who, req.n,
             u["prompt_tokens"], u["completion_tokens"], u["mean_acceptance_length"],
             u["drafted_tokens"], u["accepted_tokens"], u["wire_bytes_up"], u["wire_bytes_down"])
    if svc.metrics:
        svc.metrics.record(u)


def _clip(value: str, most: int = 256) -> str:
    return value if len(value) <= most else value[:most] + "..."
