"""The ContextBias benchmark: prompts, attribute schema, merge and metrics."""
