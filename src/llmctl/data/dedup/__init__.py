"""Deduplication: URL, exact-text, line-frequency and MinHash near-duplicate removal."""
