"""Discrete-event model of the modes in virtual time (docs/design.md §7-§8).

Edge: one worker that drafts (draft_s per token) and applies verdicts. Cloud: one target
that scores whatever Extends have arrived in one pass, T(n) = base + per_node * n. Link: the
same stages as the emulator (acespec.sim.stages), on a virtual clock. Acceptance: each draft
is accepted with probability `accept` (independently), from a seeded Generator. `acespec`
adds recovery branches: a rejection is a cache hit with probability `hit_rate`, and each
chunk carries `branch_nodes` more nodes. A hit decides the branch's tokens (its
`branch_depth` drafts, each accepted with `accept`, then one more) without a round trip;
then, as AceSpec's edge-decided sessions do, drafting restarts from there like after a miss.
With `hit_continues` the model is the ideal state cache whose branches carry whole
continuations: a hit loses nothing and the pipeline keeps flowing.
`acespec` with `decided` is the engine of greedy and coupled sessions (docs/design.md §3): the
verifier runs passes back to back and never waits for the link; each feeds the last decided
token and the live drafts that have arrived, and decides the accepted drafts plus one more
token (correction, bonus, or continuation with no draft). The edge drafts chunks while its
chain is shorter than the window and learns each verdict one trip later; drafts that reach
the verifier for positions it decided meanwhile are compared without a pass.
`tree` (with `decided`) is the speculation tree of those sessions (docs/design.md §6):
where a draft will be rejected, the edge's chunk carries, with probability `hit_rate`, a
guessed branch of `branch_depth` drafts; the verifier's walk (or its comparison of late drafts) goes on
into it, and the edge, learning of the hit, keeps drafting after the branch.
ModelCosts come from `acespec bench calibrate` (measured components) or are given directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from acespec.proto.sizes import (
    DOWN_NODE_GREEDY,
    DOWN_SCORES_MESSAGE,
    FRAMING,
    UP_EXTEND_MESSAGE,
    UP_NODE,
)
from acespec.sim.stages import Chunk, LinkSpec


@dataclass(frozen=True)
class ModelCosts:
    """What the modelled components cost in time and wire bytes (`acespec bench calibrate`
    measures them; the names are its JSON keys)."""

    draft_s: float = 0.001  # drafter seconds per token
    target_base_s: float = 0.040  # target seconds per pass
    target_per_node_s: float = 0.0005  # and per scored node
    # Wire bytes of an uplink message (Extend) and a downlink one (Scores): base + per node.
    # `acespec bench calibrate` fits them at the proxy's sockets; the defaults are the
    # encoded sizes of greedy messages (acespec.proto.sizes).
    up_base: float = FRAMING + UP_EXTEND_MESSAGE
    up_per_node: float = UP_NODE
    down_base: float = FRAMING + DOWN_SCORES_MESSAGE
    down_per_node: float = DOWN_NODE_GREEDY
    ar_down_per_token: float = 18.0  # wire bytes per streamed token in `ar`

    target_knee: int = 0  # nodes a pass scores at its base time (a GPU below its roofline)

    def target_s(self, nodes: int) -> float:
        return self.target_base_s + self.target_per_node_s * max(0, nodes - self.target_knee)


@dataclass(frozen=True)
class Scenario:
    mode: str  # ar | sd | pipeline | acespec; decided and tree say how acespec runs
    # (acespec.sim.sweep.MODES names each variant as `acespec bench` does)
    link: LinkSpec
    accept: float = 0.7  # per-position acceptance probability
    depth: int = 4
    window: int = 16
    tokens: int = 200
    hit_rate: float = 0.7  # acespec: P(rejection lands on a pre-scored branch)
    branch_nodes: int = 2  # acespec: extra nodes per chunk
    branch_depth: int = 1  # acespec: drafts below a branch's guessed token
    hit_continues: bool = False  # acespec: the ideal cache (a hit costs no restart)
    decided: bool = False  # acespec: the verifier decides (greedy and coupled sessions)
    tree: bool = False  # decided: the edge's chunks carry guessed branches (hit_rate)
    propose: int = 0  # decided: a pass no draft covers scores this many verifier proposals
    propose_accept: float = 0.0  # ... each accepted (in order) with this probability
    propose_s: float = 0.0  # ... each costing this long before the pass (a gap drafter's
    # decode; prompt lookup costs nothing)
    hold_s: float = 0.0  # decided: before a pass no draft covers, the verifier idles up to
    # this long for a Drafts message already on its way (an oracle's wait: the bound of what
    # waiting for the edge could buy; the real verifier never waits)
    seed: int = 0


@dataclass(frozen=True)
class SimResult:
    seconds: float
    tokens: int
    passes: int
    rounds: int  # verdict rounds; in decided sessions the verifier's passes
    verifier_busy: float = 0.0  # the verifier's seconds in passes / the session's seconds
    continuation: int = 0  # decided: tokens decided with no draft at their position
    reconciled: int = 0  # decided: drafts compared with tokens decided before they arrived
    dead_skipped: int = 0  # decided: drafts dropped unscored (behind a rejection)
    hits: int = 0  # decided with tree: rejections that went on into a guessed branch
    lone_passes: int = 0  # decided: passes no draft covered
    lone_tokens: int = 0  # ... and the tokens they decided (more than one with proposals)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def mean_acceptance_length(self) -> float:
        return self.tokens / max(1, self.rounds)


def simulate(sc: Scenario, costs: ModelCosts) -> SimResult:
    if sc.mode == "ar":
        return _ar(sc, costs)
    if sc.mode == "sd":
        return _sd(sc, costs)
    if sc.decided and sc.mode != "acespec":
        raise ValueError(f"decided is a property of acespec sessions, not {sc.mode!r}")
    if sc.decided:
        return _decided(sc, costs)
    if sc.mode in ("pipeline", "acespec"):
        return _pipeline(sc, costs)
    raise ValueError(f"unknown mode {sc.mode!r}")


def _ar(sc: Scenario, c: ModelCosts) -> SimResult:
    up, down = sc.link.build(sc.seed)
    t = up(Chunk(int(c.up_base), 0.0)).t  # the request
    arrival = t
    for _ in range(sc.tokens):
        t += c.target_s(1)
        arrival = down(Chunk(int(round(c.ar_down_per_token)), t)).t
    busy = sc.tokens * c.target_s(1)
    return SimResult(arrival, sc.tokens, sc.tokens, sc.tokens, busy / arrival)


def _accepted(rng: np.random.Generator, n: int, p: float) -> int:
    """Leading accepted drafts among n."""
    for i in range(n):
        if rng.random() >= p:
            return i
    return n


def _sd(sc: Scenario, c: ModelCosts) -> SimResult:
    up, down = sc.link.build(sc.seed)
    rng = np.random.default_rng(sc.seed)
    t, out, rounds, cloud_free, busy = 0.0, 0, 0, 0.0, 0.0
    while out < sc.tokens:
        t += sc.depth * c.draft_s
        nodes = sc.depth + (1 if rounds else 0)  # the head token joins from the 2nd round
        arrive = up(Chunk(int(c.up_base + c.up_per_node * nodes), t)).t
        busy += c.target_s(nodes)
        cloud_free = max(arrive, cloud_free) + c.target_s(nodes)
        t = down(Chunk(int(c.down_base + c.down_per_node * nodes), cloud_free)).t
        out += _accepted(rng, sc.depth, sc.accept) + 1
        rounds += 1
    return SimResult(t, sc.tokens, rounds + 1, rounds, busy / t)


def _pipeline(sc: Scenario, c: ModelCosts) -> SimResult:
    """Chunks of `depth` drafts stream up while earlier ones are scored; the edge applies
    scores as they arrive (between chunks), and a rejection (a miss, in acespec) kills the
    chunks behind it: drafting restarts from the recovered token."""
    up, down = sc.link.build(sc.seed)
    rng = np.random.default_rng(sc.seed)
    extra = sc.branch_nodes if sc.mode == "acespec" else 0
    cloud = _Cloud(c, down)
    edge_t, out, rounds, epoch, head = 0.0, 0, 0, 0, 0
    flight: list[dict] = []  # sent, not yet applied: {"epoch", "n", "nodes", "arrive", ...}
    while out < sc.tokens:
        cloud.advance(flight, edge_t)
        while flight and flight[0].get("scored_at", float("inf")) <= edge_t:
            ch = flight.pop(0)
            if ch["epoch"] != epoch:
                continue  # dead: behind an earlier rejection
            k = _accepted(rng, ch["n"], sc.accept)
            out += k
            if k < ch["n"]:
                out += 1  # the recovered token
                hit = sc.mode == "acespec" and rng.random() < sc.hit_rate
                if hit and sc.hit_continues:
                    continue  # the chunks in flight carry on as the branch's continuation
                if hit:  # walk the pre-scored branch: its accepted drafts, then one more
                    out += _accepted(rng, sc.branch_depth, sc.accept) + 1
                rounds, epoch, head = rounds + 1, epoch + 1, 1  # restart from there
        if out >= sc.tokens:
            break
        live = sum(ch["n"] for ch in flight if ch["epoch"] == epoch)
        if live + sc.depth <= sc.window and out + live < sc.tokens:
            edge_t += sc.depth * c.draft_s
            nodes = sc.depth + head + extra
            arrive = up(Chunk(int(c.up_base + c.up_per_node * nodes), edge_t)).t
            flight.append({"epoch": epoch, "n": sc.depth, "nodes": nodes, "arrive": arrive})
            head = 0
        else:
            edge_t = max(edge_t, cloud.deliver_oldest(flight))
    return SimResult(edge_t, sc.tokens, cloud.passes + 1, max(rounds, 1), cloud.busy / edge_t)


class _Cloud:
    """The target: each pass scores every chunk that has arrived by the pass's start."""

    def __init__(self, c: ModelCosts, down):
        self.c, self.down, self.free, self.passes, self.busy = c, down, 0.0, 0, 0.0

    def _pass(self, flight: list[dict]) -> None:
        pending = [ch for ch in flight if "scored_at" not in ch]
        start = max(self.free, pending[0]["arrive"])
        batch = [ch for ch in pending if ch["arrive"] <= start]
        seconds = self.c.target_s(sum(ch["nodes"] for ch in batch))
        self.free, self.busy, self.passes = start + seconds, self.busy + seconds, self.passes + 1
        for ch in batch:
            size = int(self.c.down_base + self.c.down_per_node * ch["nodes"])
            ch["scored_at"] = self.down(Chunk(size, self.free)).t

    def advance(self, flight: list[dict], now: float) -> None:
        """Run the passes that start by `now` (later chunks cannot join them)."""
        while any("scored_at" not in ch for ch in flight):
            pending = [ch for ch in flight if "scored_at" not in ch]
            if max(self.free, pending[0]["arrive"]) > now:
                return
            self._pass(flight)

    def deliver_oldest(self, flight: list[dict]) -> float:
        """Run passes until the oldest chunk's scores are on their way; their arrival time."""
        while "scored_at" not in flight[0]:
            self._pass(flight)
        return flight[0]["scored_at"]


