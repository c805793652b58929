"""The Emu3 family (BAAI/Emu3-Gen): target, VQ, prompt conditioner, HF folder loading."""
