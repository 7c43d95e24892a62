"""The speculation tree of a decided session (docs/design.md §6).

The edge keeps one tree per session, rooted at its committed text: the drafted line and the
guessed guessed branches alike are leaves that can grow. A node's value is the probability
that its path becomes the accepted path: a drafted child multiplies its parent's by the
calibrated P(accept) of the draft's confidence; a guessed child c (an alternative the
drafter ranks high) by P(the draft is rejected) * P(recovered = c | rejection). Growth
expands the leaves of highest value first, several per batched drafter decode, within the
budgets (verifier nodes, edge KV, uplink bytes); a likely branch so keeps receiving
continuations while its parent's verdict travels, and a hit lands on nodes already sent.

Exactness does not depend on the tree: in decided sessions every token is decided by the
verifier from (seed, position, p~); the tree only decides what gets scored in advance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from acespec.edge.speculation.allocator import Candidate, allocate
from acespec.edge.speculation.branches import NodeCosts, guesses
from acespec.edge.speculation.calibration import AcceptanceModel, RecoveryModel

ACCEPTED, HIT, REJECTED, CONTINUATION = "accepted", "hit", "rejected", "continuation"


@dataclass(eq=False)
class Node:
    """One node: its token sits at `position`."""

    token: int
    position: int
    parent: Node | None
    guess: bool = False  # a guessed recovery token (not drafted)
    p_c: float = 1.0  # a guess: P(recovered token = this | the draft beside it is rejected)
    nid: int = -1  # wire node id once sent; -1 before (and for the frontier)
    sent_in: int = 0  # the uplink message (1-based, per connection) that carried it; 0: unsent
    lead: int = 0  # once sent: its position's distance past the committed end then
    children: dict[int, Node] = field(default_factory=dict)
    draft: Node | None = None  # the drafted child, once this node was expanded
    conf: float = 1.0  # the drafter's probability of `draft` (its plain softmax)
    alts: list[int] = field(default_factory=list)  # guessable tokens, by rank
    alt_p: list[float] = field(default_factory=list)  # their P(recovered = it | rejection)
    seq: int | None = None  # drafter sequence whose KV holds this node's path

    @property
    def expanded(self) -> bool:
        return self.draft is not None


@dataclass(frozen=True)
class GrowBudget:
    """What one growth step may add (the budgets of docs/design.md §6, per step)."""

    nodes: int  # verifier nodes still free in the window
    kv_bytes: float  # edge drafter KV still free for new cells
    uplink_bytes: float  # uplink bytes the link carries in one round trip
    batch: int  # leaves one decode may grow (free drafter sequences)


class GrowTree:
    """The live tree. `root` stands for the committed text (its token is the last one)."""

    def __init__(self, last_token: int, end: int, acc: AcceptanceModel,
                 guesses_per_node: int = 2):
        self.root = Node(last_token, end - 1, None)
        self.acc = acc  # calibrated online by the caller: odds follow what it learns
        self.guesses_per_node = guesses_per_node
        self.unsent: list[Node] = []  # created, not yet uploaded (parents first)
        self.dropped_seqs: list[int] = []  # sequences of nodes that died, to free

    @property
    def end(self) -> int:
        """The committed end: the next position to be decided."""
        return self.root.position + 1

    # -- decisions ----------------------------------------------------------------

    def take(self, token: int) -> str:
        """Apply one decided token at the committed end: the matching child becomes the
        root (its subtree lives on); everything else dies. Returns how it went."""
        old = self.root
        nxt = old.children.get(token)
        if old.draft is not None and old.draft.token == token:
            verdict = ACCEPTED
        elif nxt is not None:
            verdict = HIT
        elif old.children:
            verdict = REJECTED
        else:
            verdict = CONTINUATION
        for child in old.children.values():
            if child is not nxt:
                self._drop(child)
        if nxt is None:
            nxt = Node(token, old.position + 1, None, seq=old.seq)
            old.seq = None
        elif nxt.seq is None:
            nxt.seq, old.seq = old.seq, None
        if old.seq is not None:
            self.dropped_seqs.append(old.seq)
        nxt.parent = None
        self.root = nxt
        self.unsent = [n for n in self.unsent if self._live(n)]
        return verdict

    def _drop(self, node: Node) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.seq is not None:
                self.dropped_seqs.append(n.seq)
                n.seq = None
            stack.extend(n.children.values())

    def _live(self, node: Node) -> bool:
        while node.parent is not None:
            node = node.parent
        return node is self.root

    # -- growth -------------------------------------------------------------------

    def nodes(self) -> list[tuple[Node, float]]:
        """Every live node below the root with its path probability (parents first)."""
        return [(n, p) for n, p, _ in self.walk()]

    def walk(self) -> list[tuple[Node, float, bool]]:
        """(node, path probability, under a guess?) for every live node below the root,
        parents first. One pass; the calibration is read once."""
        acc = self._accept_table()
        out, stack = [], [(c, self._odds(c, acc), c.guess) for c in self.root.children.values()]
        while stack:
            n, p, b = stack.pop()
            out.append((n, p, b))
            stack.extend((c, p * self._odds(c, acc), b or c.guess) for c in n.children.values())
        return out

    def odds(self, child: Node) -> float:
        """P(child is on the accepted path | its parent is): the parent's draft is accepted
        with the calibrated P(accept | confidence); a guess needs a rejection and then the
        recovered token to be it."""
        return self._odds(child, self._accept_table())

    def _accept_table(self) -> list[float]:
        return (self.acc.accepted / self.acc.total).tolist()  # [bins] P(accept) per bin

    def _odds(self, child: Node, acc: list[float]) -> float:
        conf = (child.parent or self.root).conf
        a = acc[min(len(acc) - 1, int(conf * len(acc)))]
        return (1 - a) * child.p_c if child.guess else a

    def leaves(self, walked: list[tuple[Node, float, bool]], max_position: int
               ) -> list[tuple[Node, float, bool]]:
        """Nodes not grown yet (the root included) among `walked` (see walk): (node, path
        probability, under a guess?). The drafted line is the one leaf not under a guess."""
        out = [(self.root, 1.0, False)] if not self.root.expanded else []
        return out + [(n, p, b) for n, p, b in walked
                      if not n.expanded and n.position < max_position]

    def select(self, cands: list[tuple[Node, float]], budget: GrowBudget,
               costs: NodeCosts) -> list[Node]:
        """The leaves to grow in one step: highest value first; when a budget binds, the
        Lagrangian allocator (acespec.edge.speculation.allocator) picks within every budget."""
        cands = sorted(cands, key=lambda c: -c[1])[:max(0, budget.batch)]
        # No draft time (the batch bounds a step's drafting) and no downlink (Decided
        # carries decided tokens, not the nodes' scores).
        per = (costs.kv_per_token, 0.0, costs.up_per_node, 0.0, 1.0)
        limits = (budget.kv_bytes, 1.0, budget.uplink_bytes, 1.0, float(budget.nodes))
        need = np.array(per) * len(cands)
        if (need <= np.array(limits)).all():
            return [n for n, _ in cands]
        chosen = allocate([Candidate(i, None, v, per) for i, (_, v) in enumerate(cands)],
                          limits).selected
        return [cands[i][0] for i in sorted(chosen)]

    def expand(self, node: Node, draft_token: int, ranks: np.ndarray,
               rec: RecoveryModel) -> Node:
        """Add node's drafted child; its confidence is ranks[draft] of the drafter's plain
        softmax ranks [V]; the next most likely tokens become guessable (see guess)."""
        node.conf = float(ranks[draft_token])
        node.draft = self._child(node, draft_token, guess=False, p_c=1.0)
        rest = max(1e-9, 1.0 - node.conf)
        node.alts = guesses(ranks, draft_token, self.guesses_per_node)
        node.alt_p = [rec.p(rank, float(ranks[c]) / rest) for rank, c in enumerate(node.alts)]
        return node.draft

    def guess(self, walked: list[tuple[Node, float, bool]],
              worth: Callable[[float, int], float], room: int) -> list[Node]:
        """Add guessed children where worth(P(their path), lead) > 0, best first, at most
        `room` (lead: how far past the committed end the child sits).
        Re-checked every step: a node drafted early, when its path looked unlikely, gets
        its guesses once the accepted path comes close."""
        if room <= 0:
            return []
        cands, acc = [], self._accept_table()
        for n, p, _ in [(self.root, 1.0, False)] + walked:
            if not n.expanded:
                continue
            a = acc[min(len(acc) - 1, int(n.conf * len(acc)))]
            for c, p_c in zip(n.alts, n.alt_p):
                lead = n.position + 1 - self.end
                if c not in n.children and (v := worth(p * (1 - a) * p_c, lead)) > 0:
                    cands.append((v, n, c, p_c))
        cands.sort(key=lambda x: -x[0])
        return [self._child(n, c, guess=True, p_c=p_c) for _, n, c, p_c in cands[:room]]

    def _child(self, parent: Node, token: int, guess: bool, p_c: float) -> Node:
        child = parent.children.get(token)
        if child is None:
            child = Node(token, parent.position + 1, parent, guess=guess, p_c=p_c)
            parent.children[token] = child
            self.unsent.append(child)
        return child

    def path(self, node: Node) -> list[int]:
        """Tokens from below the root down to `node`, inclusive ([] for the root)."""
        out = []
        while node is not self.root and node is not None:
            out.append(node.token)
            node = node.parent
        return out[::-1]

    def shape(self) -> tuple[int, int]:
        """(width: most live nodes at one position, depth: deepest live position ahead)."""
        counts: dict[int, int] = {}
        for n, _ in self.nodes():
            counts[n.position] = counts.get(n.position, 0) + 1
        if not counts:
            return 0, 0
        return max(counts.values()), max(counts) - self.root.position
