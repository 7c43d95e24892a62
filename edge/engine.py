"""The edge engine: one request, decoded against a remote verifier in one of three modes.

* ar       - cloud-only `Generate` (the baseline): no drafter.
* sd       - vanilla speculative decoding: draft `depth` tokens, send, wait, walk, repeat.
* pipeline - keep drafting past in-flight nodes (the edge's own draft stands in for the
             bonus) and stream Extends up to `window` live nodes; apply verdicts in order.

All modes sample p~ exactly (acceptance decided by `acespec.shared.walk` with randomness
that is a function of (seed, position)); greedy gives the same text in every mode. The edge
holds the committed text: if the verifier goes away, it reconnects with backoff and re-opens
the session with the committed tokens, losing and duplicating nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from acespec.edge.adaptive import LinkBudgets, LinkEstimate, Shape, choose_shape
from acespec.edge.client import FRAMING, CloudSession, Tail, generate
from acespec.edge.decided import DecidedDriver
from acespec.edge.engine_types import GROW_SEQS, EngineConfig, Stats
from acespec.edge.grow_driver import GrowDriver
from acespec.edge.live_nodes import RESERVE, VerifierLive, fit_to_grant
from acespec.edge.spec_tree import SpecTree
from acespec.edge.state_cache import BUDGETS, AcceptanceModel, Costs, RecoveryModel, guesses, plan
from acespec.shared.sampling import PositionalRng
from acespec.shared.walk import NeedTail, walk

log = logging.getLogger(__name__)

NODE_PASS_S = 5e-4  # what one more tree node adds to a big target's pass (a planning guess)



@dataclass
class _Flight:
    """What is in flight on one session."""

    in_flight: int = 0  # Extends whose Scores have not arrived
    want_tail: bool = False  # a MoreTail is outstanding
    sent: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes) of those Extends


class Lost(Exception):
    """The verifier connection failed; the engine reconnects."""


class EdgeEngine:
    def __init__(self, connect: Callable[[], grpc.aio.Channel], vocab_hash: str,
                 drafter=None, token: str | None = None, owns_channels: bool = True):
        """connect() gives a channel per session attempt; with owns_channels=False it may
        return one shared channel, which the engine then never closes."""
        self.connect, self.vocab_hash, self.drafter, self.token = connect, vocab_hash, drafter, token
        self.owns_channels = owns_channels

    async def generate(self, prompt: Sequence[int], cfg: EngineConfig,
                       on_tokens: Callable[[list[int], Stats], None] | None = None,
                       seq: int = 0, branch_seq: int | Sequence[int] | None = None
                       ) -> tuple[list[int], Stats]:
        """Decode up to cfg.max_tokens after `prompt`; returns (tokens, stats). on_tokens is
        called with each newly committed token (and the running stats). `seq` is the
        drafter sequence this request may use (one per concurrent request); acespec mode
        builds its branches on `branch_seq` (default seq + 1..seq + 6; a list gives several),
        which no other request may use.
        Raises ConnectionError when the verifier cannot be reached (soon, if it never was),
        grpc.aio.AioRpcError when it refuses, GrantTooSmall when its grant is too small."""
        if cfg.mode != "ar" and self.drafter is None:
            raise ValueError(f"mode {cfg.mode!r} needs a drafter")
        if branch_seq is None:  # as many as the drafter has, up to GROW_SEQS
            limit = getattr(getattr(self.drafter, "config", None), "n_seq_max", seq + 7)
            branch_seq = list(range(seq + 1, min(seq + 1 + GROW_SEQS, limit))) or [seq + 1]
        run = _Run(self, list(prompt), cfg, on_tokens, seq,
                   [branch_seq] if isinstance(branch_seq, int) else list(branch_seq))
        retry = _Reconnect(cfg)
        while not run.finished:
            try:
                await (run.ar() if cfg.mode == "ar" else run.speculate())
            except (grpc.aio.AioRpcError, ConnectionError, Lost) as e:
                await retry.wait(e, run)
        run.stats.seconds = time.perf_counter() - run.t0
        return run.out, run.stats


def _reason(e: Exception) -> str:
    """One line for a failed call (an AioRpcError's str() is a multi-line debug dump)."""
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return str(e)


def _retriable(e: Exception) -> bool:
    """A lost connection is worth a new session; a refusal (bad request, auth, vocabulary,
    an unusable token in the metadata) would only be refused again."""
    if not isinstance(e, grpc.aio.AioRpcError):
        return True
    if "metadata" in (e.details() or "").lower():
        return False
    return e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                        grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


class _Reconnect:
    """The resume policy of one request: exponential backoff for a connection that worked
    (the committed text is kept), but a quick, clear failure when no session ever opened:
    a wrong address or a verifier that is down should not take half a minute to report."""

    def __init__(self, cfg: EngineConfig):
        self.cfg, self.t0 = cfg, time.perf_counter()
        self.delay, self.failures, self.progress = cfg.backoff_s, 0, 0
        self.outage_t0 = time.perf_counter()

    async def wait(self, e: Exception, run: _Run) -> None:
        if not _retriable(e):
            raise e
        cfg = self.cfg
        if not run.connected and (time.perf_counter() - self.t0 + self.delay
                                  > cfg.connect_timeout_s):
            raise ConnectionError(f"no connection within {cfg.connect_timeout_s:g} s "
                                  f"({_reason(e)})") from e
        if len(run.out) > self.progress:  # the last session got somewhere: a new outage
            self.delay, self.failures, self.progress = cfg.backoff_s, 0, len(run.out)
        if self.failures == 0:
            self.outage_t0 = time.perf_counter()
        deadline = cfg.reconnect_deadline_s
        if deadline is not None:
            if time.perf_counter() - self.outage_t0 + self.delay > deadline:
                raise ConnectionError(f"verifier unreachable for {deadline:g} s "
                                      f"(reconnect deadline; {_reason(e)})") from e
        elif self.failures >= cfg.max_reconnects:
            raise ConnectionError(f"verifier unreachable after {cfg.max_reconnects} "
                                  f"reconnects ({_reason(e)})") from e
        self.failures += 1
        run.stats.reconnects += 1
        # Before any session opened this is not an outage yet, only a slow start: no warning.
        log.log(logging.WARNING if run.connected else logging.INFO,
                "verifier connection lost (%s); reconnecting in %.2f s with %d committed "
                "tokens", _reason(e), self.delay, len(run.out))
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, 8.0 if deadline is None else 2.0)


