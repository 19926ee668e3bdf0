"""Data stages: corpus -> tokenizer -> packed shards, and the post-training SFT mixture."""
