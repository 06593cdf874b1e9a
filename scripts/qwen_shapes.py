"""The shapes of Qwen2.5 models that the GPU scripts build with random weights (Hugging Face config fields), shared by
scripts/gpu_check.py (its models) and scripts/gguf_random.py (GGUF files of them for llama.cpp and for us)."""

SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "32b": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
    "72b": dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
}
TINY = {
    "0.5b": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "7b": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=1, vocab_size=512, tie_word_embeddings=False),
}
TINY["32b"] = dict(TINY["7b"], num_hidden_layers=4)
