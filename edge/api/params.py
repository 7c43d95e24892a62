"""Every request field this server knows, and what it does with it.

A field of a /v1/completions or /v1/chat/completions body is one of:
  honoured   parsed and acted on (openai_types.parse_request);
  off-only   a feature this server does not implement, accepted only at a value that means
             "off" (SDKs send those: `n: 1`, `presence_penalty: 0`, `store: false`), else a
             400 naming the field;
  unknown    anything else: a 400 naming the field. Nothing is silently ignored.
"""

from __future__ import annotations

import json

from acespec.edge.api.errors import ApiError, same_json

_BOTH = frozenset({
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "seed",
    "stop", "stream", "stream_options", "user", "safety_identifier", "metadata",
    "top_k", "ignore_eos",  # vLLM's extensions
    "sampling",  # AceSpec's: "coupled" | "exact"
    "offline",  # AceSpec's: "wait" | "local" (while the verifier cannot be reached)
    "logprobs",  # the target's (acespec.shared.logprobs): chat true|false, completions 0..20
    "presence_penalty", "frequency_penalty", "repetition_penalty",  # acespec.shared.penalties
    "response_format",  # structured output (edge.api.structured)
})
HONOURED = {True: _BOTH | {"messages", "top_logprobs", "tools", "tool_choice",
                           "parallel_tool_calls"},
            False: _BOTH | {"prompt", "parse_special", "echo"}}

# Off-only fields -> the values that mean "off" (null always does). logit_bias and min_p
# would change the served distribution: they belong at the verifier, which does not take
# them; echo is a completions field; `functions` (the tools' deprecated form), audio and
# the hosted features are not served here.
OFF: dict[str, tuple] = {
    "echo": (False,), "best_of": (1,), "suffix": ("",), "logit_bias": ({},),
    "functions": ([],), "function_call": ("none",), "store": (False,),
    "service_tier": ("auto", "default"), "modalities": (["text"],), "audio": (),
    "prediction": (), "reasoning_effort": (), "verbosity": (), "web_search_options": (),
    "prompt_cache_key": (),
    # vLLM's extensions, at what this server does anyway
    "min_p": (0,), "min_tokens": (0,), "stop_token_ids": ([],),
    "include_stop_str_in_output": (False,), "skip_special_tokens": (True,),
    "add_generation_prompt": (True,), "continue_final_message": (False,),
}


def is_off(value, offs: tuple) -> bool:
    return value is None or any(same_json(value, v) for v in offs)


def off_values(offs: tuple) -> str:
    return " or ".join(json.dumps(v) for v in (None, *offs))


def check_off(name: str, value, offs: tuple) -> None:
    """ApiError 400 naming `name` (as the client spells it) unless `value` is one of the
    values that change nothing (`offs`, or null)."""
    if not is_off(value, offs):
        raise ApiError(400, f"'{name}' is not supported by this server (accepted only as "
                       f"{off_values(offs)})", name, code="unsupported_parameter")


def check_fields(body: dict, chat: bool) -> None:
    """ApiError 400 naming the first field that is unknown here, or off-only and not off."""
    honoured = HONOURED[chat]
    for name, value in body.items():
        if name in honoured:
            continue
        if name in OFF:
            check_off(name, value, OFF[name])
            continue
        where = "/v1/chat/completions" if chat else "/v1/completions"
        raise ApiError(400, f"Unrecognized request argument supplied: '{name:.80}' (not a "
                       f"parameter of {where} on this server)", name[:80],
                       code="unknown_parameter")
