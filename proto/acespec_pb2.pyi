from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "send_mass", "k_max", "tail_samples", "tail_samples_set", "coupled", "presence_penalty", "frequency_penalty", "repetition_penalty", "output_from", "grammar")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEND_MASS_FIELD_NUMBER: _ClassVar[int]
    K_MAX_FIELD_NUMBER: _ClassVar[int]
    TAIL_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TAIL_SAMPLES_SET_FIELD_NUMBER: _ClassVar[int]
    COUPLED_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FROM_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    send_mass: float
    k_max: int
    tail_samples: int
    tail_samples_set: bool
    coupled: bool
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    output_from: int
    grammar: str
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., send_mass: _Optional[float] = ..., k_max: _Optional[int] = ..., tail_samples: _Optional[int] = ..., tail_samples_set: _Optional[bool] = ..., coupled: _Optional[bool] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., output_from: _Optional[int] = ..., grammar: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_live_nodes",)
    MAX_LIVE_NODES_FIELD_NUMBER: _ClassVar[int]
    max_live_nodes: int
    def __init__(self, max_live_nodes: _Optional[int] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("protocol_version", "vocab_hash", "prompt_tokens", "sampling", "seed", "limits", "decide")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_HASH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DECIDE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    vocab_hash: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: Sampling
    seed: int
    limits: Limits
    decide: Decide
    def __init__(self, protocol_version: _Optional[int] = ..., vocab_hash: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., seed: _Optional[int] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., decide: _Optional[_Union[Decide, _Mapping]] = ...) -> None: ...

class Decide(_message.Message):
    __slots__ = ("max_tokens", "stop_tokens", "no_gap", "logprobs", "top_logprobs", "first_before_opened")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NO_GAP_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FIRST_BEFORE_OPENED_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    stop_tokens: _containers.RepeatedScalarFieldContainer[int]
    no_gap: bool
    logprobs: bool
    top_logprobs: int
    first_before_opened: bool
    def __init__(self, max_tokens: _Optional[int] = ..., stop_tokens: _Optional[_Iterable[int]] = ..., no_gap: _Optional[bool] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., first_before_opened: _Optional[bool] = ...) -> None: ...

class Grow(_message.Message):
    __slots__ = ("anchor", "tokens", "first_parent", "branch_index", "branch_parent")
    ANCHOR_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FIRST_PARENT_FIELD_NUMBER: _ClassVar[int]
    BRANCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    BRANCH_PARENT_FIELD_NUMBER: _ClassVar[int]
    anchor: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    first_parent: int
    branch_index: _containers.RepeatedScalarFieldContainer[int]
    branch_parent: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, anchor: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., first_parent: _Optional[int] = ..., branch_index: _Optional[_Iterable[int]] = ..., branch_parent: _Optional[_Iterable[int]] = ...) -> None: ...

class Extend(_message.Message):
    __slots__ = ("tokens", "branch_index", "branch_parent", "commit")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    BRANCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    BRANCH_PARENT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    branch_index: _containers.RepeatedScalarFieldContainer[int]
    branch_parent: _containers.RepeatedScalarFieldContainer[int]
    commit: int
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., branch_index: _Optional[_Iterable[int]] = ..., branch_parent: _Optional[_Iterable[int]] = ..., commit: _Optional[int] = ...) -> None: ...

