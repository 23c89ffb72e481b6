// pgjdbc receives LISTEN notifications while idle: getNotifications(timeout) waits on the
// socket without sending a query. Run by tests/it/monitoring.rs as
// `java -cp <postgresql.jar> JdbcListen.java URL VIEW STREAM`; VIEW is a running
// materialized view over table stream STREAM (`user_id TEXT`).
import java.sql.*;
import java.util.ArrayList;
import java.util.List;
import org.postgresql.PGConnection;
import org.postgresql.PGNotification;

public class JdbcListen {
    public static void main(String[] args) throws Exception {
        String url = args[0], view = args[1], stream = args[2];
        String events = "tidemark_events_" + view;
        try (Connection listener = DriverManager.getConnection(url, "postgres", "");
             Connection writer = DriverManager.getConnection(url, "postgres", "")) {
            try (Statement s = listener.createStatement()) {
                s.execute("LISTEN " + events);
                s.execute("LISTEN chat");
            }
            int writerPid = writer.unwrap(PGConnection.class).getBackendPID();
            try (Statement s = writer.createStatement()) {
                s.execute("INSERT INTO " + stream + " VALUES ('pgjdbc')");
                s.execute("FLUSH MATERIALIZED VIEW " + view);
                s.execute("NOTIFY chat, 'hello from pgjdbc'");
            }
            PGConnection pg = listener.unwrap(PGConnection.class);
            List<PGNotification> got = new ArrayList<>();
            long deadline = System.currentTimeMillis() + 60_000;
            boolean progress = false, chat = false;
            while (!(progress && chat)) {
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) throw new RuntimeException("timed out; received " + describe(got));
                PGNotification[] ns = pg.getNotifications((int) left);
                if (ns == null) continue;
                for (PGNotification n : ns) {
                    got.add(n);
                    if (n.getName().equals(events) && n.getParameter().contains("\"event\":\"progress\"")
                            && !n.getParameter().contains("\"numInputRows\":0,")) {
                        progress = true;
                    }
                    if (n.getName().equals("chat")) {
                        if (!n.getParameter().equals("hello from pgjdbc") || n.getPID() != writerPid) {
                            throw new RuntimeException("unexpected chat notification " + describe(got));
                        }
                        chat = true;
                    }
                }
            }
        }
        System.out.println("ok pgjdbc");
    }

    static String describe(List<PGNotification> ns) {
        StringBuilder b = new StringBuilder();
        for (PGNotification n : ns) {
            b.append(n.getName()).append('(').append(n.getPID()).append("): ").append(n.getParameter()).append('\n');
        }
        return b.toString();
    }
}
