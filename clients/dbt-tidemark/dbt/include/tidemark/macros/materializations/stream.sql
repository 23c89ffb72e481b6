{#- A stream: the model's body is the column list (with an optional WATERMARK FOR clause),
    the config gives the connector and its options:

      {{ config(materialized='stream', connector='file', format='json', path='/data/clicks') }}
      user_id text, page text, event_time timestamp,
      watermark for event_time as event_time - interval '10 minutes'

    A stream that exists is kept as it is: its sinks read it, and a changed declaration
    needs them dropped first. -#}
{% materialization stream, adapter='tidemark' %}
  {%- set existing = load_cached_relation(this) -%}
  {%- set target = this.incorporate(type='stream') -%}
  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {%- if existing is not none and not existing.is_stream -%}
    {{ log("Dropping " ~ existing ~ " (a " ~ existing.type ~ "): the model is now a stream", info=True) }}
    {{ adapter.drop_relation(existing) }}
    {%- set existing = none -%}
  {%- endif -%}
  {%- if existing is none -%}
    {% call statement('main') -%}
      create stream {{ target }} (
        {{ sql }}
      ) {{ tidemark__with_options('stream') }}
    {%- endcall %}
  {%- else -%}
    {{ log("Stream " ~ target ~ " exists and is kept as declared (drop it and its sinks to declare it again)", info=True) }}
    {% call noop_statement('main', 'STREAM KEPT') -%}{%- endcall %}
  {%- endif -%}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}
