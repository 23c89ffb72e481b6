"""A Python driver receives LISTEN notifications while idle: NOTIFY from another session
and a streaming query's listener events.

Run by tests/it/monitoring.rs as

    python3 listen_check.py DRIVER PORT VIEW STREAM

- DRIVER: `psycopg` (3, `conn.notifies()`), `psycopg2` (`conn.poll()` on select) or
  `asyncpg` (`add_listener`);
- VIEW: a running materialized view over table stream STREAM (`user_id TEXT`).

The listening connection sends nothing while it waits: notifications must come to it
unasked, as Postgres delivers them. Prints `ok DRIVER` when every check passed.
"""
import asyncio
import json
import select
import sys
import time

driver, port, view, stream = sys.argv[1:5]
port = int(port)
DEADLINE_S = 60
CONNINFO = f"host=127.0.0.1 port={port} user=postgres dbname=tidemark"
EVENTS = f"tidemark_events_{view}"


def writer_steps(run, pid_of):
    """What the second session does, as (statement, ...) calls through `run`; returns its pid."""
    pid = pid_of()
    run(f"INSERT INTO {stream} VALUES ('{driver}')")
    run(f"FLUSH MATERIALIZED VIEW {view}")
    run("NOTIFY chat, 'hello from " + driver + "'")
    return pid


def check(received, writer_pid):
    """The notifications received: a progress event that read the row, then the NOTIFY."""
    progress = [
        json.loads(p) for c, p, _ in received if c == EVENTS
    ]
    assert any(
        e["event"] == "progress" and e["progress"]["numInputRows"] >= 1
        and e["progress"]["name"] == view
        for e in progress
    ), f"no progress event with the new row: {received}"
    e = next(e for e in progress if e["event"] == "progress")
    for key in ["id", "runId", "batchId", "durationMs", "sources", "sink", "stateOperators"]:
        assert key in e["progress"], f"progress event without {key}: {e}"
    chat = [(p, pid) for c, p, pid in received if c == "chat"]
    assert chat == [(f"hello from {driver}", writer_pid)], f"chat: {chat}"


def wait_for(received, done):
    deadline = time.time() + DEADLINE_S
    while not done(received):
        if time.time() > deadline:
            raise SystemExit(f"{driver}: timed out; received {received}")
        yield max(0.0, deadline - time.time())


def complete(received):
    return any(c == "chat" for c, _, _ in received) and any(
        c == EVENTS and '"numInputRows":' in p and '"event":"progress"' in p
        and '"numInputRows":0' not in p
        for c, p, _ in received
    )


def with_psycopg():
    import psycopg

    listener = psycopg.connect(CONNINFO, autocommit=True)
    writer = psycopg.connect(CONNINFO, autocommit=True)
    listener.execute(f"LISTEN {EVENTS}")
    listener.execute("LISTEN chat")
    listener.execute("LISTEN other")
    pid = writer_steps(writer.execute, lambda: writer.info.backend_pid)
    received = []
    for remaining in wait_for(received, complete):
        for n in listener.notifies(timeout=remaining, stop_after=1):
            received.append((n.channel, n.payload, n.pid))
    check(received, pid)
    # pg_notify(): NOTIFY as a function, from the writer's pid.
    writer.execute("SELECT pg_notify('chat', 'by function')")
    got = [(n.channel, n.payload, n.pid) for n in listener.notifies(timeout=DEADLINE_S, stop_after=1)]
    assert got == [("chat", "by function", pid)], got
    # UNLISTEN: only `other` is still heard.
    listener.execute("UNLISTEN chat")
    writer.execute("NOTIFY chat, 'unheard'")
    writer.execute("NOTIFY other, 'heard'")
    got = [(n.channel, n.payload) for n in listener.notifies(timeout=DEADLINE_S, stop_after=1)]
    assert got == [("other", "heard")], got
    # UNLISTEN *: nothing is heard.
    listener.execute("UNLISTEN *")
    writer.execute("NOTIFY other, 'unheard'")
    assert list(listener.notifies(timeout=0.5)) == []
    # Postgres's payload limit.
    try:
        writer.execute("NOTIFY chat, '" + "x" * 8000 + "'")
        raise SystemExit("an 8000-byte payload was accepted")
    except psycopg.errors.InvalidParameterValue:
        pass


def with_psycopg2():
    import psycopg2
    import psycopg2.extensions

    listener = psycopg2.connect(CONNINFO)
    listener.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
    writer = psycopg2.connect(CONNINFO)
    writer.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
    cur = listener.cursor()
    cur.execute(f"LISTEN {EVENTS}; LISTEN chat")
    wcur = writer.cursor()
    pid = writer_steps(wcur.execute, lambda: writer.get_backend_pid())
    received = []
    for remaining in wait_for(received, complete):
        # Waits on the socket; poll() reads what arrived without sending anything.
        select.select([listener], [], [], remaining)
        listener.poll()
        while listener.notifies:
            n = listener.notifies.pop(0)
            received.append((n.channel, n.payload, n.pid))
    check(received, pid)


def with_asyncpg():
    import asyncpg

    async def main():
        listener = await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="tidemark")
        writer = await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="tidemark")
        received = []
        arrived = asyncio.Event()

        def on(conn, pid, channel, payload):
            received.append((channel, payload, pid))
            arrived.set()

        await listener.add_listener(EVENTS, on)
        await listener.add_listener("chat", on)
        pid = writer.get_server_pid()
        await writer.execute(f"INSERT INTO {stream} VALUES ('{driver}')")
        await writer.execute(f"FLUSH MATERIALIZED VIEW {view}")
        await writer.execute(f"NOTIFY chat, 'hello from {driver}'")
        deadline = time.time() + DEADLINE_S
        while not complete(received):
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), max(0.1, deadline - time.time()))
        check(received, pid)
        await listener.remove_listener("chat", on)
        await listener.close()
        await writer.close()

    asyncio.run(main())


{"psycopg": with_psycopg, "psycopg2": with_psycopg2, "asyncpg": with_asyncpg}[driver]()
print(f"ok {driver}")
