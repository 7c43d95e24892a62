"""The verifier's gap drafter: an operator's small drafter on the cloud side (torch, no
llama.cpp) that fills the passes no edge draft covers.

In a decided session the verifier never waits for the link (docs/design.md §3). After a miss, the
edge learns of it a round trip later, so the verifier decides a few passes alone ("lone
passes", one token each with nothing to score). Prompt lookup fills some of them where the
text repeats itself; a gap drafter proposes the next `--propose` tokens from the session's
decided text in any text. Its proposals are scored in the lone pass and walked like any
draft: every verdict stays the deterministic function of (seed, position, p~) it is, so
greedy and coupled output are unchanged; only passes are saved. What it costs is its own
decoding, before each lone pass (counted per session as `gap_s`).

The drafter is a GGUF (the edge's own drafter file, dequantized by acespec.models.gguf_to_hf)
or a Hugging Face checkpoint folder, with the target's tokenizer. Each session keeps its
own KV cache in the drafter's page pool, holding the decided text; proposals are decoded
past it and dropped again (the next call re-feeds what was decided).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from acespec.argtypes import ms_profile
from acespec.cloud.target.config import UnsupportedModel
from acespec.cloud.target.kv_cache import KVCache
from acespec.cloud.target.model import Request, Transformer
from acespec.cloud.target.packed import select_linear
from acespec.cloud.verify.gap_file import read
from acespec.shared.tokenizer import ModelFileError

log = logging.getLogger(__name__)


WARMUP = 4  # the drafter's first calls always run (they measure what it earns)
EXPLORE = 8  # while it does not pay, one lone pass in this many still asks it
DECAY = 0.98  # the ledger's memory per call (about the last 50 calls count)
STEP_DECAY = 0.9  # per batch: a draft step's seconds, over the last ~10 batches
Pick = Callable  # (logits [V] float32 numpy, position) -> the proposed token


CREDIT_KEPT = 256  # positions behind the decided end whose credit an edge draft may take back


@dataclass
class Ledger:
    """What the drafter has earned and spent, over all sessions (one drafter, one target,
    one kind of traffic), recent calls weighing most. Earned: its accepted proposals beyond
    what prompt lookup (free) would have had accepted in the same passes, each saving
    about a pass. Spent: its wall seconds, cache prefills of new sessions included."""

    calls: int = 0
    earned_s: float = 0.0
    spent_s: float = 0.0
    skipped: int = 0  # lone passes since the last call, while it does not pay

    def settle(self, accepted: int, baseline: int, pass_s: float, spent_s: float) -> None:
        """A call's pass took `accepted` of its proposals, where lookup's would have had
        `baseline` taken (verdicts do not depend on proposals: exact up to the tokens the
        pass decided); the call took spent_s."""
        self.calls += 1
        self.earned_s = DECAY * self.earned_s + (accepted - baseline) * pass_s
        self.spent_s = DECAY * self.spent_s + spent_s

    def refund(self, seconds: float) -> None:
        """Take back credit its proposals did not earn (GapState.brought)."""
        self.earned_s -= seconds

    def worth(self, sharing: float = 1.0) -> bool:
        """Ask the drafter in this lone pass? sharing: the sessions that share the device
        (acespec.cloud.verify.batcher.Batcher.sharing). A draft step holds the device, so
        every one of them waits it out: its seconds cost that many session-seconds, while
        what it earns is the device's time for the passes it saved one session. Asked during the first WARMUP calls, and
        while it has earned what it cost; else once in EXPLORE x sharing lone passes (prompt
        lookup proposes in the others), so that exploring costs the same under load. Idle
        the drafter thus drafts wherever it pays; as the device fills, it stops."""
        load = max(1.0, sharing)
        if self.calls < WARMUP or self.earned_s >= self.spent_s * load:
            return True
        self.skipped += 1
        if self.skipped >= EXPLORE * load:
            self.skipped = 0
            return True
        return False


@dataclass
class GapState:
    """One session's drafter cache: it holds the session's text [:fed]. And what its
    proposals were credited for, until an edge draft shows what they saved."""

    cache: KVCache
    ledger: Ledger  # the drafter's, which an unearned credit goes back to
    fed: int = 0
    calls: int = 0
    credited: dict[int, tuple[float, float]] = field(default_factory=dict)  # position ->
    # (seconds credited, perf_counter when decided), for the positions its proposals decided
    # beyond lookup's

    def credit(self, first: int, n: int, seconds: float) -> None:
        """Its proposals decided positions first..first+n-1 (beyond lookup's), each credited
        `seconds` (a pass)."""
        now = time.perf_counter()
        for position in range(first, first + n):
            self.credited[position] = (seconds, now)
        for position in [p for p in self.credited if p < first - CREDIT_KEPT]:
            del self.credited[position]

    def brought(self, position: int) -> None:
        """An edge draft brought the token already decided at `position`: had the drafter not
        proposed it, the draft would have decided it, so the proposal saved at most the time
        between its pass and the draft's arrival. The rest of its credit goes back to the ledger."""
        got = self.credited.pop(position, None)
        if got is not None:
            seconds, at = got
            self.ledger.refund(max(0.0, seconds - (time.perf_counter() - at)))


@dataclass(frozen=True)
class DraftEmulation:
    """TESTBED knob (`--emulate-cloud-draft-ms T0[,PER_SEQ]`): pad each batched draft step
    to a co-located draft model's step on the target's device, T0 plus PER_SEQ per session
    in the batch, milliseconds. The real decode counts toward it."""

    base_ms: float = 0.0
    per_seq_ms: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> DraftEmulation:
        if not text:
            return cls()
        return cls(*ms_profile(text, "T0[,PER_SEQ] >= 0", 2, flag="--emulate-cloud-draft-ms"))

    def seconds(self, seqs: int) -> float:
        return (self.base_ms + self.per_seq_ms * seqs) / 1000

    def pad(self, seqs: int, spent_s: float) -> None:
        """Sleep what a step of `seqs` sessions has left after the real `spent_s`."""
        left = self.seconds(seqs) - spent_s
        if left > 0:
            time.sleep(left)


@dataclass
class Ask:
    """One session's request for proposals."""

    state: GapState
    text: list[int]  # the session's decided text
    k: int  # at most this many proposals
    pick: Pick | None = None
    fut: asyncio.Future | None = None


class GapDrafter:
    """Greedy proposals from a small torch model; the asks of all sessions that wait at
    once are decoded as one batch."""

    def __init__(self, model: Transformer, name: str,
                 emulation: DraftEmulation = DraftEmulation()):
        self.model, self.name, self.emulation = model, name, emulation
        self.ledger = Ledger()  # whether it pays (the engine asks and settles)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gap")
        # Where draft steps run. The engine hands it the target's worker: a co-located
        # drafter takes the device's time between the target's passes, as it would on a GPU.
        self.executor: Executor = self._pool
        self._asks: list[Ask] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.busy_s = 0.0  # seconds of draft batches
        self.step_s = 0.0  # seconds of one batched draft step, recently (0: none yet)
        self.on_batch = None  # callback(seconds) per batch, for metrics

    @classmethod
    def load(cls, path: str | Path, vocab_hash: str, vocab: int, dtype: str = "float32",
             device: str = "cpu", linear: str = "auto",
             emulation: DraftEmulation = DraftEmulation()) -> GapDrafter:
        """The drafter at `path` (a .gguf file or an HF checkpoint folder), its linears as
        the target's (`--linear`). Raises ValueError unless it has the target's tokenizer
        (vocab_hash) and vocabulary size."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"--gap-drafter {path}: no such file or folder")
        try:
            theirs, model = read(path, dtype, device)
        except (ModelFileError, UnsupportedModel) as e:  # each message starts with a path
            raise type(e)(f"--gap-drafter {e}") from None
        if theirs != vocab_hash or model.args.vocab_size != vocab:
            raise ValueError(f"--gap-drafter {path}: its tokenizer ({theirs}, vocab "
                             f"{model.args.vocab_size}) is not the target's ({vocab_hash}, "
                             f"vocab {vocab}); the gap drafter must share the target's tokenizer")
        # No set_threads: torch's thread count is the process's, set for the target.
        select_linear(linear, model)
        log.info("gap drafter %s: %d layers, %.1fM params, proposes in lone passes", path.name,
                 model.args.num_layers, sum(p.numel() for p in model.parameters()) / 1e6)
        return cls(model, path.name, emulation)

    def open(self) -> GapState:
        return GapState(self.model.new_cache(256), self.ledger)

    def propose(self, state: GapState, text: Sequence[int], k: int,
                pick: Pick | None = None) -> list[int]:
        """Up to k tokens after `text` [D] (the session's decided text); fewer near the
        drafter's context end. pick(logits [V], position) chooses each (default: greedy;
        the engine passes the session's own verdict rule, so that in a coupled session the
        drafter's pick at a position is its Gumbel-max with the target's noise there, the
        edge's coupled drafting). The cache holds text afterwards, never the proposals."""
        return self.propose_batch([Ask(state, list(text), k, pick)])[0]

    def propose_batch(self, asks: Sequence[Ask]) -> list[list[int]]:
        """Each ask's proposals, decoded together: one batched forward per draft step over
        the asks still drafting (the first step feeds each session's text not yet in its
        cache), each step padded to the emulated step time."""
        outs: list[list[int]] = [[] for _ in asks]
        ks = [min(a.k, self.model.args.max_position_embeddings - len(a.text)) if a.text else 0
              for a in asks]
        live, feed = [], []  # indices of the asks still drafting; what each feeds next
        for i, a in enumerate(asks):
            if ks[i] > 0:
                a.state.calls += 1
                keep = min(a.state.fed, len(a.text) - 1)  # the last token is fed again
                a.state.cache.truncate(keep)
                live.append(i)
                feed.append(list(map(int, a.text[keep:])))
        with torch.inference_mode():
            while live:
                t0 = time.perf_counter()
                rows = self.model.forward_batch([Request(f, asks[i].state.cache, None,
                                                         last_only=True)
                                                 for i, f in zip(live, feed)])
                self.emulation.pad(len(live), time.perf_counter() - t0)
                self._time_step(time.perf_counter() - t0)
                for i, row in zip(live, rows):
                    self._pick(asks[i], outs[i], row[-1])
                live = [i for i in live if len(outs[i]) < ks[i]]
                feed = [outs[i][-1:] for i in live]
        for i, a in enumerate(asks):
            if ks[i] > 0:
                a.state.cache.truncate(len(a.text))
                a.state.fed = len(a.text)
        return outs

    def _time_step(self, seconds: float) -> None:
        """A draft step took `seconds` (what a proposal costs the pass's depth)."""
        self.step_s = seconds if not self.step_s else \
            STEP_DECAY * self.step_s + (1 - STEP_DECAY) * seconds

    @staticmethod
    def _pick(ask: Ask, out: list[int], logits: torch.Tensor) -> None:
        """Append the next proposal to `out`, from the drafter's logits [V]."""
        out.append(int(logits.argmax()) if ask.pick is None else
                   ask.pick(logits.float().cpu().numpy(), len(ask.text) + len(out)))

    async def propose_async(self, state: GapState, text: Sequence[int], k: int,
                            pick: Pick | None = None) -> tuple[list[int], float]:
        """propose() batched with every other session's ask that is waiting, on
        `self.executor`: (tokens, this session's share of the batch's seconds)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wake = asyncio.Event()  # this loop's (a drafter may outlive a loop)
            self._task = loop.create_task(self._worker())
        ask = Ask(state, list(text), k, pick, loop.create_future())
        self._asks.append(ask)
        self._wake.set()
        return await ask.fut

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            asks, self._asks = [a for a in self._asks if not a.fut.done()], []
            if not asks:
                continue
            t0 = time.perf_counter()
            try:
                outs = await loop.run_in_executor(self.executor, self.propose_batch, asks)
            except Exception as e:  # noqa: BLE001 - a failed batch fails its asks only
                log.exception("gap drafter batch of %d failed", len(asks))
                outs = [e] * len(asks)
            seconds = time.perf_counter() - t0
            self.busy_s += seconds
            if self.on_batch:
                self.on_batch(seconds)
            for a, out in zip(asks, outs):
                if a.fut.done():
                    continue
                if isinstance(out, BaseException):
                    a.fut.set_exception(out)
                else:
                    a.fut.set_result((out, seconds / len(asks)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
