{{ config(materialized='stream', connector='file', format='json',
          path=var('landing'), max_files_per_trigger=1) }}

user_id    text,
page       text,
event_time timestamp,
duration_s double precision,
watermark for event_time as event_time - interval '10 minutes'
