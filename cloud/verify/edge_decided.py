"""The verifier's side of an edge-decided session: a trie of token nodes over the target's tree
KV cache (docs/design.md §3).

Node 0 is the root (the last prompt token); new nodes get consecutive ids. The session
scores nodes (served distribution p~ of the next token, sparse) and never decides: the edge
does. Work is split in plan (validate, build the model request) and finish (turn the
logits into scores), so a batcher can run many sessions' requests in one forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from acespec.cloud.errors import InvalidArgument, NotFound, OutOfRange, ResourceExhausted
from acespec.cloud.target.model import Request, Transformer
from acespec.cloud.verify.share import Share
from acespec.shared.grammar import Cursor
from acespec.shared.served import (
    NodeScore,
    ServedDist,
    ServeParams,
    n_sent,
    node_score,
    served,
    tail_draws,
)
from acespec.shared.shaping import shape


@dataclass
class Node:
    token: int
    parent: int  # node id; -1 for the root
    slot: int  # KV cache slot
    position: int  # RoPE position of the token (its depth below the first prompt token)
    dist: ServedDist | None = None  # p~ of the next token, once scored
    tails_issued: int = 0  # tail samples sent so far


FP32_TINY = 1e-37  # about float32's smallest normal number: Triton passes floats as float32


class EdgeDecidedSession:
    def __init__(self, model: Transformer, params: ServeParams, seed: int, max_live_nodes: int,
                 max_tail_per_node: int = 4096):
        self.model, self.params, self.seed = model, params, seed
        self.max_live_nodes, self.max_tail_per_node = max_live_nodes, max_tail_per_node
        self.cache = model.new_cache()
        self.nodes: dict[int, Node] = {}
        self.root = 0
        self.next_id = 0
        self.pending = 0  # nodes planned for the next forward pass, not yet in the cache
        self.share = Share(max_live_nodes)  # nodes per pass it earns (acespec.cloud.verify.share)
        self.grammar: Cursor | None = None  # the structured output's (set by the engine)
        self.text: list[int] = []  # penalties or a grammar: the prompt and committed tokens,
        # the root's included (what a node's text starts with)

    @property
    def live_nodes(self) -> int:
        """Uncommitted nodes below the root."""
        return max(0, len(self.nodes) - 1)

    # -- open ------------------------------------------------------------------

    def plan_open(self, prompt: Sequence[int]) -> Request:
        self._check_tokens(prompt, "prompt_tokens")
        n = len(prompt)
        self.nodes[0] = Node(token=int(prompt[-1]), parent=-1, slot=n - 1, position=n - 1)
        self.next_id = 1
        if self.params.sampling.shaped:
            self.text = list(map(int, prompt))
        return Request(list(map(int, prompt)), self.cache, None, last_only=True)

    def finish_open(self, logits: torch.Tensor) -> NodeScore:
        if self._encoder():
            return self._score_encoded(0, logits[-1:])[0]
        return self._score(0, logits[-1].cpu().numpy(), self_units=0)

    # -- extend ----------------------------------------------------------------

    def plan_extend(self, first_id: int, tokens: np.ndarray, parents: np.ndarray) -> Request:
        """Validate new nodes first_id.. (tokens [n], parent ids [n]); the model request."""
        if first_id != self.next_id:
            raise InvalidArgument(f"Extend starts at node {first_id}, expected {self.next_id}")
        self._check_tokens(tokens, "Extend.tokens")
        if self.live_nodes + len(tokens) > self.max_live_nodes:
            raise ResourceExhausted(f"{self.live_nodes + len(tokens)} live nodes would exceed "
                                    f"max_live_nodes={self.max_live_nodes}; Commit first")
        base = self.cache.length + self.pending
        slots, positions = [], []
        for i, p in enumerate(parents.tolist()):
            if p in self.nodes:
                slots.append(self.nodes[p].slot)
                positions.append(self.nodes[p].position + 1)
            elif first_id <= p < first_id + i:
                slots.append(base + p - first_id)
                positions.append(positions[p - first_id] + 1)
            else:
                raise InvalidArgument(f"parent {p} of node {first_id + i} is not a live node")
        self._check_context(first_id, positions)
        for i, (t, p) in enumerate(zip(tokens.tolist(), parents.tolist())):
            self.nodes[first_id + i] = Node(token=t, parent=p, slot=base + i,
                                            position=positions[i])
        self.next_id += len(tokens)
        self.pending += len(tokens)
        return Request(tokens.tolist(), self.cache, slots)

    def finish_extend(self, first_id: int, logits: torch.Tensor) -> list[NodeScore]:
        self.pending = 0
        self.share.settle(len(logits))
        if self._encoder():
            return self._score_encoded(first_id, logits)
        rows = logits.cpu().numpy()
        out = []
        for i, row in enumerate(rows):
            node = self.nodes[first_id + i]
            parent_dist = self.nodes[node.parent].dist
            out.append(self._score(first_id + i, row, parent_dist.units_of(node.token)))
        return out

    def abandon(self, first_id: int, n: int) -> None:
        """Forget nodes of a request whose forward pass failed (the model already dropped
        their cache slots)."""
        for i in range(n):
            self.nodes.pop(first_id + i, None)
        self.next_id, self.pending = first_id, 0

    # -- commit, tail ------------------------------------------------------------

    def commit(self, node_id: int) -> None:
        """Re-root at node_id: keep its path and its subtree, free everything else."""
        if node_id not in self.nodes:
            raise NotFound(f"Commit: node {node_id} is not live")
        if self.nodes[node_id].dist is None:
            raise InvalidArgument(f"Commit: node {node_id} has not been scored")
        self.share.accept(self.nodes[node_id].position - self.nodes[self.root].position)
        if self.params.sampling.shaped:
            self.text += self._path(node_id)
        keep = {node_id}
        for nid in sorted(self.nodes):
            if nid > node_id and self.nodes[nid].parent in keep:
                keep.add(nid)
        slots = set(self.cache.path_to(self.nodes[node_id].slot))
        slots |= {self.nodes[n].slot for n in keep}
        remap = self.cache.retain(sorted(slots))
        self.nodes = {n: self.nodes[n] for n in sorted(keep)}
        for node in self.nodes.values():
            node.slot = remap[node.slot]
        self.nodes[node_id].parent = -1
        self.root = node_id

    def more_tail(self, node_id: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Tail samples [tails_issued, tails_issued + n) of a node: (ids [n], units [n])."""
        node = self.nodes.get(node_id)
        if node is None or node.dist is None:
            raise NotFound(f"MoreTail: node {node_id} is not a live scored node")
        if node.tails_issued + n > self.max_tail_per_node:
            # An honest edge needs another sample with probability <= (tail share)^m per
            # round; thousands on one node is a client looping, not a residual draw.
            raise ResourceExhausted(f"MoreTail: node {node_id} already has "
                                    f"{node.tails_issued} tail samples; at most "
                                    f"max_tail_per_node={self.max_tail_per_node} per node")
        sent = n_sent(node.dist, self.params.send_mass)
        ids, units = tail_draws(node.dist, sent, self.seed, self._decides(node), node.tails_issued, n)
        node.tails_issued += n
        return ids, units

    # -- helpers ---------------------------------------------------------------

    def _path(self, node_id: int) -> list[int]:
        """Tokens of the nodes from below the root down to node_id."""
        path = []
        while node_id != self.root:
            node = self.nodes[node_id]
            path.append(node.token)
            node_id = node.parent
        return path[::-1]

    def _score(self, node_id: int, logits: np.ndarray, self_units: int) -> NodeScore:
        node = self.nodes[node_id]
        if self.params.sampling.shaped:  # from the node's text
            logits = shape(logits, self.text + self._path(node_id), self.params.sampling,
                           self.grammar)
        node.dist = served(logits, self.params)
        node.tails_issued = self.params.tail_samples
        return node_score(node.dist, self.params, node_id, self_units, self.seed,
                          self._decides(node))

    def _encoder(self) -> bool:
        """The fused Triton encoder serves exact sampled sessions when the model runs Triton
        (greedy and coupled sessions send one decided id per node) and nothing shapes the
        logits from the text (penalties, a grammar), at temperatures a
        float32 kernel argument holds (below FP32_TINY the numpy path serves them)."""
        return (self.model.kernels == "triton" and not self.params.sampling.decided
                and not self.params.sampling.shaped
                and self.params.sampling.temperature >= FP32_TINY)

    def _score_encoded(self, first_id: int, logits: torch.Tensor) -> list[NodeScore]:
        """Score nodes first_id.. from logits [n, V] (on the device) in one encoder call."""
        from acespec.kernels.served_encoder import encode  # lazy: Triton jits its kernels on import

        ids = range(first_id, first_id + len(logits))
        nodes = [self.nodes[i] for i in ids]
        in_batch = [n.parent - first_id if first_id <= n.parent < first_id + len(nodes) else -1
                    for n in nodes]
        enc = encode(logits, self.params, self.seed, [self._decides(n) for n in nodes],
                     [n.token for n in nodes], in_batch, kmax=_pow2(self.params.k_max))
        out = []
        for i, (nid, node) in enumerate(zip(ids, nodes)):
            c, s = enc.count[i], enc.n_sent[i]
            m = self.params.tail_samples if c > s else 0  # no tail, no samples
            node.dist = ServedDist(ids=enc.ids[i, :c], units=enc.units[i, :c])
            node.tails_issued = self.params.tail_samples
            if in_batch[i] >= 0 or node.parent < 0:
                self_units = int(enc.self_units[i])
            else:
                self_units = self.nodes[node.parent].dist.units_of(node.token)
            order = np.argsort(node.dist.ids[:s])
            out.append(NodeScore(nid, self_units, node.dist.ids[:s][order],
                                 node.dist.units[:s][order], int(enc.tail_units[i]),
                                 enc.tail_ids[i, :m], enc.tail_sample_units[i, :m]))
        return out

    def _decides(self, node: Node) -> int:
        """Position of the token this node's p~ decides (its own position + 1)."""
        return node.position + 1

    def _check_context(self, first_id: int, positions: list[int]) -> None:
        """Refuse nodes the model has no position for (RoPE past its trained context)."""
        limit = self.model.args.max_position_embeddings
        deepest = max(positions)
        if deepest >= limit:
            node = first_id + positions.index(deepest)
            raise OutOfRange(f"Extend: node {node} would sit at position {deepest}, past the "
                             f"model's context of max_position_embeddings={limit} tokens; "
                             "the session is full")

    def _check_tokens(self, tokens, field: str) -> None:
        if len(tokens) == 0:
            raise InvalidArgument(f"{field} is empty")
        vocab = self.model.args.vocab_size
        bad = [int(t) for t in tokens if not 0 <= int(t) < vocab]
        if bad:
            raise InvalidArgument(f"{field}: token id {bad[0]} is outside the vocabulary "
                                  f"[0, {vocab})")


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
