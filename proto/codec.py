"""Protobuf <-> domain types. The only module besides the servicer and the client that
touches protobuf messages; the math never sees them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from acespec.proto import acespec_pb2 as pb
from acespec.shared.config import ConfigError, Penalties, SamplingParams
from acespec.shared.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from acespec.shared.served import MAX_TAIL_SAMPLES, NodeScore, ServeParams

MAX_GRAMMAR_CHARS = 1 << 18  # a structured-output grammar (JSON schemas, tools)


class WireError(ValueError):
    """A message is malformed; the text names the field."""


@dataclass(frozen=True)
class NewNodes:
    """An Extend in domain form: node first_id + i has token tokens[i], parent parents[i]."""

    first_id: int
    tokens: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64 node ids, each < its own id


# -- sampling -----------------------------------------------------------------


def encode_serve_params(p: ServeParams) -> pb.Sampling:
    s, pen = p.sampling, p.sampling.penalties
    return pb.Sampling(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                       send_mass=p.send_mass, k_max=p.k_max, tail_samples=p.tail_samples,
                       tail_samples_set=True, coupled=s.coupled,
                       presence_penalty=pen.presence, frequency_penalty=pen.frequency,
                       repetition_penalty=pen.repetition, output_from=s.output_from,
                       grammar=s.grammar or "")


def decode_serve_params(msg: pb.Sampling, default: ServeParams = ServeParams()) -> ServeParams:
    """Wire sampling -> ServeParams; zeros mean 'default'. Raises WireError naming the field."""
    try:
        penalties = Penalties(msg.presence_penalty, msg.frequency_penalty,
                              msg.repetition_penalty or 1.0)
        if len(msg.grammar) > MAX_GRAMMAR_CHARS:
            raise WireError(f"sampling: grammar is {len(msg.grammar)} characters, more than "
                            f"{MAX_GRAMMAR_CHARS}")
        sampling = SamplingParams(temperature=msg.temperature, top_k=msg.top_k,
                                  top_p=msg.top_p or 1.0, coupled=msg.coupled,
                                  penalties=penalties, grammar=msg.grammar or None,
                                  output_from=msg.output_from)
        return ServeParams(
            sampling=sampling, k_max=msg.k_max or default.k_max,
            send_mass=msg.send_mass or default.send_mass,
            tail_samples=msg.tail_samples if msg.tail_samples_set else default.tail_samples)
    except ConfigError as e:
        raise WireError(f"sampling: {e}") from None


# -- uplink: Extend -------------------------------------------------------------


def encode_extend(first_id: int, tokens: Sequence[int], parents: Sequence[int],
                  commit: int | None = None) -> pb.Extend:
    """Chain parents cost nothing; others become (index, parent) exceptions. `commit` rides
    along (applied before the new nodes)."""
    idx = [i for i, p in enumerate(parents) if p != first_id + i - 1]
    msg = pb.Extend(tokens=list(map(int, tokens)), branch_index=idx,
                    branch_parent=[int(parents[i]) for i in idx])
    if commit is not None:
        msg.commit = commit
    return msg


def _node_count(msg: pb.Extend | pb.Grow, kind: str) -> int:
    """How many new nodes an Extend or a Grow carries; WireError when none, or when its
    branch lists differ in length."""
    n = len(msg.tokens)
    if n == 0:
        raise WireError(f"{kind}.tokens is empty")
    if len(msg.branch_index) != len(msg.branch_parent):
        raise WireError(f"{kind}.branch_index has {len(msg.branch_index)} entries but "
                        f"branch_parent has {len(msg.branch_parent)}")
    return n


def decode_extend(msg: pb.Extend, first_id: int) -> NewNodes:
    n = _node_count(msg, "Extend")
    parents = np.arange(first_id - 1, first_id - 1 + n, dtype=np.int64)
    for i, p in zip(msg.branch_index, msg.branch_parent):
        if i >= n:
            raise WireError(f"Extend.branch_index {i} is outside the {n} new nodes")
        if p >= first_id + i:
            raise WireError(f"Extend.branch_parent {p} of node {first_id + i} is not an earlier node")
        parents[i] = p
    return NewNodes(first_id, np.asarray(msg.tokens, dtype=np.int64), parents)


# -- downlink: Scores -------------------------------------------------------------


def encode_scores(scores: Sequence[NodeScore], greedy: bool) -> pb.Scores:
    """Consecutive node scores -> one Scores message (parallel packed arrays)."""
    if not scores:
        raise ValueError("no scores to encode")
    first = scores[0].node_id
    if any(s.node_id != first + i for i, s in enumerate(scores)):
        raise ValueError("scores must cover consecutive node ids")
    if greedy:
        return pb.Scores(first_node_id=first, greedy_token=[s.greedy_token for s in scores])
    msg = pb.Scores(first_node_id=first)
    for s in scores:
        msg.self_p.append(s.self_units)
        msg.n_entries.append(len(s.ids))
        msg.entry_id_delta.extend(np.diff(s.ids, prepend=0).tolist())
        msg.entry_p.extend(s.units.tolist())
        msg.tail_p.append(s.tail_units)
        msg.n_tail_samples.append(len(s.tail_ids))
        msg.tail_token.extend(s.tail_ids.tolist())
        msg.tail_token_p.extend(s.tail_sample_units.tolist())
    return msg


def decode_scores(msg: pb.Scores) -> list[NodeScore]:
    """One Scores message -> NodeScore per node (greedy messages carry only argmax ids)."""
    first = msg.first_node_id
    if msg.greedy_token:
        one, empty = np.array([65536]), np.zeros(0, np.int64)
        return [NodeScore(first + i, 0, np.array([t]), one, 0, empty, empty)
                for i, t in enumerate(msg.greedy_token)]
    n = len(msg.n_entries)
    if not (len(msg.self_p) == len(msg.tail_p) == len(msg.n_tail_samples) == n):
        raise WireError("Scores per-node arrays differ in length")
    if sum(msg.n_entries) != len(msg.entry_id_delta) or len(msg.entry_p) != len(msg.entry_id_delta):
        raise WireError("Scores.n_entries does not match the entry arrays")
    if sum(msg.n_tail_samples) != len(msg.tail_token) or len(msg.tail_token) != len(msg.tail_token_p):
        raise WireError("Scores.n_tail_samples does not match the tail arrays")
    ids, probs = np.asarray(msg.entry_id_delta, np.int64), np.asarray(msg.entry_p, np.int64)
    tz, tp = np.asarray(msg.tail_token, np.int64), np.asarray(msg.tail_token_p, np.int64)
    out, e, t = [], 0, 0
    for i in range(n):
        k, m = msg.n_entries[i], msg.n_tail_samples[i]
        out.append(NodeScore(first + i, msg.self_p[i], np.cumsum(ids[e:e + k]), probs[e:e + k],
                             msg.tail_p[i], tz[t:t + m], tp[t:t + m]))
        e, t = e + k, t + m
    return out


# -- decided sessions -------------------------------------------------------------


@dataclass(frozen=True)
class GrowMsg:
    """A Grow uplink in domain form: node first_id + i has token tokens[i] and parent
    parents[i] (a node id, or -1 for the decided text up to `anchor`)."""

    anchor: int
    first_id: int
    tokens: list[int]  # [n]
    parents: list[int]  # [n] node id or -1


def encode_grow(anchor: int, first_id: int, tokens: Sequence[int],
                parents: Sequence[int]) -> pb.Grow:
    """Chain parents cost nothing; the first node's parent and the exceptions are written
    as how far back they are (small varints; 0 = the decided text at `anchor`)."""
    def back(i: int) -> int:
        return 0 if parents[i] < 0 else first_id + i - parents[i]
    idx = [i for i in range(1, len(tokens)) if parents[i] != first_id + i - 1]
    return pb.Grow(anchor=anchor, tokens=list(map(int, tokens)), first_parent=back(0),
                   branch_index=idx, branch_parent=[back(i) for i in idx])


def decode_grow(msg: pb.Grow, first_id: int) -> GrowMsg:
    n = _node_count(msg, "Grow")
    backs = {0: msg.first_parent}
    for i, k in zip(msg.branch_index, msg.branch_parent):
        if not 1 <= i < n:
            raise WireError(f"Grow.branch_index {i} is outside nodes 1..{n - 1} of the message")
        backs[i] = k
    parents = []
    for i in range(n):
        k = backs.get(i, 1)
        if k > first_id + i:
            raise WireError(f"Grow: node {first_id + i}'s parent is {k} nodes back, before "
                            "node 0")
        parents.append(-1 if k == 0 else first_id + i - k)
    return GrowMsg(msg.anchor, first_id, list(msg.tokens), parents)


def encode_counts(c, now: float) -> pb.DecidedCounts:
    """DecidedCounts from acespec.cloud.verify.decided.DecidedCounts (times in microseconds)."""
    return pb.DecidedCounts(wall_us=round((now - c.opened_at) * 1e6), busy_us=round(c.busy_s * 1e6),
                            drafts_received=c.drafts_received, drafts_scored=c.drafts_scored,
                            drafts_reconciled=c.drafts_reconciled,
                            dead_skipped=c.dead_skipped(), continuation=c.continuation,
                            hits=c.hits, hits_restarted=c.hits_restarted,
                            lone_passes=c.lone_passes, lone_tokens=c.lone_tokens,
                            proposed=c.proposed, proposed_accepted=c.proposed_accepted,
                            gap_us=round(c.gap_s * 1e6))


def decode_counts(msg: pb.DecidedCounts) -> dict:
    """The verifier's account of a decided session, as the edge reports it."""
    return {"wall_s": msg.wall_us / 1e6, "busy_s": msg.busy_us / 1e6,
            "drafts_received": msg.drafts_received, "drafts_scored": msg.drafts_scored,
            "drafts_reconciled": msg.drafts_reconciled, "dead_skipped": msg.dead_skipped,
            "continuation": msg.continuation, "hits": msg.hits,
            "hits_restarted": msg.hits_restarted, "lone_passes": msg.lone_passes,
            "lone_tokens": msg.lone_tokens, "proposed": msg.proposed,
            "proposed_accepted": msg.proposed_accepted, "gap_s": msg.gap_us / 1e6}


