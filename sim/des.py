"""Discrete-event model of the four modes in virtual time (DESIGN §7-§8).

Edge: one worker that drafts (draft_s per token) and applies verdicts. Cloud: one target
that scores whatever Extends have arrived in one pass, T(n) = base + per_node * n. Link: the
same stages as the emulator (acespec.sim.stages), on a virtual clock. Acceptance: each draft
is accepted with probability `accept` (independently), from a seeded Generator. `acespec`
adds recovery branches: a rejection is a cache hit with probability `hit_rate`, and each
chunk carries `branch_nodes` more nodes. A hit decides the branch's tokens (its
`branch_depth` drafts, each accepted with `accept`, then one more) without a round trip;
then, as AceSpec is implemented today, drafting restarts from there like after a miss.
With `hit_continues` the model is the ideal state cache whose branches carry whole
continuations: a hit loses nothing and the pipeline keeps flowing.
Costs come from `acespec bench calibrate` (measured components) or are given directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from acespec.sim.stages import Chunk, LinkSpec


@dataclass(frozen=True)
class Costs:
    draft_s: float = 0.001  # drafter seconds per token
    target_base_s: float = 0.040  # target seconds per pass
    target_per_node_s: float = 0.0005  # and per scored node
    up_base: float = 20.0  # wire bytes of an Extend: base + per node
    up_per_node: float = 1.5
    down_base: float = 20.0  # wire bytes of a Scores message: base + per node
    down_per_node: float = 1.5
    ar_down_per_token: float = 18.0  # wire bytes per streamed token in `ar`

    def target_s(self, nodes: int) -> float:
        return self.target_base_s + self.target_per_node_s * nodes


@dataclass(frozen=True)
class Scenario:
    mode: str  # ar | sd | pipeline | acespec
    link: LinkSpec
    accept: float = 0.7  # per-position acceptance probability
    depth: int = 4
    window: int = 16
    tokens: int = 200
    hit_rate: float = 0.7  # acespec: P(rejection lands on a pre-scored branch)
    branch_nodes: int = 2  # acespec: extra nodes per chunk
    branch_depth: int = 1  # acespec: drafts below a branch's guessed token
    hit_continues: bool = False  # acespec: the ideal cache (a hit costs no restart)
    seed: int = 0


@dataclass(frozen=True)
class SimResult:
    seconds: float
    tokens: int
    target_forwards: int
    rounds: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def mean_acceptance_length(self) -> float:
        return self.tokens / max(1, self.rounds)


def simulate(sc: Scenario, costs: Costs) -> SimResult:
    if sc.mode == "ar":
        return _ar(sc, costs)
    if sc.mode == "sd":
        return _sd(sc, costs)
    if sc.mode in ("pipeline", "acespec"):
        return _pipeline(sc, costs)
    raise ValueError(f"unknown mode {sc.mode!r}")


def _ar(sc: Scenario, c: Costs) -> SimResult:
    up, down = sc.link.build(sc.seed)
    t = up(Chunk(int(c.up_base), 0.0)).t  # the request
    arrival = t
    for _ in range(sc.tokens):
        t += c.target_s(1)
        arrival = down(Chunk(int(round(c.ar_down_per_token)), t)).t
    return SimResult(arrival, sc.tokens, sc.tokens, sc.tokens)


def _accepted(rng: np.random.Generator, n: int, p: float) -> int:
    """Leading accepted drafts among n."""
    for i in range(n):
        if rng.random() >= p:
            return i
    return n


def _sd(sc: Scenario, c: Costs) -> SimResult:
    up, down = sc.link.build(sc.seed)
    rng = np.random.default_rng(sc.seed)
    t, out, rounds, cloud_free = 0.0, 0, 0, 0.0
    while out < sc.tokens:
        t += sc.depth * c.draft_s
        nodes = sc.depth + (1 if rounds else 0)  # the head token joins from the 2nd round
        arrive = up(Chunk(int(c.up_base + c.up_per_node * nodes), t)).t
        cloud_free = max(arrive, cloud_free) + c.target_s(nodes)
        t = down(Chunk(int(c.down_base + c.down_per_node * nodes), cloud_free)).t
        out += _accepted(rng, sc.depth, sc.accept) + 1
        rounds += 1
    return SimResult(t, sc.tokens, rounds + 1, rounds)


def _pipeline(sc: Scenario, c: Costs) -> SimResult:
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
    return SimResult(edge_t, sc.tokens, cloud.passes + 1, max(rounds, 1))


class _Cloud:
    """The target: each pass scores every chunk that has arrived by the pass's start."""

    def __init__(self, c: Costs, down):
        self.c, self.down, self.free, self.passes = c, down, 0.0, 0

    def _pass(self, flight: list[dict]) -> None:
        pending = [ch for ch in flight if "scored_at" not in ch]
        start = max(self.free, pending[0]["arrive"])
        batch = [ch for ch in pending if ch["arrive"] <= start]
        self.free = start + self.c.target_s(sum(ch["nodes"] for ch in batch))
        self.passes += 1
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
