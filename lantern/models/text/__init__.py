"""Caption encoders producing LlamaGen-style left-padded per-token text states (FLAN-T5, MiniLM)."""
