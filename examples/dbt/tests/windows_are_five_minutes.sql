-- Every window of the sink spans five minutes.
select *
from {{ ref('page_views_5m') }}
where window_end - window_start <> interval '5 minutes'
