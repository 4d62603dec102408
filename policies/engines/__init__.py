"""Inference engines behind one interface (transformers, vLLM and the code inside vLLM's workers), serving
batches, and `LivePolicy`: the one follower of the live version that serve and the actors generate with."""
