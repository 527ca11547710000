"""BiasIG (Luo et al.): implicit and explicit generative bias and the manifestation factor.

``prompts`` builds the 47,040-prompt table, ``truth`` loads and validates the ground truth,
weights, categories and pairs, ``metrics`` computes S_imp, S_exp and eta with bootstrap
confidence intervals (from ``formulas``, ``answers``, ``resample``, ``groups``, ``pairs`` and
``score_tables``), ``cli`` adds the ``stereolens biasig`` subcommands.
"""
