{{ config(materialized='view') }}

select w.window_start, w.page, w.views, p.section
from {{ ref('page_views_5m') }} w
join {{ ref('pages') }} p on p.page = w.page
where w.views >= 2
