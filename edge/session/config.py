"""Configuration and statistics of one edge generation (see acespec.edge.session)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from acespec.edge.session.offline import OFFLINE_MODES
from acespec.edge.speculation.branches import CacheConfig, CacheStats
from acespec.shared.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from acespec.shared.modes import Mode
from acespec.shared.modes import mode as mode_named
from acespec.shared.served import ServeParams

SAMPLINGS = ("coupled", "exact")  # who decides a sampled session: see EngineConfig.sampling
MAX_DEPTH, MAX_WINDOW = 64, 1024  # the largest --depth and --window an edge accepts
GROW_SEQS = 6  # drafter sequences a request's speculation tree may use besides its main one
# What one more node adds to a verifier pass: a planning guess, the 40,0.5 profile's per-node
# cost (docs/design.md §8).
NODE_PASS_S = 5e-4


@dataclass(frozen=True)
class EngineConfig:
    mode: str = "pipeline"  # a name in acespec.shared.modes.MODES
    depth: int = 4  # drafts per Extend
    window: int = 16  # most live (uncommitted) nodes in pipeline mode
    serve: ServeParams = field(default_factory=ServeParams)
    seed: int = 0
    max_tokens: int = 128
    stop_ids: frozenset[int] = frozenset()
    max_reconnects: int = 8
    backoff_s: float = 0.25  # first reconnect delay, doubled each time (max 8 s)
    reconnect_deadline_s: float | None = None  # set: retry an outage for this long, however
    # many reconnects that takes (max_reconnects then does not apply; delays cap at 2 s)
    connect_timeout_s: float = 3.0  # give up this soon when no session ever opened
    cache: CacheConfig = field(default_factory=CacheConfig)  # modes with branches
    sampling: str = "coupled"  # coupled: a sampled session is decided where the mode decides
    # (the verifier, in acespec); exact: at the edge, by rejection sampling, in every mode
    adaptive: bool = False  # depth/window follow the link (acespec.edge.speculation.adaptive); start at depth/window
    max_depth: int = 8  # bounds for the adaptive shape
    max_window: int = 32
    offline: str = "wait"  # while the verifier cannot be reached: wait (lossless pause) or
    # local (answer from the drafter, every token flagged unverified; acespec.edge.session.offline);
    # a mode whose row says local answers locally whatever this says
    stall_s: float | None = None  # a session silent this long while owing an answer counts
    # as down (None: the mode's default, offline.STALL_S)
    logprobs: int | None = None  # the target's logprobs of each token, with this many
    # alternatives (Stats.logprobs); None: none. Served where the verifier decides each token

    def drafter_reserve(self) -> int:
        """Drafter KV cells one request may need beyond prompt + max_tokens: each of its
        sequences (the main one and its tree's) may hold up to a window and a chunk of
        drafts the others do not share, plus a guessed token and a branch's drafts."""
        per_seq = max(self.window, self.max_window) + max(self.depth, self.max_depth)
        return (1 + GROW_SEQS) * per_seq + self.cache.branch_depth + 2

    def __post_init__(self):
        spec = mode_named(self.mode)  # ValueError naming the modes
        if spec.offline == "local":
            object.__setattr__(self, "offline", "local")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if spec.drafts == "verifier" and not self.decided:
            raise ValueError(f"mode {self.mode} has the verifier speculate alone, so it must "
                             "decide: greedy or coupled sampling, not exact")
        if self.depth < 1 or self.window < self.depth:
            raise ValueError("need depth >= 1 and window >= depth")
        if self.offline not in OFFLINE_MODES:
            raise ValueError(f"offline must be one of {OFFLINE_MODES}, got {self.offline!r}")
        if self.stall_s is not None and self.stall_s <= 0:
            raise ValueError(f"stall_s must be > 0, got {self.stall_s}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64 - 1], got {self.seed}")
        if self.adaptive and (self.max_depth < self.depth or self.max_window < self.window):
            raise ValueError("need max_depth >= depth and max_window >= window")
        if self.logprobs is not None:
            self._check_logprobs()

    @property
    def spec(self) -> Mode:
        """This mode's row (acespec.shared.modes)."""
        return mode_named(self.mode)

    @property
    def decided(self) -> bool:
        """A session the verifier decides (Grow/Decided): the mode lets it decide, and the
        sampling is greedy or coupled (not exact)."""
        return self.spec.verifier_decides(self.serve.sampling.decided
                                          and self.sampling != "exact")

    @property
    def verifier_decides_all(self) -> bool:
        """The verifier decides every token: cloud-only decoding, or a decided session."""
        return self.spec.cloud_only or self.decided

    def _check_logprobs(self) -> None:
        """Logprobs come from the verifier with each token it decides: in ar mode, and in
        acespec sessions it decides (greedy or coupled); never for unverified tokens."""
        if not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs (alternatives per token) must be in "
                             f"[0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if not self.verifier_decides_all:
            raise ValueError("logprobs are served where the verifier decides every token: "
                             "greedy (temperature 0) or coupled sampling, or ar mode; this "
                             "session samples exactly at the edge ('sampling': 'exact')")
        if self.offline == "local":
            raise ValueError("logprobs come from the verifier, and offline 'local' answers "
                             "with unverified tokens: ask with 'offline': 'wait'")


@dataclass
class Stats:
    tokens: int = 0
    rounds: int = 0  # verification outcomes that ended a run (a rejection or a bonus)
    drafted: int = 0
    accepted: int = 0
    passes: int = 0  # verifier passes for this request
    wire_bytes_up: int = 0  # protobuf + gRPC/HTTP2 data framing, per message
    wire_bytes_down: int = 0
    messages_up: int = 0  # uplink messages (each costs its gRPC/HTTP2 framing)
    reconnects: int = 0
    more_tail: int = 0
    seconds: float = 0.0
    first_token_s: float | None = None
    longest_gap_s: float = 0.0  # the longest wait between two tokens after the first
    round_trips: list[float] = field(default_factory=list)  # Extend sent -> its Scores, seconds
    cache: CacheStats = field(default_factory=CacheStats)  # acespec mode
    budgets: dict | None = None  # acespec mode: the branch budgets in force
    depth: int | None = None  # the adaptive shape in force at the end
    window: int | None = None
    shape_changes: int = 0
    link: dict | None = None  # the link as the adaptive shape sees it
    verifier: dict | None = None  # decided sessions: the verifier's account (summed)
    server_s: float = 0.0  # edge-decided sessions: sum of Scores.server_time (queue + pass), s
    tree_width: int = 0  # decided sessions with a speculation tree: most live nodes at one
    tree_depth: int = 0  # position, and the deepest live position ahead (maxima seen)
    verdicts: dict = field(default_factory=dict)  # speculation tree: decided tokens by verdict
    outages: int = 0  # times the link went down during this request
    offline_s: float = 0.0  # seconds it was down
    unverified_tokens: int = 0  # local mode: tokens answered from the drafter alone
    unverified_confirmed: int = 0  # ... of which verified as they were
    unverified_replaced: int = 0  # ... of which replaced by the verified text
    unverified_tail: list[int] = field(default_factory=list)  # the request ended on them:
    # the verifier never came back (reconnect deadline), so they stay unverified
    logprobs: list[TokenLogprob] = field(default_factory=list)  # asked for: the target's,
    # one per committed token

    def note_tree(self, width: int, depth: int) -> None:
        self.tree_width, self.tree_depth = max(self.tree_width, width), max(self.tree_depth, depth)

    def add_verifier(self, counts: dict) -> None:
        """Sum the account of one decided session (one per connection attempt)."""
        if self.verifier is None:
            self.verifier = dict.fromkeys(counts, 0)
        for k, v in counts.items():
            self.verifier[k] += v

    def idle_figures(self) -> dict:
        """verifier_busy (fraction of the verifier's session time spent in passes for it),
        dead drafts it never scored, tokens it decided with no draft. Decided sessions
        report them exactly; edge-decided sessions estimate busy from the Scores' server times."""
        v = self.verifier
        if v is not None:
            return {"verifier_busy": round(v["busy_s"] / v["wall_s"], 3) if v["wall_s"] else None,
                    "dead_nodes_skipped": v["dead_skipped"],
                    "continuation_tokens": v["continuation"],
                    "reconciled_drafts": v["drafts_reconciled"],
                    "verifier_hits": v.get("hits", 0),
                    "hits_restarted": v.get("hits_restarted", 0),
                    **self.pass_figures()}
        busy = min(1.0, self.server_s / self.seconds) if self.seconds and self.server_s else None
        return {"verifier_busy": round(busy, 3) if busy is not None else None,
                "dead_nodes_skipped": 0, "continuation_tokens": 0, "reconciled_drafts": 0,
                "verifier_hits": 0, "hits_restarted": self.cache.hits_restarted,
                **self.pass_figures()}

    def pass_figures(self) -> dict:
        """Decided sessions: passes no edge draft covered ("lone") and what they decided,
        the verifier's own proposals and how many it accepted, the passes with drafts and
        what they decided. None in edge-decided sessions (no verifier account); a verifier older
        than these counts reports zeros."""
        v = self.verifier
        if v is None or "lone_passes" not in v:
            return dict.fromkeys(("lone_passes", "lone_tokens", "verifier_proposed",
                                  "proposed_accepted", "draft_passes", "draft_pass_tokens",
                                  "gap_s"))
        passes = self.passes
        return {"lone_passes": v["lone_passes"], "lone_tokens": v["lone_tokens"],
                "verifier_proposed": v["proposed"], "proposed_accepted": v["proposed_accepted"],
                "draft_passes": max(0, passes - v["lone_passes"]),
                "draft_pass_tokens": max(0, self.tokens - v["lone_tokens"]),
                "gap_s": round(v.get("gap_s", 0.0), 4)}

    def as_dict(self) -> dict:
        t = max(self.tokens, 1)
        return {"tokens": self.tokens, "tokens_per_s": round(self.tokens / self.seconds, 2)
                if self.seconds else 0.0,
                "mean_acceptance_length": round(self.tokens / self.rounds, 3) if self.rounds else 0.0,
                "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "passes": self.passes, "passes_per_token": round(self.passes / t, 3),
                "wire_bytes_up": self.wire_bytes_up, "wire_bytes_down": self.wire_bytes_down,
                "wire_bytes_up_per_token": round(self.wire_bytes_up / t, 2),
                "wire_bytes_down_per_token": round(self.wire_bytes_down / t, 2),
                "messages_up": self.messages_up,
                "reconnects": self.reconnects, "more_tail": self.more_tail,
                "rtt_ms": round(1000 * float(np.median(self.round_trips)), 2)
                if self.round_trips else None,
                "cache_hit_rate": round(self.cache.hit_rate, 3),
                "cache_rejections": self.cache.rejections, "cache_hits": self.cache.hits,
                "verdicts": self.verdicts,
                "tree_width": self.tree_width, "tree_depth": self.tree_depth,
                "nodes_per_pass": round(self.verifier["drafts_scored"] / self.passes, 2)
                if self.verifier and self.passes else None,
                "branches_uploaded": self.cache.branches_uploaded,
                "branch_nodes_scored": self.cache.branch_nodes, "budgets": self.budgets,
                "drafts_in_time": None if self.cache.in_time_rate is None
                else round(self.cache.in_time_rate, 3),
                "adaptive_depth": self.depth, "adaptive_window": self.window,
                "shape_changes": self.shape_changes, "link_estimate": self.link,
                **self.idle_figures(),
                "outages": self.outages, "offline_s": round(self.offline_s, 3),
                "unverified_tokens": self.unverified_tokens,
                "unverified_confirmed": self.unverified_confirmed,
                "unverified_replaced": self.unverified_replaced,
                "unverified_tail_tokens": len(self.unverified_tail),
                "ttft_s": round(self.first_token_s, 4) if self.first_token_s is not None else None,
                "longest_gap_s": round(self.longest_gap_s, 4),
                "seconds": round(self.seconds, 3)}
