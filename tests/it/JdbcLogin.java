// pgjdbc logs in with a password (SCRAM-SHA-256), optionally over TLS, and runs a query.
// Run by tests/it/security.rs as
// `java -cp <postgresql.jar> JdbcLogin.java URL USER PASSWORD EXPECT` where EXPECT is `ok`
// or the SQLSTATE the login must fail with.
import java.sql.*;
import java.util.Properties;

public class JdbcLogin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        String expect = args[3];
        try (Connection c = DriverManager.getConnection(args[0], props);
             Statement s = c.createStatement();
             ResultSet rs = s.executeQuery("SELECT 41 + 1")) {
            rs.next();
            if (rs.getInt(1) != 42) throw new RuntimeException("expected 42, got " + rs.getInt(1));
            if (!expect.equals("ok")) throw new RuntimeException("logged in; expected " + expect);
        } catch (SQLException e) {
            if (!expect.equals(e.getSQLState())) {
                throw new RuntimeException("expected " + expect + ", got " + e.getSQLState(), e);
            }
        }
        System.out.println("pgjdbc login " + expect);
    }
}
