"""The decided session: the state of one session the verifier decides (greedy and coupled
sampling; docs/design.md §3, §5), its limits and its account.

Every verdict of such a session is a deterministic function of (seed, position, p~)
(acespec.cloud.verify.verdict), so the verifier needs no edge to decide: after each pass it
walks what it scored, keeps the accepted drafts, and decides one more token (the recovered
token after a rejection, the bonus after a fully accepted line, or - with no draft at all -
the next token of plain autoregressive decoding). It never waits for the link: while the
edge learns a verdict and drafts again, the verifier keeps decoding, and the edge's late
drafts are reconciled with what was decided meanwhile (compared, not scored).

The edge's uplink is its speculation tree (`Grow`: nodes with parents, rooted in the decided
text; docs/design.md §6; a chain is a tree with no branches). Each node is pending (beyond
the decided end, on a path that agrees with the decided text), matched (its position is
decided and equals its token) or dead (it or an ancestor disagrees). Only pending nodes are
scored, so a dead draft never costs a pass; a pass feeds the whole pending tree and the walk
follows whichever child it decides - the draft or a guess - so a hit on a branch continues
with no round trip.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from acespec.cloud.errors import InvalidArgument, ResourceExhausted
from acespec.cloud.verify.share import Share
from acespec.cloud.verify.verdict import FIRST, Walk, decide, walk
from acespec.shared.grammar import Cursor
from acespec.shared.logprobs import TokenLogprob, token_logprob
from acespec.shared.lookup import lookup_order
from acespec.shared.served import ServeParams

PENDING, MATCHED, DEAD = 0, 1, 2
ROOT = -1  # a node's parent: the decided text up to its position
HORIZON = 1024  # nodes this many positions behind the decided end are forgotten


@dataclass(frozen=True)
class DecideLimits:
    """What bounds a decided session: its length, the model's context and vocabulary, and
    what one pass feeds and applies."""

    max_tokens: int  # decide at most this many tokens after the prompt
    stop: frozenset[int] = frozenset()  # a decided stop token ends the session (it is sent)
    context: int = 4096  # positions the model has (max_position_embeddings)
    pass_nodes: int = 64  # most drafts scored in one pass
    applied_per_pass: int = 2048  # uplink nodes applied before one pass (2x the edge's
    # largest window); the rest wait for the next pass
    vocab: int = 1 << 32  # token ids must be below this
    propose: int = 0  # a pass no draft covers scores up to this many of the verifier's own
    # proposals (prompt lookup over the session's text; 0: none)
    propose_min_n: int = 1  # shortest n-gram a proposal must follow


@dataclass
class DecidedCounts:
    """What the session's verifier did, for the edge's stats (sent with the last message)."""

    opened_at: float = field(default_factory=time.perf_counter)
    passes: int = 0
    busy_s: float = 0.0  # seconds in passes for this session
    drafts_received: int = 0
    drafts_scored: int = 0  # drafts fed to a pass
    drafts_reconciled: int = 0  # drafts found equal to tokens decided before they arrived
    continuation: int = 0  # tokens decided with no draft at their position
    hits: int = 0  # walks into a later-sent sibling (a guess), not the first
    hits_restarted: int = 0  # ... that held no draft below the guess: decoding went on alone
    lone_passes: int = 0  # passes no edge draft covered (the decided end had none)
    lone_tokens: int = 0  # tokens those passes decided
    proposed: int = 0  # the verifier's own proposals scored (in lone passes)
    proposed_accepted: int = 0  # ... that the walk took
    gap_s: float = 0.0  # seconds the gap drafter spent drafting this session's proposals

    def dead_skipped(self) -> int:
        """Drafts never scored nor settled by comparison: behind a rejection, contradicted
        before scoring, or left over when the session ended. (A draft is counted once:
        scored ones are decided or dead after their pass, reconciled ones were decided.)"""
        return self.drafts_received - self.drafts_scored - self.drafts_reconciled


@dataclass
class Node:
    """One node of the edge's speculation tree."""

    token: int
    parent: int  # node id, or ROOT
    position: int  # where its token sits in the text
    state: int = PENDING
    scored: bool = False  # fed to a pass
    proposed: bool = False  # the verifier's own (ids below ROOT), dropped after its pass