# -- the decided engine (greedy and coupled acespec sessions) ---------------------------------


@dataclass(frozen=True)
class _Drafts:
    """A Drafts message up: chain `epoch`'s drafts at positions start, start + 1, ...;
    flags[i] = the draft equals the verifier's token there (given a right context). The
    edge's text before `base` is decided text it has received (Drafts.position - behind)."""

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


class _DecidingVerifier:
    """The target of a decided session (acespec.cloud.verify.decided): passes back to back from
    `free` on, each fed the last decided token plus the live drafts that have arrived."""

    def __init__(self, sc: Scenario, c: ModelCosts, down, start: float,
                 rng: np.random.Generator | None = None):
        self.sc, self.c, self.down, self.free = sc, c, down, start
        self.rng = rng or np.random.default_rng([sc.seed, 1])  # the proposals' verdicts
        self.lone_passes = self.lone_tokens = 0
        self.decided = 0  # D: the next position to decide
        self.epoch, self.flags, self.dead, self.agree = -1, {}, False, 0  # the edge's chain
        self.inbox: list[_Drafts] = []  # uplink in send (= arrival) order
        self.outbox: list[_Decided] = []
        self.passes, self.busy, self.received, self.scored = 0, 0.0, 0, 0
        self.continuation = self.reconciled = self.hits = 0
        self.branches: dict[int, tuple[bool, ...]] = {}  # the chain's guessed branches

    @property
    def next_t(self) -> float:
        return float("inf") if self.decided >= self.sc.tokens else self.free

    def _receive(self) -> None:
        """Apply the Drafts that arrived by the pass's start (later ones wait for the next)."""
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

    def plan(self) -> tuple[int, int]:
        """The next pass, from `free` on: (nodes it scores, the verifier's proposals among
        them). finish() ends it."""
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
        proposed = self.sc.propose if lone else 0
        if proposed:
            k = _accepted(self.rng, min(proposed, self.sc.tokens - 1 - self.decided),
                          self.sc.propose_accept)
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


