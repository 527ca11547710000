"""Text-to-image generation: backends (lazy) and the shard runner."""
