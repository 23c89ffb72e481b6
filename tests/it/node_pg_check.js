// node-postgres (`pg` from npm) against Tidemark: the extended protocol with typed
// parameters and results, SQLSTATEs, a transaction, a pool. Run by tests/it/clients.rs as
// `node node_pg_check.js PORT` after it made `orders` (a table).
const assert = require("assert");
const { Client, Pool } = require("pg");

async function main() {
  const port = Number(process.argv[2]);
  const client = new Client({ host: "127.0.0.1", port, user: "tidemark", database: "shop" });
  await client.connect();

  // Parameters bound by the server (Parse/Bind/Execute).
  const typed = await client.query(
    "SELECT $1::bigint AS i, $2::double precision AS f, $3::text AS t, $4::boolean AS b",
    ["7", 2.5, "x", true],
  );
  // node-postgres reads int8 as a string (it may not fit a JS number).
  assert.deepStrictEqual(typed.rows, [{ i: "7", f: 2.5, t: "x", b: true }]);
  assert.deepStrictEqual(
    typed.fields.map((f) => f.dataTypeID),
    [20, 701, 25, 16],
  );

  const orders = await client.query(
    "SELECT id, amount, note FROM orders WHERE amount > $1 ORDER BY id",
    [1.0],
  );
  assert.deepStrictEqual(orders.rows, [
    { id: "1", amount: 9.5, note: "a" },
    { id: "2", amount: 20, note: null },
  ]);
  const version = await client.query("SHOW server_version_num");
  assert.ok(Number(version.rows[0].server_version_num) >= 170000);

  // Errors carry Postgres's SQLSTATE, and the connection goes on.
  await assert.rejects(client.query("SELECT * FROM nope"), (e) => e.code === "42P01");
  await assert.rejects(client.query("SELECT 1/0"), (e) => e.code === "22012");
  await client.query("BEGIN");
  const inTx = await client.query("SELECT count(*)::int AS n FROM orders");
  assert.strictEqual(inTx.rows[0].n, 2);
  await client.query("COMMIT");
  await client.end();

  // A pool of connections, used at once.
  const pool = new Pool({ host: "127.0.0.1", port, user: "tidemark", database: "shop", max: 4 });
  const sums = await Promise.all(
    [1, 2, 3, 4, 5, 6, 7, 8].map((i) => pool.query("SELECT $1::int + $1::int AS d", [i])),
  );
  assert.deepStrictEqual(
    sums.map((r) => r.rows[0].d),
    [2, 4, 6, 8, 10, 12, 14, 16],
  );
  await pool.end();
  console.log("node-postgres ok");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
