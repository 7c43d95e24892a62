"""One request decoded against a remote verifier: the engine (connection attempts and the
resume policy), the runner (what every mode shares), and one driver per wire protocol:

    engine.py      EdgeEngine.generate; Reconnect (backoff, deadlines, fail-fast)
    runner.py      Runner: committed text, stats, drafter calls, positional RNGs, learning
    driver.py      the Driver interface; the downlink reader every streaming driver uses
    ar.py          ArDriver      Generate (cloud-only)
    edge_decided.py  EdgeDecidedDriver  Extend/Scores (the edge walks the scores: sd,
                   pipeline, acespec-exact, exact sampling)
    decided.py     DecidedDriver: what the verifier-decided drivers share (the Decided stream)
    grow.py        GrowDriver    Grow/Decided (a speculation tree; a chain without branches)
    no_draft.py    NoDraftDriver Decided only (the edge drafts nothing: colo, cloud-lookup)
    live_nodes.py  the verifier's grant of live nodes (edge-decided sessions)
    config.py      EngineConfig, Stats
"""

from acespec.edge.session.config import EngineConfig, Stats
from acespec.edge.session.engine import EdgeEngine

__all__ = ["EdgeEngine", "EngineConfig", "Stats"]
