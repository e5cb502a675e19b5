-- Fencing high-water table of github.com/ticketing-dev/ticketing/fence.
-- One row per resource; see docs/fence.md.

-- +goose Up
CREATE TABLE ticketing_fence (
    resource   BLOB    NOT NULL PRIMARY KEY CHECK (typeof(resource) = 'blob' AND length(resource) BETWEEN 1 AND 255),
    high_water INTEGER NOT NULL CHECK (high_water >= 0),
    updated_at TEXT    NOT NULL
);

-- +goose Down
DROP TABLE ticketing_fence;
