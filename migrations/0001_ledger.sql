-- The kiln ledger: input files, tasks, attempts. Forward-only: never edit this file once released,
-- add a new numbered migration instead (sqlx checks the checksum of applied migrations).
--
-- Conventions:
--   * timestamps are INTEGER unix milliseconds (UTC);
--   * task ids are UUID v7 in hyphenated lower-case TEXT (readable with the sqlite3 CLI, time-ordered);
--   * state and class strings mirror TaskState::as_str() and ErrorClass::as_str() (CHECK constraints).

-- One row per (path, content, generation) seen in inputs/. The same content of the same file is never
-- run twice; changed content is a new row with new tasks; `kiln submit --force` asks for a new
-- generation of the same content (a row in rerun_requests, consumed by the next intake).
CREATE TABLE input_files (
    id            INTEGER PRIMARY KEY,
    path          TEXT    NOT NULL,                     -- relative to inputs/, '/'-separated
    sha256        TEXT    NOT NULL CHECK (length(sha256) = 64),
    size          INTEGER NOT NULL CHECK (size >= 0),   -- bytes
    kind          TEXT    NOT NULL CHECK (kind IN ('txt', 'md', 'json', 'jsonl')),
    generation    INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
    discovered_at INTEGER NOT NULL,
    UNIQUE (path, sha256, generation)
);

-- `kiln submit --force`: run this content of this path again even though it is known.
CREATE TABLE rerun_requests (
    path         TEXT    NOT NULL,
    sha256       TEXT    NOT NULL CHECK (length(sha256) = 64),
    requested_at INTEGER NOT NULL,
    PRIMARY KEY (path, sha256)
);

CREATE TABLE tasks (
    task_id         TEXT    PRIMARY KEY,
    input_file_id   INTEGER NOT NULL REFERENCES input_files (id),
    line            INTEGER CHECK (line IS NULL OR line >= 1),   -- 1-based line of a .jsonl; NULL otherwise
    custom_id       TEXT,                                        -- .jsonl `custom_id`, echoed in outputs
    request_json    TEXT,            -- the parsed request body; NULL when the task was rejected at intake
    state           TEXT    NOT NULL CHECK (state IN
                        ('queued', 'running', 'succeeded', 'retry_wait', 'failed', 'dead', 'cancelled')),
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),  -- counted attempts since intake / last retry
    queued_at       INTEGER NOT NULL,          -- last time the task became queued (orders the queue)
    next_attempt_at INTEGER,                   -- retry_wait only: when it becomes claimable
    error_class     TEXT    CHECK (error_class IS NULL OR error_class IN
                        ('oom', 'timeout', 'parse', 'invalid_input', 'internal')),
    error           TEXT,
    result_json     TEXT,                      -- the completion / response body, for assembling outputs
    output_path     TEXT,                      -- where the writer put the result (or the error line)
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    started_at      INTEGER,                   -- last claim
    finished_at     INTEGER,                   -- last terminal or retry_wait transition
    CHECK ((state = 'retry_wait') = (next_attempt_at IS NOT NULL)),
    UNIQUE (input_file_id, line)
);

CREATE INDEX tasks_by_state ON tasks (state, next_attempt_at);
CREATE INDEX tasks_by_file ON tasks (input_file_id, state);

-- One row per claim. `n` numbers every claim of a task (1, 2, …, never reused); an attempt cut by a
-- shutdown keeps its row (outcome 'interrupted') but does not count in tasks.attempts.
CREATE TABLE attempts (
    task_id           TEXT    NOT NULL REFERENCES tasks (task_id),
    n                 INTEGER NOT NULL CHECK (n >= 1),
    started_at        INTEGER NOT NULL,
    finished_at       INTEGER,                 -- NULL while running
    outcome           TEXT    CHECK (outcome IS NULL OR outcome IN
                          ('succeeded', 'oom', 'timeout', 'parse', 'invalid_input', 'internal', 'interrupted')),
    message           TEXT,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    cached_tokens     INTEGER,
    ttft_ms           REAL,
    decode_tps        REAL,                    -- tokens per second of decode
    PRIMARY KEY (task_id, n)
);
