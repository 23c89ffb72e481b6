{{ config(materialized='materialized_view', output_mode='update') }}

select page, count(*) as views, max(event_time) as last_view
from {{ ref('clicks') }}
group by page