class _DraftingEdge:
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

    def step(self, outbox: list[_Decided], inbox: list[_Drafts]) -> None:
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
        inbox.append(_Drafts(arrive, self.epoch, self.committed, start, flags, branches))

    def _branches(self, start: int, flags) -> tuple:
        """Tree: at each rejected draft, with probability hit_rate a guessed branch of
        branch_depth drafts (each accepted with `accept`) rides along."""
        if not self.sc.tree:
            return ()
        return tuple((start + i, tuple(bool(self.rng.random() < self.sc.accept)
                                       for _ in range(self.sc.branch_depth)))
                     for i, ok in enumerate(flags)
                     if not ok and self.rng.random() < self.sc.hit_rate)


def _decided(sc: Scenario, c: ModelCosts) -> SimResult:
    """The two actors on one virtual clock: whichever acts first goes next (a verifier pass
    sees the Drafts that arrived by its start; the edge, the Decided that arrived by now)."""
    up, down = sc.link.build(sc.seed)
    rng = np.random.default_rng(sc.seed)
    opened = up(Chunk(int(c.up_base), 0.0)).t + c.target_s(1)  # Open; the prompt's prefill
    # The edge drafts once Opened says the verifier decides (an old verifier would not).
    edge_start = down(Chunk(int(c.down_base), opened)).t
    v = _DecidingVerifier(sc, c, down, opened)
    e = _DraftingEdge(sc, c, up, rng, edge_start)
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
