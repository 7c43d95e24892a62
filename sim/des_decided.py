"""The discrete-event model's decided engine: greedy and coupled acespec sessions
(docs/design.md §3, §7). A verifier that runs passes back to back and never waits for the
link, an edge that drafts chunks while its chain is shorter than the window; the two on one
virtual clock (acespec.sim.des_scenario has the scenario and the costs, acespec.sim.des the
other modes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from acespec.sim.des_scenario import ModelCosts, Scenario, SimResult, accepted_run
from acespec.sim.stages import Chunk


@dataclass(frozen=True)
class _Grow:
    """A Grow message up: chain `epoch`'s drafts at positions start, start + 1, ...;
    flags[i] = the draft equals the verifier's token there (given a right context). The
    edge's text before `base` is decided text it has received (the message's anchor)."""

    arrive: float
    epoch: int
    base: int
    start: int
    flags: tuple[bool, ...]
    branches: tuple[tuple[int, tuple[bool, ...]], ...] = ()  # (rejected position, its
    # guessed branch's draft flags at the positions after it)


@dataclass(frozen=True)
class _Decided:
    """A Decided message down: `count` tokens decided from `position` on."""

    arrive: float
    position: int
    count: int


class DecidingVerifier:
    """The target of a decided session (acespec.cloud.verify.decided): passes back to back from
    `free` on, each fed the last decided token plus the live drafts that have arrived."""

    def __init__(self, sc: Scenario, c: ModelCosts, down, start: float,
                 rng: np.random.Generator | None = None):
        self.sc, self.c, self.down, self.free = sc, c, down, start
        self.rng = rng or np.random.default_rng([sc.seed, 1])  # the proposals' verdicts
        self.lone_passes = self.lone_tokens = 0
        self.decided = 0  # D: the next position to decide
        self.epoch, self.flags, self.dead, self.agree = -1, {}, False, 0  # the edge's chain
        self.inbox: list[_Grow] = []  # uplink in send (= arrival) order
        self.outbox: list[_Decided] = []
        self.passes, self.busy, self.received, self.scored = 0, 0.0, 0, 0
        self.continuation = self.reconciled = self.hits = 0
        self.branches: dict[int, tuple[bool, ...]] = {}  # the chain's guessed branches

    @property
    def next_t(self) -> float:
        return float("inf") if self.decided >= self.sc.tokens else self.free

    def _receive(self) -> None:
        """Apply the Grow messages that arrived by the pass's start (later ones wait for the next)."""
        while self.inbox and self.inbox[0].arrive <= self.free:
            m = self.inbox.pop(0)
            if m.epoch != self.epoch:  # a restarted chain replaces the dead one
                self.epoch, self.flags, self.dead, self.branches = m.epoch, {}, False, {}
            self.branches.update(m.branches)
            self.received += sum(1 + len(b) for _, b in m.branches)
            if not self.dead:  # the edge's text up to base is decided text: it agrees
                self.agree = max(self.agree, m.base)
            self.received += len(m.flags)
            self.flags.update(zip(range(m.start, m.start + len(m.flags)), m.flags))
            self._reconcile()

    def _reconcile(self) -> None:
        """Drafts at positions decided before they arrived are compared, not scored; the
        first mismatch kills the chain from there (every later draft has a wrong context)."""
        while not self.dead and self.agree < self.decided and self.agree in self.flags:
            if not self.flags[self.agree] and not self._hit(self.agree):
                self.dead = True
                return
            self.reconciled += 1
            self.agree += 1

    def _hit(self, p: int) -> bool:
        """The draft at p is rejected: with a guessed branch there, the decided token is
        the guess and the chain goes on into the branch's drafts."""
        branch = self.branches.pop(p, None)
        if branch is None:
            return False
        self.flags.update(zip(range(p + 1, p + 1 + len(branch)), branch))
        for q in [q for q in self.flags if q > p + len(branch)]:
            del self.flags[q]  # the main line below the rejection is dead
        self.hits += 1
        return True

    def _live(self) -> list[int]:
        """Positions of the drafts the next pass feeds: contiguous from D on a chain that
        agrees with every decided token, leaving room for the one more token."""
        if self.dead or self.agree != self.decided:
            return []
        return self._live_from(self.decided)

    def _live_from(self, p: int) -> list[int]:
        out = []
        while p + len(out) < self.sc.tokens - 1 and p + len(out) in self.flags:
            out.append(p + len(out))
        return out

    def step(self) -> None:
        """One pass: decide the accepted drafts and one more; send them down at its end."""
        nodes, proposed = self.plan()
        self.finish(self.free + self.c.target_s(nodes) + self.sc.propose_s * proposed)

    def plan(self, propose: int | None = None, accept: float | None = None
             ) -> tuple[int, int]:
        """The next pass, from `free` on: (nodes it scores, the verifier's proposals among
        them); propose: the most proposals a lone pass scores now (None: the scenario's,
        which bounds it too), each accepted with probability `accept` (None: the
        scenario's). finish() ends it."""
        self._receive()
        feed = self._live()
        if not feed and self.inbox and self.inbox[0].arrive - self.free <= self.sc.hold_s:
            self.free = self.inbox[0].arrive  # idle until the drafts on their way land
            self._receive()
            feed = self._live()
        fed = len(feed) + sum(1 + len(b) for p, b in self.branches.items() if p in feed)
        k = 0
        while k < len(feed) and (self.flags[feed[k]] or self._hit(feed[k])):
            k += 1
            feed = feed[:k] + self._live_from(feed[k - 1] + 1)  # a hit's branch is fed too
        lone = not feed  # no draft: the verifier's own proposals, if any, are scored
        cap = self.sc.propose if propose is None else min(propose, self.sc.propose)
        proposed = cap if lone else 0
        if proposed:
            k = accepted_run(self.rng, min(proposed, self.sc.tokens - 1 - self.decided),
                             self.sc.propose_accept if accept is None else accept)
        self._planned = (feed, fed, k, lone)
        return 1 + fed + proposed, proposed

    def finish(self, end: float) -> None:
        """The planned pass ends at `end` (with the other sessions' of a shared pass, and
        any draft steps before it): its tokens are decided and sent down."""
        feed, fed, k, lone = self._planned
        seconds = end - self.free
        self.free, self.busy, self.passes = end, self.busy + seconds, self.passes + 1
        start = self.decided
        self.decided += k + 1
        self.lone_passes += lone
        self.lone_tokens += (k + 1) * lone
        self.scored += fed
        self.continuation += lone or k == len(feed)  # the bonus or plain decoding
        if feed:
            self.agree, self.dead = start + k, k < len(feed)
        size = int(self.c.down_base + self.c.down_per_node * (k + 1))
        self.outbox.append(_Decided(self.down(Chunk(size, self.free)).t, start, k + 1))


