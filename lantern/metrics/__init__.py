"""Quality metrics: FID (clean-fid resize, Inception), CLIP score and the world's classifier."""
