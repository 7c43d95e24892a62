"""In-process speculative decoding of a (target, drafter) pair, with no network.

The reference loop for measuring a pair's acceptance (model card, `acespec generate`):
each step feeds the last committed token plus D drafts through the target in one pass,
verifies them with `acespec.shared.rejection`, and commits the accepted prefix plus the
recovered or bonus token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from acespec.shared.config import SamplingParams
from acespec.shared.rejection import verify_greedy, verify_sampled
from acespec.shared.sampling import transform


@dataclass
class LocalStats:
    steps: int = 0  # verification passes
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens committed by verification steps
    passes: int = 0  # target passes: verification steps + the prompt's prefill
    seconds: float = 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification step, the bonus/recovered token included."""
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.emitted / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {"steps": self.steps, "drafted": self.drafted, "accepted": self.accepted,
                "tokens": self.emitted, "passes": self.passes,
                "mean_acceptance_length": round(self.mean_acceptance_length, 4),
                "tokens_per_s": round(self.tokens_per_s, 2), "seconds": round(self.seconds, 3)}


def generate_local(target, drafter, prompt: Sequence[int], max_tokens: int, depth: int,
                   sampling: SamplingParams, seed: int = 0, eos_id: int | None = None,
                   on_tokens: Callable[[list[int]], None] | None = None
                   ) -> tuple[list[int], LocalStats]:
    """Generate up to max_tokens after `prompt` (>= 1 token). Returns (new tokens, stats)."""
    if not prompt:
        raise ValueError("prompt must hold at least one token (e.g. BOS)")
    rng = np.random.default_rng(seed)
    stats, t0 = LocalStats(), time.perf_counter()
    cache = target.new_cache(capacity=len(prompt) + max_tokens + depth + 2)
    if len(prompt) > 1:
        target(list(prompt[:-1]), cache, last_only=True)
        stats.passes += 1
    committed, out = list(prompt), []
    while len(out) < max_tokens:
        draft = drafter.draft(committed, depth, sampling, rng)
        base = cache.length
        logits = target([committed[-1], *draft.tokens.tolist()], cache).numpy()  # [D+1, V]
        if sampling.greedy:
            verdict = verify_greedy(logits.argmax(1), draft.tokens)
        else:
            verdict = verify_sampled(transform(logits, sampling), draft.q, draft.tokens, rng)
        cache.truncate(base + 1 + verdict.accepted)
        new = [*draft.tokens[:verdict.accepted].tolist(), verdict.next_token]
        stats.steps += 1
        stats.passes += 1
        stats.drafted += len(draft)
        stats.accepted += verdict.accepted
        stop = eos_id is not None and eos_id in new
        if stop:
            new = new[:new.index(eos_id)]
        new = new[:max_tokens - len(out)]
        stats.emitted += len(new)  # what reaches the output (the last step may be cut short)
        committed += new
        out += new
        if on_tokens and new:
            on_tokens(new)
        if stop:
            break
    stats.seconds = time.perf_counter() - t0
    return out, stats
