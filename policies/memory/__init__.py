"""The navigator's policy: experiences from judged groups, sentence embeddings, and the experience pool
(Milvus Lite with an exact in-process index for reads)."""
