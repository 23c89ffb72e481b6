{{ config(materialized='sink', output_mode='append',
          trigger=var('page_views_trigger', 'default')) }}

select window.start as window_start, window.end as window_end, page,
       count(*) as views, sum(duration_s) as total_duration_s
from {{ ref('clicks') }}
group by window(event_time, '5 minutes'), page
