"""Instruction prompts for the SmolLM2 drafter's corpus: templates x topics, plus functions
from this interpreter's standard library to explain, document, fix or continue.

Deterministic given the seed and the Python version. Topics and standard-library files are
split into train and held-out sets *before* prompts are built, so no held-out prompt shares
a topic or a source file with a training prompt.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CODE_TASKS = """reverse a string; check whether a number is prime; compute the factorial of n;
return the n-th Fibonacci number; merge two sorted lists; remove duplicates from a list while
keeping order; count the words in a text file; find the largest element in a list; flatten a
nested list; check whether a string is a palindrome; convert Celsius to Fahrenheit; sort a list
of dictionaries by a key; read a CSV file and sum a column; compute the average of a list of
numbers; find the most common element in a list; validate an email address with a regular
expression; implement binary search; implement bubble sort; implement quicksort; implement merge
sort; compute the greatest common divisor of two numbers; check whether two strings are anagrams;
generate all permutations of a list; generate all subsets of a set; transpose a matrix; multiply
two matrices; count vowels in a string; capitalize the first letter of each word; parse a date
string into a datetime; compute the number of days between two dates; download a web page with
urllib; write a dictionary to a JSON file; load a JSON file into a dictionary; find all files with
a given extension in a folder; rename files in a directory; implement a stack class; implement a
queue class; implement a linked list; implement a binary search tree insert; compute the depth of
a binary tree; check balanced parentheses; convert a number to binary; convert a Roman numeral to
an integer; convert an integer to a Roman numeral; compute the sum of digits of a number; find
the second largest number in a list; split a list into chunks of size n; rotate a list by k
positions; compute a moving average; find common elements of two lists; group words by their
first letter; count character frequencies; check whether a year is a leap year; generate a random
password; compute compound interest; compute the area of a circle; find prime numbers up to n with
a sieve; compute the power set; memoize a recursive function; retry a function call on exception;
time how long a function takes; read a file line by line; remove whitespace from a string; check
whether a list is sorted; find the median of a list; compute the standard deviation; normalize a
list of numbers; find the longest word in a sentence; implement a simple LRU cache; parse command
line arguments with argparse; run a shell command and capture its output; zip two lists into a
dictionary; invert a dictionary; deep copy a nested structure; implement run-length encoding;
decode run-length encoding; compute the Levenshtein distance; find the longest common prefix;
count lines in a file; print a multiplication table; simulate rolling two dice; shuffle a list;
compute a histogram of values; find pairs that sum to a target; compute the dot product of two
vectors; implement a simple calculator; convert a list of tuples to a dictionary; check whether a
number is a perfect square; find the missing number in a sequence; compute the least common
multiple; convert snake_case to camelCase; convert camelCase to snake_case; truncate a string with
an ellipsis; pad a number with leading zeros; validate a phone number; compute the checksum of a
file; implement a generator of even numbers; use a context manager to open a file; write a class
for a bank account; write a dataclass for a point; sort a string's characters; count the words in
a sentence; extract numbers from a string; check whether a string contains only digits"""

CONCEPTS = """recursion; photosynthesis; the water cycle; machine learning; neural networks;
the internet; HTTP; DNS; encryption; public key cryptography; blockchain; inflation; supply and
demand; climate change; the greenhouse effect; black holes; gravity; evolution; DNA; vaccines;
the immune system; democracy; the French Revolution; the Roman Empire; the industrial revolution;
renewable energy; solar panels; electric cars; the stock market; compound interest; object
oriented programming; functional programming; version control with git; databases; SQL; REST APIs;
cloud computing; operating systems; compilers; garbage collection; big O notation; hash tables;
linked lists; sorting algorithms; binary search; the Pythagorean theorem; prime numbers;
probability; statistics; the scientific method; plate tectonics; volcanoes; earthquakes; the moon
phases; the seasons; rainbows; the human heart; sleep; nutrition; exercise; meditation; time
management; public speaking; writing a resume; job interviews; learning a new language; the
causes of World War I; the printing press; the Renaissance; artificial intelligence; large
language models; the Python programming language; unit testing; debugging; recursion versus
iteration; multithreading; asynchronous programming; caching; computer memory; CPUs; GPUs;
quantum computing; the speed of light; electricity; magnetism; batteries; the periodic table;
chemical reactions; acids and bases; the carbon cycle; ecosystems; biodiversity; bees and
pollination; ocean currents; weather forecasting; budgeting; saving for retirement; credit scores;
taxes; marketing; customer service; teamwork; leadership; negotiation; critical thinking;
creativity; habits; stress; coffee; tea; bread baking; composting; gardening; recycling; minimalism;
the Olympic Games; chess; music theory; photography; poetry; the novel; film editing"""

ACTIVITIES = """studying for an exam; learning to code; staying productive at home; running a
first marathon; cooking healthy meals on a budget; saving money; traveling on a budget; improving
sleep; reducing screen time; starting a small business; writing a blog; learning to draw; keeping
a plant alive; moving to a new city; preparing for a job interview; making new friends; reading
more books; learning to swim; organizing a kitchen; planning a birthday party; hosting a dinner;
writing clean code; reviewing a pull request; giving feedback; running a meeting; reducing waste;
training a puppy; learning guitar; taking better photos; staying motivated"""

CHAT_TEMPLATES = ["Explain {c} in simple terms.", "What is {c}?", "Give me a short overview of {c}.",
                  "Describe {c} to a beginner.", "What are the main ideas behind {c}?",
                  "Why is {c} important?", "Write a short paragraph about {c}.",
                  "List three facts about {c}.", "Can you summarize {c} in a few sentences?",
                  "How would you teach {c} to a ten-year-old?"]
ACTIVITY_TEMPLATES = ["Give me some tips for {c}.", "What should I know before {c}?",
                      "Write a short checklist for {c}.", "How do I get better at {c}?",
                      "What are common mistakes when {c}?"]
CODE_TEMPLATES = ["Write a Python function to {c}.", "How do I {c} in Python?",
                  "Show me Python code to {c}.", "Write a Python function that can {c}. "
                  "Include a docstring.", "Implement a function to {c} and explain it briefly.",
                  "Write a short Python script to {c}.", "Can you write code to {c}?"]
SNIPPET_TEMPLATES = ["Explain what this Python function does:\n```python\n{c}\n```",
                     "Write a docstring for this function:\n```python\n{c}\n```",
                     "Is there a bug in this code?\n```python\n{c}\n```",
                     "Rewrite this function to be more readable:\n```python\n{c}\n```",
                     "Complete this Python code:\n```python\n{h}",
                     "Add comments to this code:\n```python\n{c}\n```"]


@dataclass(frozen=True)
class Prompt:
    text: str  # the user message
    kind: str  # "chat" | "code"


def _items(block: str) -> list[str]:
    return [" ".join(s.split()) for s in block.split(";") if s.strip()]


def _held_out(name: str, frac: float) -> bool:
    """Stable split by name (not by the seed): the held-out set never moves."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 2**32 < frac


