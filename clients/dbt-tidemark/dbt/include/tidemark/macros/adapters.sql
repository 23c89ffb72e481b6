{#- Tidemark's catalog: every object is in schema `public`, and `tidemark.relations` says
    what each one is (stream, sink, materialized view, table). Plain views are DataFusion's
    and are listed by `pg_views`. -#}

{% macro tidemark__list_relations_without_caching(schema_relation) %}
  {% call statement('list_relations_without_caching', fetch_result=True) -%}
    select
      '{{ schema_relation.database }}' as database,
      name,
      'public' as schema,
      case kind
        when 'materialized view' then 'materialized_view'
        else kind
      end as type
    from tidemark.relations
    where 'public' ilike '{{ schema_relation.schema }}'
    union all
    select
      '{{ schema_relation.database }}' as database,
      viewname as name,
      schemaname as schema,
      'view' as type
    from pg_views
    where schemaname ilike '{{ schema_relation.schema }}'
  {%- endcall %}
  {{ return(load_result('list_relations_without_caching').table) }}
{% endmacro %}

{#- What drops each kind of object. A sink's table stays unless `purge` (a full refresh). -#}
{% macro tidemark__get_drop_sql(relation) -%}
  {%- if relation.is_stream -%}
    drop stream if exists {{ relation }}
  {%- elif relation.is_sink -%}
    drop sink if exists {{ relation }}
  {%- elif relation.is_materialized_view -%}
    drop materialized view if exists {{ relation }}
  {%- elif relation.is_view -%}
    drop view if exists {{ relation }}
  {%- else -%}
    drop table if exists {{ relation }}
  {%- endif -%}
{%- endmacro %}

{% macro tidemark__drop_relation(relation) -%}
  {% call statement('drop_relation', auto_begin=False) -%}
    {{ tidemark__get_drop_sql(relation) }}
  {%- endcall %}
{% endmacro %}


{% macro tidemark__rename_relation(from_relation, to_relation) -%}
  {{ exceptions.raise_compiler_error(
      "Tidemark cannot rename " ~ from_relation ~ " yet (no ALTER ... RENAME TO)") }}
{% endmacro %}

{#- The option names Tidemark takes for one kind of object (`stream`, `sink`,
    `materialized view`), read from `tidemark.options`, so that a new option needs no new
    adapter. -#}
{% macro tidemark__option_names(object) -%}
  {%- set rows = run_query("select distinct option from tidemark.options where object = '" ~ object ~ "'") -%}
  {{ return(rows.columns[0].values() | list) }}
{%- endmacro %}

{% macro tidemark__option_value(value) -%}
  {%- if value is number or value is boolean -%}
    {{ value | string | lower if value is boolean else value }}
  {%- else -%}
    '{{ value | string | replace("'", "''") }}'
  {%- endif -%}
{%- endmacro %}

{#- `WITH (...)` from the model's config: every key that names an option of `object`, then
    the `options` dictionary (which wins). Keys in `skip` are left out. -#}
{% macro tidemark__with_options(object, skip=[]) -%}
  {%- set names = tidemark__option_names(object) -%}
  {%- set opts = {} -%}
  {%- for name in names -%}
    {%- set value = config.get(name) -%}
    {%- if value is not none and name not in skip -%}
      {%- do opts.update({name: value}) -%}
    {%- endif -%}
  {%- endfor -%}
  {%- do opts.update(config.get('options', {})) -%}
  {%- if opts -%}
    with ({%- for key, value in opts.items() %}{{ key }} = {{ tidemark__option_value(value) }}{{ ", " if not loop.last }}{%- endfor %})
  {%- endif -%}
{%- endmacro %}

{#- `public` is the only schema and cannot go: dropping it drops every object in it, with
    its data, as Postgres's `DROP SCHEMA ... CASCADE` would (dbt's test suite does this
    after each test class). What reads an object is dropped before it. -#}
{% macro tidemark__drop_schema(relation) -%}
  {%- if relation.schema | lower != 'public' -%}
    {%- call statement('drop_schema') -%}
      drop schema if exists {{ relation.without_identifier().include(database=False) }} cascade
    {%- endcall -%}
  {%- else -%}
    {%- set listed = tidemark__list_relations_without_caching(relation) -%}
    {%- for kind in ['view', 'sink', 'materialized_view', 'table', 'stream'] -%}
      {%- for row in listed if row['type'] == kind -%}
        {%- set object = api.Relation.create(database=relation.database, schema='public',
                                               identifier=row['name'], type=kind) -%}
        {%- call statement('drop_schema_object') -%}
          {%- if kind == 'sink' -%}
            drop sink if exists {{ object }} purge
          {%- elif kind == 'table' -%}
            drop table if exists {{ object }} purge
          {%- else -%}
            {{ tidemark__get_drop_sql(object) }}
          {%- endif -%}
        {%- endcall -%}
      {%- endfor -%}
    {%- endfor -%}
  {%- endif -%}
{% endmacro %}

{#- `CREATE TABLE ... AS`. Tidemark has no temporary tables: a "temporary" table (dbt's
    staging of an incremental model's new rows) is a plain one with a name of its own
    (`make_temp_relation` adds a timestamp), which whatever made it drops. -#}
{% macro tidemark__create_table_as(temporary, relation, sql) -%}
  {%- set sql_header = config.get('sql_header', none) -%}
  {{ sql_header if sql_header is not none }}
  create table {{ relation }} as
  {{ sql }}
{%- endmacro %}
