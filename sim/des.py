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
        from acespec.sim.des_decided import decided_run  # it builds on this module's types

        return decided_run(sc, costs)
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


def accepted_run(rng: np.random.Generator, n: int, p: float) -> int:
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
        out += accepted_run(rng, sc.depth, sc.accept) + 1
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
            k = accepted_run(rng, ch["n"], sc.accept)
            out += k
            if k < ch["n"]:
                out += 1  # the recovered token
                hit = sc.mode == "acespec" and rng.random() < sc.hit_rate
                if hit and sc.hit_continues:
                    continue  # the chunks in flight carry on as the branch's continuation
                if hit:  # walk the pre-scored branch: its accepted drafts, then one more
                    out += accepted_run(rng, sc.branch_depth, sc.accept) + 1
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
