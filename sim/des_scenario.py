"""What the discrete-event model (acespec.sim.des) is given and gives back: the scenario of
one session, what the modelled components cost, the result; and the model of acceptance."""

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
from acespec.sim.stages import LinkSpec


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
    # this long for a Grow message already on its way (an oracle's wait: the bound of what
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


def accepted_run(rng: np.random.Generator, n: int, p: float) -> int:
    """Leading accepted drafts among n."""
    for i in range(n):
        if rng.random() >= p:
            return i
    return n
