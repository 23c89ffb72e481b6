{{ config(materialized='merge_sink', unique_key='user_id',
          merge_condition='s.event_time > t.event_time') }}

select user_id, page, event_time
from (
    select *, row_number() over (partition by user_id order by event_time desc) as rn
    from {{ ref('clicks') }}
)
where rn = 1
