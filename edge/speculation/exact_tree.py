"""The edge's view of one verifier session: the trie of nodes it sent, their scores, and
the committed root. Pure bookkeeping; the engine decides when to draft and send."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from acespec.shared.served import NodeScore
from acespec.shared.walk import Node


class SpecTree:
    def __init__(self, root_token: int, root_position: int, root_score: NodeScore | None):
        self.root = Node(0, token=root_token, position=root_position, score=root_score)
        self._take_tails(self.root)
        self.nodes: dict[int, Node] = {0: self.root}
        self._parent: dict[int, Node] = {}  # node id -> parent node
        self.tip = self.root  # deepest node of the speculative main chain

    def live(self) -> int:
        """Nodes below the committed root (what the verifier's max_live_nodes counts)."""
        return len(self.nodes) - 1

    def path_tokens(self, node: Node) -> list[int]:
        """Tokens from just below the root down to `node` (empty for the root)."""
        out = []
        while node is not self.root:
            out.append(node.token)
            node = self._parent[node.node_id]
        return out[::-1]

    def add(self, first_id: int, tokens: Sequence[int], parent: Node,
            qs: np.ndarray | None) -> list[Node]:
        """Record a chain sent under `parent`: tokens [n]; qs [n, V] the draft distributions,
        or None for decided tokens (recovered/bonus: never tested)."""
        made, prev = [], parent
        for i, tok in enumerate(tokens):
            q = None if qs is None else qs[i]
            node = Node(first_id + i, token=int(tok), position=prev.position + 1, q=q)
            prev.children[node.token] = node
            if q is not None:
                prev.drafted = node
            self._parent[node.node_id] = prev
            self.nodes[node.node_id] = node
            made.append(node)
            prev = node
        return made

    def apply_scores(self, scores: Sequence[NodeScore]) -> None:
        for s in scores:
            node = self.nodes.get(s.node_id)
            if node is not None:  # scores of nodes already cut off are dropped
                node.score = s
                self._take_tails(node)

    def add_tails(self, node_id: int, ids: Sequence[int], units: Sequence[int]) -> None:
        node = self.nodes.get(node_id)
        if node is not None:
            node.tails += list(zip(ids, units))

    def reroot(self, node: Node) -> None:
        """`node` is committed: forget everything not below it."""
        keep, stack = {}, [node]
        while stack:
            n = stack.pop()
            keep[n.node_id] = n
            stack.extend(n.children.values())
        self.nodes, self.root = keep, node
        if self.tip.node_id not in keep:  # e.g. the walk went into a branch: follow its drafts
            tip = node
            while tip.drafted is not None:
                tip = tip.drafted
            self.tip = tip

    def cut_below(self, node: Node) -> None:
        """Every node below `node` is dead (a rejection there); the tip returns to it."""
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            self.nodes.pop(n.node_id, None)
            stack.extend(n.children.values())
        node.children, node.drafted = {}, None
        self.tip = node

    @staticmethod
    def _take_tails(node: Node) -> None:
        if node.score is not None and not node.tails:
            node.tails = list(zip(node.score.tail_ids.tolist(),
                                  node.score.tail_sample_units.tolist()))
