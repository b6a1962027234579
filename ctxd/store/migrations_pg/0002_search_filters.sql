-- Search filters without a join: each indexed message's session and role beside its
-- tsvector (store/search_pg.py), so a search in one session ranks only that session's
-- matches instead of every match of the word.
ALTER TABLE messages_fts ADD COLUMN session_id TEXT COLLATE "C";
ALTER TABLE messages_fts ADD COLUMN role TEXT;
UPDATE messages_fts f SET session_id = m.session_id, role = m.role FROM messages m WHERE m.id = f.id;
