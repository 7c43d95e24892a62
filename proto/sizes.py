"""Bytes on the wire: the one source of every message and node size the edge's planners and
the discrete-event model use (docs/design.md §4).

Each size is measured at import by encoding real messages of acespec.proto; FRAMING is what
gRPC and HTTP/2 add to each. They count what the edge's own stats count (a message's
ByteSize() plus FRAMING), not the socket's HTTP/2 control frames. They assume a token id of
3 varint bytes (ids 16384 to 2**21 - 1, as most of a 32K-200K vocabulary), a position or node
id of 2 (128 to 16383), small counts and back-distances of 1, and messages under 128 bytes
(one length byte each: a Grow chain of up to 40 nodes). tests/shared/test_wire_sizes.py checks that
they predict encoded messages.
"""

from __future__ import annotations

from acespec.proto import acespec_pb2 as pb

FRAMING = 14  # per message: 5 B gRPC length prefix + 9 B HTTP/2 DATA frame header

_TOKEN = 20_000  # a token id of 3 varint bytes
_POSITION = 300  # a position or node id of 2
_N = 16  # nodes in the longer message of each pair measured


def _grow(n: int, branches: int = 0) -> int:
    """ByteSize of an uplink Grow of n nodes, `branches` of them branch nodes."""
    idx = list(range(2, 2 + 2 * branches, 2))
    return pb.Uplink(grow=pb.Grow(anchor=_POSITION, tokens=[_TOKEN] * n, first_parent=1,
                                  branch_index=idx, branch_parent=[2] * branches)).ByteSize()


def _scores(n: int, sampled: bool = False) -> int:
    """ByteSize of a downlink Scores of n nodes: greedy (one token id each), or sampled with
    a peaked p~ (one entry sent, its tail mass and two tail samples)."""
    if not sampled:
        msg = pb.Scores(first_node_id=_POSITION, greedy_token=[_TOKEN] * n, server_time=450)
    else:
        msg = pb.Scores(first_node_id=_POSITION, self_p=[45_000] * n, n_entries=[1] * n,
                        entry_id_delta=[_TOKEN] * n, entry_p=[60_000] * n, tail_p=[5_000] * n,
                        n_tail_samples=[2] * n, tail_token=[_TOKEN] * 2 * n,
                        tail_token_p=[100] * 2 * n, server_time=450)
    return pb.Downlink(scores=msg).ByteSize()


def _decided(n: int) -> int:
    """ByteSize of a downlink Decided of n tokens (a pass count and hold time of a long
    session: 2 and 3 varint bytes)."""
    return pb.Downlink(decided=pb.Decided(position=_POSITION, tokens=[_TOKEN] * n, passes=300,
                                          acked=1, held_us=40_000)).ByteSize()


# Uplink (Grow, Extend): one varint per chain node; a branch node lists its index and parent.
UP_NODE = (_grow(_N) - _grow(1)) // (_N - 1)  # a chain node: its token id
UP_MESSAGE = _grow(1) - UP_NODE  # a Grow less its nodes: anchor, first parent, field headers
UP_BRANCH_NODE = _grow(_N, 2) - _grow(_N, 1)  # more per branch node: its index and parent
UP_BRANCH_FIELDS = _grow(_N, 1) - _grow(_N) - UP_BRANCH_NODE  # once per message with branches
UP_EXTEND_MESSAGE = pb.Uplink(extend=pb.Extend(tokens=[_TOKEN], commit=_POSITION)).ByteSize() \
    - UP_NODE  # an Extend (with its commit) less its nodes

# Downlink (Scores, Decided).
DOWN_NODE_GREEDY = (_scores(_N) - _scores(1)) // (_N - 1)  # a greedy Scores node: one token id
DOWN_SCORES_MESSAGE = _scores(1) - DOWN_NODE_GREEDY  # a Scores less its nodes
DOWN_DECIDED_TOKEN = (_decided(_N) - _decided(1)) // (_N - 1)  # a decided token
DOWN_DECIDED_MESSAGE = _decided(1) - DOWN_DECIDED_TOKEN  # a Decided less its tokens
# A sampled Scores node of a peaked p~: self_p, one sent entry (delta-coded id and
# probability), its tail mass and two pre-drawn tail samples. A flatter p~ sends more
# entries (up to k_max) and costs several times this.
DOWN_NODE_SAMPLED = (_scores(_N, True) - _scores(1, True)) // (_N - 1)


def grow_bytes(nodes: int, branches: int = 0) -> int:
    """Bytes of one Grow uplink of `nodes` nodes, `branches` of them branch nodes, framing
    included."""
    extra = UP_BRANCH_FIELDS + branches * UP_BRANCH_NODE if branches else 0
    return FRAMING + UP_MESSAGE + nodes * UP_NODE + extra


NAIVE_PROB_BYTES = 2  # a probability as float16
NAIVE_TOKEN_BYTES = 4  # a token id as int32


def naive_bytes(drafted: int, passes: int, vocab: int) -> tuple[int, int]:
    """(uplink, downlink) bytes a naive protocol sends for a session that drafted `drafted`
    tokens and took `passes` verifier passes: each draft goes up as its id and the drafter's
    distribution over the vocabulary, and each scored node (every draft, and the decided
    end of every pass) comes down as the target's distribution over the vocabulary, dense,
    float16. Framing is left out, which flatters it."""
    dense = vocab * NAIVE_PROB_BYTES
    return drafted * (NAIVE_TOKEN_BYTES + dense), (drafted + passes) * dense
