{#- A materialized view, maintained batch by batch: `CREATE OR REPLACE MATERIALIZED VIEW`
    with the config's options (output_mode, trigger, watermark, state_store, retention…),
    kept, altered or redefined over its checkpoint as a sink is. -#}
{% materialization materialized_view, adapter='tidemark' %}
  {%- set existing = load_cached_relation(this) -%}
  {%- set target = this.incorporate(type='materialized_view') -%}
  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {%- set exists = tidemark__prepare_query_relation(existing, 'materialized_view') -%}
  {% call statement('main') -%}
    {{ tidemark__create_or_replace_query('materialized view', target, sql) }}
  {%- endcall %}
  {% do persist_docs(target, model) %}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}
