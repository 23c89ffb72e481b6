{#- A MERGE sink, the seed's upsert: each micro-batch of the model's query is merged into a
    table on the key.

      {{ config(materialized='merge_sink', unique_key='user_id',
                merge_condition='s.event_time > t.event_time',
                trigger='processing_time 30 seconds') }}
      select user_id, page, event_time from ( ...row_number() over (...) as rn... ) where rn = 1

    The target table is `target_table` (default `<model>_table`), made with the query's
    columns when it does not exist. Selecting from the model reads the table. -#}
{% materialization merge_sink, adapter='tidemark' %}
  {%- set existing = load_cached_relation(this) -%}
  {%- set target = this.incorporate(type='sink') -%}
  {%- set keys = config.require('unique_key') -%}
  {%- set keys = [keys] if keys is string else keys -%}
  {%- set condition = config.get('merge_condition') -%}
  {%- set table = this.incorporate(path={"identifier": config.get('target_table', this.identifier ~ '_table')}, type='table') -%}
  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {%- set exists = tidemark__prepare_query_relation(existing, 'sink') -%}
  {%- if should_full_refresh() -%}
    {{ log("Full refresh: dropping the MERGE sink's table " ~ table, info=True) }}
    {% call statement('drop_target', auto_begin=False) -%}
      drop table if exists {{ table }} purge
    {%- endcall %}
  {%- endif -%}
  {%- if load_relation(table) is none or should_full_refresh() -%}
    {#- The query's columns, with no rows: planned by Tidemark over the streams. -#}
    {% call statement('create_target', auto_begin=False) -%}
      create table if not exists {{ table }} as
      select * from (
        {{ sql }}
      ) as s limit 0
    {%- endcall %}
  {%- endif -%}
  {% call statement('main') -%}
    create or replace sink {{ target }} {{ tidemark__with_options('sink', skip=['path']) }} as
    merge into {{ adapter.quote(table.identifier) }} as t
    using (
      {{ sql }}
    ) as s
    on {% for key in keys %}t.{{ adapter.quote(key) }} = s.{{ adapter.quote(key) }}{{ " and " if not loop.last }}{% endfor %}
    when matched {%- if condition %} and {{ condition }}{% endif %} then update set *
    when not matched then insert *
  {%- endcall %}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}