def stdlib_functions(max_files: int | None = None, max_lines: int = 24) -> dict[str, list[str]]:
    """{relative file: [source of each top-level or method def of 4..max_lines lines]}."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: dict[str, list[str]] = {}
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts
                   and "test" not in p.parts and "idlelib" not in p.parts)
    for path in files[:max_files]:
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = src.splitlines()
        defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        snippets = []
        for n in defs:
            body = lines[n.lineno - 1:n.end_lineno]
            if 4 <= len(body) <= max_lines and all(len(x) < 100 for x in body):
                indent = len(body[0]) - len(body[0].lstrip())
                snippets.append("\n".join(x[indent:] for x in body))
        if snippets:
            out[str(path.relative_to(root))] = snippets
    return out


def build_prompts(n_train: int, n_eval: int, seed: int, held_frac: float = 0.15,
                  max_files: int | None = None) -> dict[str, list[Prompt]]:
    """{'train': n_train prompts, 'eval_chat': n_eval, 'eval_code': n_eval}. Train: half
    chat (explain / tips), then code tasks, the rest standard-library snippets; eval_code:
    half tasks, half snippets."""
    rng = np.random.default_rng(seed)
    pools = {s: {"chat": [], "code": [], "snippet": []} for s in ("train", "eval")}
    for block, templates, kind in ((CONCEPTS, CHAT_TEMPLATES, "chat"),
                                   (ACTIVITIES, ACTIVITY_TEMPLATES, "chat"),
                                   (CODE_TASKS, CODE_TEMPLATES, "code")):
        for item in _items(block):
            split = "eval" if _held_out(item, held_frac) else "train"
            pools[split][kind].extend(Prompt(t.format(c=item), kind) for t in templates)
    for name, snippets in stdlib_functions(max_files).items():
        split = "eval" if _held_out(name, held_frac) else "train"
        for s in snippets:
            t = SNIPPET_TEMPLATES[int(rng.integers(len(SNIPPET_TEMPLATES)))]
            head = "\n".join(s.splitlines()[:max(2, len(s.splitlines()) // 2)])
            pools[split]["snippet"].append(Prompt(t.format(c=s, h=head), "code"))

    def take(items: list[Prompt], n: int) -> list[Prompt]:
        idx = rng.permutation(len(items))[:n]
        return [items[i] for i in idx]

    tr, ev = pools["train"], pools["eval"]
    chat = take(tr["chat"], n_train // 2)
    code = take(tr["code"], (n_train - len(chat)) // 2)
    train = chat + code + take(tr["snippet"], n_train - len(chat) - len(code))
    train = [train[i] for i in rng.permutation(len(train))]
    eval_code = take(ev["code"], n_eval // 2)
    return {"train": train, "eval_chat": take(ev["chat"], n_eval),
            "eval_code": eval_code + take(ev["snippet"], n_eval - len(eval_code))}
