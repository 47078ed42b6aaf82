"""The memory's SQLite schema: its file, the kinds of jobs, and the migrations that bring any
older file up to date (``PRAGMA user_version``)."""

from __future__ import annotations

FILE = "memory.sqlite"
TIER_TERMS = "terms"
IN_BATCH = 500  # SQLite's variable limit is far above; keeps statements small
# The most of a text (a question) the memory compares with names: what a question may hold
# (limits.question_chars at most), so however long the text, the matching's work is bounded.
MATCH_CHARS = 20_000
RELATED_JOB = "related"  # a note whose related notes are due
LLM_JOB = "llm"  # a note the LLM tier has yet to read
ASKED_JOB = "asked"  # a note whose questions the LLM has yet to write (rag.index.asked)

MIGRATIONS = [
    """
    CREATE TABLE notes (
        note_id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        version INTEGER NOT NULL,
        tier TEXT NOT NULL,
        processed_at REAL NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        notebook TEXT NOT NULL DEFAULT '',
        url TEXT NOT NULL DEFAULT '',
        updated_at TEXT NOT NULL DEFAULT '',
        terms TEXT NOT NULL DEFAULT '[]',
        summary TEXT
    );
    CREATE INDEX notes_user ON notes(user_id);
    CREATE TABLE entities (
        id INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        name TEXT NOT NULL,
        norm TEXT NOT NULL,
        kind TEXT NOT NULL,
        UNIQUE (user_id, norm, kind)
    );
    CREATE TABLE mentions (
        entity_id INTEGER NOT NULL REFERENCES entities(id),
        user_id TEXT NOT NULL,
        note_id TEXT NOT NULL,
        point_id TEXT,
        char_start INTEGER,
        char_end INTEGER,
        snippet TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX mentions_note ON mentions(note_id);
    CREATE INDEX mentions_entity ON mentions(entity_id, note_id);
    CREATE TABLE df (
        user_id TEXT NOT NULL,
        term TEXT NOT NULL,
        notes INTEGER NOT NULL,
        PRIMARY KEY (user_id, term)
    ) WITHOUT ROWID;
    CREATE TABLE facts (
        id INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        subject TEXT NOT NULL,
        predicate TEXT NOT NULL,
        object TEXT NOT NULL,
        quote TEXT NOT NULL,
        note_id TEXT NOT NULL,
        point_id TEXT,
        char_start INTEGER,
        char_end INTEGER,
        time REAL,
        origin TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'active',
        superseded_by INTEGER,
        created REAL NOT NULL
    );
    CREATE INDEX facts_note ON facts(note_id);
    CREATE INDEX facts_subject ON facts(user_id, subject, predicate);
    CREATE TABLE related (
        user_id TEXT NOT NULL,
        note_a TEXT NOT NULL,
        note_b TEXT NOT NULL,
        score REAL NOT NULL,
        reasons TEXT NOT NULL DEFAULT '{}',
        computed_at REAL NOT NULL,
        PRIMARY KEY (note_a, note_b)
    );
    CREATE INDEX related_b ON related(note_b);
    CREATE TABLE jobs (
        note_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        user_id TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_try REAL NOT NULL,
        error TEXT,
        parked INTEGER NOT NULL DEFAULT 0,
        created REAL NOT NULL,
        PRIMARY KEY (note_id, kind)
    );
    CREATE INDEX jobs_next ON jobs(parked, next_try);
    CREATE TABLE corrections (
        id INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        verdict TEXT NOT NULL,
        comment TEXT,
        at REAL NOT NULL,
        UNIQUE (user_id, kind, target)
    );
    """,
    # facts and jobs (the LLM tier): a job carries what it extracts from (the note's text,
    # title and updated time), a note what its LLM extraction cost (calls, tokens, drops)
    """
    ALTER TABLE jobs ADD COLUMN payload TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE notes ADD COLUMN llm TEXT
    """,
    # the log of verdicts (corrections). IF NOT EXISTS: before this migration the table was
    # created on first use (by a ``_corrections_ready`` since removed), so a store that
    # recorded a verdict already holds it, with this very shape, and keeps its rows
    """
    CREATE TABLE IF NOT EXISTS correction_log (
        id INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        verdict TEXT NOT NULL,
        by TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS correction_log_target ON correction_log(user_id, kind, target)
    """,
    # facts by their subject as compared (``norm``), for the facts about what a question
    # names (``facts_named``) without reading all the user's facts. Rows written before
    # this migration get theirs when the store is opened (``_norm_subjects``: SQL has no
    # ``norm``)
    """
    ALTER TABLE facts ADD COLUMN subject_norm TEXT;
    CREATE INDEX facts_subject_norm ON facts(user_id, status, subject_norm)
    """,
    # the questions each note answers, written by the LLM (rag.index.asked, sync.memory_jobs):
    # at the content hash they were written from; an empty list is a generation dropped
    # (counted in ``stats``), not asked again until the note's text changes
    """
    CREATE TABLE asked (
        note_id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        questions TEXT NOT NULL DEFAULT '[]',
        stats TEXT NOT NULL DEFAULT '{}',
        at REAL NOT NULL
    );
    CREATE INDEX asked_user ON asked(user_id)
    """,
    # what the questions were written from (memory.questions_scope: note or sections) and, per
    # question, the chunks of the section it was written for ([]: the note's nearest chunk); the
    # rows written before are the note scope's
    """
    ALTER TABLE asked ADD COLUMN scope TEXT NOT NULL DEFAULT 'note';
    ALTER TABLE asked ADD COLUMN ties TEXT NOT NULL DEFAULT '[]'
    """,
    # what the index saw of each note, for the digest's "added" and "edited" (rag.digest): when
    # it was first processed and when its text last changed (rows from before: unknown, NULL),
    # and when each user's first complete pass ended (the notes it held are what the notes were)
    """
    ALTER TABLE notes ADD COLUMN first_seen REAL;
    ALTER TABLE notes ADD COLUMN changed_at REAL;
    CREATE TABLE first_index (
        user_id TEXT PRIMARY KEY,
        at REAL NOT NULL
    )
    """,
]
