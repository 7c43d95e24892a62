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
ModelCosts come from `acespec bench calibrate` (measured components) or are given directly;
they, the Scenario and the SimResult are acespec.sim.des_scenario's.
"""

from __future__ import annotations

import numpy as np

from acespec.sim.des_decided import decided_run
from acespec.sim.des_scenario import ModelCosts, Scenario, SimResult, accepted_run
from acespec.sim.stages import Chunk


def simulate(sc: Scenario, costs: ModelCosts) -> SimResult:
    if sc.mode == "ar":
        return _ar(sc, costs)
    if sc.mode == "sd":
        return _sd(sc, costs)
    if sc.decided and sc.mode != "acespec":
        raise ValueError(f"decided is a property of acespec sessions, not {sc.mode!r}")
    if sc.decided:
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
