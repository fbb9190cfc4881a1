"""On-disk artifacts shared by every stage: docs shards, manifests (DESIGN §2)."""
