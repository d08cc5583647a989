"""DSpark drafting layer: grammar-forced + statistical drafts inside vLLM's scheduler."""