class DecidedSession:
    """The decided text of one session and the edge's speculation tree beside it."""

    def __init__(self, prompt: Sequence[int], params: ServeParams, seed: int,
                 limits: DecideLimits):
        self.params, self.seed, self.limits = params, seed, limits
        self.tokens = list(map(int, prompt))  # [D] prompt + decided; the KV holds all but the last
        self.prompt_len = len(self.tokens)
        self.nodes: dict[int, Node] = {}
        self.next_id = 0
        self.live: dict[int, None] = {}  # ids of pending nodes, in id (topological) order
        self.done = False
        self.counts = DecidedCounts()
        self._in_pass: list[int] = []  # node ids fed to the pass in flight
        self._base = 0  # the KV slot of the pass's first input
        self.walked: list[int] = []  # pass indices of the nodes the last walk accepted
        self._lone = False  # the pass in flight had no edge draft at the decided end
        self.proposal_room = 0  # proposals the planned (lone) pass still has room for
        self.share = Share(limits.pass_nodes)  # nodes per pass it earns (cloud.verify.share)
        self.gap = None  # the gap drafter's state for this session (cloud.verify.gap), if any
        self.acked, self.acked_at = 0, 0.0  # uplink messages applied; the last one's arrival
        self.grammar: Cursor | None = None  # the structured output's (set by the engine)
        self.logprobs: int | None = None  # asked for: alternatives per token (None: not asked)
        self.last_logprobs: list[TokenLogprob] = []  # of the tokens the last pass decided

    @property
    def end(self) -> int:
        """D: the next position to decide."""
        return len(self.tokens)

    def edge_on_path(self) -> bool:
        """Whether the edge's latest node (the last one it sent) is decided text: the
        drafts it has in flight then continue the decided text, and a lone pass only means
        the verifier ran ahead of them. False before any draft, and after a miss until
        drafts from the recovered token arrive (the round trip a proposer has to itself)."""
        last = self.nodes.get(self.next_id - 1) if self.next_id else None
        return last is not None and last.state == MATCHED

    def pending(self) -> list[int]:
        """Tokens of the live nodes beyond the decided end, in id order."""
        return [self.nodes[i].token for i in self.live]

    # -- uplink -----------------------------------------------------------------

    def apply_grow(self, anchor: int, parents: Sequence[int], tokens: Sequence[int]) -> int:
        """New nodes next_id.. with these parents (node ids, or ROOT = the decided text up
        to `anchor`). Raises InvalidArgument for a node that cannot be true. Returns the
        message's reach: how many positions past the decided end its deepest node kept goes
        (<= 0: every position it drafts was decided before it arrived; with none kept, the
        anchor's distance behind the end)."""
        if ROOT in parents:
            self._check_base(anchor, "Grow.anchor")
        self._check_vocab(tokens, "Grow.tokens")
        if len(self.live) + len(tokens) > 8 * self.limits.pass_nodes:
            raise ResourceExhausted(f"Grow: {len(self.live) + len(tokens)} pending nodes would "
                                    f"exceed {8 * self.limits.pass_nodes}; wait for Decided")
        deepest = anchor - 1
        for t, p in zip(tokens, parents):
            if (node := self.nodes.get(self._add(int(t), int(p), anchor))) is not None:
                deepest = max(deepest, node.position)
        self._forget()
        return deepest + 1 - self.end

    def _check_base(self, base: int, what: str) -> None:
        if not self.prompt_len <= base <= self.end:
            raise InvalidArgument(f"{what} builds on {base} decided positions; the session has "
                                  f"{self.prompt_len} prompt + {self.end - self.prompt_len} "
                                  "decided")

    def _check_vocab(self, tokens: Sequence[int], what: str) -> None:
        bad = [t for t in tokens if not 0 <= t < self.limits.vocab]
        if bad:
            raise InvalidArgument(f"{what}: token id {bad[0]} is outside the vocabulary "
                                  f"[0, {self.limits.vocab})")

    def _add(self, token: int, parent: int, anchor: int) -> int:
        """Append one node; its state follows from its parent's. Returns its id. A node
        below a dead or forgotten one (dead, or decided long ago) is dead at once and is
        not kept: a flood of doomed drafts costs a counter, not memory."""
        nid = self.next_id
        self.next_id += 1
        self.counts.drafts_received += 1
        if parent != ROOT and (parent not in self.nodes or self.nodes[parent].state == DEAD):
            return nid
        position = anchor if parent == ROOT else self.nodes[parent].position + 1
        node = self.nodes[nid] = Node(token, parent, position)
        self._settle(nid, node)
        return nid

    def _settle(self, nid: int, node: Node) -> None:
        """Resolve a pending node against the decided text, as far as it reaches."""
        up = MATCHED if node.parent == ROOT else self.nodes[node.parent].state
        if up == DEAD:
            node.state = DEAD
        elif up == MATCHED and node.position < self.end:
            node.state = MATCHED if node.token == self.tokens[node.position] else DEAD
            if node.state == MATCHED and not node.scored:
                self.counts.drafts_reconciled += 1
                if self.gap is not None:
                    self.gap.brought(node.position)
        else:
            node.state = PENDING
        if node.state == PENDING:
            self.live[nid] = None
        else:
            self.live.pop(nid, None)

    def _kill(self, nid: int) -> None:
        node = self.nodes.get(nid)
        if node is not None and node.state == PENDING:
            node.state = DEAD
            self.live.pop(nid, None)

    # -- passes -----------------------------------------------------------------

    def plan_pass(self, lookup_proposals: bool = True, budget: int | None = None
                  ) -> list[int]:
        """Tokens of the next pass: the last decided token (not in the KV yet), then the
        pending tree in id order (parents first), within the pass and context limits and
        `budget` nodes besides the first (the session's share). A pass no draft covers has
        room for `proposal_room` of the verifier's own proposals: prompt lookup fills it
        here unless the caller brings its own (add_proposals: a gap drafter)."""
        reach = min(self.limits.context - 1,
                    self.prompt_len + self.limits.max_tokens - 1)  # last position worth scoring
        pass_nodes = self.limits.pass_nodes if budget is None else \
            min(self.limits.pass_nodes, budget)
        fed: dict[int, int] = {}  # node id -> index in the pass
        for nid in self.live:
            node = self.nodes[nid]
            if len(fed) >= pass_nodes or node.position >= reach:
                continue
            if node.parent in fed or self.nodes.get(node.parent, _TOP).state == MATCHED:
                fed[nid] = len(fed)
        self._in_pass = list(fed)
        self._lone = not fed  # a pending node with a decided parent sits at the decided end
        self.proposal_room = (max(0, min(self.limits.propose, reach - self.end,
                                         pass_nodes - len(fed)))
                              if self._lone else 0)
        if lookup_proposals and self.proposal_room:
            self.add_proposals(self.looked_up()[0])
        return self.pass_tokens()

    def looked_up(self) -> tuple[list[int], int]:
        """Prompt lookup's proposals for the planned lone pass (acespec.shared.lookup: what
        followed the latest earlier occurrence of the text's last n-gram) and that n (0:
        none)."""
        tokens, n = lookup_order(self.tokens, self.proposal_room, self.limits.propose_min_n)
        return [int(t) for t in tokens], n

    def add_proposals(self, tokens: Sequence[int]) -> None:
        """The verifier's own chain for the planned lone pass, from the decided end (prompt
        lookup or a gap drafter; at most proposal_room tokens). Its verdicts are decided like
        any draft's, so output is unchanged; it only saves passes."""
        parent = ROOT
        for i, t in enumerate(tokens[:self.proposal_room]):
            nid = ROOT - 1 - i
            self.nodes[nid] = Node(int(t), parent, self.end + i, proposed=True)
            self._in_pass.append(nid)
            parent = nid
        self.proposal_room = 0

    def pick(self, logits: np.ndarray, position: int) -> int:
        """This session's verdict rule applied to a proposer's logits [V] at `position`: in a
        coupled session a drafter's Gumbel-max with the target's noise there (what the
        edge's coupled drafts are), so its proposal is taken whenever both agree."""
        return decide(logits, self.params, self.seed, position)

    def _text(self, new: list[int]) -> Sequence[int]:
        """Every token before the next decision (what penalties and the grammar count),
        when it matters."""
        return self.tokens + new if self.params.sampling.shaped else ()

    def pass_tokens(self) -> list[int]:
        """The planned pass's inputs [1 + n]: the last decided token, then the fed nodes."""
        return [self.tokens[-1]] + [self.nodes[i].token for i in self._in_pass]

    def pass_parents(self, base: int) -> list[int]:
        """KV parent slots [1 + n] of the planned pass, its first input at slot `base`."""
        index = {nid: i for i, nid in enumerate(self._in_pass)}
        self._base = base
        return [base - 1] + [base + 1 + index[self.nodes[i].parent]
                             if self.nodes[i].parent in index else base for i in self._in_pass]

    def finish_prefill(self, row: np.ndarray, seconds: float) -> tuple[int, list[int]]:
        """Decide the first token from the prompt's last logits row [V] (the prefill pass):
        the KV then holds the whole prompt, all but the last decided token."""
        self._in_pass = []
        return self.finish_pass(row[None, :], seconds)

    def finish_pass(self, rows: np.ndarray, seconds: float) -> tuple[int, list[int]]:
        """Decide from the pass's logits rows [1 + n, V]: returns (position of the first
        decided token, decided tokens: the walked path then one more)."""
        fed, start = self._in_pass, self.end
        index = {nid: i for i, nid in enumerate(fed)}
        nodes = [self.nodes[nid] for nid in fed]
        parents = [index.get(n.parent, FIRST) for n in nodes]  # [n] pass indices
        for node in nodes:
            node.scored = True

        def verdict(row: np.ndarray, new: list[int]) -> int:
            return decide(row, self.params, self.seed, start + len(new), self._text(new),
                          self.grammar)

        w = walk(parents, [n.token for n in nodes], rows, verdict, self.limits.stop)
        self.walked = w.path
        self._count_walk(w, parents, nodes)
        new = self._commit(w.tokens)
        self.last_logprobs = [] if self.logprobs is None else [
            token_logprob(rows[r], y, self.logprobs) for r, y in zip(w.rows(), new)]
        self._count_pass(fed, new, seconds)
        for nid in fed:  # a fed node the walk did not take is dead (its slot is gone)
            if self.nodes[nid].proposed:
                self.nodes.pop(nid)
            else:
                self._kill(nid)
        self._settle_live()
        return start, new

    def _count_walk(self, w: Walk, parents: list[int], nodes: list[Node]) -> None:
        """The walk's account: continuation (it ended where no edge draft was), hits and
        the proposals it took."""
        c, end = self.counts, w.path[-1] if w.path else FIRST
        drafted = {p for p, n in zip(parents, nodes) if not n.proposed}  # with an edge draft below
        c.continuation += end not in drafted
        c.hits += w.hits
        c.hits_restarted += w.restarted
        c.proposed_accepted += sum(nodes[i].proposed for i in w.path)

    def _count_pass(self, fed: list[int], new: list[int], seconds: float) -> None:
        c, proposed = self.counts, sum(self.nodes[i].proposed for i in fed)
        c.passes += 1
        c.busy_s += seconds
        c.drafts_scored += len(fed) - proposed
        c.proposed += proposed
        if self._lone:
            c.lone_passes += 1
            c.lone_tokens += len(new)

    def kept_slots(self) -> list[int]:
        """KV slots to keep after a pass: every decided token but the last (the pass's
        first input and the walked nodes, the last of which may be cut by a limit)."""
        keep = self.end - 1 - self._base
        walked = [self._base + 1 + i for i in self.walked][:max(0, keep - 1)]
        return list(range(self._base + min(1, keep))) + walked

    def _commit(self, new: list[int]) -> list[int]:
        """Append decided tokens, ending the session at a stop token, max_tokens or the
        context's end; then settle the pending nodes they reach."""
        left = min(self.limits.max_tokens - (self.end - self.prompt_len),
                   self.limits.context - self.end)
        new = new[:left]
        for i, t in enumerate(new):
            if t in self.limits.stop:
                new = new[:i + 1]
                break
        self.tokens += new
        if (self.end - self.prompt_len >= self.limits.max_tokens or
                (new and new[-1] in self.limits.stop) or self.end >= self.limits.context):
            self.done = True
        self._settle_live()
        self._forget()
        return new

    def _settle_live(self) -> None:
        for nid in list(self.live):  # id order: parents settle before their children
            self._settle(nid, self.nodes[nid])

    def _forget(self) -> None:
        """Drop dead nodes, and decided ones far behind the decided end: what the session
        holds stays O(pending + HORIZON) however many drafts die (a node that names a
        forgotten parent is dead; see _add)."""
        if len(self.nodes) <= 2 * HORIZON:
            return
        old = self.end - HORIZON
        self.nodes = {i: n for i, n in self.nodes.items()
                      if n.state == PENDING or (n.state == MATCHED and n.position >= old)}


_TOP = Node(token=-1, parent=ROOT, position=-1, state=MATCHED)  # stands for ROOT

