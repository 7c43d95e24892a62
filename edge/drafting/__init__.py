"""Drafters behind one interface, `Drafter.draft(context, n, sampling, rng) -> Draft`:

    base.py    Draft, the Drafter protocol, draw (sampling a draft from q)
    llama.py   LlamaDrafter: llama.cpp on a GGUF file (batched, forked sequences)
    ngram.py   NgramDrafter: prompt lookup, no model (tests, and a drafter-less edge)
"""
