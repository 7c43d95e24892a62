"""Prompt sets for `acespec bench --dataset NAME`: real chats rendered for the pair.

    shipped   the shipped set (sim/data/bench_prompts.jsonl) or `--prompts FILE`
    sharegpt  first user turns of ShareGPT V3 (acespec.models.sharegpt; fetched and cached on
              first use), by default from the evaluation split, balanced over its categories
              and rendered with the pair's chat template, so each prompt asks for an answer
"""

from __future__ import annotations

from acespec.models import sharegpt
from acespec.pairs import render_chat

DATASETS = ("shipped", "sharegpt")


def sharegpt_prompts(template: str | None, split: str = "eval", per_category: int = 10,
                     max_chars: int = 1500) -> list[dict]:
    """[{id, category, prompt, user}] from ShareGPT `split`: up to `per_category` English
    first turns of at most max_chars per category, in file order, each rendered with
    `template` (a chat template is needed: these are chat prompts)."""
    if not template:
        raise ValueError("--dataset sharegpt needs a chat template: use --pair smollm2 or a "
                         "drafter GGUF that carries one")
    chats = sharegpt.prompts_by_category(sharegpt.records(split), per_category, max_chars)
    return [{"id": f"sharegpt-{c.index}", "category": c.category, "user": c.first_user,
             "prompt": render_chat(template, c.first_user)} for c in chats]
