"""The speculation tree (docs/design.md §6): the trees of both session kinds and the
math that sizes them, as pure functions and plain data (no sockets, no drafter):

    exact_tree.py   SpecTree: the nodes an edge-decided session sent, with their scores (the walk's input)
    grow_tree.py    GrowTree: a decided session's tree of likely continuations, re-rooted by
                    each decided token
    branches.py     the edge-decided sessions' guessed branches: which (position, guess, depth) to build
    allocator.py    the Lagrangian allocation of candidates under several budgets
    calibration.py  P(accept | confidence) and P(recovered = guess k), learnt online
    adaptive.py     the link estimate and the (depth, window) the speedup model picks
"""
