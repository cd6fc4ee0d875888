-- Exactly-once output groups, and start-up without re-hashing unchanged inputs.
-- Forward-only, like 0001: never edit once released.

-- An output group being published (at most one per input file). The publisher writes every file of
-- the group to a hidden temporary in the day folder (fsynced), records the plan here, links the
-- temporaries to their final names, then records the tasks' output paths and deletes this row in one
-- transaction. A row found at start means a crash in between: the publisher completes the group from
-- the temporaries it names (or rolls it back), so a restart never writes a second, suffixed group.
-- `plan_json`: {"files": [{"tmp": path, "path": path}, ...], "task_paths": [[task_id, path], ...]}.
CREATE TABLE output_intents (
    input_file_id INTEGER PRIMARY KEY REFERENCES input_files (id),
    plan_json     TEXT    NOT NULL,
    created_at    INTEGER NOT NULL
);

-- What intake last saw at a path of inputs/: its size, modification time and inode with the sha256 of
-- the content read then. A file whose size, mtime and inode are unchanged is not read or hashed again
-- at start (or at a rescan); any difference means a re-read.
CREATE TABLE input_stamps (
    path      TEXT    PRIMARY KEY,         -- relative to inputs/, '/'-separated
    size      INTEGER NOT NULL CHECK (size >= 0),
    mtime_ns  INTEGER NOT NULL,            -- nanoseconds since the Unix epoch
    inode     INTEGER NOT NULL,
    sha256    TEXT    NOT NULL CHECK (length(sha256) = 64),
    seen_at   INTEGER NOT NULL
);

-- The tasks whose output is not recorded yet, by file: whether a file's outputs are due, and the
-- periodic sweep for due files, read only these rows instead of every row of every file.
CREATE INDEX tasks_unpublished ON tasks (input_file_id) WHERE output_path IS NULL;
