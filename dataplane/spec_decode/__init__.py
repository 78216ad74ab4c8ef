"""Speculative decoding: n-gram (prompt-lookup) drafts verified in one forward pass (see verify.py)."""
