"""Data stages: crawl extraction, filtering, dedup, tokenization."""
