"""Passes: one module per pass, each registering a ModulePass subclass by name."""
