"""Model backends, loaded lazily by the registry (stereolens.models.registry.BACKENDS):
importing stereolens imports none of torch, diffusers, transformers or vllm."""
