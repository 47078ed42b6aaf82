"""leanote-rag core: notes in, hits and answers out. Imports neither bot/ nor sync/."""
