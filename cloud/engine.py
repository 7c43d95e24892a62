"""The verifier's domain core: sessions, limits, batching and cloud-only generation.

Protobuf-free: the servicer converts messages to these calls and SessionErrors to status
codes. All methods run on the event loop; the target runs in the batcher's worker thread.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from acespec.cloud.batcher import Batcher, StepEmulation
from acespec.cloud.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from acespec.cloud.model import Request, Transformer
from acespec.cloud.session import TreeSession
from acespec.proto import PROTOCOL_VERSION
from acespec.shared.served import NodeScore, ServeParams, sample_served, served

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    max_sessions: int = 256
    max_live_nodes: int = 256  # uncommitted nodes per session
    max_prompt_tokens: int = 4096
    max_generate_tokens: int = 4096
    max_batch_nodes: int = 1024


@dataclass
class OpenResult:
    session_id: str
    session: TreeSession
    root: NodeScore
    max_live_nodes: int


@dataclass
class Engine:
    model: Transformer
    vocab_hash: str
    model_id: str
    limits: Limits = field(default_factory=Limits)
    emulation: StepEmulation = field(default_factory=StepEmulation)
    metrics: object | None = None  # acespec.cloud.metrics.Metrics

    def __post_init__(self) -> None:
        on_pass = self.metrics.on_pass if self.metrics else None
        self.batcher = Batcher(self.model, self.limits.max_batch_nodes, self.emulation, on_pass)
        self.sessions: dict[str, TreeSession] = {}

    def check_handshake(self, protocol_version: int, vocab_hash: str) -> None:
        if protocol_version != PROTOCOL_VERSION:
            raise FailedPrecondition(f"protocol_version {protocol_version} is not supported; "
                                     f"this verifier speaks {PROTOCOL_VERSION}")
        if vocab_hash and vocab_hash != self.vocab_hash:
            raise FailedPrecondition(f"vocab_hash mismatch: edge {vocab_hash}, verifier "
                                     f"{self.vocab_hash} ({self.model_id}); drafter and target "
                                     "must share one tokenizer")

    def _check_prompt(self, prompt: Sequence[int]) -> None:
        limit = min(self.limits.max_prompt_tokens, self.model.args.max_position_embeddings)
        if len(prompt) > limit:
            raise ResourceExhausted(f"prompt of {len(prompt)} tokens exceeds max_prompt_tokens={limit}")

    async def open(self, prompt: Sequence[int], params: ServeParams, seed: int,
                   max_live_nodes: int = 0) -> OpenResult:
        if len(self.sessions) >= self.limits.max_sessions:
            raise ResourceExhausted(f"verifier is full: {len(self.sessions)} sessions "
                                    f"(max_sessions={self.limits.max_sessions})")
        self._check_prompt(prompt)
        live = min(max_live_nodes or self.limits.max_live_nodes, self.limits.max_live_nodes)
        session = TreeSession(self.model, params, seed, live)
        req = session.plan_open(prompt)
        session_id = uuid.uuid4().hex
        self.sessions[session_id] = session
        try:
            root = session.finish_open(await self.batcher.score(req))
        except BaseException:
            self.sessions.pop(session_id, None)
            raise
        return OpenResult(session_id, session, root, live)

    async def extend(self, session: TreeSession, first_id: int, tokens: np.ndarray,
                     parents: np.ndarray) -> list[NodeScore]:
        return (await self.extend_many(session, [(first_id, tokens, parents)]))[0]

    async def extend_many(self, session: TreeSession, extends: Sequence[tuple]
                          ) -> list[list[NodeScore]]:
        """Score several consecutive Extends of one session in one forward pass (the edge
        pipelines them while the target is busy). extends: [(first_id, tokens, parents)]."""
        first_id, reqs = extends[0][0], []
        try:
            for fid, tokens, parents in extends:
                reqs.append(session.plan_extend(fid, tokens, parents))
            merged = Request([t for r in reqs for t in r.tokens], session.cache,
                             [p for r in reqs for p in r.parents])
            logits = await self.batcher.score(merged)
        except BaseException:
            session.abandon(first_id, sum(len(t) for _, t, _ in extends))
            raise
        out, offset = [], 0
        for fid, tokens, _ in extends:
            out.append(session.finish_extend(fid, logits[offset:offset + len(tokens)]))
            offset += len(tokens)
        return out

    def close(self, session_id: str | None) -> None:
        """Free a session's KV (on end, error or disconnect)."""
        if session_id is not None:
            self.sessions.pop(session_id, None)

    async def generate(self, prompt: Sequence[int], params: ServeParams, seed: int,
                       max_tokens: int, stop: Sequence[int] = ()) -> AsyncIterator[int]:
        """Cloud-only autoregressive decoding from p~; token at absolute position i is drawn
        with a uniform from RNG(seed, i), so a seed fixes the output."""
        if not prompt:
            raise InvalidArgument("prompt_tokens is empty")
        self._check_prompt(prompt)
        if not 1 <= max_tokens <= self.limits.max_generate_tokens:
            raise InvalidArgument(f"max_tokens must be in [1, {self.limits.max_generate_tokens}]")
        vocab = self.model.args.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise InvalidArgument(f"prompt_tokens: a token id is outside the vocabulary [0, {vocab})")
        cache = self.model.new_cache(len(prompt) + max_tokens)
        logits = await self.batcher.score(Request(list(prompt), cache, None, last_only=True))
        stop = set(stop)
        for i in range(max_tokens):
            dist = served(logits[-1].cpu().numpy(), params)
            u = np.random.default_rng([seed, len(prompt) + i]).random()
            token = sample_served(dist, u)
            yield token
            if token in stop or i + 1 == max_tokens:
                return
            logits = await self.batcher.score(Request([token], cache))

    async def close_all(self) -> None:
        self.sessions.clear()
        await self.batcher.close()
