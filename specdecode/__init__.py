"""specdecode: lossless speculative decoding for LLM inference."""
