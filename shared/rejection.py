"""Speculative verification of a draft chain against dense target distributions.

The standard rule (Leviathan et al.; gpt-fast `speculative_decode`): accept draft x_i with
probability min(1, p_i(x_i)/q_i(x_i)); at the first rejection draw the *recovered* token from
norm((p_i - q_i)+); if every draft is accepted, draw the *bonus* token from p_n. The output
is distributed exactly as p. Greedy is its own path: accept while x_i = argmax p_i.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from acespec.shared.sampling import sample


@dataclass(frozen=True)
class Verdict:
    accepted: int  # leading draft tokens accepted
    next_token: int  # recovered token (after a rejection) or bonus token (all accepted)

    @property
    def emitted(self) -> int:
        """Tokens this step adds to the text (acceptance length, bonus/recovered included)."""
        return self.accepted + 1


def verify_greedy(p_argmax: np.ndarray, draft: np.ndarray) -> Verdict:
    """p_argmax [n+1] int target argmax per position; draft [n] int."""
    n = len(draft)
    mismatch = np.nonzero(p_argmax[:n] != draft)[0]
    k = int(mismatch[0]) if len(mismatch) else n
    return Verdict(accepted=k, next_token=int(p_argmax[k]))


def verify_sampled(p: np.ndarray, q: np.ndarray, draft: np.ndarray,
                   rng: np.random.Generator) -> Verdict:
    """p [n+1, V] target distributions, q [n, V] draft distributions, draft [n] int."""
    for i, x in enumerate(draft):
        if rng.random() * q[i, x] < p[i, x]:  # accept w.p. min(1, p/q), no division
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        return Verdict(accepted=i, next_token=sample(residual / residual.sum(), rng))
    return Verdict(accepted=len(draft), next_token=sample(p[len(draft)], rng))
