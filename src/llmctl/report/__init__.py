"""`llmctl report`: one page that tells the whole story of a model, from its lineage's manifests."""
