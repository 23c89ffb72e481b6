//! librdkafka's mock Kafka cluster as a process of its own, for the Kafka benchmarks
//! (`benches/kafka.sh`): a broker that implements Kafka's protocol, transactions included,
//! in memory, from the client Tidemark already builds.
//!
//!     cargo run --release --example mock_broker -- TOPIC:PARTITIONS ...
//!
//! Makes the topics, prints the bootstrap address on a line of its own, and runs until its
//! standard input closes.

use std::io::{Read, Write};

fn main() {
    let mock = rdkafka::mocking::MockCluster::new(1).expect("a mock cluster");
    for spec in std::env::args().skip(1) {
        let (name, parts) = spec.split_once(':').unwrap_or((&spec, "1"));
        let parts: i32 = parts.parse().expect("TOPIC:PARTITIONS");
        mock.create_topic(name, parts, 1).expect("create a topic");
    }
    println!("{}", mock.bootstrap_servers());
    std::io::stdout().flush().expect("stdout");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
}
