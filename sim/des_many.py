"""The discrete-event model with many sessions on one verifier (`acespec bench load
--predict`).

N clients, each with a link of its own and, in `acespec`, an edge of its own (drafting on its
own device, so its time is not the verifier's). One device runs the target: a pass starts
as soon as the device is free and a session is ready, and takes every ready session; it
lasts T(all its nodes), flat up to the knee on a GPU-like profile. A lone pass's proposals
come from prompt lookup (free) or, in `colo`, from a drafter beside the target: its draft
steps run on the device before the pass, one batched step per proposal depth, each
`draft_base_s + draft_per_seq_s x` the sessions drafting. A lone pass scores as many
proposals as pay at the device's load, as the verifier picks them (load-aware speculation:
acespec.cloud.verify.pressure's recent passes and proposals.worth_depth, at the fleet's
acceptance). Sessions are acespec.sim.des's decided sessions, so acceptance is drawn per
position as there. What it leaves out: the verifier's Python, the edges sharing a machine,
prefill and TTFT, closed-loop restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from acespec.cloud.verify.pressure import Pressure
from acespec.cloud.verify.proposals import worth_depth
from acespec.shared import modes
from acespec.sim.des_decided import DecidingVerifier, DraftingEdge
from acespec.sim.des_scenario import ModelCosts, Scenario
from acespec.sim.stages import Chunk, LinkSpec

MANY_MODES = ("ar", "acespec", "colo", "cloud-lookup")  # the rows the model runs
PROPOSE = 8  # cloud serve --propose's default: the most a lone pass scores


@dataclass(frozen=True)
class Fleet:
    """What the model needs beyond ModelCosts: acceptance per position of the edge's
    drafts (`accept`, also the co-located drafter's: the same file) and of prompt lookup's
    proposals, and the co-located drafter's step on the device."""

    accept: float = 0.7
    lookup_accept: float = 0.3
    draft_base_s: float = 0.005
    draft_per_seq_s: float = 0.00005
    depth: int = 8  # the edge's chunk
    window: int = 8
    tokens: int = 64  # per client


def scenario(mode: str, link: LinkSpec, fleet: Fleet, costs: ModelCosts, seed: int
             ) -> Scenario:
    """One client's session in `mode`, from its row (acespec.shared.modes): an edge that
    drafts sends a chain; one that does not has a window of 0. The verifier proposes by
    prompt lookup or with its gap drafter, up to PROPOSE a pass (simulate_many: as many as
    pay, `proposals`); cloud-only decoding proposes nothing."""
    if mode not in MANY_MODES:
        raise ValueError(f"unknown mode {mode!r}; the model runs {', '.join(MANY_MODES)}")
    m = modes.mode(mode)
    base = Scenario("acespec", link, accept=fleet.accept, depth=fleet.depth,
                    window=fleet.window if m.edge_drafts else 0, tokens=fleet.tokens,
                    decided=True, seed=seed)
    if m.cloud_only:
        return base
    return replace(base, propose=PROPOSE,
                   propose_accept=fleet.accept if m.gap else fleet.lookup_accept)


@dataclass(frozen=True)
class Proposals:
    """What a lone pass scores of the verifier's own proposals now."""

    depth: int
    accept: float  # each one's acceptance
    drafted: bool  # by the co-located drafter (its steps on the device), else prompt lookup


def proposals(mode: str, fleet: Fleet, costs: ModelCosts, load: Pressure) -> Proposals:
    """The proposals a lone pass scores in passes as full as the recent ones, as the
    verifier's engine picks them (proposals.Depth): the depth that decides the most tokens
    per second of the pass. A co-located drafter's proposals (at the fleet's acceptance)
    cost a draft step each, waited out by the sessions sharing the device; where none pays,
    prompt lookup's (free) are scored instead."""
    others = load.others()
    if modes.mode(mode).gap:
        extra_s = (fleet.draft_base_s + fleet.draft_per_seq_s * load.sessions) * load.sessions
        if k := worth_depth([fleet.accept] * PROPOSE, costs.target_s, 1, extra_s, *others):
            return Proposals(k, fleet.accept, True)
    k = worth_depth([fleet.lookup_accept] * PROPOSE, costs.target_s, 1, 0.0, *others)
    return Proposals(k, fleet.lookup_accept, False)


def simulate_many(mode: str, clients: int, link: LinkSpec, fleet: Fleet, costs: ModelCosts,
                  seed: int = 0) -> dict:
    """N clients generating fleet.tokens at once: per-client tokens/s p50 and p10,
    aggregate tokens/s, the device's busy fraction and scored nodes per token."""
    pairs = []
    for i in range(clients):
        sc = scenario(mode, link, fleet, costs, seed * 1000 + i)
        up, down = link.build(sc.seed)
        opened = up(Chunk(int(costs.up_base), 0.0)).t
        v = DecidingVerifier(sc, costs, down, opened)
        e = DraftingEdge(sc, costs, up, np.random.default_rng(sc.seed),
                          down(Chunk(int(costs.down_base), opened)).t)
        pairs.append((v, e))
    device, busy, nodes_total, load = 0.0, 0.0, 0, Pressure()
    while any(e.done_at is None for _, e in pairs):
        start = max(device, min(v.next_t for v, _ in pairs))
        edge_t, i = min((e.next_t(v.outbox), i) for i, (v, e) in enumerate(pairs))
        if edge_t < start:  # an edge acts first (the verifier's pass sees what it sends)
            v, e = pairs[i]
            e.step(v.outbox, v.inbox)
            continue
        batch = [v for v, _ in pairs if v.next_t <= start]
        for v in batch:
            v.free = start
        now = proposals(mode, fleet, costs, load)
        planned = [v.plan(now.depth, now.accept) for v in batch]
        nodes = sum(n for n, _ in planned)
        before = [v.decided for v in batch]
        drafting = [p for _, p in planned if p] if now.drafted else []
        steps = max(drafting, default=0)
        seconds = costs.target_s(nodes) + steps * (
            fleet.draft_base_s + fleet.draft_per_seq_s * len(drafting))
        for v in batch:
            v.finish(start + seconds)
        load.on_pass(len(batch), nodes)
        for v, d in zip(batch, before):
            load.on_decided(v.decided - d)
        device, busy, nodes_total = start + seconds, busy + seconds, nodes_total + nodes
    rates = [fleet.tokens / e.done_at for _, e in pairs]
    wall = max(e.done_at for _, e in pairs)
    return {"mode": mode, "clients": clients,
            "per_client_tok_s_p50": round(float(np.percentile(rates, 50)), 2),
            "per_client_tok_s_p10": round(float(np.percentile(rates, 10)), 2),
            "aggregate_tok_s": round(clients * fleet.tokens / wall, 2),
            "verifier_busy": round(min(1.0, busy / wall), 3),
            "nodes_per_token": round(nodes_total / (clients * fleet.tokens), 2)}
