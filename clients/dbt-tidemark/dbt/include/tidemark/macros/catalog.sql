{#- dbt docs' catalog: dbt-postgres's query over pg_catalog, with one difference. Tidemark
    has no `COMMENT ON`; the descriptions `pg_description` holds for its tables and sinks
    are generated ("table (Delta, <path>)"), which dbt would show as the table's comment,
    so `table_comment` is NULL, as Postgres gives for an uncommented table. -#}
{% macro tidemark__get_catalog_relations(information_schema, relations) -%}
  {%- call statement('catalog', fetch_result=True) -%}
    {% set database = information_schema.database %}
    {{ adapter.verify_database(database) }}
    select
        '{{ database }}' as table_database,
        sch.nspname as table_schema,
        tbl.relname as table_name,
        case tbl.relkind
            when 'v' then 'VIEW'
            when 'm' then 'MATERIALIZED VIEW'
            else 'BASE TABLE'
        end as table_type,
        cast(null as text) as table_comment,
        col.attname as column_name,
        col.attnum as column_index,
        pg_catalog.format_type(col.atttypid, col.atttypmod) as column_type,
        cast(null as text) as column_comment,
        pg_get_userbyid(tbl.relowner) as table_owner
    from pg_catalog.pg_namespace sch
    join pg_catalog.pg_class tbl on tbl.relnamespace = sch.oid
    join pg_catalog.pg_attribute col on col.attrelid = tbl.oid
    where (
      {%- for relation in relations -%}
        {%- if relation.identifier -%}
          (upper(sch.nspname) = upper('{{ relation.schema }}') and
           upper(tbl.relname) = upper('{{ relation.identifier }}'))
        {%- else-%}
          upper(sch.nspname) = upper('{{ relation.schema }}')
        {%- endif -%}
        {%- if not loop.last %} or {% endif -%}
      {%- endfor -%}
    )
      and tbl.relkind in ('r', 'v', 'f', 'p', 'm')
      and col.attnum > 0
      and not col.attisdropped
    order by
        sch.nspname,
        tbl.relname,
        col.attnum
  {%- endcall -%}
  {{ return(load_result('catalog').table) }}
{%- endmacro %}

{% macro tidemark__get_catalog(information_schema, schemas) -%}
  {%- set relations = [] -%}
  {%- for schema in schemas -%}
    {%- set dummy = relations.append({'schema': schema}) -%}
  {%- endfor -%}
  {{ return(tidemark__get_catalog_relations(information_schema, relations)) }}
{%- endmacro %}
