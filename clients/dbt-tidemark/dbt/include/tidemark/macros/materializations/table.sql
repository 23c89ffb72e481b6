{#- A table: a Delta table made with `CREATE TABLE ... AS`. Tidemark has no `ALTER TABLE
    ... RENAME` yet, so the old table is dropped (with its data) before the new one is made,
    instead of being swapped for it: a reader between the two statements finds no table. -#}
{% materialization table, adapter='tidemark' %}
  {%- set existing = load_cached_relation(this) -%}
  {%- set target = this.incorporate(type='table') -%}
  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {%- if existing is not none -%}
    {{ tidemark__drop_for_replacement(existing) }}
  {%- endif -%}
  {% call statement('main') -%}
    create table {{ target }} as
    {{ sql }}
  {%- endcall %}
  {% do persist_docs(target, model) %}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}

{#- Drops an object a table or view model replaces; a table's data goes with it. -#}
{% macro tidemark__drop_for_replacement(relation) -%}
  {%- if relation.is_table -%}
    {% call statement('drop_relation', auto_begin=False) -%}
      drop table if exists {{ relation }} purge
    {%- endcall %}
  {%- else -%}
    {{ adapter.drop_relation(relation) }}
  {%- endif -%}
{%- endmacro %}

{% macro tidemark__truncate_relation(relation) -%}
  {% call statement('truncate_relation') -%}
    delete from {{ relation }}
  {%- endcall %}
{%- endmacro %}
