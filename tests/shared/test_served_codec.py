"""The served distribution p~ and its wire codec (property tests with hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acespec.proto import acespec_pb2 as pb
from acespec.proto.codec import (
    WireError,
    decode_extend,
    decode_scores,
    decode_serve_params,
    encode_extend,
    encode_scores,
    encode_serve_params,
)
from acespec.shared.config import SamplingParams
from acespec.shared.served import (
    UNITS,
    ServeParams,
    n_sent,
    node_score,
    quantize,
    served,
    tail_draws,
)

logits_st = st.lists(st.floats(-30, 30), min_size=1, max_size=300).map(np.array)
params_st = st.builds(
    ServeParams,
    sampling=st.builds(SamplingParams, temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
                       top_k=st.integers(0, 80), top_p=st.floats(0.05, 1.0)),
    k_max=st.integers(1, 96), send_mass=st.floats(0.01, 1.0), tail_samples=st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(logits_st, params_st)
def test_units_sum_to_65536_and_respect_k(logits, params):
    d = served(logits, params)
    assert int(d.units.sum()) == UNITS and (d.units > 0).all()
    assert len(d.ids) <= (1 if params.sampling.greedy else min(params.k, len(logits)))
    assert len(set(d.ids.tolist())) == len(d.ids)
    assert (np.diff(d.units) <= 0).all()  # descending probability
    assert d.units_of(int(np.argmax(logits))) == d.units[0]  # the top logit has top mass


@settings(max_examples=300, deadline=None)
@given(logits_st, params_st, st.integers(0, 2**63), st.integers(0, 10_000))
def test_encode_decode_roundtrip(logits, params, seed, node_id):
    d = served(logits, params)
    score = node_score(d, params, node_id, self_units=1234, seed=seed)
    back = decode_scores(pb.Scores.FromString(
        encode_scores([score], params.sampling.greedy).SerializeToString()))[0]
    if params.sampling.greedy:
        assert back.greedy_token == score.greedy_token == int(np.argmax(logits))
        assert len(back.ids) == 1
        return
    for f in ("node_id", "self_units", "tail_units"):
        assert getattr(back, f) == getattr(score, f)
    for f in ("ids", "units", "tail_ids", "tail_sample_units"):
        assert np.array_equal(getattr(back, f), getattr(score, f)), f
    assert (np.diff(back.ids) > 0).all()  # ascending on the wire
    assert int(back.units.sum()) + back.tail_units == UNITS
    tail = set(d.ids[n_sent(d, params.send_mass):].tolist())
    assert set(back.tail_ids.tolist()) <= tail
    assert all(u == d.units_of(z) for z, u in zip(back.tail_ids, back.tail_sample_units))


def test_sent_set_is_smallest_reaching_send_mass():
    d = served(np.log([0.5, 0.3, 0.15, 0.05]), ServeParams(SamplingParams(temperature=1.0)))
    assert d.units.tolist() == [32768, 19661, 9830, 3277]  # largest remainder
    assert n_sent(d, 0.5) == 1 and n_sent(d, 0.8) == 2 and n_sent(d, 0.81) == 3
    assert n_sent(d, 1.0) == 4


def test_quantize_largest_remainder():
    assert quantize(np.array([1 / 3, 1 / 3, 1 / 3])).tolist() == [21846, 21845, 21845]
    assert quantize(np.array([1.0])).tolist() == [UNITS]


def test_top_p_and_top_k_cut_is_not_tail():
    params = ServeParams(SamplingParams(temperature=1.0, top_k=2), send_mass=0.5)
    d = served(np.log([0.4, 0.35, 0.25]), params)
    assert d.ids.tolist() == [0, 1]  # token 2 is cut by top-k: p~ = 0, not tail
    s = node_score(d, params, 5, 0, seed=1)
    assert s.ids.tolist() == [0] and s.tail_units == d.units[1]
    assert set(s.tail_ids.tolist()) == {1}


def test_tail_draws_follow_tail_distribution_and_continue_stream():
    d = served(np.log([0.6, 0.2, 0.1, 0.06, 0.04]), ServeParams(SamplingParams(temperature=1.0)))
    ids, units = tail_draws(d, 1, seed=9, position=3, start=0, count=20000)
    freq = np.bincount(ids, minlength=5)[1:] / 20000
    assert np.abs(freq - np.array([0.2, 0.1, 0.06, 0.04]) / 0.4).max() < 0.015
    more, _ = tail_draws(d, 1, seed=9, position=3, start=5, count=3)
    assert more.tolist() == ids[5:8].tolist()  # MoreTail continues the same stream


def test_extend_chain_costs_no_parents_and_branches_roundtrip():
    chain = encode_extend(10, [5, 6, 7], [9, 10, 11])
    assert list(chain.branch_index) == [] and list(chain.branch_parent) == []
    msg = encode_extend(10, [5, 6, 7, 8], [9, 10, 9, 12])
    assert list(msg.branch_index) == [2]
    nodes = decode_extend(pb.Extend.FromString(msg.SerializeToString()), 10)
    assert nodes.parents.tolist() == [9, 10, 9, 12] and nodes.tokens.tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize("msg,match", [
    (pb.Extend(), "empty"),
    (pb.Extend(tokens=[1], branch_index=[0, 1], branch_parent=[0]), "branch_parent has 1"),
    (pb.Extend(tokens=[1], branch_index=[3], branch_parent=[0]), "outside"),
    (pb.Extend(tokens=[1, 2], branch_index=[1], branch_parent=[11]), "not an earlier node"),
])
def test_malformed_extend_is_named(msg, match):
    with pytest.raises(WireError, match=match):
        decode_extend(msg, 10)


def test_malformed_scores_and_sampling_are_named():
    with pytest.raises(WireError, match="n_entries"):
        decode_scores(pb.Scores(self_p=[1], n_entries=[2], entry_id_delta=[1], entry_p=[1],
                                tail_p=[0], n_tail_samples=[0]))
    with pytest.raises(WireError, match="sampling: top_p"):
        decode_serve_params(pb.Sampling(top_p=1.5))
    p = ServeParams(SamplingParams(0.7, 5, 0.9), k_max=32, send_mass=0.8, tail_samples=0)
    assert decode_serve_params(encode_serve_params(p)) == p


def test_top_k_ties_take_the_lowest_ids():
    """At the k-th value, ties go to the lowest ids: p~ is a function of the logits alone
    (numpy's argpartition would pick an arbitrary subset)."""
    from acespec.shared.config import SamplingParams
    from acespec.shared.served import ServeParams, served

    logits = np.zeros(300)
    logits[[7, 250]] = 1.0
    d = served(logits, ServeParams(SamplingParams(temperature=1.0, top_k=5)))
    assert sorted(d.ids.tolist()) == [0, 1, 2, 7, 250]
