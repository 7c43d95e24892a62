"""The edge's side of a decided session: the speculation tree over Grow (docs/design.md §6).

The verifier decides every token and never waits for the link (acespec.cloud.verify.decided); the
edge grows a tree of likely continuations beside the decided text (acespec.edge.speculation.grow_tree)
and streams its new nodes up: the drafted line, guessed recovered tokens at the positions
where a rejection is likely, and continuations of both. In a mode without branches
(acespec-chain, the rivals' edge) the tree is the drafted line alone: a chain. Each decided token re-roots the
tree: an accepted draft or a hit on a guessed branch keeps the subtree below it, already
sent and often already scored, so the pipeline flows on with no round trip; a miss drops
the tree and growth restarts from the decided text (the verifier decodes alone meanwhile).
Leaves are grown several per batched drafter decode, each in its own drafter sequence.
"""

from __future__ import annotations

import asyncio
import time

from acespec.edge.client import CloudSession
from acespec.edge.session.config import NODE_PASS_S
from acespec.edge.session.decided import DecidedDriver
from acespec.edge.session.driver import get_within
from acespec.edge.session.pacing import until_due
from acespec.edge.session.runner import Runner
from acespec.edge.speculation.branches import NodeCosts
from acespec.edge.speculation.calibration import TimingModel
from acespec.edge.speculation.grow_tree import (
    ACCEPTED,
    HIT,
    REJECTED,
    GrowBudget,
    GrowTree,
    Node,
)
from acespec.proto.sizes import UP_NODE, grow_bytes

ROOT = -1
REACT_SHARE = 0.5  # a line chunk drafts for at most this share of a verifier pass
RAMP = 2  # fewest drafts in the line's first chunk after a miss (the chunks then double)
# A guessed child that hits saves what a miss costs: the passes the verifier decides alone
# until the edge's new drafts arrive (about two at 50 kbit/s, 50 ms; docs/benchmarks.md §3).
MISS_PASSES = 2.0
BRANCH_SHARE = 0.5  # guessed branches may hold this share of the window
SLOW_LINK_BPS = 50e3  # assumed until the link is measured: the slow case we design for
# Uplink pacing (acespec.edge.session.pacing): the message for a verifier pass start S may
# leave from DUE_MARGIN of a pass before the last moment that still reaches S (S less the
# one-way delay and its serialisation) until DUE_SAFETY of a pass before that moment; before
# the verifier's clock is known, messages go at most PACE_SHARE of a pass apart.
DUE_MARGIN = 0.4
DUE_SAFETY = 0.1
PACE_SHARE = 0.5


