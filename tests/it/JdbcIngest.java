// pgjdbc against a table stream: a batch of prepared INSERTs (executeBatch), then a count.
// Run by tests/it/ingest.rs as `java -cp <postgresql.jar> JdbcIngest.java PORT`.
import java.sql.*;

public class JdbcIngest {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/tidemark?user=tidemark";
        try (Connection c = DriverManager.getConnection(url)) {
            try (PreparedStatement ps = c.prepareStatement("INSERT INTO events VALUES (?, ?, ?)")) {
                for (int i = 0; i < 100; i++) {
                    ps.setLong(1, 5000 + i);
                    ps.setTimestamp(2, Timestamp.valueOf("2026-06-10 10:00:00"));
                    ps.setDouble(3, i * 0.5);
                    ps.addBatch();
                }
                int[] counts = ps.executeBatch();
                for (int n : counts) {
                    if (n != 1) throw new RuntimeException("update count " + n + ", expected 1");
                }
            }
            try (Statement s = c.createStatement();
                 ResultSet rs = s.executeQuery("SELECT count(*) FROM events WHERE id >= 5000")) {
                rs.next();
                long n = rs.getLong(1);
                if (n != 100) throw new RuntimeException("expected 100 rows, got " + n);
            }
        }
        System.out.println("pgjdbc ingest ok");
    }
}
