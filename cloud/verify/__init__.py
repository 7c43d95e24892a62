"""The verifying policy: sessions (edge-decided trees, decided sessions), what each pass
scores, the verifier's own proposals and gap drafter, and the batcher that runs passes for
many sessions. Protobuf-free: the serving shell converts at the boundary.

    engine      the domain core: sessions, limits, batching, cloud-only generation
    edge_decided  an edge-decided session: the node trie over the tree KV cache
    decided     a decided session (greedy, coupled): the decided text beside the edge's
                tree, what each pass feeds, its limits and account
    verdict     the verdict rule and the walk of one scored pass (pure)
    proposals   how many of its own proposals a lone pass scores
    share       the speculative nodes per pass a session has earned by its acceptance
    gap         the operator's cloud-side gap drafter (gap_file: its model file)
    batcher     one pass at a time for all pending requests, in a worker thread
"""
