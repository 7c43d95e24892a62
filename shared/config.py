"""Config dataclasses shared by the edge and the cloud."""

from __future__ import annotations

import math
from dataclasses import dataclass


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the field."""


MAX_ADDITIVE = 2.0  # presence and frequency penalties lie in [-2, 2] (OpenAI)
MAX_REPETITION = 10.0  # the repetition penalty lies in [1/10, 10]: a logit is at most
MIN_REPETITION = 1 / MAX_REPETITION  # multiplied by 10 (a smaller one overflows: 5e-324)


@dataclass(frozen=True)
class Penalties:
    """Repetition penalties (applied by acespec.shared.penalties.penalise). presence: subtracted from the logit of every token the output holds; frequency: times
    the number of times it holds it; repetition: a token of the prompt or the output has its
    logit divided by this when positive, multiplied when negative (1 = off)."""

    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0

    def __post_init__(self) -> None:
        for name in ("presence", "frequency"):
            v = getattr(self, name)
            if not (math.isfinite(v) and -MAX_ADDITIVE <= v <= MAX_ADDITIVE):
                raise ConfigError(f"{name}_penalty must be in [-{MAX_ADDITIVE}, "
                                  f"{MAX_ADDITIVE}], got {v!r}")
        if not (math.isfinite(self.repetition)
                and MIN_REPETITION <= self.repetition <= MAX_REPETITION):
            raise ConfigError(f"repetition_penalty must be in [{MIN_REPETITION:g}, "
                              f"{MAX_REPETITION:g}], got {self.repetition!r}")

    @property
    def on(self) -> bool:
        return self.presence != 0 or self.frequency != 0 or self.repetition != 1


@dataclass(frozen=True)
class SamplingParams:
    """How a next-token distribution is derived from logits.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_k: keep the k most likely tokens; 0 means no limit (the cloud caps it at k_max).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p; 1 = all.
    coupled: sample by Gumbel-max with noise G(seed, position, token) that edge and cloud
      compute alike (docs/design.md §5): each token is a function of (seed, position, p~), so the
      verifier decides, and a seed gives cloud-only decoding's text whatever the drafter.
      False ('exact'): rejection sampling at the edge.
    penalties: applied to the logits first (acespec.shared.penalties), on both sides.
    grammar: the tokens it forbids are cut from the logits first (acespec.shared.grammar).
    output_from: the position where the request's output starts (what penalties and the
      grammar count; a re-opened session's prompt holds the output committed so far).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    coupled: bool = False
    penalties: Penalties = Penalties()
    grammar: str | None = None  # llguidance's grammar (JSON); None: free text
    output_from: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = no limit), got {self.top_k!r}")
        if not (0 < self.top_p <= 1):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.output_from < 0:
            raise ConfigError(f"output_from must be >= 0, got {self.output_from}")

    @property
    def shaped(self) -> bool:
        """The logits are changed by the text so far: penalties or a grammar."""
        return self.penalties.on or self.grammar is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def decided(self) -> bool:
        """Every verdict is a function of (seed, position, p~): greedy or coupled."""
        return self.greedy or self.coupled

    @classmethod
    def from_name(cls, name: str) -> SamplingParams:
        """Named presets: 'greedy', 'code' (τ=0.2), 'chat' (τ=0.8, top-k 40, top-p 0.95)."""
        presets = {
            "greedy": cls(),
            "code": cls(temperature=0.2, top_k=20, top_p=0.95),
            "chat": cls(temperature=0.8, top_k=40, top_p=0.95),
        }
        if name not in presets:
            raise ConfigError(f"unknown sampling preset {name!r}; choose from {sorted(presets)}")
        return presets[name]