# -- logprobs -----------------------------------------------------------------


def check_top_logprobs(asked: bool, top_n: int, where: str) -> int | None:
    """What a request asked for: None (no logprobs) or the alternatives per token."""
    if not asked:
        return None
    if not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise WireError(f"{where}.top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top_n}")
    return top_n


def encode_logprobs(entries: Sequence[TokenLogprob]) -> pb.Logprobs:
    """One entry per token, each with as many alternatives as the first."""
    top_n = len(entries[0].top_ids) if entries else 0
    return pb.Logprobs(token=[e.logprob for e in entries], top_n=top_n,
                       top_id=[i for e in entries for i in e.top_ids],
                       top=[x for e in entries for x in e.top_logprobs])


def decode_logprobs(msg: pb.Logprobs, n_tokens: int) -> list[TokenLogprob]:
    """The entries of `n_tokens` tokens; WireError if the message does not hold them."""
    n, k = len(msg.token), msg.top_n
    if n != n_tokens or len(msg.top_id) != n * k or len(msg.top) != n * k:
        raise WireError(f"Logprobs holds {n} tokens with {len(msg.top_id)} alternatives "
                        f"(top_n {k}) for {n_tokens} tokens")
    return [TokenLogprob(msg.token[i], tuple(msg.top_id[i * k:(i + 1) * k]),
                         tuple(msg.top[i * k:(i + 1) * k])) for i in range(n)]


def check_more_tail(msg: pb.MoreTail) -> tuple[int, int]:
    if not 1 <= msg.n <= MAX_TAIL_SAMPLES:
        raise WireError(f"MoreTail.n must be in [1, {MAX_TAIL_SAMPLES}], got {msg.n}")
    return msg.node_id, msg.n
