{#- A sink: `CREATE OR REPLACE SINK <model> WITH (<config>) AS <model SQL>`. Tidemark keeps
    an unchanged sink running, applies a changed trigger or rate limit as ALTER SINK does,
    and replaces a changed query over the sink's checkpoint when the checkpoint can serve it
    (refusing with 55000 otherwise). `--full-refresh` drops the sink, its checkpoint and its
    table in the data directory, and starts it again from the streams' beginning. -#}
{% macro tidemark__create_or_replace_query(kind, target, sql, skip=[]) -%}
  create or replace {{ kind }} {{ target }} {{ tidemark__with_options(kind, skip) }} as
  {{ sql }}
{%- endmacro %}

{% macro tidemark__prepare_query_relation(existing, kind) -%}
  {#- Drops what stands in the way: another kind of object of the name, or anything on a
      full refresh. Returns whether the object still exists. -#}
  {%- if existing is none -%}
    {{ return(false) }}
  {%- endif -%}
  {%- if existing.type != kind -%}
    {{ log("Dropping " ~ existing ~ " (a " ~ existing.type ~ "): the model is now a " ~ kind, info=True) }}
    {{ adapter.drop_relation(existing) }}
    {{ return(false) }}
  {%- endif -%}
  {%- if should_full_refresh() -%}
    {%- if kind == 'sink' and config.get('path') is none and config.get('materialized') == 'sink' -%}
      {{ log("Full refresh: dropping sink " ~ existing ~ " with its checkpoint and table", info=True) }}
      {% call statement('drop_for_refresh', auto_begin=False) -%}
        drop sink {{ existing }} purge
      {%- endcall %}
    {%- else -%}
      {{ log("Full refresh: dropping " ~ existing ~ " and its checkpoint" ~ (" (the data at path = '" ~ config.get('path') ~ "' is kept)" if config.get('path') else ""), info=True) }}
      {{ adapter.drop_relation(existing) }}
    {%- endif -%}
    {{ return(false) }}
  {%- endif -%}
  {{ return(true) }}
{%- endmacro %}

{% materialization sink, adapter='tidemark' %}
  {%- set existing = load_cached_relation(this) -%}
  {%- set target = this.incorporate(type='sink') -%}
  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {%- set exists = tidemark__prepare_query_relation(existing, 'sink') -%}
  {% call statement('main') -%}
    {{ tidemark__create_or_replace_query('sink', target, sql) }}
  {%- endcall %}
  {% do persist_docs(target, model) %}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}
