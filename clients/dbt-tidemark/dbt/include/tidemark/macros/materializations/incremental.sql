{#- dbt's incremental materialization on Tidemark. The new rows are staged in a table
    named `<model>__dbt_tmp<timestamp>`, a plain table (Tidemark has no `CREATE TEMPORARY
    TABLE`), which is dropped with its data once the strategy has run. A full refresh, or a
    view in the model's place, drops the old relation and creates the table again, since
    there is no `ALTER TABLE ... RENAME` to swap one in. -#}
{% materialization incremental, adapter='tidemark' -%}
  {%- set existing_relation = load_cached_relation(this) -%}
  {%- set target_relation = this.incorporate(type='table') -%}
  {%- set temp_relation = make_temp_relation(target_relation) -%}
  {%- set unique_key = config.get('unique_key') -%}
  {%- set full_refresh_mode = (should_full_refresh() or (existing_relation is not none and not existing_relation.is_table)) -%}
  {%- set on_schema_change = incremental_validate_on_schema_change(config.get('on_schema_change'), default='ignore') -%}
  {%- set grant_config = config.get('grants') -%}

  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {{ run_hooks(pre_hooks, inside_transaction=True) }}

  {%- set incremental_strategy = config.get('incremental_strategy') or 'default' -%}
  {%- set strategy_sql_macro_func = adapter.get_incremental_strategy_macro(context, incremental_strategy) -%}
  {%- set staged = false -%}

  {% if existing_relation is none %}
    {%- set build_sql = get_create_table_as_sql(False, target_relation, sql) -%}
  {% elif full_refresh_mode %}
    {{ tidemark__drop_for_replacement(existing_relation) }}
    {%- set build_sql = get_create_table_as_sql(False, target_relation, sql) -%}
  {% else %}
    {% do run_query(get_create_table_as_sql(True, temp_relation, sql)) %}
    {%- set staged = true -%}
    {%- set dest_columns = process_schema_changes(on_schema_change, temp_relation, existing_relation) -%}
    {%- if not dest_columns -%}
      {%- set dest_columns = adapter.get_columns_in_relation(existing_relation) -%}
    {%- endif -%}
    {%- set incremental_predicates = config.get('predicates', none) or config.get('incremental_predicates', none) -%}
    {%- set strategy_arg_dict = ({'target_relation': target_relation, 'temp_relation': temp_relation, 'unique_key': unique_key, 'dest_columns': dest_columns, 'incremental_predicates': incremental_predicates }) -%}
    {%- set build_sql = strategy_sql_macro_func(strategy_arg_dict) -%}
  {% endif %}

  {% call statement("main") %}
    {{ build_sql }}
  {% endcall %}

  {% if staged %}
    {% call statement('drop_staging', auto_begin=False) -%}
      drop table if exists {{ temp_relation }} purge
    {%- endcall %}
  {% endif %}

  {% set should_revoke = should_revoke(existing_relation, full_refresh_mode) %}
  {% do apply_grants(target_relation, grant_config, should_revoke=should_revoke) %}
  {% do persist_docs(target_relation, model) %}
  {{ run_hooks(post_hooks, inside_transaction=True) }}
  {% do adapter.commit() %}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target_relation]}) }}
{%- endmaterialization %}
