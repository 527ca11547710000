"""BiasIG (Luo et al.): implicit and explicit generative bias (S_imp, S_exp) and the manifestation
factor eta; ``metrics`` is the public API, ``cli`` the ``stereolens biasig`` subcommands."""
