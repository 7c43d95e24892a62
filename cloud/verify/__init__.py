"""The verifying policy: sessions (edge-decided trees, decided sessions), what each pass
scores, the verifier's own proposals and gap drafter, and the batcher that runs passes for
many sessions. Protobuf-free: the serving shell converts at the boundary.

    engine      the domain core: sessions, limits, batching, cloud-only generation
    session     an edge-decided session: the node trie over the tree KV cache
    decided     decided sessions (greedy, coupled): the verifier walks the tree itself
    proposals   how many of its own proposals a lone pass scores
    gap         the operator's cloud-side gap drafter
    batcher     one pass at a time for all pending requests, in a worker thread
"""
