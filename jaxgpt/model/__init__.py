"""The model: the Transformer (transformer.py: embeddings, blocks, head; a decoder, an encoder or
both) and its parts, a module each (attention with its kernels and KV cache, positions, the
norms and MLP, a mixture of experts, the named activation sites the lab reads and changes,
low-rank adapters for fine-tuning), and decoding with the cache (sampling.py).
Uses only the package's top (config, errors, sharding)."""
