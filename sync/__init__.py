"""Keeping the index a mirror of Leanote: sources, state, the indexer."""
