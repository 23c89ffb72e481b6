// node-postgres (`pg` from npm) logs in with a password (SCRAM-SHA-256 or md5), optionally
// over TLS. Run by tests/it/security.rs as `node node_pg_login.js PORT USER PASSWORD CA
// EXPECT`, with CA and EXPECT as for driver_login.py: CA `-` for no TLS, EXPECT `plain`,
// `tls` or the refusal's SQLSTATE.
const assert = require("assert");
const fs = require("fs");
const { Client } = require("pg");

async function main() {
  const [port, user, password, ca, expect] = process.argv.slice(2);
  const tls = ca !== "-";
  const client = new Client({
    host: tls ? "localhost" : "127.0.0.1",
    port: Number(port),
    user,
    password,
    database: "tidemark",
    // Verified against the CA, for host name localhost (sslmode=verify-full).
    ssl: tls ? { ca: fs.readFileSync(ca, "utf8"), rejectUnauthorized: true } : false,
  });
  let got;
  try {
    await client.connect();
    const r = await client.query("SELECT 41 + 1 AS n");
    assert.strictEqual(Number(r.rows[0].n), 42);
    got = client.connection.stream.encrypted ? "tls" : "plain";
    await client.end();
  } catch (e) {
    got = e.code || String(e);
  }
  assert.strictEqual(got, expect, `node-postgres: expected ${expect}, got ${got}`);
  console.log("node-postgres login", got);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
