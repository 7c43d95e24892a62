"""The verifier's domain core: sessions, limits, batching and cloud-only generation.

Protobuf-free: the servicer converts messages to these calls and SessionErrors to status
codes. All methods run on the event loop; the target runs in the batcher's worker thread.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from acespec.cloud.errors import (
    FailedPrecondition,
    InvalidArgument,
    OutOfRange,
    ResourceExhausted,
)
from acespec.cloud.target.model import Request, Transformer
from acespec.cloud.verify.batcher import Batcher, StepEmulation
from acespec.cloud.verify.decided import DecidedSession, DecideLimits
from acespec.cloud.verify.edge_decided import EdgeDecidedSession
from acespec.cloud.verify.gap import GapDrafter
from acespec.cloud.verify.grammar_work import GrammarWork
from acespec.cloud.verify.pressure import Pressure
from acespec.cloud.verify.proposals import Depth
from acespec.cloud.verify.verdict import decide
from acespec.proto import PROTOCOL_VERSION
from acespec.shared.logprobs import TokenLogprob, token_logprob
from acespec.shared.served import NodeScore, ServeParams

log = logging.getLogger(__name__)


DEFAULT_GENERATE_TOKENS = 128  # Generate with max_tokens unset (0 on the wire)


@dataclass(frozen=True)
class Limits:
    max_sessions: int = 256  # edge-decided and decided sessions and Generate calls at once
    max_live_nodes: int = 256  # uncommitted nodes per session
    max_prompt_tokens: int = 4096
    max_generate_tokens: int = 4096
    max_batch_nodes: int = 1024
    max_tail_per_node: int = 4096  # tail samples (Scores + MoreTail) per node
    propose: int = 8  # decided sessions: the most of the verifier's own proposals in a pass
    # no draft covers (prompt lookup over the session's text, or a gap drafter; as many as
    # pay, acespec.cloud.verify.proposals; 0: none)


@dataclass
class Lone:
    """The verifier's proposals for one lone pass: where they came from, lookup's n-gram
    order (0 for a gap drafter's), lookup's own (the gap drafter's baseline), the drafter's
    seconds (None: not asked) and what the pass scores."""

    source: str  # "lookup" | "gap"
    order: int
    lookup: list[int]
    gap_s: float | None = None
    proposals: list[int] | None = None

    def __post_init__(self) -> None:
        if self.proposals is None:
            self.proposals = self.lookup


@dataclass(frozen=True)
class Generated:
    """One token of cloud-only decoding: its logprob entry (None: not asked) and whether it
    ends the call (a stop token or the last of max_tokens)."""

    token: int
    logprob: TokenLogprob | None
    last: bool


@dataclass
class OpenResult:
    session_id: str
    session: EdgeDecidedSession
    root: NodeScore
    max_live_nodes: int


@dataclass
class Engine:
    model: Transformer
    vocab_hash: str
    model_id: str
    limits: Limits = field(default_factory=Limits)
    emulation: StepEmulation = field(default_factory=StepEmulation)
    metrics: object | None = None  # acespec.cloud.serving.metrics.Metrics
    gap: GapDrafter | None = None  # proposes in decided sessions' lone passes (cloud.gap)
    tokenizer: tuple[str, int | None] | None = None  # (tokenizer.json, eos id): structured
    # output's grammars need it (None: requests with a grammar are refused)

    def __post_init__(self) -> None:
        self.pressure = Pressure()  # how full the passes are (load-aware speculation)
        self.batcher = Batcher(self.model, self.limits.max_batch_nodes, self.emulation,
                               self._on_pass)
        self.sessions: dict[str, EdgeDecidedSession] = {}
        self._ids: dict[int, str] = {}  # id(session) -> its session id, for the metrics
        self.clients: dict[str, set[str]] = {}  # client -> its open sessions' ids
        self.grammars = GrammarWork(self.tokenizer, self.model.args.vocab_size)
        self.depth = Depth(max(1, self.limits.propose))  # lone passes' proposals worth scoring
        self.depth.cost = self.batcher.cost  # the passes' measured cost, all sessions in them
        self.generating = 0  # Generate calls running now
        if self.metrics:
            self.metrics.sessions_active.set_function(lambda: self.active)
        if self.gap:
            # Drafting shares the target's worker: a co-located drafter takes the device's
            # time between passes (and the verifier's busy time counts it).
            self.gap.executor = self.batcher.executor
            self.gap.on_batch = self.metrics.on_draft if self.metrics else None

    def _on_pass(self, stats) -> None:
        self.pressure.on_pass(stats.sessions, stats.nodes)
        if self.metrics:
            self.metrics.on_pass(stats)

    def client_rows(self) -> list[tuple[str, list, float]]:
        """(client, its open sessions' shares, its nodes per pass) for each client with an
        open session (Generate calls alone are none): the per-client metrics, read from the
        metrics server's thread at a scrape (each list() copies under the GIL, as the loop
        may open or close sessions meanwhile)."""
        rows = []
        for client, ids in list(self.clients.items()):
            shares = [s.share for i in list(ids) if (s := self.sessions.get(i)) is not None]
            if shares:
                rows.append((client, shares, self.batcher.client_nodes(client)))
        return rows

    @property
    def active(self) -> int:
        """Sessions plus Generate calls: what max_sessions bounds."""
        return len(self.sessions) + self.generating

    def _admit(self) -> None:
        if self.active >= self.limits.max_sessions:
            raise ResourceExhausted(f"verifier is full: {len(self.sessions)} sessions and "
                                    f"{self.generating} Generate calls "
                                    f"(max_sessions={self.limits.max_sessions})")

    def check_handshake(self, protocol_version: int, vocab_hash: str) -> None:
        if protocol_version != PROTOCOL_VERSION:
            older = "edge" if protocol_version < PROTOCOL_VERSION else "verifier"
            raise FailedPrecondition(f"edge speaks protocol {protocol_version}, this verifier "
                                     f"speaks {PROTOCOL_VERSION}; upgrade the {older} so "
                                     "both speak one protocol")
        if vocab_hash and vocab_hash != self.vocab_hash:
            raise FailedPrecondition(f"vocab_hash mismatch: edge {vocab_hash}, verifier "
                                     f"{self.vocab_hash} ({self.model_id}); drafter and target "
                                     "must share one tokenizer")

    def _check_prompt(self, prompt: Sequence[int]) -> None:
        limit = min(self.limits.max_prompt_tokens, self.model.args.max_position_embeddings)
        if len(prompt) > limit:
            raise ResourceExhausted(f"prompt of {len(prompt)} tokens exceeds max_prompt_tokens={limit}")

    async def open(self, prompt: Sequence[int], params: ServeParams, seed: int,
                   max_live_nodes: int = 0, client: str = "") -> OpenResult:
        grammar = await self.grammars.cursor(params)
        self._admit()
        self._check_prompt(prompt)
        live = min(max_live_nodes or self.limits.max_live_nodes, self.limits.max_live_nodes)
        session = EdgeDecidedSession(self.model, params, seed, live, self.limits.max_tail_per_node)
        session.grammar = grammar
        req = session.plan_open(prompt)
        session_id = self._register(session, client)
        try:
            root = await self._decisions(session, session.finish_open,
                                         await self.batcher.score(req, client=client))
        except BaseException:
            self.close(session_id)
            raise
        return OpenResult(session_id, session, root, live)

    async def open_decided(self, prompt: Sequence[int], params: ServeParams, seed: int,
                           max_tokens: int, stop: Sequence[int], gap: bool = True,
                           logprobs: int | None = None, client: str = ""
                           ) -> tuple[str, DecidedSession, list[int]]:
        """A session the verifier decides (greedy or coupled): the prefill pass decides the
        first token (returned); every later pass feeds the last decided token first. gap:
        the gap drafter (if the verifier has one) proposes in its lone passes. logprobs: the
        target's logprobs of each decided token are kept, with that many alternatives
        (session.last_logprobs)."""
        if not params.sampling.decided:
            raise FailedPrecondition("Open.decide needs a greedy (temperature 0) or coupled "
                                     "session: exact sampled sessions are decided by the edge")
        self._admit()
        self._check_prompt(prompt)
        vocab = self.model.args.vocab_size
        if not prompt or any(not 0 <= t < vocab for t in prompt):
            raise InvalidArgument(f"prompt_tokens must be non-empty ids in [0, {vocab})")
        context = self.model.args.max_position_embeddings
        limits = DecideLimits(max_tokens=max_tokens or context, stop=frozenset(stop),
                              context=context, pass_nodes=self.limits.max_live_nodes,
                              vocab=vocab, propose=self.limits.propose)
        session = DecidedSession(prompt, params, seed, limits)
        session.logprobs = logprobs
        session.grammar = await self.grammars.cursor(params)
        session.cache = self.model.new_cache(len(prompt) + 64)
        if gap and self.gap and self.limits.propose:
            session.gap = self.gap.open()
        session_id = self._register(session, client)
        try:
            t0 = time.perf_counter()
            logits = await self.batcher.score(Request(list(prompt), session.cache, None,
                                                      last_only=True), client=client)
        except BaseException:
            self.close(session_id)
            raise
        _, first = await self._decisions(session, session.finish_prefill,
                                         logits[-1].cpu().numpy(), time.perf_counter() - t0)
        return session_id, session, first

    async def decided_pass(self, session: DecidedSession) -> tuple[int, list[int]]:
        """One forward pass of a decided session: (first position, decided tokens)."""
        tokens = session.plan_pass(lookup_proposals=False,
                                   budget=self.pressure.budget(session.share, self.batcher.cost))
        lone = await self._lone_proposals(session, len(tokens)) \
            if session.proposal_room else None
        if lone:
            tokens = session.pass_tokens()
        parents = session.pass_parents(session.cache.length)
        chain = parents == list(range(parents[0], parents[0] + len(parents)))
        before = (session.counts.proposed, session.counts.proposed_accepted)
        t0 = time.perf_counter()
        logits = await self.batcher.score(Request(tokens, session.cache,
                                                  None if chain else parents),
                                          client=session.client)
        pass_s = time.perf_counter() - t0
        start, new = await self._decisions(session, session.finish_pass,
                                           logits.cpu().numpy(), pass_s)
        self.pressure.on_decided(len(new))
        if session.done:  # lingering for the edge's last drafts, it is scored no more
            self.batcher.forget(session.cache)
        session.share.settle(len(tokens) - 1, len(session.walked))
        self._report_share(session)
        if lone:  # a saved pass is worth the device's time for one (the session's wait
            # would count every draft step queued before it, the drafter's own included)
            self._settle_proposals(session, lone, session.counts.proposed - before[0],
                                   session.counts.proposed_accepted - before[1], start, new,
                                   self.batcher.cost.seconds(len(tokens)))
        keep = session.kept_slots()
        if keep == list(range(len(keep))):
            session.cache.truncate(len(keep))  # a chain: the rejected drafts' slots
        else:
            session.cache.retain(keep)  # the walked branch, compacted
        return start, new

    def _settle_proposals(self, session: DecidedSession, lone: Lone, proposed: int,
                          accepted: int, start: int, new: list[int], pass_s: float) -> None:
        """A lone pass's proposals were walked: the depth statistics, the gap drafter's
        ledger (against lookup's counterfactual; the edge's drafts, arriving later, may
        take back part of it) and the metrics learn what they earned."""
        self.depth.settle(lone.order, proposed, accepted)
        if lone.gap_s is not None:  # the gap drafter was asked (fallen back to lookup, it
            # earned nothing: accepted is then lookup's own)
            baseline = _agreeing(lone.lookup, new)
            self.gap.ledger.settle(accepted, baseline, pass_s, lone.gap_s)
            if lone.source == "gap" and accepted > baseline:
                session.gap.credit(start + baseline, accepted - baseline, pass_s)
        if self.metrics:
            self.metrics.on_proposals(lone.source, proposed, accepted, lone.gap_s or 0.0)

    def sharing(self) -> float:
        """The sessions sharing the device lately (sequences per pass): what a co-located
        draft step makes wait."""
        return self.batcher.sharing

    async def _lone_proposals(self, session: DecidedSession, fed: int) -> Lone | None:
        """Fill a lone pass of `fed` tokens with as many proposals as pay (self.depth): the
        gap drafter's where the session has one and its ledger says it pays at the device's
        load (Ledger.worth), else (or when it proposes nothing) prompt lookup's. None when
        none is worth scoring."""
        looked, order = session.looked_up()  # lookup's: free, and the drafter's baseline
        base = self.pressure.others()  # what the other sessions bring to the pass
        lone = Lone("lookup", order, looked[:self.depth.depth(order, len(looked), fed,
                                                              base=base)])
        sharing = self.sharing()
        # While the edge's drafts in flight continue the decided text, the drafter would
        # only propose what they bring a pass later; it fills the round trip after a miss.
        if session.gap is not None and not session.edge_on_path() and \
                self.gap.ledger.worth(sharing):
            # Each proposal costs a draft step besides its node, waited out by every
            # session sharing the device.
            k = self.depth.depth(0, session.proposal_room, fed, self.gap.step_s * sharing,
                                 base=base)
            proposals, gap_s = (await self.gap.propose_async(
                session.gap, list(session.tokens), k,
                None if session.params.sampling.greedy else session.pick)
                if k else ([], None))
            if gap_s is not None:
                session.counts.gap_s += gap_s
            if proposals:
                lone = Lone("gap", 0, lone.lookup, gap_s, proposals)
            else:
                lone.gap_s = gap_s
        if not lone.proposals:
            return None if lone.gap_s is None else lone
        session.add_proposals(lone.proposals)
        return lone

    async def extend(self, session: EdgeDecidedSession, first_id: int, tokens: np.ndarray,
                     parents: np.ndarray) -> list[NodeScore]:
        return (await self.extend_many(session, [(first_id, tokens, parents)]))[0]

    async def extend_many(self, session: EdgeDecidedSession, extends: Sequence[tuple]
                          ) -> list[list[NodeScore]]:
        """Score several consecutive Extends of one session in one forward pass (the edge
        pipelines them while the target is busy). extends: [(first_id, tokens, parents)]."""
        first_id, reqs = extends[0][0], []
        try:
            for fid, tokens, parents in extends:
                reqs.append(session.plan_extend(fid, tokens, parents))
            merged = Request([t for r in reqs for t in r.tokens], session.cache,
                             [p for r in reqs for p in r.parents])
            logits = await self.batcher.score(merged, session.share.grant, session.client)
        except BaseException:
            session.abandon(first_id, sum(len(t) for _, t, _ in extends))
            raise
        out = await self._decisions(session, _finish_extends, session, extends, logits)
        self._report_share(session)
        return out

    async def _decisions(self, session, fn, *args):
        """fn(*args): a session's decisions from its pass's logits, off the event loop when
        a grammar masks them (GrammarWork), whose seconds are charged to the session's
        share as the nodes passes would score meanwhile."""
        out, seconds = await self.grammars.apply(session.grammar, fn, *args)
        if seconds:
            session.share.charge(seconds / self._node_seconds())
        return out

    def _node_seconds(self) -> float:
        """A node's part of the recent passes' seconds."""
        nodes = max(1, round(self.pressure.nodes))
        return max(self.batcher.cost.seconds(nodes) / nodes, 1e-6)

    def _report_share(self, session) -> None:
        if self.metrics:
            self.metrics.on_share(self._ids.get(id(session), "?"), session.share)

    def _register(self, session, client: str) -> str:
        session_id = uuid.uuid4().hex
        session.client = client  # whose: its passes share the client's part (verify.clients)
        self.sessions[session_id] = session
        self._ids[id(session)] = session_id
        self.clients.setdefault(client, set()).add(session_id)
        return session_id

    def close(self, session_id: str | None) -> None:
        """Free a session's KV (on end, error or disconnect)."""
        if session_id is None:
            return
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self._ids.pop(id(session), None)
            self.batcher.forget(session.cache)
            mine = self.clients.get(session.client, set())
            mine.discard(session_id)
            if not mine:
                self.clients.pop(session.client, None)
            if self.metrics:
                self.metrics.drop_share(session_id)

    async def generate(self, prompt: Sequence[int], params: ServeParams, seed: int,
                       max_tokens: int = 0, stop: Sequence[int] = (),
                       logprobs: int | None = None, client: str = ""
                       ) -> AsyncIterator[Generated]:
        """Cloud-only autoregressive decoding from p~: yields each token with its logprob
        entry (`logprobs` alternatives, or None when not asked), the one that ends the call
        marked last. The token at absolute position i
        is drawn with a uniform from RNG(seed, i), so a seed fixes the output. max_tokens
        0 = unset: DEFAULT_GENERATE_TOKENS, or fewer when the model's context has less room.
        Counts as a session against max_sessions while it runs; close it (aclose) to stop."""
        max_tokens = self._check_generate(prompt, max_tokens)
        self._admit()
        self.generating += 1
        cache = None
        try:
            cache = self.model.new_cache(len(prompt) + max_tokens)
            logits = await self.batcher.score(Request(list(prompt), cache, None, last_only=True),
                                              client=client)
            stop = set(stop)
            shaped = params.sampling.shaped
            text = list(prompt) if shaped else []  # what penalties and the grammar count
            grammar = await self.grammars.cursor(params)
            for i in range(max_tokens):
                row = logits[-1].cpu().numpy()
                token, _ = await self.grammars.apply(grammar, decide, row, params, seed,
                                                     len(prompt) + i, text, grammar)
                last = token in stop or i + 1 == max_tokens
                if last:  # no pass after this one: the next one does not wait for it
                    self.batcher.forget(cache)
                yield Generated(token, None if logprobs is None
                                else token_logprob(row, token, logprobs), last)
                if last:
                    return
                if shaped:
                    text.append(token)
                logits = await self.batcher.score(Request([token], cache), client=client)
        finally:
            self.generating -= 1
            if cache is not None:  # ended early (cancelled, failed): nor is it waited for
                self.batcher.forget(cache)

    async def prompt_logprobs(self, prompt: Sequence[int], top_n: int, client: str = ""
                              ) -> list[TokenLogprob]:
        """The target's logprobs of prompt[1:], each given what precedes it, with top_n
        alternatives: the prompt prefilled in chunks, as any prompt is, within its client's
        part of the prefill budget, each chunk's logits reduced to its tokens' entries as
        it comes. Counts as a session while it runs."""
        self._check_generate(prompt, 1)
        self._admit()
        self.generating += 1
        try:
            cache = self.model.new_cache(len(prompt))
            return await self.batcher.score(Request(list(prompt), cache, None), client=client,
                                            reduce=lambda rows, at: _scored(rows, at, prompt,
                                                                            top_n))
        finally:
            self.generating -= 1

    def _check_generate(self, prompt: Sequence[int], max_tokens: int) -> int:
        """Validate a Generate request; returns the number of tokens to generate. The
        prompt and the generated tokens must fit the model's context (positions <
        max_position_embeddings): an explicit max_tokens past it is refused, not cut."""
        if not prompt:
            raise InvalidArgument("prompt_tokens is empty")
        self._check_prompt(prompt)
        vocab = self.model.args.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise InvalidArgument(f"prompt_tokens: a token id is outside the vocabulary [0, {vocab})")
        context = self.model.args.max_position_embeddings
        room = context - len(prompt)
        if max_tokens == 0:
            max_tokens = min(DEFAULT_GENERATE_TOKENS, room)
            if max_tokens < 1:
                raise OutOfRange(f"a prompt of {len(prompt)} tokens leaves no room in the "
                                 f"model's context (max_position_embeddings={context})")
        if not 1 <= max_tokens <= self.limits.max_generate_tokens:
            raise InvalidArgument(f"max_tokens must be in [1, {self.limits.max_generate_tokens}]")
        if max_tokens > room:
            raise OutOfRange(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) "
                             f"exceeds the model's context of max_position_embeddings={context}"
                             f" tokens: ask for at most {max(room, 0)}")
        return max_tokens

    async def close_all(self) -> None:
        self.sessions.clear()
        self._ids.clear()
        self.clients.clear()
        await self.batcher.close()
        if self.gap:
            self.gap.close()
        self.grammars.close()


def _finish_extends(session: EdgeDecidedSession, extends: Sequence[tuple],
                    logits: torch.Tensor) -> list[list[NodeScore]]:
    """Each Extend's scores from the one pass's logits (their nodes' rows, in order)."""
    out, offset = [], 0
    for fid, tokens, _ in extends:
        out.append(session.finish_extend(fid, logits[offset:offset + len(tokens)]))
        offset += len(tokens)
    return out


def _scored(rows: torch.Tensor, at: int, prompt: Sequence[int], top_n: int
            ) -> list[TokenLogprob]:
    """The entries of prompt[at + 1 : at + 1 + n] from a chunk's logits rows [n, V] (row j
    scores the token after prompt[at + j]; the prompt's last row scores nothing)."""
    rows = rows.float().cpu().numpy()
    end = min(len(rows), len(prompt) - 1 - at)
    return [token_logprob(rows[j], int(prompt[at + 1 + j]), top_n) for j in range(end)]


def _agreeing(proposals: Sequence[int], decided: Sequence[int]) -> int:
    """How many of `proposals` a pass that decided `decided` (from the same position)
    would have accepted: their prefix equal to what was decided."""
    n = 0
    while n < min(len(proposals), len(decided)) and proposals[n] == decided[n]:
        n += 1
    return n
