"""Model definitions: the LlamaGen GPT target, its KV cache and the VQ tokenizer."""
