"""Model backends, loaded lazily by the registry (stereolens.models.registry.BACKENDS):
importing stereolens imports none of torch, diffusers, transformers or vllm."""


def resolve_device(device: str | None) -> str:
    """Device name: "auto" (or unset) = "cuda" when available, else "cpu"."""
    if device in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)
