#!/usr/bin/env python3
"""Startup time of the server: process start to the first accepted TCP connection.

    python3 benches/startup.py [BINARY]     (default target/release/tidemark)

Starts `tidemark --listen 127.0.0.1:0` with a fresh data directory three times, reads
the port it logs, and connects as soon as it can."""
import socket, subprocess, sys, time, tempfile, re
bin = sys.argv[1] if len(sys.argv) > 1 else "target/release/tidemark"
for i in range(3):
    d = tempfile.mkdtemp()
    t0 = time.time()
    p = subprocess.Popen([bin, "--data-dir", d, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    while port is None and time.time() - t0 < 30:
        line = p.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+)", line)
        if m and m.group(1) != "0":
            port = int(m.group(1))
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close(); break
        except OSError:
            if time.time() - t0 > 30: raise
    print(f"first accepted connection after {1000*(time.time()-t0):.0f} ms (port {port})")
    p.terminate(); p.wait()
