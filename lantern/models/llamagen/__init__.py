"""LlamaGen: the GPT target (class- and text-conditional), its VQ-16 tokenizer and 2-D RoPE."""
