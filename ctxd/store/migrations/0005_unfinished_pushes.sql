-- A large push on SQLite writes its message rows in several short transactions, then
-- makes them part of the session in a last small one (store/messages.py, "Staged
-- pushes"). Until then its rows lie above the session's last_seq, where no reader looks,
-- and this row says so: it is written before the first of them and deleted with the
-- last transaction. A row left here (the daemon was killed between the transactions)
-- marks rows that were never acknowledged: the daemon removes them when it starts, or
-- before the session's next push, and `ctxd-cli doctor` does not call them damage.
CREATE TABLE unfinished_pushes (
    session_id  TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    after_seq   INTEGER NOT NULL,      -- the session's last_seq when the push began
    started_at  TEXT NOT NULL
);
