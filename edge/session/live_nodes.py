"""The verifier's live nodes, mirrored on the edge, so that drafting stays inside the
`max_live_nodes` the verifier granted in `Opened`.

The verifier frees nodes only on a Commit, and commits ride on the next Extend: it holds
dead and committed nodes one Extend longer than the edge's own tree does. So the edge
counts what the verifier will hold when its next message arrives, not what the edge holds.

Why the sizes below suffice: after a rejection at j, the next Extend leads with the decided
token h (plus drafts) and commits an older node, so the verifier still holds the dead
subtree under j when h arrives; h itself is committed only with the Extend after. Hence
* an Extend that carries no decided token leaves >= RESERVE nodes free (room for h and one
  draft whatever the next verdict is), and
* an Extend led by h adds at most grant - 1 nodes, so that once h is committed another
  rejection still leaves room for the next decided token and a draft.
"""

from __future__ import annotations

from collections.abc import Sequence

from acespec.edge.client import VerifierUnfit

RESERVE = 2  # a decided token and one draft: the smallest Extend that makes progress
MIN_GRANT = RESERVE + 1  # one draft in flight while a decided token can still be sent


class GrantTooSmall(VerifierUnfit):
    """The verifier allows fewer live nodes than any speculative mode needs."""


def fit_to_grant(grant: int, depth: int, window: int) -> tuple[int, int]:
    """The largest (depth, window), each at most the given one, that `grant` live nodes
    hold: after a rejection the verifier still holds the old window when the decided token
    and the next `depth` drafts arrive, so window + 1 + depth <= grant."""
    if grant < MIN_GRANT:
        raise GrantTooSmall(f"the verifier grants max_live_nodes={grant}; speculative modes "
                            f"need at least {MIN_GRANT} (use --mode ar, or raise the "
                            "verifier's --max-live-nodes)")
    depth = max(1, min(depth, (grant - 1) // 2))
    window = max(depth, min(window, grant - 1 - depth))
    return depth, window


class VerifierLive:
    """The trie as the verifier holds it: live node ids below its committed root."""

    def __init__(self, grant: int):
        self.grant = grant
        self.root = 0
        self._parent: dict[int, int] = {}  # live node id -> parent id (root excluded)

    def held_after(self, commit: int | None) -> int:
        """Nodes the verifier holds once it has applied `commit` (None: no commit)."""
        return len(self._kept(commit))

    def room(self, commit: int | None, decided: bool) -> int:
        """Most nodes the next Extend (carrying `commit`) may add; `decided`: it is led by
        a decided token (see the module docstring)."""
        free = self.grant - self.held_after(commit)
        return min(free, self.grant - 1) if decided else free - RESERVE

    def commit(self, node_id: int) -> None:
        """The verifier re-roots at node_id: it keeps node_id's subtree, frees the rest."""
        kept = self._kept(node_id)
        self._parent = {n: self._parent[n] for n in kept}
        self.root = node_id

    def extend(self, first_id: int, parents: Sequence[int], commit: int | None) -> None:
        """Record an Extend: the commit it carries first, then nodes first_id.. under parents."""
        if commit is not None:
            self.commit(commit)
        for i, p in enumerate(parents):
            self._parent[first_id + i] = int(p)

    def _kept(self, commit: int | None) -> set[int]:
        if commit is None or commit == self.root:
            return set(self._parent)
        keep = {commit}
        for nid in sorted(self._parent):  # a parent's id is always below its children's
            if nid > commit and self._parent[nid] in keep:
                keep.add(nid)
        keep.discard(commit)
        return keep
