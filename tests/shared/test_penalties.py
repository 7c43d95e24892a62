"""Repetition penalties: the logits they give (against transformers' repetition penalty and
OpenAI's definition of presence and frequency), what counts as output, and coupled sampling
from the penalised target, checked by chi-square."""

from __future__ import annotations

import numpy as np
import pytest

from acespec.shared.config import ConfigError, Penalties, SamplingParams
from acespec.shared.penalties import penalise
from acespec.shared.served import ServeParams, served

torch = pytest.importorskip("torch")


def test_off_changes_nothing():
    logits = np.random.default_rng(0).standard_normal(9).astype(np.float32)
    assert np.array_equal(penalise(logits, [1, 2, 2], Penalties()), logits)


def test_repetition_matches_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(1)
    logits = rng.standard_normal(50) * 3
    text = [3, 7, 7, 49, 0, 12]
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([text]),
                                                 torch.tensor(logits[None]))[0].numpy()
    got = penalise(logits, text, Penalties(repetition=1.3), output_from=4)
    assert got == pytest.approx(want, abs=1e-12)  # prompt tokens count too


def test_presence_and_frequency_count_the_output_only():
    logits = np.zeros(6)
    text = [1, 1, 2, 3, 3, 3, 4]  # prompt [1, 1, 2]; output [3, 3, 3, 4]
    got = penalise(logits, text, Penalties(presence=0.5, frequency=0.25), 3)
    assert list(got) == [0, 0, 0, -0.5 - 3 * 0.25, -0.5 - 0.25, 0]
    negative = penalise(logits, text, Penalties(presence=-1.0), 3)
    assert list(negative) == [0, 0, 0, 1, 1, 0]  # a negative penalty encourages


@pytest.mark.parametrize("fields,name", [({"presence": 2.5}, "presence_penalty"),
                                         ({"frequency": float("nan")}, "frequency_penalty"),
                                         ({"repetition": 0.0}, "repetition_penalty"),
                                         ({"repetition": 5e-324}, "repetition_penalty"),
                                         ({"repetition": 0.0999}, "repetition_penalty"),
                                         ({"repetition": 10.01}, "repetition_penalty")])
def test_out_of_range_is_refused_by_name(fields, name):
    with pytest.raises(ConfigError, match=name):
        Penalties(**fields)
    with pytest.raises(ConfigError, match="output_from"):
        SamplingParams(output_from=-1)


def test_coupled_sampling_follows_the_penalised_target():
    """Over 6,000 seeds, the coupled token after a text is distributed as the penalised
    target's p~ (chi-square, p > 0.001), and not as the unpenalised one's."""
    from scipy.stats import chisquare

    from acespec.cloud.verify.verdict import decide

    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 1.8, 0.2])
    text = [0, 6, 6, 1, 0, 6]
    pen = Penalties(presence=0.4, frequency=0.3, repetition=1.2)
    params = ServeParams(SamplingParams(0.8, coupled=True, penalties=pen, output_from=3))
    n = 6000
    picks = np.bincount([decide(logits, params, seed, len(text), text) for seed in range(n)],
                        minlength=len(logits))
    dist = served(penalise(logits, text, pen, 3), params)
    want = np.zeros(len(logits))
    want[dist.ids] = dist.units / dist.units.sum() * n
    assert chisquare(picks, want).pvalue > 1e-3
    plain = served(logits, ServeParams(SamplingParams(0.8, coupled=True)))
    unpen = np.zeros(len(logits))
    unpen[plain.ids] = plain.units / plain.units.sum() * n
    assert chisquare(picks, unpen).pvalue < 1e-6


@pytest.mark.parametrize("repetition", [0.1, 10.0])
def test_the_ends_of_the_repetition_range_keep_logits_finite(repetition):
    """float32's extremes, penalised at either end of [0.1, 10], stay finite."""
    big = float(np.finfo(np.float32).max)
    logits = np.array([big, -big, 1e-30, -1e-30, 0.0, 3.0], dtype=np.float32)
    got = penalise(logits, [0, 1, 2, 3, 4, 5], Penalties(repetition=repetition))
    assert np.isfinite(got).all()
    assert got[5] == pytest.approx(3.0 / repetition)


def test_the_verifier_refuses_a_repetition_penalty_out_of_range_by_name():
    """What the verifier makes of a session's sampling on the wire: a penalty that would
    overflow is a WireError (INVALID_ARGUMENT) naming it, not an overflow in a pass."""
    from acespec.proto import acespec_pb2 as pb
    from acespec.proto.codec import WireError, decode_serve_params

    with pytest.raises(WireError, match="repetition_penalty"):
        decode_serve_params(pb.Sampling(temperature=0.5, repetition_penalty=5e-324))
    assert decode_serve_params(pb.Sampling(repetition_penalty=0.1)).sampling.penalties \
        .repetition == pytest.approx(0.1)
