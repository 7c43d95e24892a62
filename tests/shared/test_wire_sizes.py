"""acespec.proto.sizes against real encoded messages: each size, with FRAMING, predicts what
the edge counts for a message (ByteSize() + FRAMING), built through the codec where it has an
encoder. Exact within the stated field widths (token ids of 3 varint bytes, positions and node
ids of 2, back-distances of 1, messages under 128 bytes); within 2 B where a Grow's first
parent is the decided text (0: proto3 leaves the field out)."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.proto import acespec_pb2 as pb
from acespec.proto.codec import encode_extend, encode_grow, encode_scores
from acespec.proto.sizes import (
    DOWN_DECIDED_MESSAGE,
    DOWN_DECIDED_TOKEN,
    DOWN_NODE_GREEDY,
    DOWN_NODE_SAMPLED,
    DOWN_SCORES_MESSAGE,
    FRAMING,
    UP_EXTEND_MESSAGE,
    UP_NODE,
    grow_bytes,
)
from acespec.shared.config import SamplingParams
from acespec.shared.served import NodeScore, ServeParams, node_score, served

SIZES = (1, 3, 7, 13, 29, 37)  # nodes per message: irregular, messages under 128 B


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(16_384, 49_152, n).tolist()  # 3-byte ids (a SmolLM2-sized vocabulary)


def _wire(msg) -> int:
    return msg.ByteSize() + FRAMING


@pytest.mark.parametrize("n", SIZES)
def test_grow_chain_is_exact(n):
    rng = np.random.default_rng(n)
    first, anchor = int(rng.integers(128, 16_000)), int(rng.integers(128, 16_000))
    parents = [first - 3] + [first + i - 1 for i in range(1, n)]  # first parent 3 back
    msg = encode_grow(anchor, first, _tokens(rng, n), parents)
    assert _wire(pb.Uplink(grow=msg)) == grow_bytes(n)


@pytest.mark.parametrize("n", SIZES)
def test_grow_from_the_decided_text_is_within_two_bytes(n):
    rng = np.random.default_rng(n)
    parents = [-1] + [200 + i - 1 for i in range(1, n)]
    msg = encode_grow(500, 200, _tokens(rng, n), parents)
    assert grow_bytes(n) - 2 <= _wire(pb.Uplink(grow=msg)) <= grow_bytes(n)


@pytest.mark.parametrize("n, branches", [(5, 1), (11, 2), (23, 4), (37, 1)])
def test_grow_with_branches_is_exact(n, branches):
    rng = np.random.default_rng(n)
    first = 1_000
    parents = [first - 1] + [first + i - 1 for i in range(1, n)]
    at = sorted(rng.choice(np.arange(2, n), branches, replace=False).tolist())
    for i in at:  # a branch: a sibling of the node before it (its parent is 2 back)
        parents[i] = first + i - 2
    msg = encode_grow(700, first, _tokens(rng, n), parents)
    assert len(msg.branch_index) == branches
    assert _wire(pb.Uplink(grow=msg)) == grow_bytes(n, branches)


@pytest.mark.parametrize("n", SIZES)
def test_extend_chain_is_exact(n):
    rng = np.random.default_rng(n)
    first = int(rng.integers(129, 16_000))
    msg = encode_extend(first, _tokens(rng, n), list(range(first - 1, first - 1 + n)),
                        commit=first - 1)
    assert _wire(pb.Uplink(extend=msg)) == FRAMING + UP_EXTEND_MESSAGE + n * UP_NODE


@pytest.mark.parametrize("n", SIZES)
def test_greedy_scores_is_exact(n):
    rng = np.random.default_rng(n)
    first, empty = int(rng.integers(128, 16_000)), np.zeros(0, np.int64)
    nodes = [NodeScore(first + i, 0, np.array([t]), np.array([1 << 16]), 0, empty, empty)
             for i, t in enumerate(_tokens(rng, n))]
    msg = encode_scores(nodes, greedy=True)
    msg.server_time = int(rng.integers(128, 16_000))  # 100 us units: a pass of 13 ms-1.6 s
    assert _wire(pb.Downlink(scores=msg)) == FRAMING + DOWN_SCORES_MESSAGE + n * DOWN_NODE_GREEDY


@pytest.mark.parametrize("n", SIZES)
def test_decided_is_exact(n):
    rng = np.random.default_rng(n)
    msg = pb.Decided(position=int(rng.integers(128, 16_000)), tokens=_tokens(rng, n),
                     passes=int(rng.integers(128, 16_000)), acked=int(rng.integers(1, 128)),
                     held_us=int(rng.integers(16_384, 2_000_000)))
    assert _wire(pb.Downlink(decided=msg)) == FRAMING + DOWN_DECIDED_MESSAGE \
        + n * DOWN_DECIDED_TOKEN


def test_sampled_scores_node_of_a_peaked_distribution():
    """DOWN_NODE_SAMPLED stands for a peaked p~ (one entry reaches send_mass, two tail
    samples): the codec's nodes of such distributions are within 3 B of it."""
    rng = np.random.default_rng(0)
    params = ServeParams(SamplingParams(temperature=0.8))
    n, nodes = 9, []
    for i in range(n):
        logits = rng.normal(0.0, 1.0, 49_152)
        top = rng.choice(np.arange(16_384, 49_152), 4, replace=False)
        logits[top[0]] += 12.0 + rng.uniform(0, 4)
        logits[top[1:]] += 7.0
        nodes.append(node_score(served(logits, params), params, 300 + i, 45_000, 0, 500 + i))
    assert all(len(s.ids) == 1 and len(s.tail_ids) == 2 for s in nodes)
    per_node = (encode_scores(nodes, False).ByteSize()
                - encode_scores(nodes[:1], False).ByteSize()) / (n - 1)
    assert abs(per_node - DOWN_NODE_SAMPLED) <= 3


def test_the_naive_protocol_sends_dense_distributions_both_ways():
    """A draft goes up with its id and the drafter's distribution; every scored node (each
    draft and each pass's decided end) comes down as the target's, float16 over the vocab."""
    from acespec.proto.sizes import naive_bytes

    assert naive_bytes(drafted=10, passes=4, vocab=1000) == (10 * (4 + 2000), 14 * 2000)
    assert naive_bytes(drafted=0, passes=64, vocab=49152) == (0, 64 * 98304)  # ar's passes
