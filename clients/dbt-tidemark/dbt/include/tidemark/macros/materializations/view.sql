{#- A view: `CREATE OR REPLACE VIEW`, answered by the query each time it is read. -#}
{% materialization view, adapter='tidemark' %}
  {%- set existing = load_cached_relation(this) -%}
  {%- set target = this.incorporate(type='view') -%}
  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {%- if existing is not none and not existing.is_view -%}
    {{ tidemark__drop_for_replacement(existing) }}
  {%- endif -%}
  {% call statement('main') -%}
    create or replace view {{ target }} as
    {{ sql }}
  {%- endcall %}
  {% do persist_docs(target, model) %}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}
