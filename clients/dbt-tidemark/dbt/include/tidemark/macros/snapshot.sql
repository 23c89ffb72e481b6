{#- Snapshots. The changes are applied with one `MERGE INTO` (dbt's default, as Spark and
    Databricks run it) instead of dbt-postgres's `UPDATE ... FROM` and `INSERT`: Tidemark's
    UPDATE takes no `FROM`, and one MERGE is one Delta commit. The target is named without
    its schema (Tidemark's MERGE takes a bare name) and the inserted values name the source. -#}
{% macro tidemark__snapshot_merge_sql(target, source, insert_cols) -%}
    {%- set columns = config.get("snapshot_table_column_names") or get_snapshot_table_column_names() -%}
    merge into {{ target.include(database=False, schema=False) }} as DBT_INTERNAL_DEST
    using {{ source }} as DBT_INTERNAL_SOURCE
    on DBT_INTERNAL_SOURCE.{{ columns.dbt_scd_id }} = DBT_INTERNAL_DEST.{{ columns.dbt_scd_id }}
    when matched
      {% if config.get("dbt_valid_to_current") %}
        and (DBT_INTERNAL_DEST.{{ columns.dbt_valid_to }} = {{ config.get('dbt_valid_to_current') }}
             or DBT_INTERNAL_DEST.{{ columns.dbt_valid_to }} is null)
      {% else %}
        and DBT_INTERNAL_DEST.{{ columns.dbt_valid_to }} is null
      {% endif %}
      and DBT_INTERNAL_SOURCE.dbt_change_type in ('update', 'delete')
      then update set {{ columns.dbt_valid_to }} = DBT_INTERNAL_SOURCE.{{ columns.dbt_valid_to }}
    when not matched
      and DBT_INTERNAL_SOURCE.dbt_change_type = 'insert'
      then insert ({{ insert_cols | join(', ') }})
      values ({% for column in insert_cols -%}
        DBT_INTERNAL_SOURCE.{{ column }}{{ ", " if not loop.last }}
      {%- endfor %})
{%- endmacro %}

{#- The staging table (a plain table: see `tidemark__create_table_as`) goes once merged. -#}
{% macro tidemark__post_snapshot(staging_relation) -%}
  {% call statement('drop_staging', auto_begin=False) -%}
    drop table if exists {{ staging_relation }} purge
  {%- endcall %}
{%- endmacro %}
