"""stereolens: social-bias audits of generative vision models.

Importing this package is cheap: torch, diffusers, transformers and vllm are
imported only by the backend that needs them (see :mod:`stereolens.models.registry`).
"""

__version__ = "0.1.0"
