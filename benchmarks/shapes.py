"""Model shapes the benchmarks build from random weights (no downloads).

``tiny`` runs on a CPU in seconds, ``small`` in minutes; ``qwen2.5-0.5b`` has the shape of
Qwen/Qwen2.5-0.5B (its config.json: 24 layers, hidden 896, 14 heads, 2 KV heads, tied embeddings, a
vocabulary of 151,936), for the GPU check (``benchmarks/gpu.sh``); ``qwen2.5-3b`` has the shape of
Qwen/Qwen2.5-3B, the smallest model of the paper (its config.json: 36 layers, hidden 2048,
16 heads of 128, 2 KV heads, tied embeddings, the same vocabulary), for
``benchmarks/run_overhead.py --paper-shape``.
"""

from __future__ import annotations

from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 512,
    },
    # Big enough on a CPU that a step's arithmetic outweighs its Python and collective
    # overheads (the 1-vs-2-process measurement of docs/scale.md).
    "small": {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "max_position_embeddings": 512,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-3b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
}
