-- An incremental batch job: run it whenever you like with
--   mkdir -p /tmp/lake/landing/clicks && cp sql/data/clicks-*.json /tmp/lake/landing/clicks/
--   cargo run --release -- run sql/examples/long_views.sql --data-dir /tmp/lake/tidemark
-- Each run processes only the files that landed since the previous run, then exits.

CREATE STREAM IF NOT EXISTS clicks (
    user_id    TEXT,
    page       TEXT,
    event_time TIMESTAMP,
    duration_s DOUBLE PRECISION
) WITH (connector = 'file', format = 'json', path = '/tmp/lake/landing/clicks',
        max_files_per_trigger = 1);

CREATE SINK IF NOT EXISTS long_views WITH (
    path    = '/tmp/lake/long_views',
    trigger = 'available_now'
) AS
    SELECT user_id, upper(page) AS page, event_time, duration_s
    FROM clicks
    WHERE duration_s > 5;

-- On later runs the sink exists and has finished: start it again for the new files.
START SINK long_views;

SELECT page, count(*) AS views, sum(duration_s) AS seconds
FROM long_views GROUP BY page ORDER BY page;