class Commit(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class MoreTail(_message.Message):
    __slots__ = ("node_id", "n")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    n: int
    def __init__(self, node_id: _Optional[int] = ..., n: _Optional[int] = ...) -> None: ...

class Uplink(_message.Message):
    __slots__ = ("open", "extend", "commit", "more_tail", "grow")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    EXTEND_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    MORE_TAIL_FIELD_NUMBER: _ClassVar[int]
    GROW_FIELD_NUMBER: _ClassVar[int]
    open: Open
    extend: Extend
    commit: Commit
    more_tail: MoreTail
    grow: Grow
    def __init__(self, open: _Optional[_Union[Open, _Mapping]] = ..., extend: _Optional[_Union[Extend, _Mapping]] = ..., commit: _Optional[_Union[Commit, _Mapping]] = ..., more_tail: _Optional[_Union[MoreTail, _Mapping]] = ..., grow: _Optional[_Union[Grow, _Mapping]] = ...) -> None: ...

class Scores(_message.Message):
    __slots__ = ("first_node_id", "self_p", "n_entries", "entry_id_delta", "entry_p", "tail_p", "n_tail_samples", "tail_token", "tail_token_p", "greedy_token", "server_time")
    FIRST_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SELF_P_FIELD_NUMBER: _ClassVar[int]
    N_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_DELTA_FIELD_NUMBER: _ClassVar[int]
    ENTRY_P_FIELD_NUMBER: _ClassVar[int]
    TAIL_P_FIELD_NUMBER: _ClassVar[int]
    N_TAIL_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TAIL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TAIL_TOKEN_P_FIELD_NUMBER: _ClassVar[int]
    GREEDY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    first_node_id: int
    self_p: _containers.RepeatedScalarFieldContainer[int]
    n_entries: _containers.RepeatedScalarFieldContainer[int]
    entry_id_delta: _containers.RepeatedScalarFieldContainer[int]
    entry_p: _containers.RepeatedScalarFieldContainer[int]
    tail_p: _containers.RepeatedScalarFieldContainer[int]
    n_tail_samples: _containers.RepeatedScalarFieldContainer[int]
    tail_token: _containers.RepeatedScalarFieldContainer[int]
    tail_token_p: _containers.RepeatedScalarFieldContainer[int]
    greedy_token: _containers.RepeatedScalarFieldContainer[int]
    server_time: int
    def __init__(self, first_node_id: _Optional[int] = ..., self_p: _Optional[_Iterable[int]] = ..., n_entries: _Optional[_Iterable[int]] = ..., entry_id_delta: _Optional[_Iterable[int]] = ..., entry_p: _Optional[_Iterable[int]] = ..., tail_p: _Optional[_Iterable[int]] = ..., n_tail_samples: _Optional[_Iterable[int]] = ..., tail_token: _Optional[_Iterable[int]] = ..., tail_token_p: _Optional[_Iterable[int]] = ..., greedy_token: _Optional[_Iterable[int]] = ..., server_time: _Optional[int] = ...) -> None: ...

class Opened(_message.Message):
    __slots__ = ("session_id", "model_id", "vocab_hash", "max_live_nodes", "k_max", "root", "coupled", "decides", "gap")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VOCAB_HASH_FIELD_NUMBER: _ClassVar[int]
    MAX_LIVE_NODES_FIELD_NUMBER: _ClassVar[int]
    K_MAX_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    COUPLED_FIELD_NUMBER: _ClassVar[int]
    DECIDES_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model_id: str
    vocab_hash: str
    max_live_nodes: int
    k_max: int
    root: Scores
    coupled: bool
    decides: bool
    gap: bool
    def __init__(self, session_id: _Optional[str] = ..., model_id: _Optional[str] = ..., vocab_hash: _Optional[str] = ..., max_live_nodes: _Optional[int] = ..., k_max: _Optional[int] = ..., root: _Optional[_Union[Scores, _Mapping]] = ..., coupled: _Optional[bool] = ..., decides: _Optional[bool] = ..., gap: _Optional[bool] = ...) -> None: ...

class Decided(_message.Message):
    __slots__ = ("position", "tokens", "passes", "done", "counts", "acked", "held_us", "logprobs")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    HELD_US_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    position: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    passes: int
    done: bool
    counts: DecidedCounts
    acked: int
    held_us: int
    logprobs: Logprobs
    def __init__(self, position: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., passes: _Optional[int] = ..., done: _Optional[bool] = ..., counts: _Optional[_Union[DecidedCounts, _Mapping]] = ..., acked: _Optional[int] = ..., held_us: _Optional[int] = ..., logprobs: _Optional[_Union[Logprobs, _Mapping]] = ...) -> None: ...

class Logprobs(_message.Message):
    __slots__ = ("token", "top_n", "top_id", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    TOP_ID_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: _containers.RepeatedScalarFieldContainer[float]
    top_n: int
    top_id: _containers.RepeatedScalarFieldContainer[int]
    top: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token: _Optional[_Iterable[float]] = ..., top_n: _Optional[int] = ..., top_id: _Optional[_Iterable[int]] = ..., top: _Optional[_Iterable[float]] = ...) -> None: ...

class DecidedCounts(_message.Message):
    __slots__ = ("wall_us", "busy_us", "drafts_received", "drafts_scored", "drafts_reconciled", "dead_skipped", "continuation", "hits", "hits_restarted", "lone_passes", "lone_tokens", "proposed", "proposed_accepted", "gap_us")
    WALL_US_FIELD_NUMBER: _ClassVar[int]
    BUSY_US_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_SCORED_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_RECONCILED_FIELD_NUMBER: _ClassVar[int]
    DEAD_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    HITS_RESTARTED_FIELD_NUMBER: _ClassVar[int]
    LONE_PASSES_FIELD_NUMBER: _ClassVar[int]
    LONE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    GAP_US_FIELD_NUMBER: _ClassVar[int]
    wall_us: int
    busy_us: int
    drafts_received: int
    drafts_scored: int
    drafts_reconciled: int
    dead_skipped: int
    continuation: int
    hits: int
    hits_restarted: int
    lone_passes: int
    lone_tokens: int
    proposed: int
    proposed_accepted: int
    gap_us: int
    def __init__(self, wall_us: _Optional[int] = ..., busy_us: _Optional[int] = ..., drafts_received: _Optional[int] = ..., drafts_scored: _Optional[int] = ..., drafts_reconciled: _Optional[int] = ..., dead_skipped: _Optional[int] = ..., continuation: _Optional[int] = ..., hits: _Optional[int] = ..., hits_restarted: _Optional[int] = ..., lone_passes: _Optional[int] = ..., lone_tokens: _Optional[int] = ..., proposed: _Optional[int] = ..., proposed_accepted: _Optional[int] = ..., gap_us: _Optional[int] = ...) -> None: ...

class TailSamples(_message.Message):
    __slots__ = ("node_id", "tail_token", "tail_token_p")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TAIL_TOKEN_P_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    tail_token: _containers.RepeatedScalarFieldContainer[int]
    tail_token_p: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[int] = ..., tail_token: _Optional[_Iterable[int]] = ..., tail_token_p: _Optional[_Iterable[int]] = ...) -> None: ...

