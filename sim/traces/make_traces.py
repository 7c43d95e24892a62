"""Rebuild the shipped link traces beside this file: `python sim/traces/make_traces.py`.

Deterministic (one seeded generator per trace): running it again writes the same files.
Each trace is 60 s of 0.5 s steps, `time_s,kbps,rtt_ms,loss` (acespec.sim.trace), applied to
both directions of the link.

What the numbers are modelled on. The step values are synthetic: drawn at random within
ranges, not replayed from any capture. The ranges are our choice, set to be of the order of
what these works describe for the same kinds of links; they are not figures taken from them.

- `lte`, a phone on LTE/3G: a rate that wanders between 0.2 and 5 Mbit/s over seconds, an RTT
  of 30-300 ms that rises when the rate falls (queueing in the network), loss in bursts, and
  one gap of several seconds with no link. Modelled on the setting of Huang et al., "An
  In-depth Study of LTE: Effect of Network Protocol and Application Behavior on Performance"
  (SIGCOMM 2013), TCP over a commercial LTE network, and of Winstein, Sivaraman and
  Balakrishnan, "Stochastic Forecasts Achieve High Throughput and Low Delay over Cellular
  Networks" (Sprout, NSDI 2013), whose traces of commercial LTE and 3G links show the rate
  changing by large factors within seconds, and whose link model allows for outages.
- `wifi-handover`, a laptop leaving Wi-Fi: Wi-Fi at several Mbit/s and 20-40 ms RTT, then a
  handover gap of 4 s with no link at all (a plain TCP path whose interface went away, before
  the cellular one carries traffic), then cellular at a lower rate and a higher RTT. The
  Wi-Fi to 3G move is the setting of Paasch et al., "Exploring Mobile/WiFi Handover with
  Multipath TCP" (ACM SIGCOMM CellNet workshop, 2012); the gap length is a round figure of
  ours, not a value from that paper.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

STEP_S = 0.5  # seconds per step
DURATION_S = 60.0
HERE = Path(__file__).resolve().parent


def _wander(rng: np.random.Generator, n: int, lo: float, hi: float, sigma: float,
            keep: float = 0.85) -> np.ndarray:
    """[n] float64 in [lo, hi]: an AR(1) walk in log space (values change over seconds)."""
    mid, half = (np.log(lo) + np.log(hi)) / 2, (np.log(hi) - np.log(lo)) / 2
    x, out = 0.0, np.empty(n)
    for i in range(n):
        x = keep * x + sigma * rng.standard_normal()
        out[i] = np.exp(mid + half * np.tanh(x))
    return out


def _bursts(rng: np.random.Generator, n: int, count: int, lo: float, hi: float,
            length: tuple[int, int] = (2, 5)) -> np.ndarray:
    """[n] float64 loss: 0, except `count` bursts of a few steps at lo..hi."""
    loss = np.zeros(n)
    for start in rng.choice(n - length[1], size=count, replace=False):
        loss[start:start + rng.integers(*length, endpoint=True)] = rng.uniform(lo, hi)
    return loss


def lte(seed: int = 1) -> list[tuple[float, float, float, float]]:
    """(time_s, kbps, rtt_ms, loss) steps of the `lte` trace."""
    rng = np.random.default_rng(seed)
    n = int(DURATION_S / STEP_S)
    kbps = _wander(rng, n, 200, 5000, 0.6)
    # Queueing: the RTT climbs from 30 ms towards 300 ms as the rate falls.
    share = (np.log(5000) - np.log(kbps)) / (np.log(5000) - np.log(200))  # 0 fast .. 1 slow
    rtt = np.clip(30 + 270 * share ** 1.5 + rng.normal(0, 8, n), 30, 300)
    loss = _bursts(rng, n, 3, 0.02, 0.10)
    gap = slice(int(34 / STEP_S), int(38 / STEP_S))  # 4 s with no link, after a fade
    fade = slice(gap.start - 4, gap.start)
    kbps[fade] = np.minimum(kbps[fade], [600, 400, 300, 200])
    rtt[fade] = np.maximum(rtt[fade], [180, 220, 260, 300])
    kbps[gap], rtt[gap], loss[gap] = 0, 300, 0
    return _rows(kbps, rtt, loss)


def wifi_handover(seed: int = 2) -> list[tuple[float, float, float, float]]:
    """(time_s, kbps, rtt_ms, loss) steps of the `wifi-handover` trace."""
    rng = np.random.default_rng(seed)
    n = int(DURATION_S / STEP_S)
    wifi, gap = int(25 / STEP_S), int(4 / STEP_S)  # Wi-Fi for 25 s, then 4 s with nothing
    cell = n - wifi - gap
    kbps = np.concatenate([_wander(rng, wifi, 4000, 12000, 0.3), np.zeros(gap),
                           _wander(rng, cell, 500, 3000, 0.5)])
    rtt = np.concatenate([rng.uniform(20, 40, wifi), np.full(gap, 40.0),
                          np.clip(rng.normal(110, 25, cell), 60, 200)])
    loss = np.concatenate([np.zeros(wifi + gap), _bursts(rng, cell, 2, 0.01, 0.05)])
    return _rows(kbps, rtt, loss)


def _rows(kbps: np.ndarray, rtt: np.ndarray, loss: np.ndarray):
    return [(round(i * STEP_S, 1), round(float(k)), round(float(r)), round(float(p), 3))
            for i, (k, r, p) in enumerate(zip(kbps, rtt, loss))]


HEADERS = {
    "lte": """\
# lte: a phone on an LTE/3G-like link, 60 s in 0.5 s steps, both directions.
# Rate 0.2-5 Mbit/s wandering over seconds; RTT 30-300 ms, rising as the rate falls
# (queueing); loss in bursts; a fade, then 4 s with no link at all (34-38 s).
# Synthetic: seeded random values within ranges of the order reported for LTE and 3G
# by Huang et al., "An In-depth Study of LTE", SIGCOMM 2013, and by Winstein et al.,
# Sprout, NSDI 2013 (cellular traces). Not a capture. Rebuild: make_traces.py.""",
    "wifi-handover": """\
# wifi-handover: a laptop leaving Wi-Fi, 60 s in 0.5 s steps, both directions.
# Wi-Fi 4-12 Mbit/s and 20-40 ms RTT for 25 s; then a 4 s handover gap with no link
# (25-29 s); then cellular 0.5-3 Mbit/s, 60-200 ms RTT, light loss bursts.
# Synthetic: seeded random values; the Wi-Fi to cellular handover is the setting of
# Paasch et al., "Exploring Mobile/WiFi Handover with Multipath TCP", CellNet 2012;
# the gap length is a round figure of ours. Not a capture. Rebuild: make_traces.py.""",
}


MAKERS = {"lte": lte, "wifi-handover": wifi_handover}


def render(name: str) -> str:
    """The text of sim/traces/NAME.csv: the comment header, a column header, one row a step."""
    rows = MAKERS[name]()
    return "\n".join([HEADERS[name], "time_s,kbps,rtt_ms,loss",
                      *(f"{t:g},{k:g},{r:g},{p:g}" for t, k, r, p in rows)]) + "\n"


if __name__ == "__main__":
    for name in MAKERS:
        (HERE / f"{name}.csv").write_text(render(name))
        print(HERE / f"{name}.csv")
