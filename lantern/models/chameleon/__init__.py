"""The Chameleon family (Anole, Lumina-mGPT): target, VQGAN, prompt conditioner, HF folder loading."""
