"""The target model: a Llama-family decoder in torch scoring trees of nodes, its weights
(Hugging Face checkpoints, oneDNN-packed linears), attention paths, the paged tree KV cache,
and tensor parallelism over torch.distributed. Knows nothing of sessions or gRPC.

    config, loader, packed      hyper-parameters, checkpoint loading, prepacked linears
    model, attention, kv_cache  the decoder, its attention paths, the paged tree KV cache
    sharding, tensor_parallel, tp_launch   the Megatron split, the group, starting ranks
    profile                     `acespec cloud profile`: pass time against nodes
"""