class GrowDriver(DecidedDriver):
    """Runs one connection attempt of a decided session in which the edge drafts."""

    def __init__(self, run: Runner, sess: CloudSession, inbox: asyncio.Queue):
        super().__init__(run, sess, inbox)
        context = run.context
        guesses = run.cfg.cache.guesses if run.cfg.spec.branches else 0
        self.tree = GrowTree(context[-1], len(context), run.acc, guesses)
        limit = getattr(getattr(run.drafter, "config", None), "n_seq_max", 1 << 30)
        self.free = [s for s in run.branch_seqs if s != run.seq and s < limit]
        self.tree.root.seq = run.seq
        self.pass_s = 0.05  # the verifier's seconds per pass (smoothed)
        self.last_decided: float | None = None
        # P(a node sent so far ahead is held when its position is decided), learnt from the
        # line's drafts: a guess goes up in the message of the draft it hedges, as early
        # or late as it; a late guess saves the verifier nothing.
        self.timing = TimingModel()
        self.pass_tokens = 1.0  # tokens the verifier decides per pass (smoothed)
        self.last_send: float | None = None  # perf_counter() of the last uplink message
        self.aimed: float | None = None  # the verifier pass start it was sent for (pacing)

    async def work(self) -> bool:
        """One growth step, then the unsent nodes in one message once it is due (see
        acespec.edge.session.pacing); with nothing to grow, the wait until it is due (the
        downlink read meanwhile), then the message."""
        grew = await self._grow_step()
        if not self._sendable():
            return grew
        due, start = self._clock()
        if due <= self.run.draft_s:  # after another growth step it would be too late
            await self._send(start)
        elif not grew:
            await self._pause(due)
        return True

    def _clock(self) -> tuple[float, float | None]:
        """(seconds until the unsent nodes must go up to make the verifier's next pass start,
        <= 0: now; that pass start, None before the verifier's clock is known). Before the
        link and the clock are known: PACE_SHARE of a pass after the last message."""
        now, link = time.perf_counter(), self.run.link
        if self.last_send is None:
            return 0.0, None
        if not link.ready or self.last_decided is None:
            return self.last_send + PACE_SHARE * self.pass_s - now, None
        bw, one_way, margin = link.bandwidth(), link.base_rtt() / 2, DUE_MARGIN * self.pass_s
        send_s = grow_bytes(len(self.tree.unsent)) / bw
        return until_due(now, self.last_decided - one_way, self.pass_s, one_way + send_s + margin,
                         margin - DUE_SAFETY * self.pass_s, self.aimed)

    async def _pause(self, wait: float) -> None:
        """Wait up to `wait` s for the downlink; a message arriving is applied at once (it
        may kill unsent nodes: they then never go up)."""
        if wait <= 0:
            return
        try:
            self._take(await get_within(self.inbox, wait))
        except asyncio.TimeoutError:
            pass

    # -- growth -------------------------------------------------------------------

    async def _grow_step(self) -> bool:
        """Grow leaves by one drafted token each, in one batched decode: the drafted line
        up to the window (as a chain would), and the guessed branches by value within their
        own budget (half the window). With no branch worth growing, or the line short of
        its secure lead (_secure_lead), the line grows a chunk of drafts in one call, as a
        chain does. False when nothing is worth it."""
        run, tree = self.run, self.tree
        self._free_dropped()
        walked = tree.walk()
        lead = sum(not b for _, _, b in walked)  # the drafted line's nodes past the root
        line_room = self.window - lead
        branch_room = self._branch_room(walked)
        left = run.cfg.max_tokens - len(run.out)
        if left <= 0:
            return False
        guessed = self._guess(walked, branch_room)
        branch_room -= len(guessed)
        leaves = tree.leaves(walked, max_position=tree.end + min(left, self.window) - 1)
        line = [n for n, _, b in leaves if not b][:1 if line_room > 0 else 0]
        # While the line is short of a secure lead it grows alone: a guess in its step would
        # slow it (a leaf more per decode), and a late line costs more than a guess saves.
        alone = bool(line) and lead < self._secure_lead()
        branches = [] if alone else self._branches(leaves, walked, branch_room)
        if line and not branches:
            # After a miss the line starts short: its first drafts go up at once, so the
            # verifier (deciding alone meanwhile) meets them sooner; the chunks then grow.
            n = min(self._chunk(), max(self._ramp(), lead), line_room, left)
            return await self._grow_line(line[0], n) or bool(guessed)
        return await self._grow_batch(line + branches, walked) or bool(guessed)

    def _branches(self, leaves: list, walked: list, room: int) -> list[Node]:
        """The leaves under guesses worth growing this step, within the budgets (room:
        branch nodes still free). A guess is worth nothing without drafts below it (the
        verifier would decide its token anyway): its first draft carries the hit's value,
        deeper ones a pass each."""
        tree, node_s, pass_s, ahead = self.tree, self._node_s(), self.pass_s, self._advance()
        cands = [(n, v) for n, p, b in leaves
                 if b and (v := p * self.timing.p(n.position + 1 - tree.end, ahead)
                           * self.run.alpha * pass_s * (MISS_PASSES if n.guess else 1)
                           - node_s) > 0]
        if not cands:
            return []
        budget = GrowBudget(nodes=room, kv_bytes=self._kv_room(len(walked)),
                            uplink_bytes=self._uplink_room(), batch=len(self.free))
        return tree.select(cands, budget, self._costs())

    async def _grow_batch(self, leaves: list[Node], walked: list) -> bool:
        """Grow each leaf by one drafted token in one batched decode (each in its own
        drafter sequence; leaves with none to get are left). False if none grew."""
        run, tree = self.run, self.tree
        p_of, busy = {n: p for n, p, _ in walked}, set(leaves)
        grow = [n for n in leaves if self._seq_for(n, p_of, busy) is not None]
        if not grow:
            return False
        contexts = [run.context + tree.path(n) for n in grow]
        drafts = await run.draft_many(contexts, [n.seq for n in grow])
        for n, d in zip(grow, drafts):
            tree.expand(n, int(d.tokens[0]), d.q[0] if d.ranks is None else d.ranks[0],
                        run.rec)
        return True

    def _advance(self, n: int = RAMP) -> float:
        """Tokens the verifier decides, alone, while a message of n fresh drafts is drafted
        and travels to it: its tokens per second times the round trip, the drafting and
        the uplink of the message."""
        link = self.run.link
        rtt = link.base_rtt() if link.ready else 2 * self.pass_s
        bw = link.bandwidth() if link.ready else SLOW_LINK_BPS / 8
        rate = self.pass_tokens / max(self.pass_s, 1e-3)
        return rate * (rtt + n * self.run.draft_s + grow_bytes(n) / bw)

    def _ramp(self) -> int:
        """Drafts in the line's first chunk after a miss: past where the verifier will be
        when they arrive, so the chunk holds drafts in time (the ones before that cost
        bytes only: the verifier compares them with what it decided). At least RAMP."""
        n = max(RAMP, int(self._advance()) + 2)
        n = max(RAMP, int(self._advance(n)) + 2)  # the chunk's own delay: refined once
        return min(n, self.window)

    def _secure_lead(self) -> int:
        """The line's lead past which guesses may share its decodes: where the verifier
        will be when a chunk drafted now arrives, and one chunk more (at most the window)."""
        return min(self.window, self._ramp() + self._chunk())

    def _chunk(self) -> int:
        """Drafts per line chunk: `depth`, but no more than half a verifier pass's worth of
        drafting: a slow drafter still sends something every pass, and the edge reads the
        verifier's decisions (a miss above all) between chunks, so it reacts within that."""
        return max(1, min(self.depth, int(REACT_SHARE * self.pass_s
                                          / max(1e-4, self.run.draft_s))))

    async def _grow_line(self, tip: Node, n: int) -> bool:
        """Draft n tokens after the line's tip in one drafter call (its own sequence)."""
        run, tree = self.run, self.tree
        if n <= 0 or self._seq_for(tip) is None:
            return False
        context = run.context + tree.path(tip)
        draft = await run.draft(context, n, tip.seq)
        ranks = draft.q if draft.ranks is None else draft.ranks
        node = tip
        for tok, r in zip(draft.tokens.tolist(), ranks):
            node = tree.expand(node, int(tok), r, run.rec)
        node.seq, tip.seq = tip.seq, None  # the line goes on in the same sequence
        # The guesses beside these drafts get their first drafts in a later batched decode,
        # beside the line's next draft once the line leads securely, and go up with them: a
        # decode of their own here would hold the line back a drafter step after every
        # chunk (docs/design.md §6).
        walked = tree.walk()
        self._guess(walked, self._branch_room(walked))
        return True

    def _branch_room(self, walked: list) -> int:
        """Nodes the guessed branches may still add: their share of the window, less what
        they hold (walked: GrowTree.walk()); none in a mode without branches."""
        if not self.run.cfg.spec.branches:
            return 0
        return int(self.window * BRANCH_SHARE) - sum(b for _, _, b in walked)

    def _guess(self, walked: list, room: int) -> list[Node]:
        """Guessed children where they are worth their cost: a hit the verifier holds in
        time saves the passes a miss costs (MISS_PASSES); a late one saves it nothing.
        Re-checked every step, as the calibration, the root and the timing move."""
        node_s, pass_s, ahead, timing = self._node_s(), self.pass_s, self._advance(), self.timing
        return self.tree.guess(
            walked, lambda p, lead: p * timing.p(lead, ahead) * MISS_PASSES * pass_s - node_s,
            room=room)

    def _seq_for(self, node: Node, p_of: dict | None = None, busy: set | None = None
                 ) -> int | None:
        """A drafter sequence for growing `node`: its own, its parent's (the drafted line
        continues in place), a free one, or - none free - the one held by the least likely
        node (p_of: path probabilities; busy: nodes this step grows), if it is less likely
        than `node`. A new one is forked from a sequence that holds the parent's path."""
        if node.seq is not None:
            return node.seq
        parent = node.parent or self.tree.root
        if parent.seq is not None and parent.draft is node:
            node.seq, parent.seq = parent.seq, None
            return node.seq
        if not self.free and not self._evict(p_of or {}, busy or set(), p_of.get(node, 0.0)
                                             if p_of else 0.0):
            return None
        node.seq = self.free.pop()
        src_seq = self._holder(parent)
        drafter = self.run.drafter
        if src_seq is not None and hasattr(drafter, "fork"):
            drafter.fork(src_seq, node.seq, self.run.committed_end
                         + len(self.tree.path(parent)))
        return node.seq

    def _holder(self, node: Node) -> int | None:
        """A sequence whose KV starts with node's path: node's own, the drafted line's below
        it (the line moves its sequence down as it grows), or an ancestor's."""
        down = node
        while down is not None:
            if down.seq is not None:
                return down.seq
            down = down.draft
        up = node.parent
        while up is not None and up.seq is None:
            up = up.parent
        return up.seq if up is not None else self._any_seq()

    def _evict(self, p_of: dict, busy: set, above: float) -> bool:
        """Free the sequence of the least likely node holding one (not the root's, not one
        this step grows), if it is less likely than `above`: KV goes where it is worth most."""
        held = [(p_of.get(n, 0.0), id(n), n) for n, _ in self.tree.nodes()
                if n.seq is not None and n not in busy]
        if not held:
            return False
        p, _, n = min(held)
        if p >= above:
            return False
        self.free.append(n.seq)
        n.seq = None
        return True

    def _any_seq(self) -> int | None:
        if self.tree.root.seq is not None:
            return self.tree.root.seq
        return next((n.seq for n, _ in self.tree.nodes() if n.seq is not None), None)

    def _free_dropped(self) -> None:
        """Sequences of dead nodes go back to the pool, cut to the committed text (the
        unified KV frees their cells)."""
        drafter, keep = self.run.drafter, self.run.committed_end
        while self.tree.dropped_seqs:
            seq = self.tree.dropped_seqs.pop()
            if hasattr(drafter, "truncate"):
                drafter.truncate(seq, keep)
            self.free.append(seq)
        if self.tree.root.seq is None and self.free:  # the root needs one to grow from
            self.tree.root.seq = self.free.pop()

    def _costs(self) -> NodeCosts:
        return NodeCosts(kv_per_token=float(getattr(self.run.drafter, "kv_bytes_per_token",
                                                    4096.0)))

    def _kv_room(self, live: int) -> float:
        return self.run.cfg.cache.kv_bytes - live * self._costs().kv_per_token

    def _uplink_room(self) -> float:
        link = self.run.link
        if not link.ready:
            return float("inf")
        return link.bandwidth() * (link.base_rtt() + link.step())

    def link_figures(self) -> dict:
        return {"uplink_budget_bytes": round(self._uplink_room())}

    def _node_s(self) -> float:
        """What one more node costs the cycle: its uplink bytes and its share of a pass."""
        link = self.run.link
        bw = link.bandwidth() if link.ready else SLOW_LINK_BPS / 8
        return NODE_PASS_S + UP_NODE / bw

    def _time_pass(self) -> None:
        """The verifier's pass time: the interval between its Decided messages (one per
        pass). A right node where the verifier would otherwise run dry saves about a pass:
        without it that token costs a pass of its own."""
        now = time.perf_counter()
        if self.last_decided is not None:
            self.pass_s += 0.2 * (min(1.0, now - self.last_decided) - self.pass_s)
        self.last_decided = now

    # -- uplink ---------------------------------------------------------------------

    async def _send(self, aimed: float | None) -> None:
        """Upload the unsent nodes (parents first) as one Grow, anchored at the committed
        end: a child of the root hangs off the decided text there. aimed: the verifier pass
        start it is sent for (_clock)."""
        tree, first = self.tree, self.sess.next_id
        held = self._held()
        nodes = [n for n in tree.unsent if id(n) not in held]
        tree.unsent = [n for n in tree.unsent if id(n) in held]
        if not nodes:
            return
        for i, n in enumerate(nodes):
            n.nid = first + i
        parents = [ROOT if n.parent is None or n.parent is tree.root else n.parent.nid
                   for n in nodes]
        self.last_send, self.aimed = time.perf_counter(), aimed
        await self.guarded(self.sess.grow(tree.end, [n.token for n in nodes], parents))
        for n in nodes:
            n.sent_in, n.lead = len(self.sent), n.position - tree.end
        self.run.stats.note_tree(*tree.shape())

        self.run.stats.cache.branch_nodes += sum(n.guess for n in nodes)

    def _held(self) -> set[int]:
        """ids of unsent guesses that wait: a guess goes up with its first draft, never
        alone: walked into with nothing below it, it would only restart decoding (and cost
        bytes)."""
        return {id(n) for n in self.tree.unsent if n.guess and not n.children}

    def _sendable(self) -> bool:
        return len(self.tree.unsent) > len(self._held())

    # -- downlink -------------------------------------------------------------------

    def _apply_token(self, t: int) -> None:
        run, tree, stats = self.run, self.tree, self.run.stats
        root = tree.root
        if root.draft is not None:
            run.acc.update(root.conf, root.draft.token == t)
            run.learn_acceptance(root.draft.token == t)
            self._judge_timing(root.draft)
        verdict = tree.take(t)
        if verdict in (HIT, REJECTED):
            stats.cache.rejections += 1
            run.rec.observe(root.alts.index(t) if t in root.alts else len(root.alts))
        stats.cache.hits += verdict == HIT
        stats.accepted += verdict == ACCEPTED
        stats.verdicts[verdict] = stats.verdicts.get(verdict, 0) + 1

    def _judge_timing(self, draft: Node) -> None:
        """Was the line draft at the position just decided held by the verifier then? (A
        verifier that never acknowledges messages, older than `acked`, leaves the prior.)"""
        if not draft.sent_in or not self.applied:
            return
        held = draft.sent_in <= self.applied
        cache = self.run.stats.cache
        cache.drafts_judged += 1
        cache.drafts_in_time += held
        self.timing.observe(draft.lead, held)

    def take_tokens(self, tokens: list[int]) -> None:
        self._time_pass()
        self.pass_tokens += 0.2 * (len(tokens) - self.pass_tokens)
        for t in tokens:
            self._apply_token(t)
            self.run.emit([t])
            if self.run.finished:
                break

