// pgjdbc's DatabaseMetaData against Tidemark: what DBeaver, Metabase and every JDBC tool
// call to browse a database. The expected answers are a PostgreSQL server's for the same
// table through the same driver (pgjdbc 42.5, Debian's): getColumns gives id as BIGINT
// (-5) `int8` size 19 NOT NULL and name as VARCHAR (12) `text` size 2147483647;
// getPrimaryKeys gives id, key 1, `<table>_pkey`.
// Run by tests/it/wire.rs as `java -cp <postgresql.jar> JdbcMeta.java PORT`.
import java.sql.*;
import java.util.*;

public class JdbcMeta {
    static void check(boolean ok, String what) {
        if (!ok) throw new RuntimeException(what);
    }

    static List<String> rows(ResultSet rs, String... cols) throws SQLException {
        List<String> out = new ArrayList<>();
        while (rs.next()) {
            StringBuilder b = new StringBuilder();
            for (String c : cols) b.append(c).append('=').append(rs.getString(c)).append(' ');
            out.add(b.toString().trim());
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/warehouse?user=tidemark";
        try (Connection c = DriverManager.getConnection(url)) {
            try (Statement s = c.createStatement()) {
                s.execute("CREATE TABLE jdbc_dims (id BIGINT PRIMARY KEY, name TEXT)");
                s.execute("CREATE STREAM jdbc_events (id BIGINT, at TIMESTAMP) WITH (connector = 'table')");
            }
            DatabaseMetaData m = c.getMetaData();
            check(m.getDatabaseProductName().equals("PostgreSQL"), "product " + m.getDatabaseProductName());
            check(m.getDatabaseMajorVersion() == 17, "major version " + m.getDatabaseMajorVersion());

            List<String> catalogs = rows(m.getCatalogs(), "TABLE_CAT");
            check(catalogs.contains("TABLE_CAT=warehouse"), "getCatalogs: " + catalogs);
            List<String> schemas = rows(m.getSchemas(), "TABLE_SCHEM");
            check(schemas.contains("TABLE_SCHEM=public"), "getSchemas: " + schemas);

            List<String> tables = rows(m.getTables(null, "public", "jdbc%", null), "TABLE_NAME", "TABLE_TYPE");
            // With no types, every kind, as PostgreSQL answers: the key's index too.
            check(tables.equals(List.of("TABLE_NAME=jdbc_dims_pkey TABLE_TYPE=INDEX",
                                        "TABLE_NAME=jdbc_dims TABLE_TYPE=TABLE",
                                        "TABLE_NAME=jdbc_events TABLE_TYPE=TABLE")), "getTables: " + tables);
            List<String> onlyTables = rows(m.getTables(null, "public", "jdbc%", new String[] {"TABLE"}), "TABLE_NAME");
            check(onlyTables.equals(List.of("TABLE_NAME=jdbc_dims", "TABLE_NAME=jdbc_events")), "getTables(TABLE): " + onlyTables);
            List<String> remarks = rows(m.getTables(null, "public", "jdbc_events", null), "REMARKS");
            check(remarks.equals(List.of("REMARKS=stream (connector = 'table')")), "REMARKS: " + remarks);

            List<String> columns = rows(m.getColumns(null, "public", "jdbc_dims", "%"),
                "COLUMN_NAME", "DATA_TYPE", "TYPE_NAME", "COLUMN_SIZE", "IS_NULLABLE");
            check(columns.equals(List.of(
                "COLUMN_NAME=id DATA_TYPE=-5 TYPE_NAME=int8 COLUMN_SIZE=19 IS_NULLABLE=NO",
                "COLUMN_NAME=name DATA_TYPE=12 TYPE_NAME=text COLUMN_SIZE=2147483647 IS_NULLABLE=YES")),
                "getColumns: " + columns);

            List<String> keys = rows(m.getPrimaryKeys(null, "public", "jdbc_dims"), "COLUMN_NAME", "KEY_SEQ", "PK_NAME");
            check(keys.equals(List.of("COLUMN_NAME=id KEY_SEQ=1 PK_NAME=jdbc_dims_pkey")), "getPrimaryKeys: " + keys);

            List<String> types = rows(m.getTypeInfo(), "TYPE_NAME", "DATA_TYPE");
            check(types.contains("TYPE_NAME=int8 DATA_TYPE=-5"), "getTypeInfo has no int8: " + types.size());
            check(types.contains("TYPE_NAME=text DATA_TYPE=12"), "getTypeInfo has no text");
            check(types.contains("TYPE_NAME=bool DATA_TYPE=-7"), "getTypeInfo has no bool");

            // A prepared query with a parameter, read by column label.
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT column_name, data_type FROM information_schema.columns "
                    + "WHERE table_name = ? ORDER BY ordinal_position")) {
                ps.setString(1, "jdbc_events");
                List<String> got = rows(ps.executeQuery(), "column_name", "data_type");
                check(got.equals(List.of("column_name=id data_type=bigint",
                                         "column_name=at data_type=timestamp without time zone")),
                      "prepared information_schema query: " + got);
            }
        }
        System.out.println("pgjdbc metadata ok");
    }
}
