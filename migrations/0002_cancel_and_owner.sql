-- `kiln cancel` of a running task, and the daemon's ownership of the ledger.
-- Forward-only, like 0001: never edit once released.

-- Set by `kiln cancel` on a `running` task; the daemon that runs it stops the attempt in the engine
-- and moves it to `cancelled` (guarded on `running`). Cleared by every claim.
ALTER TABLE tasks ADD COLUMN cancel_requested_at INTEGER;

-- Set by `kiln retry` from `output_path`: the file that reported on the task before the retry. Once the
-- file's new output group is recorded, a superseded error file (`.error.json`, `.errors.jsonl`) is removed
-- so it no longer sits beside the new result; then this is cleared.
ALTER TABLE tasks ADD COLUMN superseded_output TEXT;

-- The daemon that owns this ledger (at most one row, id = 1). The flock on `<canonical ledger>.lock`
-- keeps a second daemon off the same path, symlinks included; this row catches a second path to
-- the same file that canonicalizes differently (a hard link, a bind mount): a daemon records its
-- lock file here, and the next one refuses while the recorded lock file is still locked.
CREATE TABLE daemon_owner (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    lock_path   TEXT    NOT NULL,
    pid         INTEGER NOT NULL,
    acquired_at INTEGER NOT NULL
);
