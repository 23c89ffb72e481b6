-- The seed pipeline: five-minute page-view windows with a ten-minute watermark, appended to
-- Delta. An incremental batch job; run it whenever files have landed:
--   mkdir -p /tmp/lake/landing/clicks && cp sql/data/clicks-1.json /tmp/lake/landing/clicks/
--   cargo run --release -- run sql/examples/page_views_5m.sql --data-dir /tmp/lake/tidemark
-- then land sql/data/clicks-2.json and run it again: the late 10:03 click is dropped, the
-- 10:40 click closes the 10:20 and 10:25 windows (Spark's seed_two_runs scenario).

CREATE STREAM IF NOT EXISTS clicks (
    user_id    TEXT,
    page       TEXT,
    event_time TIMESTAMP,
    duration_s DOUBLE PRECISION,
    WATERMARK FOR event_time AS event_time - INTERVAL '10 minutes'
) WITH (connector = 'file', format = 'json', path = '/tmp/lake/landing/clicks',
        max_files_per_trigger = 1);

CREATE SINK IF NOT EXISTS page_views_5m WITH (
    path        = '/tmp/lake/page_views_5m',
    output_mode = 'append',
    trigger     = 'available_now'
) AS
    SELECT window.start AS window_start, window.end AS window_end, page,
           count(*) AS views, sum(duration_s) AS total_duration_s
    FROM clicks
    GROUP BY window(event_time, '5 minutes'), page;

START SINK page_views_5m;

SELECT * FROM page_views_5m ORDER BY window_start, page;
SELECT batch_id, num_input_rows, watermark, rows_dropped_by_watermark FROM tidemark.progress;
