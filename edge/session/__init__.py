"""One request decoded against a remote verifier: the engine (connection attempts and the
resume policy), the runner (what every mode shares), and one driver per wire protocol:

    engine.py      EdgeEngine.generate; Reconnect (backoff, deadlines, fail-fast)
    runner.py      Runner: committed text, stats, drafter calls, positional RNGs, learning
    driver.py      the Driver interface; the downlink reader every streaming driver uses
    ar.py          ArDriver      Generate (cloud-only)
    exact.py       ExactDriver   Extend/Scores (the edge walks; sd, pipeline, acespec-exact)
    decided.py     DecidedDriver: what both decided drivers share (the Decided stream)
    chain.py       ChainDriver   Drafts/Decided (one chain)
    grow.py        GrowDriver    Grow/Decided (a speculation tree)
    live_nodes.py  the verifier's grant of live nodes (exact sessions)
    config.py      EngineConfig, Stats
"""

from acespec.edge.session.config import EngineConfig, Stats
from acespec.edge.session.engine import EdgeEngine

__all__ = ["EdgeEngine", "EngineConfig", "Stats"]
