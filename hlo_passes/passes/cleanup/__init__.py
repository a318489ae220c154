"""Cleanup passes (XLA's names): dce, cse, tuple-simplifier, call-inliner."""
