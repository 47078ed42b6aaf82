"""The memory of the notes: what each note is about, kept beside the index.

``entities`` finds named things in a note without an LLM; ``extract`` is the LLM tier
(summaries, typed entities, facts with the words they came from); ``store.MemoryStore``
keeps them in SQLite, each row carrying its source note; ``related`` pairs notes that
belong together, and says why; ``explore`` shapes the memory for the explorer page.

Imports the index and the plumbing, never the answer.
"""
