"""On-disk artifacts shared by every stage: docs shards, manifests (docs/design.md §2)."""