class _Run:
    """State of one request across reconnects."""

    def __init__(self, engine: EdgeEngine, prompt: list[int], cfg: EngineConfig, on_tokens,
                 seq: int, branch_seqs: list[int]):
        self.e, self.prompt, self.cfg, self.on_tokens = engine, prompt, cfg, on_tokens
        self.seq, self.branch_seqs = seq, branch_seqs
        self.branch_seq = branch_seqs[0]  # the tree protocol's branches
        self.acc = AcceptanceModel()
        self.rec = RecoveryModel(cfg.cache.guesses)
        self.link = LinkEstimate()
        self.shape = Shape(cfg.depth, cfg.window)  # follows the link when cfg.adaptive
        self.alpha = 0.7  # running per-position acceptance (for the shape model)
        self.draft_s = 1e-3  # running drafter seconds per token
        self._guess: dict[int, tuple[list[int], float]] = {}  # drafted node -> (guesses, confidence)
        self._since_change = 0  # Scores since the shape last changed
        self.out: list[int] = []
        self.stats = Stats()
        self.t0 = time.perf_counter()
        self.finished = False
        self.connected = False  # a verifier answered at least once (resume, not fail fast)
        self._sess: CloudSession | None = None  # the live session (for live byte counts)
        self._base_bytes = (0, 0)

    def _sync_bytes(self) -> None:
        if self._sess is not None:
            self.stats.wire_bytes_up = self._base_bytes[0] + self._sess.bytes_up
            self.stats.wire_bytes_down = self._base_bytes[1] + self._sess.bytes_down

    # -- committed text ---------------------------------------------------------

    def _emit(self, tokens: list[int]) -> None:
        """Append decided tokens, honouring stop ids and max_tokens."""
        for t in tokens:
            if self.finished:
                return
            if t in self.cfg.stop_ids:
                self.finished = True
                return
            self.out.append(t)
            self.stats.tokens += 1
            if self.stats.first_token_s is None:
                self.stats.first_token_s = time.perf_counter() - self.t0
            if self.on_tokens:
                self._sync_bytes()
                if self.on_tokens([t], self.stats):  # the caller wants no more (a stop string)
                    self.finished = True
            if len(self.out) >= self.cfg.max_tokens:
                self.finished = True

    def _rng_at(self, purpose: int):
        seed = self.cfg.seed
        return lambda position: np.random.default_rng([seed, position, purpose])

    # -- ar ---------------------------------------------------------------------

    async def ar(self) -> None:
        ch = self.e.connect()
        sizes: list[int] = []
        try:
            left = self.cfg.max_tokens - len(self.out)
            stream = generate(ch, self.prompt + self.out, self.cfg.serve, self.cfg.seed, left,
                              self.e.vocab_hash, self.e.token, list(self.cfg.stop_ids), sizes)
            async with contextlib.aclosing(stream) as tokens:  # closing cancels the call
                async for tok in tokens:
                    self.connected = True
                    self.stats.target_forwards += 1
                    self.stats.rounds += 1
                    self._emit([tok])
                    if self.finished:  # max_tokens or a stop: read no further
                        break
            self.finished = True
        finally:
            if sizes:
                self.stats.wire_bytes_up += sizes[0] + FRAMING
                self.stats.wire_bytes_down += sum(sizes[1:]) + FRAMING * (len(sizes) - 1)
            if self.e.owns_channels:
                await ch.close()

    # -- sd / pipeline ------------------------------------------------------------

    async def speculate(self) -> None:
        ch = self.e.connect()
        sess = CloudSession(ch, self.e.token)
        self._sess, self._base_bytes = sess, (self.stats.wire_bytes_up, self.stats.wire_bytes_down)
        inbox: asyncio.Queue = asyncio.Queue()
        reader = None
        try:
            context = self.prompt + self.out
            root = await self._open(sess, context)
            self.connected = True
            if root is None:  # the verifier decides this session (greedy/coupled acespec)
                self.passes_before = self.stats.target_forwards
                reader = asyncio.create_task(self._read(sess, inbox))
                driver = GrowDriver if sess.grows and self.cfg.grow_tree else DecidedDriver
                await driver(self, sess).drive(inbox)
                await sess.close()
                return
            self._fit(sess.max_live_nodes or self._live_limit())
            self.pending_commit = None  # node id to commit with the next Extend
            self.stats.target_forwards += 1
            tree = SpecTree(context[-1], len(context) - 1, root)
            self.head = None  # (end node, decided token) waiting to be sent as a node
            reader = asyncio.create_task(self._read(sess, inbox))
            await self._drive(sess, tree, inbox)
            await sess.close()
        finally:
            if reader:
                reader.cancel()
            if not self.finished:
                sess.cancel()  # an error or a cancelled request: the verifier frees the KV
            self._sync_bytes()
            self._sess = None
            if self.e.owns_channels:
                await ch.close()

    async def _open(self, sess: CloudSession, context: list[int]):
        """Open the session: the root's score, or None when the verifier decides it (acespec
        mode, greedy or coupled; an older verifier answers with a root score instead)."""
        cfg = self.cfg
        if cfg.mode == "acespec" and cfg.serve.sampling.decided and cfg.verifier_decides:
            return await sess.open_decided(context, cfg.serve, cfg.seed, self.e.vocab_hash,
                                           cfg.max_tokens - len(self.out), sorted(cfg.stop_ids))
        # Commits ride on the next Extend, so the verifier frees dead and committed
        # nodes one Extend later than the edge does: it may hold up to twice the window.
        return await sess.open(context, cfg.serve, cfg.seed, self.e.vocab_hash,
                               max_live_nodes=self._live_limit())

    @staticmethod
    async def _read(sess: CloudSession, inbox: asyncio.Queue) -> None:
        try:
            while True:
                before = sess.bytes_down
                msg = await sess.recv()
                await inbox.put((msg, sess.bytes_down - before, sess.server_s))
        except Exception as e:  # noqa: BLE001 - handed to the driver, which reconnects
            await inbox.put(e)

    async def _drive(self, sess: CloudSession, tree: SpecTree, inbox: asyncio.Queue) -> None:
        fl = _Flight()
        while not self.finished:
            while not inbox.empty():  # apply what has arrived before drafting further
                self._take(inbox.get_nowait(), tree, fl)
            # sd verifies a chain only once all of it is scored (draft, send, wait, verify),
            # so its rounds - and the bonus at each chain's end - align however it resumes.
            settled = self.cfg.mode != "sd" or fl.in_flight == 0
            if not fl.want_tail and self.head is None and settled:
                try:
                    res = walk(tree.root, self.cfg.serve.sampling.greedy, self._rng_at(1),
                               bonus_at_leaves=not self._will_draft(tree))
                    await self._apply(sess, tree, res)
                except NeedTail as e:
                    await sess.more_tail(e.node_id, 2)
                    self.stats.more_tail += 1
                    fl.want_tail = True
            if self.finished:
                return
            if not fl.want_tail and self._may_draft(tree, fl.in_flight):
                before = sess.bytes_up
                await self._extend(sess, tree)
                fl.sent.append((time.perf_counter(), sess.bytes_up - before))
                fl.in_flight += 1
                continue
            if fl.in_flight == 0 and not fl.want_tail and inbox.empty():
                # Nothing in flight and nothing to send: waiting would hang forever.
                raise RuntimeError(f"edge engine stalled at {len(self.out)} tokens with "
                                   f"{self.live.held_after(self.pending_commit)} of "
                                   f"{self.live.grant} live nodes held by the verifier")
            self._take(await inbox.get(), tree, fl)

    def _fit(self, grant: int) -> None:
        """Fit the shape (and its adaptive bounds) to the live nodes the verifier granted."""
        c = self.cfg
        self.live = VerifierLive(grant)
        self.bounds = fit_to_grant(grant, c.max_depth if c.adaptive else c.depth,
                                   c.max_window if c.adaptive else c.window)
        start = self.shape if c.adaptive else Shape(c.depth, c.window)  # grants may differ
        self.shape = Shape(*fit_to_grant(grant, start.depth, start.window))

    def _room(self) -> int:
        """Most nodes the next Extend may add within the verifier's grant."""
        return self.live.room(self.pending_commit, decided=self.head is not None)

    def _live_limit(self) -> int:
        """Live nodes the verifier must allow: the window, a chunk, and in acespec mode the
        branches of every chunk in flight; twice, as commits ride one Extend late."""
        c = self.cfg
        window, depth = (c.max_window, 2) if c.adaptive else (c.window, c.depth)
        branches = (window // depth + 1) * int(c.cache.cloud_nodes) if c.mode == "acespec" else 0
        return 2 * (window + max(c.max_depth, c.depth) + branches) + 2

    def _take(self, item, tree: SpecTree, fl: _Flight) -> None:
        """Apply one downlink message (or raise the reader's error)."""
        msg, size, server_s = item if isinstance(item, tuple) else (item, 0, 0.0)
        if isinstance(msg, grpc.aio.AioRpcError) and msg.code() != grpc.StatusCode.UNAVAILABLE:
            raise msg  # a refusal from the verifier: the caller decides, no blind retry
        if isinstance(msg, Exception):
            raise Lost(str(msg)) from msg
        if isinstance(msg, Tail):
            tree.add_tails(msg.node_id, msg.ids, msg.units)
            fl.want_tail = False
        else:
            fl.in_flight -= 1
            sent_at, up = fl.sent.pop(0)
            rtt = time.perf_counter() - sent_at
            self.stats.round_trips.append(rtt)
            self.stats.target_forwards += 1
            self.stats.server_s += server_s
            tree.apply_scores(msg)
            self.link.observe(up, size, rtt, server_s, sent_at + rtt)
            self._adapt()

    def _will_draft(self, tree: SpecTree) -> bool:
        """Pipeline drafts past every scored leaf until max_tokens: no bonus draws there."""
        return (self.cfg.mode in ("pipeline", "acespec") and
                len(self.out) + len(tree.path_tokens(tree.tip)) < self.cfg.max_tokens)

    def _main_live(self, tree: SpecTree) -> int:
        """Live nodes of the main chain (branches have their own budget)."""
        return len(tree.path_tokens(tree.tip))

    def _may_draft(self, tree: SpecTree, in_flight: int) -> bool:
        if self.head is not None:  # a decided token must reach the verifier, with a draft
            return self._room() >= RESERVE
        if len(self.out) + len(tree.path_tokens(tree.tip)) > self.cfg.max_tokens:
            return False
        if self._room() < 1:  # the verifier's grant is full: wait for verdicts (commits)
            return False
        if self.cfg.mode == "sd":
            return in_flight == 0
        return self._main_live(tree) + self.shape.depth <= self.shape.window

    def _adapt(self) -> None:
        """Follow the link: re-choose (depth, window) from the speedup model."""
        self._since_change += 1
        if not (self.cfg.adaptive and self.link.ready and self.cfg.mode != "sd"):
            return
        if self._since_change < 8:  # dwell: let the estimate see the current shape first
            return
        max_depth, max_window = self.bounds
        if max_depth < 2:  # the grant holds no shape the model chooses from
            return
        new = choose_shape(self.alpha, self.link.base_rtt(), self.link.bandwidth(), self.draft_s,
                           self.shape, max_depth,
                           max(max_depth, min(self.cfg.max_window, self.live.grant - 3)),
                           self.link.step())
        new = Shape(*fit_to_grant(self.live.grant, new.depth, new.window))
        if new != self.shape:
            log.debug("shape %s -> %s (acceptance %.2f, base rtt %.1f ms, %.0f B/s)", self.shape,
                      new, self.alpha, 1000 * self.link.base_rtt(), self.link.bandwidth())
            self.shape, self._since_change = new, 0
            self.stats.shape_changes += 1
        self.stats.depth, self.stats.window = self.shape.depth, self.shape.window
        self.stats.link = {"bytes_per_s": round(self.link.bandwidth()),
                           "base_rtt_ms": round(1000 * self.link.base_rtt(), 1),
                           "step_ms": round(1000 * self.link.step(), 1)}

    async def _apply(self, sess: CloudSession, tree: SpecTree, res) -> None:
        """Take what the walk decided: commit it; after a rejection or a bonus, the decided
        token waits in self.head to lead the next Extend."""
        self.stats.accepted += res.accepted
        self._learn(tree.root, res)
        if res.tokens:
            log.debug("walk from position %d decided %s (%s)", tree.root.position + 1,
                      res.tokens, "waiting" if res.waiting else "done")
        if res.waiting:
            if res.end is not tree.root:
                self._emit(res.tokens)
                tree.reroot(res.end)
                self.pending_commit = res.end.node_id
            return
        self.stats.rounds += 1
        self._emit(res.tokens)
        tree.cut_below(res.end)  # the drafts below the decision point are dead
        tree.reroot(res.end)
        self.head = (res.end, res.tokens[-1])

    async def _extend(self, sess: CloudSession, tree: SpecTree) -> None:
        """Draft at the tip and send the chain (led by the decided head token, if any), plus
        the state cache's branches in acespec mode, as one Extend."""
        head = self.head
        parent = head[0] if head else tree.tip
        lead = [head[1]] if head else []
        context = self.prompt + self.out + ([] if head else tree.path_tokens(tree.tip))
        room = self.cfg.max_tokens - len(self.out) - (0 if head else len(tree.path_tokens(tree.tip)))
        grant_room = self._room()  # nodes this Extend may add within the verifier's grant
        n = max(1, min(self.shape.depth, room, grant_room - len(lead)))
        draft = await self.propose(context, n, self.seq)
        branches = await self._branches(context, draft, grant_room - len(lead) - len(draft)) \
            if self.cfg.mode == "acespec" else []
        log.debug("extend at position %d: lead %s drafts %s, %d branches", len(context), lead,
                  draft.tokens.tolist(), len(branches))
        first = sess.next_id
        chain = lead + draft.tokens.tolist()
        ids = list(range(first, first + len(chain)))  # node ids of the chain
        parents = [parent.node_id] + ids[:-1]
        tokens, base = list(chain), first + len(chain)
        anchor = ([parent.node_id] if not head else [first]) + ids[len(lead):]  # node before draft j
        for br, toks, _ in branches:
            tokens += toks
            parents += [anchor[br.j]] + list(range(base, base + len(toks) - 1))
            base += len(toks)
        await sess.extend(tokens, parents, commit=self.pending_commit)
        self.live.extend(first, parents, self.pending_commit)
        self.pending_commit = None
        if head:
            node = tree.add(first, lead, parent, None)[0]
            self.pending_commit = first  # the head is decided: freed with the next Extend
            tree.reroot(node)
            made = tree.add(first + 1, draft.tokens, node, draft.q)
            self.head = None
        else:
            node = parent
            made = tree.add(first, draft.tokens, parent, draft.q)
        if self.cfg.mode == "acespec":
            self._remember_guesses(made, draft, tree)
        chain_nodes = [node] + made
        nid = first + len(chain)
        for br, toks, qs in branches:
            root = tree.add(nid, toks[:1], chain_nodes[br.j], None)[0]
            tree.add(nid + 1, toks[1:], root, qs)
            nid += len(toks)
            self.stats.cache.branches_uploaded += 1
            self.stats.cache.branch_nodes += len(toks)
        tree.tip = made[-1]

    async def _branches(self, context: list[int], draft, max_nodes: int) -> list[tuple]:
        """Plan and draft recovery branches for this chunk, at most max_nodes nodes in all
        (what the verifier's grant leaves): [(Branch, tokens, qs)]."""
        if max_nodes < 1:
            return []
        c = self.cfg.cache
        rtt = float(np.median(self.stats.round_trips[-8:])) if self.stats.round_trips else 0.1
        per_round = self.stats.tokens / self.stats.rounds if self.stats.rounds else 2.0
        token_s = rtt / max(1.0, per_round)  # the current time per generated token
        greedy = self.cfg.serve.sampling.greedy
        costs = Costs(kv_per_token=float(getattr(self.e.drafter, "kv_bytes_per_token", 4096.0)),
                      draft_ms=1000 * self.draft_s, down_per_node=3.0 if greedy else 20.0)
        derived = (6.0, 24.0, 96.0)
        if self.link.ready:
            derived = LinkBudgets().derive(self.link.base_rtt() + self.link.step(),
                                           self.link.bandwidth(),
                                           self.draft_s * len(draft))
        budgets = c.budgets(derived)
        nodes = BUDGETS.index("cloud_nodes")
        budgets[nodes] = min(budgets[nodes], max_nodes)
        node_s = c.node_s if c.node_s is not None else \
            (costs.up_per_node + costs.down_per_node) / self.link.bandwidth() + NODE_PASS_S
        plans = plan(draft.q, draft.tokens, self.acc, c, token_s=token_s, node_s=node_s,
                     costs=costs, budgets=budgets, ranks=draft.ranks, rec=self.rec)
        self.stats.budgets = {k: round(v, 2) for k, v in zip(BUDGETS, budgets.tolist())}
        out, used = [], 0
        for br in plans:
            if used + 1 + br.depth > max_nodes:  # the allocator's prefix closure may overshoot
                continue
            used += 1 + br.depth
            prefix = context + draft.tokens[:br.j].tolist() + [br.token]
            qs = None
            toks = [br.token]
            if br.depth:
                if hasattr(self.e.drafter, "fork"):
                    self.e.drafter.fork(self.seq, self.branch_seq, len(prefix) - 1)
                d = await self.propose(prefix, br.depth, self.branch_seq)
                toks += d.tokens.tolist()
                qs = d.q
            out.append((br, toks, qs))
        return out

    def _learn(self, root, res) -> None:
        """Feed the verdicts of this walk to the acceptance model and the cache stats."""
        n = root
        for t in res.tokens:
            x = n.drafted
            if x is not None and x.q is not None:
                g, conf = self._guess.pop(x.node_id, (None, float(x.q[x.token])))
                self.acc.update(conf, t == x.token)
                self.alpha += 0.05 * ((t == x.token) - self.alpha)
                if t != x.token:
                    self.stats.cache.rejections += 1
                    if t in n.children:
                        self.stats.cache.hits += 1
                    if g is not None:  # the downlink revealed the recovered token: calibrate
                        self.rec.observe(g.index(t) if t in g else len(g))
            nxt = n.children.get(t)
            if nxt is None:
                break
            n = nxt

    async def propose(self, context: list[int], n: int, seq: int):
        """Draft n tokens after context in drafter sequence seq, in a worker thread: the
        event loop meanwhile reads the downlink, writes the uplink and serves HTTP (a slow
        edge drafts for tens of ms per call). Timed into draft_s."""
        t0 = time.perf_counter()
        draft = await asyncio.to_thread(self.e.drafter.propose, context, n,
                                        self.cfg.serve.sampling, self._draft_rng(len(context)),
                                        seq=seq)
        self._count_drafts(t0, len(draft))
        return draft

    async def propose_many(self, contexts: list[list[int]], seqs: list[int]) -> list:
        """One draft token after each context, each in its own sequence: one batched decode
        in a worker thread (as `propose`) where the drafter batches, else one call each."""
        drafter = self.e.drafter
        if not hasattr(drafter, "propose_many"):
            return [await self.propose(c, 1, s) for c, s in zip(contexts, seqs)]
        t0 = time.perf_counter()
        drafts = await asyncio.to_thread(drafter.propose_many, contexts, self.cfg.serve.sampling,
                                         [self._draft_rng(len(c)) for c in contexts], seqs)
        self._count_drafts(t0, len(contexts))
        return drafts

    def _count_drafts(self, t0: float, n: int) -> None:
        self._time_drafts(time.perf_counter() - t0, n)
        self.stats.drafted += n

    def _time_drafts(self, seconds: float, n: int) -> None:
        if n:
            self.draft_s += 0.2 * (seconds / n - self.draft_s)

    def _remember_guesses(self, made, draft, tree: SpecTree) -> None:
        """Keep each drafted node's recovery guesses, to learn P(c | rejection) later."""
        ranks = draft.q if draft.ranks is None else draft.ranks
        for node, r in zip(made, ranks):
            self._guess[node.node_id] = (guesses(r, node.token, self.cfg.cache.guesses),
                                         float(r[node.token]))
        if len(self._guess) > 4 * self.cfg.max_window:  # forget nodes below the root
            root = tree.root.node_id
            self._guess = {k: v for k, v in self._guess.items() if k > root}

    def _draft_rng(self, position: int) -> PositionalRng:
        """Uniforms for drafts at position, position+1, ...: keyed by position, not chunk."""
        return PositionalRng(self.cfg.seed, position, purpose=0)
