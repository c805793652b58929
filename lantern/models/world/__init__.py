"""The embedded world: Fashion-MNIST data and captions, and the shipped folder of weights pinned by its manifest."""
