"""The cloud side: the torch target model, its tree KV cache, and (later) the gRPC verifier."""