class DraftingEdge:
    """The edge of a decided session (acespec.edge.session.chain): one worker that applies the
    Decided messages that have arrived, then drafts a chunk while its chain (drafts beyond
    what it knows is decided) leaves room in the window, else waits for the next message."""

    def __init__(self, sc: Scenario, c: ModelCosts, up, rng: np.random.Generator, start: float):
        self.sc, self.c, self.up, self.rng, self.t = sc, c, up, rng, start
        self.committed, self.chain, self.epoch = 0, 0, 0  # chain: drafts after `committed`
        self.flags: dict[int, bool] = {}  # the current chain's drafts, by position
        self.branches: dict[int, tuple[bool, ...]] = {}  # tree: guessed branches sent
        self.read, self.done_at = 0, None  # Decided messages applied; when the last arrived

    def _may_draft(self) -> bool:
        left = self.sc.tokens - self.committed - self.chain
        return left > 0 and self.chain + self.sc.depth <= self.sc.window

    def next_t(self, outbox: list[_Decided]) -> float:
        if self.done_at is not None:
            return float("inf")
        if self._may_draft():
            return self.t
        # Waiting: the next verdict, or (none sent yet) whenever the verifier sends one.
        return max(self.t, outbox[self.read].arrive) if self.read < len(outbox) else float("inf")

    def _apply(self, outbox: list[_Decided]) -> None:
        """Compare each decided token with the chain: a match is an accepted draft; a
        mismatch kills the chain, so drafting restarts from the decided text."""
        while self.read < len(outbox) and outbox[self.read].arrive <= self.t:
            m = outbox[self.read]
            self.read += 1
            for p in range(m.position, m.position + m.count):
                if self.chain and self.flags[p]:
                    self.chain -= 1
                elif self.chain and p in self.branches:  # a hit: the branch is the chain
                    branch = self.branches.pop(p)
                    self.flags.update(zip(range(p + 1, p + 1 + len(branch)), branch))
                    self.chain = len(branch)
                    self.branches = {q: b for q, b in self.branches.items() if q <= p}
                elif self.chain:
                    self.chain, self.epoch, self.flags, self.branches = 0, self.epoch + 1, {}, {}
                self.committed += 1  # no draft there: a continuation token
            if self.committed >= self.sc.tokens:
                self.done_at = m.arrive
                return

    def step(self, outbox: list[_Decided], inbox: list[_Grow]) -> None:
        self.t = self.next_t(outbox)  # now, or (waiting) the next message's arrival
        self._apply(outbox)
        if self.done_at is not None or not self._may_draft():
            return
        n = min(self.sc.depth, self.sc.tokens - self.committed - self.chain)
        start = self.committed + self.chain
        flags = tuple(bool(self.rng.random() < self.sc.accept) for _ in range(n))
        self.flags.update(zip(range(start, start + n), flags))
        branches = self._branches(start, flags)
        self.branches.update(branches)
        self.chain += n
        nodes = n + sum(1 + len(b) for _, b in branches)
        self.t += (n + sum(len(b) for _, b in branches)) * self.c.draft_s
        arrive = self.up(Chunk(int(self.c.up_base + self.c.up_per_node * nodes), self.t)).t
        inbox.append(_Grow(arrive, self.epoch, self.committed, start, flags, branches))

    def _branches(self, start: int, flags) -> tuple:
        """Tree: at each rejected draft, with probability hit_rate a guessed branch of
        branch_depth drafts (each accepted with `accept`) rides along."""
        if not self.sc.tree:
            return ()
        return tuple((start + i, tuple(bool(self.rng.random() < self.sc.accept)
                                       for _ in range(self.sc.branch_depth)))
                     for i, ok in enumerate(flags)
                     if not ok and self.rng.random() < self.sc.hit_rate)


