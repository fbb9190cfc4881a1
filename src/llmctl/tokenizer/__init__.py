"""Text to ids and back: byte-level BPE training and encoding (bpe), llmctl's chat format (chat),
a release's Jinja chat template (chat_jinja), and a checkpoint's vocabulary — special ids, stop
ids, the generation engine's factory (vocab). Below model/ and the data stages, which both use it."""
