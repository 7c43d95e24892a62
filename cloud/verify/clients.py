"""Each client's part of a pass (docs/design.md §3): a share per client, not per session.

Sessions group by client (the bearer token where the verifier asks for one, else the id
the edge sends, else the connection's peer: acespec.cloud.serving.servicer). A session
earns its share of speculative nodes by what its drafts return (acespec.cloud.verify.share);
a client's first session in a pass has its whole grant, and its further sessions join that
pass only within the part any other client busy on the verifier could fill (the second-
largest demand), so a client buys no share with sessions: with one session among clients
of one session each nothing changes; with fifty it gets about what the busiest other client
gets, the rest of its sessions waiting for later passes in turn (those held go first next).
Where the device scores nodes for free (below the measured cost's knee) the rest of the
free room is filled too. Prompts (prefills, and prompts scored for their logprobs) take the
pass's prefill budget in turn by client: every client's shortest waiting prompt, shortest
first, before any client's second.

Parts change only which pass scores what, never a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

DECAY = 0.9  # per pass it is in: a client's nodes per pass follow its last ~10 passes
RECENT_S = 1.0  # a client in a pass this recently still counts as busy on the verifier


@dataclass
class ClientLoad:
    """A client's recent part of the passes."""

    nodes: float = 0.0  # decayed nodes per pass it was in
    last: float = -math.inf  # when it was last in a pass (perf_counter seconds; -inf: never)

    def on_pass(self, nodes: int, now: float) -> None:
        first = self.last == -math.inf
        self.nodes = nodes if first else DECAY * self.nodes + (1 - DECAY) * nodes
        self.last = now


def fair_level(demand: Mapping[str, float], free: int = 0) -> float:
    """The most nodes one client may have in a pass, given each busy client's demand (its
    queued nodes, or its recent nodes per pass while it has none queued): the second-largest
    demand, so no client gets more than another could use, raised while the pass stays
    within `free` nodes (a GPU's knee: nodes that cost nothing more). Unlimited for one
    client."""
    if len(demand) < 2:
        return math.inf
    ordered = sorted(demand.values(), reverse=True)
    level = ordered[1]
    shared = sum(min(d, level) for d in ordered)
    if shared < free:  # only the largest is capped: it takes the free room left
        level = max(level, level + free - shared)
    return level


def in_turn(jobs: list, client, length) -> list:
    """Prompts in the order a pass takes them: each client's shortest first, shortest of
    those first (so a lone prompt per client is shortest-first, as a pass is filled best for
    the time to first token), then each client's second, and so on: a client's further
    prompts wait behind every other client's first, however many it sends."""
    ranked: dict[object, int] = {}
    keyed = []
    for job in sorted(jobs, key=length):
        rank = ranked.get(client(job), 0)
        ranked[client(job)] = rank + 1
        keyed.append((rank, length(job), job))
    return [job for _, _, job in sorted(keyed, key=lambda k: k[:2])]
