"""The ContextBias human annotation study (paper Sec. 4.3 and App. D.2): a blinded annotation
form, and agreement between annotators and with the extraction pipeline (docs/methods.md)."""
