"""The Janus-Pro family (Janus-Pro-1B / 7B): target, VQ, prompt conditioner, HF folder loading."""