class Downlink(_message.Message):
    __slots__ = ("opened", "scores", "tail", "decided")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    DECIDED_FIELD_NUMBER: _ClassVar[int]
    opened: Opened
    scores: Scores
    tail: TailSamples
    decided: Decided
    def __init__(self, opened: _Optional[_Union[Opened, _Mapping]] = ..., scores: _Optional[_Union[Scores, _Mapping]] = ..., tail: _Optional[_Union[TailSamples, _Mapping]] = ..., decided: _Optional[_Union[Decided, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("protocol_version", "vocab_hash", "prompt_tokens", "sampling", "seed", "max_tokens", "stop_tokens", "logprobs", "top_logprobs", "prompt_logprobs")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_HASH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    vocab_hash: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: Sampling
    seed: int
    max_tokens: int
    stop_tokens: _containers.RepeatedScalarFieldContainer[int]
    logprobs: bool
    top_logprobs: int
    prompt_logprobs: bool
    def __init__(self, protocol_version: _Optional[int] = ..., vocab_hash: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop_tokens: _Optional[_Iterable[int]] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[bool] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("tokens", "done", "passes", "logprobs", "prompt_logprobs")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    done: bool
    passes: int
    logprobs: Logprobs
    prompt_logprobs: Logprobs
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., done: _Optional[bool] = ..., passes: _Optional[int] = ..., logprobs: _Optional[_Union[Logprobs, _Mapping]] = ..., prompt_logprobs: _Optional[_Union[Logprobs, _Mapping]] = ...) -> None: ...