def decided_run(sc: Scenario, c: ModelCosts) -> SimResult:
    """The two actors on one virtual clock: whichever acts first goes next (a verifier pass
    sees the Grow messages that arrived by its start; the edge, the Decided that arrived by now)."""
    up, down = sc.link.build(sc.seed)
    rng = np.random.default_rng(sc.seed)
    opened = up(Chunk(int(c.up_base), 0.0)).t + c.target_s(1)  # Open; the prompt's prefill
    # The edge drafts once Opened says the verifier decides (an old verifier would not).
    edge_start = down(Chunk(int(c.down_base), opened)).t
    v = DecidingVerifier(sc, c, down, opened)
    e = DraftingEdge(sc, c, up, rng, edge_start)
    while e.done_at is None:
        if v.next_t <= e.next_t(v.outbox):
            v.step()
        else:
            e.step(v.outbox, v.inbox)
    busy = v.busy + c.target_s(1)
    return SimResult(e.done_at, sc.tokens, v.passes + 1, v.passes, busy / e.done_at,
                     continuation=v.continuation, reconciled=v.reconciled,
                     dead_skipped=v.received - v.scored - v.reconciled - len(v._live()),
                     hits=v.hits, lone_passes=v.lone_passes, lone_tokens=v.lone_tokens)
