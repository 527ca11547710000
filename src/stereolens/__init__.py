"""stereolens: social-bias audits of generative vision models. Importing it is cheap: torch,
diffusers, transformers and vllm load only with the backend that needs them."""

__version__ = "0.1.0"
