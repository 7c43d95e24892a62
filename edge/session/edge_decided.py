"""The edge-decided driver: the edge decides over `Extend`/`Scores` (modes sd, pipeline,
acespec-exact, and every mode with exact sampling; docs/design.md §3, §6).

The verifier scores the nodes it is sent and returns p~ at each; the edge walks the scored
tree with `acespec.shared.walk` (randomness a function of seed and position), commits what
the walk decided, and drafts on:

* sd       - draft `depth` tokens, send, wait, walk, repeat.
* pipeline - keep drafting past in-flight nodes (the edge's own draft stands in for the
             bonus) and stream Extends up to `window` live nodes; apply verdicts in order.
* a mode with branches (acespec-exact) - pipeline, plus the speculation tree's guessed
             branches in the same Extends (acespec.edge.speculation.branches).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from acespec.edge.client import CloudSession, Tail
from acespec.edge.session.config import NODE_PASS_S, EngineConfig
from acespec.edge.session.driver import unpack
from acespec.edge.session.live_nodes import RESERVE, VerifierLive, fit_to_grant
from acespec.edge.session.runner import Runner
from acespec.edge.speculation.adaptive import LinkBudgets, Shape, choose_shape
from acespec.edge.speculation.branches import BUDGETS, NodeCosts, guesses, plan
from acespec.edge.speculation.exact_tree import SpecTree
from acespec.proto.sizes import DOWN_NODE_GREEDY, DOWN_NODE_SAMPLED
from acespec.shared.walk import NeedTail, walk

log = logging.getLogger(__name__)


@dataclass
class _Flight:
    """What is in flight on one session."""

    in_flight: int = 0  # Extends whose Scores have not arrived
    want_tail: bool = False  # a MoreTail is outstanding
    sent: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes) of those Extends


class EdgeDecidedDriver:
    """One connection attempt of an edge-decided session, opened with the root's score."""

    def __init__(self, run: Runner, sess: CloudSession, inbox: asyncio.Queue, root):
        self.run, self.sess, self.inbox = run, sess, inbox
        self._fit(sess.max_live_nodes or self.live_limit(run.cfg))
        self.pending_commit: int | None = None  # node id to commit with the next Extend
        self.head = None  # (end node, decided token) waiting to be sent as a node
        self._guess: dict[int, tuple[list[int], float]] = {}  # drafted node -> (guesses, confidence)
        self._since_change = 0  # Scores since the shape last changed
        run.stats.passes += 1  # the root's pass
        context = run.context
        self.tree = SpecTree(context[-1], len(context) - 1, root)

    @staticmethod
    def live_limit(c: EngineConfig) -> int:
        """Live nodes the verifier must allow: the window, a chunk, and in a mode with
        branches those of every chunk in flight; twice, as commits ride one Extend late."""
        window, depth = (c.max_window, 2) if c.adaptive else (c.window, c.depth)
        branches = (window // depth + 1) * int(c.cache.cloud_nodes) if c.spec.branches else 0
        return 2 * (window + max(c.max_depth, c.depth) + branches) + 2

    async def drive(self) -> None:
        run, sess, tree, inbox, fl = self.run, self.sess, self.tree, self.inbox, _Flight()
        while not run.finished:
            while not inbox.empty():  # apply what has arrived before drafting further
                self._take(inbox.get_nowait(), fl)
            # sd verifies a chain only once all of it is scored (draft, send, wait, verify),
            # so its rounds - and the bonus at each chain's end - align however it resumes.
            settled = run.cfg.spec.pipelined or fl.in_flight == 0
            if not fl.want_tail and self.head is None and settled:
                try:
                    res = walk(tree.root, run.cfg.serve.sampling.greedy, run.rng_at(1),
                               bonus_at_leaves=not self._will_draft())
                    self._apply(res)
                except NeedTail as e:
                    await sess.more_tail(e.node_id, 2)
                    run.stats.more_tail += 1
                    fl.want_tail = True
            if run.finished:
                return
            if not fl.want_tail and self._may_draft(fl.in_flight):
                before = sess.bytes_up
                await self._extend()
                fl.sent.append((time.perf_counter(), sess.bytes_up - before))
                fl.in_flight += 1
                continue
            if fl.in_flight == 0 and not fl.want_tail and inbox.empty():
                # Nothing in flight and nothing to send: waiting would hang forever.
                raise RuntimeError(f"edge engine stalled at {len(run.out)} tokens with "
                                   f"{self.live.held_after(self.pending_commit)} of "
                                   f"{self.live.grant} live nodes held by the verifier")
            self._take(await inbox.get(), fl)

    # -- the verifier's grant -------------------------------------------------------

    def _fit(self, grant: int) -> None:
        """Fit the shape (and its adaptive bounds) to the live nodes the verifier granted."""
        run, c = self.run, self.run.cfg
        self.live = VerifierLive(grant)
        self.bounds = fit_to_grant(grant, c.max_depth if c.adaptive else c.depth,
                                   c.max_window if c.adaptive else c.window)
        start = run.shape if c.adaptive else Shape(c.depth, c.window)  # grants may differ
        run.shape = Shape(*fit_to_grant(grant, start.depth, start.window))

    def _room(self) -> int:
        """Most nodes the next Extend may add within the verifier's grant."""
        return self.live.room(self.pending_commit, decided=self.head is not None)

    # -- downlink -------------------------------------------------------------------

    def _take(self, item, fl: _Flight) -> None:
        """Apply one downlink message (or raise the reader's error)."""
        msg, size, server_s, _ = unpack(item)
        run, tree = self.run, self.tree
        if isinstance(msg, Tail):
            tree.add_tails(msg.node_id, msg.ids, msg.units)
            fl.want_tail = False
            return
        fl.in_flight -= 1
        sent_at, up = fl.sent.pop(0)
        rtt = time.perf_counter() - sent_at
        run.stats.round_trips.append(rtt)
        run.stats.passes += 1
        run.stats.server_s += server_s
        tree.apply_scores(msg)
        run.link.observe(up, size, rtt, server_s, sent_at + rtt)
        self._adapt()

    def _adapt(self) -> None:
        """Follow the link: re-choose (depth, window) from the speedup model."""
        run = self.run
        self._since_change += 1
        if not (run.cfg.adaptive and run.link.ready and run.cfg.spec.pipelined):
            return
        if self._since_change < 8:  # dwell: let the estimate see the current shape first
            return
        max_depth, max_window = self.bounds
        if max_depth < 2:  # the grant holds no shape the model chooses from
            return
        link = run.link
        new = choose_shape(run.alpha, link.base_rtt(), link.bandwidth(), run.draft_s,
                           run.shape, max_depth,
                           max(max_depth, min(run.cfg.max_window, self.live.grant - 3)),
                           link.step(), self._down_per_node())
        new = Shape(*fit_to_grant(self.live.grant, new.depth, new.window))
        if new != run.shape:
            log.debug("shape %s -> %s (acceptance %.2f, base rtt %.1f ms, %.0f B/s)", run.shape,
                      new, run.alpha, 1000 * link.base_rtt(), link.bandwidth())
            run.shape, self._since_change = new, 0
            run.stats.shape_changes += 1
        run.stats.depth, run.stats.window = run.shape.depth, run.shape.window
        run.note_link()

    def _apply(self, res) -> None:
        """Take what the walk decided: commit it; after a rejection or a bonus, the decided
        token waits in self.head to lead the next Extend."""
        run, tree = self.run, self.tree
        run.stats.accepted += res.accepted
        self._learn(tree.root, res)
        if res.tokens:
            log.debug("walk from position %d decided %s (%s)", tree.root.position + 1,
                      res.tokens, "waiting" if res.waiting else "done")
        if res.waiting:
            if res.end is not tree.root:
                run.emit(res.tokens)
                tree.reroot(res.end)
                self.pending_commit = res.end.node_id
            return
        run.stats.rounds += 1
        run.emit(res.tokens)
        tree.cut_below(res.end)  # the drafts below the decision point are dead
        tree.reroot(res.end)
        self.head = (res.end, res.tokens[-1])

    def _learn(self, root, res) -> None:
        """Feed the verdicts of this walk to the acceptance model and the cache stats."""
        run, n = self.run, root
        for t in res.tokens:
            x = n.drafted
            if x is not None and x.q is not None:
                g, conf = self._guess.pop(x.node_id, (None, float(x.q[x.token])))
                run.acc.update(conf, t == x.token)
                run.learn_acceptance(t == x.token)
                if t != x.token:
                    run.stats.cache.rejections += 1
                    if t in n.children:
                        run.stats.cache.hits += 1
                    if g is not None:  # the downlink revealed the recovered token: calibrate
                        run.rec.observe(g.index(t) if t in g else len(g))
            nxt = n.children.get(t)
            if nxt is None:
                break
            n = nxt

    # -- uplink ---------------------------------------------------------------------

    def _chain_len(self) -> int:
        """Live nodes of the main chain (branches have their own budget)."""
        return len(self.tree.path_tokens(self.tree.tip))

    def _will_draft(self) -> bool:
        """Pipeline drafts past every scored leaf until max_tokens: no bonus draws there."""
        run = self.run
        return (run.cfg.spec.pipelined and
                len(run.out) + self._chain_len() < run.cfg.max_tokens)

    def _may_draft(self, in_flight: int) -> bool:
        run = self.run
        if self.head is not None:  # a decided token must reach the verifier, with a draft
            return self._room() >= RESERVE
        if len(run.out) + self._chain_len() > run.cfg.max_tokens:
            return False
        if self._room() < 1:  # the verifier's grant is full: wait for verdicts (commits)
            return False
        if not run.cfg.spec.pipelined:
            return in_flight == 0
        return self._chain_len() + run.shape.depth <= run.shape.window

    async def _extend(self) -> None:
        """Draft at the tip and send the chain (led by the decided head token, if any), plus
        the speculation tree's guessed branches where the mode has them, as one Extend."""
        run, tree, head = self.run, self.tree, self.head
        parent = head[0] if head else tree.tip
        lead = [head[1]] if head else []
        behind = [] if head else tree.path_tokens(tree.tip)
        context = run.context + behind
        room = run.cfg.max_tokens - len(run.out) - len(behind)
        grant_room = self._room()  # nodes this Extend may add within the verifier's grant
        n = max(1, min(run.shape.depth, room, grant_room - len(lead)))
        draft = await run.draft(context, n, run.seq)
        branches = await self._branches(context, draft, grant_room - len(lead) - len(draft)) \
            if run.cfg.spec.branches else []
        log.debug("extend at position %d: lead %s drafts %s, %d branches", len(context), lead,
                  draft.tokens.tolist(), len(branches))
        first = self.sess.next_id
        chain = lead + draft.tokens.tolist()
        ids = list(range(first, first + len(chain)))  # node ids of the chain
        parents = [parent.node_id] + ids[:-1]
        tokens, base = list(chain), first + len(chain)
        anchor = ([parent.node_id] if not head else [first]) + ids[len(lead):]  # node before draft j
        for br, toks, _ in branches:
            tokens += toks
            parents += [anchor[br.j]] + list(range(base, base + len(toks) - 1))
            base += len(toks)
        await self.sess.extend(tokens, parents, commit=self.pending_commit)
        self.live.extend(first, parents, self.pending_commit)
        self.pending_commit = None
        if head:
            node = tree.add(first, lead, parent, None)[0]
            self.pending_commit = first  # the head is decided: freed with the next Extend
            tree.reroot(node)
            made = tree.add(first + 1, draft.tokens, node, draft.q)
            self.head = None
        else:
            node = parent
            made = tree.add(first, draft.tokens, parent, draft.q)
        if run.cfg.spec.branches:
            self._remember_guesses(made, draft)
        chain_nodes = [node] + made
        nid = first + len(chain)
        for br, toks, qs in branches:
            root = tree.add(nid, toks[:1], chain_nodes[br.j], None)[0]
            tree.add(nid + 1, toks[1:], root, qs)
            nid += len(toks)
            run.stats.cache.branches_uploaded += 1
            run.stats.cache.branch_nodes += len(toks)
        tree.tip = made[-1]

    def _down_per_node(self) -> float:
        """A node's Scores bytes: one token id when greedy, a sparse p~ when sampled."""
        return DOWN_NODE_GREEDY if self.run.cfg.serve.sampling.greedy else DOWN_NODE_SAMPLED

    async def _branches(self, context: list[int], draft, max_nodes: int) -> list[tuple]:
        """Plan and draft guessed branches for this chunk, at most max_nodes nodes in all
        (what the verifier's grant leaves): [(Branch, tokens, qs)]."""
        if max_nodes < 1:
            return []
        run = self.run
        c, stats, link = run.cfg.cache, run.stats, run.link
        rtt = float(np.median(stats.round_trips[-8:])) if stats.round_trips else 0.1
        per_round = stats.tokens / stats.rounds if stats.rounds else 2.0
        token_s = rtt / max(1.0, per_round)  # the current time per generated token
        costs = NodeCosts(kv_per_token=float(getattr(run.drafter, "kv_bytes_per_token", 4096.0)),
                          draft_ms=1000 * run.draft_s, down_per_node=self._down_per_node())
        derived = (6.0, 24.0, 96.0)
        if link.ready:
            derived = LinkBudgets().derive(link.base_rtt() + link.step(), link.bandwidth(),
                                           run.draft_s * len(draft))
        budgets = c.budgets(derived)
        nodes = BUDGETS.index("cloud_nodes")
        budgets[nodes] = min(budgets[nodes], max_nodes)
        node_s = c.node_s if c.node_s is not None else \
            (costs.up_per_node + costs.down_per_node) / link.bandwidth() + NODE_PASS_S
        plans = plan(draft.q, draft.tokens, run.acc, c, token_s=token_s, node_s=node_s,
                     costs=costs, budgets=budgets, ranks=draft.ranks, rec=run.rec)
        stats.budgets = {k: round(v, 2) for k, v in zip(BUDGETS, budgets.tolist())}
        out, used, branch_seq = [], 0, run.branch_seqs[0]
        for br in plans:
            if used + 1 + br.depth > max_nodes:  # the allocator's prefix closure may overshoot
                continue
            used += 1 + br.depth
            prefix = context + draft.tokens[:br.j].tolist() + [br.token]
            qs = None
            toks = [br.token]
            if br.depth:
                if hasattr(run.drafter, "fork"):
                    run.drafter.fork(run.seq, branch_seq, len(prefix) - 1)
                d = await run.draft(prefix, br.depth, branch_seq)
                toks += d.tokens.tolist()
                qs = d.q
            out.append((br, toks, qs))
        return out

    def _remember_guesses(self, made, draft) -> None:
        """Keep each drafted node's recovery guesses, to learn P(c | rejection) later."""
        ranks = draft.q if draft.ranks is None else draft.ranks
        for node, r in zip(made, ranks):
            self._guess[node.node_id] = (guesses(r, node.token, self.run.cfg.cache.guesses),
                                         float(r[node.token]))
        if len(self._guess) > 4 * self.run.cfg.max_window:  # forget nodes below the root
            root = self.tree.root.node_id
            self._guess = {k: v for k, v in self._guess.items() if k > root}
