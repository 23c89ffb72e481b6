"""Another Kafka client (confluent-kafka, CI installs it) for tests/it/kafka.rs: it makes
topics, produces the input and reads what Tidemark's sink wrote, as a user's consumer
would.

  kafka_client.py create BOOTSTRAP TOPIC PARTITIONS
  kafka_client.py produce BOOTSTRAP TOPIC PARTITIONS FIRST COUNT
      records FIRST..FIRST+COUNT-1, record i to partition i % PARTITIONS, keyed by i, valued
      {"id": i, "user": "u<i % 5>", "ts": <2024-01-01 00:00:00 + 7 i seconds>}; one record
      per produce request (tansu 0.6's ListOffsets answers the last batch's first offset
      + 1, not its end, so batches of one keep its latest offsets right)
  kafka_client.py produce_text BOOTSTRAP TOPIC PARTITION TEXT...
  kafka_client.py produce_file BOOTSTRAP TOPIC FILE
      each line of FILE a record of a 1-partition topic, in order
  kafka_client.py produce_avro BOOTSTRAP TOPIC SCHEMA_JSON FRAMING VALUE_JSON...
      each VALUE_JSON encoded by fastavro as one bare datum of SCHEMA_JSON (FRAMING raw) or
      behind Confluent's header with schema id 7 (FRAMING confluent), to partition 0 of a
      1-partition topic; a VALUE_JSON {"hex": "..."} is sent as those bytes instead
  kafka_client.py consume BOOTSTRAP TOPIC
      every record of every partition, read_committed, one JSON line each
  kafka_client.py delete BOOTSTRAP TOPIC
"""

import datetime
import json
import sys

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def admin(bs):
    return AdminClient({"bootstrap.servers": bs})


def create(bs, topic, parts):
    a = admin(bs)  # kept: futures fail once their client is gone
    if topic in a.list_topics(timeout=30).topics:
        return
    for _, f in a.create_topics(
        [NewTopic(topic, num_partitions=parts, replication_factor=1)]
    ).items():
        try:
            f.result(30)
        except Exception as e:  # already there
            if "exist" not in str(e).lower():
                raise


def producer(bs):
    return Producer(
        {"bootstrap.servers": bs, "batch.num.messages": 1, "linger.ms": 0}
    )


def produce(bs, topic, parts, first, count):
    create(bs, topic, parts)
    p = producer(bs)
    base = datetime.datetime(2024, 1, 1)
    failed = []
    for i in range(first, first + count):
        ts = base + datetime.timedelta(seconds=7 * i)
        value = {"id": i, "user": f"u{i % 5}", "ts": ts.strftime("%Y-%m-%d %H:%M:%S")}
        p.produce(
            topic,
            key=str(i),
            value=json.dumps(value),
            partition=i % parts,
            on_delivery=lambda e, m: e and failed.append(e),
        )
        p.poll(0)
        p.flush(30)
    assert p.flush(30) == 0, "records left unsent"
    assert not failed, failed


def produce_text(bs, topic, partition, texts):
    p = producer(bs)
    for t in texts:
        p.produce(topic, value=t.encode(), partition=partition)
        p.flush(30)
    assert p.flush(30) == 0


def produce_avro(bs, topic, schema, framing, values):
    import io

    import fastavro

    parsed = fastavro.parse_schema(json.loads(schema))
    create(bs, topic, 1)
    encoded = []
    for v in values:
        v = json.loads(v)
        if "hex" in v:
            encoded.append(bytes.fromhex(v["hex"]))
            continue
        buf = io.BytesIO()
        if framing == "confluent":
            buf.write(b"\x00" + (7).to_bytes(4, "big"))
        fastavro.schemaless_writer(buf, parsed, v)
        encoded.append(buf.getvalue())
    p = producer(bs)
    for e in encoded:
        p.produce(topic, value=e, partition=0)
        p.flush(30)
    assert p.flush(30) == 0


def consume(bs, topic):
    c = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": "tidemark-test-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    md = c.list_topics(topic, timeout=30)
    parts = sorted(md.topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    done = set()
    idle = 0
    while len(done) < len(parts):
        m = c.poll(1.0)
        if m is None:
            idle += 1
            assert idle < 60, f"no end of partitions {set(parts) - done}"
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                done.add(m.partition())
                continue
            raise Exception(m.error())
        done.discard(m.partition())
        print(
            json.dumps(
                {
                    "partition": m.partition(),
                    "offset": m.offset(),
                    "key": m.key().decode() if m.key() is not None else None,
                    "value": m.value().decode() if m.value() is not None else None,
                }
            )
        )
    c.close()


def delete(bs, topic):
    a = admin(bs)
    for _, f in a.delete_topics([topic]).items():
        f.result(30)


if __name__ == "__main__":
    cmd, bs, *rest = sys.argv[1:]
    if cmd == "create":
        create(bs, rest[0], int(rest[1]))
    elif cmd == "produce":
        produce(bs, rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
    elif cmd == "produce_text":
        produce_text(bs, rest[0], int(rest[1]), rest[2:])
    elif cmd == "produce_file":
        create(bs, rest[0], 1)
        with open(rest[1]) as f:
            produce_text(bs, rest[0], 0, [l.rstrip("\n") for l in f if l.strip()])
    elif cmd == "produce_avro":
        produce_avro(bs, rest[0], rest[1], rest[2], rest[3:])
    elif cmd == "consume":
        consume(bs, rest[0])
    elif cmd == "delete":
        delete(bs, rest[0])
    else:
        sys.exit(f"unknown command {cmd}")
