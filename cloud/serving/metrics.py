"""Prometheus metrics of the verifier (served as text on --metrics-port)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

SESSION_LABEL = 12  # hex digits of a session id in per-session labels


@dataclass
class Metrics:
    registry: object
    sessions_opened: object
    sessions_active: object
    nodes_scored: object
    passes: object
    batch_nodes: object
    batch_sessions: object
    message_bytes: object
    errors: object
    allreduce_bytes: object
    proposals: object
    gap_seconds: object
    session_share: object
    session_efficiency: object
    speculative_nodes: object
    busy_seconds: object
    _counted: dict = field(default_factory=dict)  # session id -> (accepted, wasted) counted

    @classmethod
    def create(cls) -> Metrics:
        r = CollectorRegistry()
        return cls(
            registry=r,
            sessions_opened=Counter("acespec_sessions_opened", "Sessions opened", registry=r),
            sessions_active=Gauge("acespec_sessions_active", "Sessions open now", registry=r),
            nodes_scored=Counter("acespec_nodes_scored", "Tree nodes scored", registry=r),
            passes=Counter("acespec_passes", "Passes of the target (one forward over every "
                           "session it scores)", registry=r),
            batch_nodes=Histogram("acespec_batch_nodes", "Nodes per pass", registry=r,
                                  buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)),
            batch_sessions=Histogram("acespec_batch_sessions", "Requests per pass",
                                     registry=r, buckets=(1, 2, 4, 8, 16, 32, 64)),
            message_bytes=Counter("acespec_message_bytes", "Serialized protobuf bytes",
                                  ["direction"], registry=r),
            errors=Counter("acespec_errors", "Sessions ended by an error", ["code"], registry=r),
            allreduce_bytes=Gauge("acespec_tp_allreduce_bytes", "Bytes rank 0 all-reduced "
                                  "with the other tensor-parallel ranks since start (0 on "
                                  "one device)", registry=r),
            proposals=Counter("acespec_proposals", "The verifier's own proposals in passes "
                              "no edge draft covered, by source (lookup, gap) and fate "
                              "(scored, accepted)", ["source", "fate"], registry=r),
            gap_seconds=Counter("acespec_gap_seconds", "Seconds the gap drafter spent "
                                "decoding proposals", registry=r),
            session_share=Gauge("acespec_session_share", "Speculative nodes per pass a "
                                "session has earned (docs/design.md §3), by session id "
                                "prefix; gone when the session ends", ["session"], registry=r),
            session_efficiency=Gauge("acespec_session_efficiency", "A session's recent "
                                     "accepted tokens per speculative node scored",
                                     ["session"], registry=r),
            speculative_nodes=Counter("acespec_speculative_nodes", "Speculative nodes "
                                      "scored, by fate: accepted, or wasted (never taken)",
                                      ["fate"], registry=r),
            busy_seconds=Counter("acespec_busy_seconds", "Seconds the target's device was "
                                 "busy, by work: pass (the target's passes) or draft (the "
                                 "gap drafter's batched steps)", ["work"], registry=r),
        )

    def on_draft(self, seconds: float) -> None:
        self.busy_seconds.labels("draft").inc(seconds)

    def on_share(self, session_id: str, share) -> None:
        """A session's share after its pass (acespec.cloud.verify.share.Share)."""
        label = session_id[:SESSION_LABEL]
        self.session_share.labels(label).set(share.nodes())
        self.session_efficiency.labels(label).set(round(share.efficiency, 4))
        accepted, wasted = share.total_accepted, share.wasted
        seen_a, seen_w = self._counted.get(session_id, (0, 0))
        self.speculative_nodes.labels("accepted").inc(max(0, accepted - seen_a))
        self.speculative_nodes.labels("wasted").inc(max(0, wasted - seen_w))
        self._counted[session_id] = (accepted, wasted)

    def drop_share(self, session_id: str) -> None:
        label = session_id[:SESSION_LABEL]
        self._counted.pop(session_id, None)
        for gauge in (self.session_share, self.session_efficiency):
            try:
                gauge.remove(label)
            except KeyError:
                pass

    def on_proposals(self, source: str, scored: int, accepted: int, gap_s: float) -> None:
        """One pass's own proposals (acespec.cloud.verify.decided): what was scored and taken."""
        if scored:
            self.proposals.labels(source, "scored").inc(scored)
            self.proposals.labels(source, "accepted").inc(accepted)
        if gap_s:
            self.gap_seconds.inc(gap_s)

    def on_pass(self, stats) -> None:
        self.passes.inc()
        self.busy_seconds.labels("pass").inc(stats.seconds)
        self.nodes_scored.inc(stats.nodes)
        self.batch_nodes.observe(stats.nodes)
        self.batch_sessions.observe(stats.sessions)

    def serve(self, port: int, host: str = "0.0.0.0"):
        """Start the HTTP exporter in a thread; returns (server, bound port)."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        return server, server.server_port
