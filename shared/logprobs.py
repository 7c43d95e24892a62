"""The target's log-probabilities of the tokens it serves (OpenAI's `logprobs`).

They are the natural log of the target's softmax at temperature 1, before top-k and top-p:
the model's own distribution, as vLLM reports by default ("raw logprobs"). The verifier
computes them from the logits row that decided each token, and sends them down only when a
request asks (proto Decide.logprobs, GenerateRequest.logprobs). Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # most alternatives per token (OpenAI's and vLLM's default limit)


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of one served token, and of its most likely tokens."""

    logprob: float  # log p(token)
    top_ids: tuple[int, ...] = ()  # [top_n] most likely ids, descending (lower id on ties)
    top_logprobs: tuple[float, ...] = ()  # [top_n] their log-probabilities


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[V] logits (any float dtype) -> [V] float64 log-probabilities."""
    x = np.asarray(logits, dtype=np.float64)
    top = x.max()
    return x - (top + np.log(np.exp(x - top).sum()))


def token_logprob(logits: np.ndarray, token: int, top_n: int = 0) -> TokenLogprob:
    """`token`'s log-probability under the logits row [V] that decided it, with the top_n
    (0..MAX_TOP_LOGPROBS) most likely tokens and theirs."""
    if not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_n must be in [0, {MAX_TOP_LOGPROBS}], got {top_n}")
    lp = log_softmax(logits)
    if top_n == 0:
        return TokenLogprob(float(lp[token]))
    n = min(top_n, len(lp))
    cand = np.argpartition(-lp, n - 1)[:n] if n < len(lp) else np.arange(len(lp))
    kth = lp[cand].min()  # ties at the cut: every id at that value, lower ids first
    cand = np.union1d(cand, np.nonzero(lp == kth)[0])
    top = cand[np.lexsort((cand, -lp[cand]))][:n]  # descending, lower id first on ties
    return TokenLogprob(float(lp[token]), tuple(int(i) for i in top),
                        tuple(float(lp[i]) for i in top))
