//! Tidemark's own thin Spark Connect client: one gRPC session (tonic, over the prost
//! messages generated once from Spark's `.proto` files into [`proto`]) that sets the
//! session's conf, registers streaming reads as temporary views, starts a
//! `WriteStreamOperationStart`, and asks a query for its status, recent progress and
//! exception, or stops it. Every call has a deadline, so an endpoint that does not answer
//! is an error, never a hang.

#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod proto;

use std::collections::HashMap;
use std::time::Duration;

use proto::spark_connect_service_client::SparkConnectServiceClient;
use proto::{
    Command, ExecutePlanRequest, Plan, Relation, StreamingQueryInstanceId, UserContext, command,
    execute_plan_response, plan, relation, streaming_query_command, streaming_query_command_result,
    streaming_query_manager_command, streaming_query_manager_command_result,
};
use tonic::transport::{Channel, Endpoint};

use super::translate::{SparkPlan, SparkRead, SparkTrigger};
use crate::error::{Error, Result};

/// The port Spark Connect listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 15002;

/// A Spark Connect endpoint, `sc://host[:port][/;param=value...]` (Spark's connection
/// string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub host: String,
    pub port: u16,
    /// `user_id`, sent in every request's user context.
    pub user_id: String,
}

impl Remote {
    pub fn parse(s: &str) -> Result<Remote> {
        let bad = |why: &str| Error::invalid_option(format!("spark_remote '{s}': {why}"));
        let rest = s
            .strip_prefix("sc://")
            .ok_or_else(|| bad("a Spark Connect address starts with sc://"))?;
        let (authority, params) = match rest.split_once('/') {
            Some((a, p)) => (a, p),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| bad("the port is not a number from 1 to 65535"))?,
            ),
            None => (authority, DEFAULT_PORT),
        };
        if host.is_empty() || port == 0 {
            return Err(bad("no host or port"));
        }
        let mut user_id = "tidemark".to_string();
        for p in params.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| bad("a parameter is key=value"))?;
            match k {
                "user_id" => user_id = v.to_string(),
                "token" | "use_ssl" => {
                    return Err(Error::Unsupported {
                        message: format!(
                            "spark_remote '{s}': {k} (TLS to Spark Connect) is not supported yet"
                        ),
                        hint: Some(
                            "Reach the Connect server over a private network or a TLS tunnel."
                                .into(),
                        ),
                    });
                }
                // Spark's other parameters (session_id, user_agent) are Tidemark's to choose.
                other => return Err(bad(&format!("unknown parameter {other}"))),
            }
        }
        Ok(Remote {
            host: host.to_string(),
            port,
            user_id,
        })
    }
}

impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sc://{}:{}", self.host, self.port)
    }
}

/// A streaming query's ids on Spark: `id` lasts across restarts from its checkpoint,
/// `run_id` is new on every start.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueryIds {
    pub id: String,
    pub run_id: String,
}

impl QueryIds {
    fn proto(&self) -> StreamingQueryInstanceId {
        StreamingQueryInstanceId {
            id: self.id.clone(),
            run_id: self.run_id.clone(),
        }
    }
}

/// `StreamingQuery.status` on Spark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryState {
    pub message: String,
    pub is_active: bool,
    pub is_trigger_active: bool,
}

/// Whether a failed call means the server or the session is gone (reconnect and look
/// again), or the request itself was refused.
pub fn is_connection_lost(e: &Error) -> bool {
    matches!(e, Error::Spark { lost: true, .. })
}

fn status_error(remote: &Remote, s: tonic::Status) -> Error {
    use tonic::Code;
    let lost = matches!(
        s.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    ) || s.message().contains("INVALID_HANDLE.SESSION");
    Error::Spark {
        lost,
        message: format!("Spark Connect at {remote}: {}", s.message()),
    }
}

/// One Spark Connect session.
pub struct Session {
    remote: Remote,
    client: SparkConnectServiceClient<Channel>,
    session_id: String,
}

impl Session {
    /// Opens session `session_id` (a UUID: an existing one, to find its queries again,
    /// or a new one) within `timeout`.
    pub async fn connect(remote: &Remote, session_id: &str, timeout: Duration) -> Result<Session> {
        let unreachable = |why: String| Error::Spark {
            lost: true,
            message: format!("could not connect to Spark Connect at {remote}: {why}"),
        };
        let endpoint = Endpoint::from_shared(format!("http://{}:{}", remote.host, remote.port))
            .map_err(|e| unreachable(e.to_string()))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(timeout)
            .keep_alive_while_idle(true);
        let channel = tokio::time::timeout(timeout, endpoint.connect())
            .await
            .map_err(|_| unreachable(format!("no answer within {timeout:?}")))?
            .map_err(|e| unreachable(source_chain(&e)))?;
        let client = SparkConnectServiceClient::new(channel)
            .max_decoding_message_size(128 << 20)
            .max_encoding_message_size(128 << 20);
        Ok(Session {
            remote: remote.clone(),
            client,
            session_id: session_id.to_string(),
        })
    }

    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    fn user(&self) -> Option<UserContext> {
        Some(UserContext {
            user_id: self.remote.user_id.clone(),
            user_name: self.remote.user_id.clone(),
            extensions: Vec::new(),
        })
    }

    /// Runs one command and gathers every response of its stream.
    async fn execute(
        &mut self,
        command: command::CommandType,
    ) -> Result<Vec<execute_plan_response::ResponseType>> {
        let request = ExecutePlanRequest {
            session_id: self.session_id.clone(),
            user_context: self.user(),
            plan: Some(Plan {
                op_type: Some(plan::OpType::Command(Command {
                    command_type: Some(command),
                })),
            }),
            client_type: Some(concat!("tidemark/", env!("CARGO_PKG_VERSION")).into()),
            ..Default::default()
        };
        let remote = self.remote.clone();
        let mut stream = self
            .client
            .execute_plan(request)
            .await
            .map_err(|s| status_error(&remote, s))?
            .into_inner();
        let mut out = Vec::new();
        while let Some(r) = stream
            .message()
            .await
            .map_err(|s| status_error(&remote, s))?
        {
            out.extend(r.response_type);
        }
        Ok(out)
    }

    /// Sets the session's conf.
    pub async fn set_conf(&mut self, pairs: &[(String, String)]) -> Result<()> {
        use proto::config_request::{Operation, Set, operation::OpType};
        let request = proto::ConfigRequest {
            session_id: self.session_id.clone(),
            user_context: self.user(),
            operation: Some(Operation {
                op_type: Some(OpType::Set(Set {
                    pairs: pairs
                        .iter()
                        .map(|(k, v)| proto::KeyValue {
                            key: k.clone(),
                            value: Some(v.clone()),
                        })
                        .collect(),
                    silent: None,
                })),
            }),
            ..Default::default()
        };
        let remote = self.remote.clone();
        self.client
            .config(request)
            .await
            .map_err(|s| status_error(&remote, s))?;
        Ok(())
    }

    /// Asks the server something (a conf value) and ends the session: whether it is a
    /// Spark Connect server that answers, within the connection's timeout.
    pub async fn probe(mut self) -> Result<()> {
        use proto::config_request::{GetOption, Operation, operation::OpType};
        let request = proto::ConfigRequest {
            session_id: self.session_id.clone(),
            user_context: self.user(),
            operation: Some(Operation {
                op_type: Some(OpType::GetOption(GetOption {
                    keys: vec!["spark.sql.session.timeZone".into()],
                })),
            }),
            ..Default::default()
        };
        let remote = self.remote.clone();
        self.client
            .config(request)
            .await
            .map_err(|s| status_error(&remote, s))?;
        self.release().await
    }

    /// Registers `read` as a temporary view of this session.
    pub async fn create_view(&mut self, read: &SparkRead) -> Result<()> {
        let mut input = Relation {
            common: None,
            rel_type: Some(relation::RelType::Read(proto::Read {
                is_streaming: true,
                read_type: Some(proto::read::ReadType::DataSource(proto::read::DataSource {
                    format: Some(read.format.clone()),
                    schema: read.schema.clone(),
                    options: read.options.iter().cloned().collect::<HashMap<_, _>>(),
                    paths: read.path.iter().cloned().collect(),
                    predicates: Vec::new(),
                    source_name: None,
                })),
            })),
        };
        if let Some((column, delay)) = &read.watermark {
            input = Relation {
                common: None,
                rel_type: Some(relation::RelType::WithWatermark(Box::new(
                    proto::WithWatermark {
                        input: Some(Box::new(input)),
                        event_time: column.clone(),
                        delay_threshold: delay.clone(),
                    },
                ))),
            };
        }
        self.execute(command::CommandType::CreateDataframeView(
            proto::CreateDataFrameViewCommand {
                input: Some(input),
                name: read.view.clone(),
                is_global: false,
                replace: true,
            },
        ))
        .await?;
        Ok(())
    }

    /// Sets the conf, registers the reads and starts the write: the query runs on Spark
    /// from its checkpoint (from the start if it has none).
    pub async fn start(&mut self, plan: &SparkPlan) -> Result<QueryIds> {
        self.set_conf(&plan.conf).await?;
        for read in &plan.reads {
            self.create_view(read).await?;
        }
        let w = &plan.write;
        let mut options: HashMap<String, String> = HashMap::new();
        options.insert("checkpointLocation".into(), w.checkpoint.clone());
        let trigger = match &w.trigger {
            SparkTrigger::Default => None,
            SparkTrigger::ProcessingTime(d) => Some(
                proto::write_stream_operation_start::Trigger::ProcessingTimeInterval(d.clone()),
            ),
            SparkTrigger::AvailableNow => Some(
                proto::write_stream_operation_start::Trigger::AvailableNow(true),
            ),
            SparkTrigger::Once => Some(proto::write_stream_operation_start::Trigger::Once(true)),
        };
        let start = proto::WriteStreamOperationStart {
            input: Some(Relation {
                common: None,
                rel_type: Some(relation::RelType::Sql(proto::Sql {
                    query: plan.sql.clone(),
                    ..Default::default()
                })),
            }),
            format: w.format.clone(),
            options,
            trigger,
            output_mode: w.output_mode.clone(),
            query_name: w.query_name.clone(),
            sink_destination: w
                .path
                .clone()
                .map(proto::write_stream_operation_start::SinkDestination::Path),
            ..Default::default()
        };
        let responses = self
            .execute(command::CommandType::WriteStreamOperationStart(start))
            .await?;
        responses
            .into_iter()
            .find_map(|r| match r {
                execute_plan_response::ResponseType::WriteStreamOperationStartResult(r) => {
                    r.query_id.map(|q| QueryIds {
                        id: q.id,
                        run_id: q.run_id,
                    })
                }
                _ => None,
            })
            .ok_or_else(|| Error::Spark {
                lost: false,
                message: format!(
                    "Spark Connect at {} started no query (no WriteStreamOperationStartResult)",
                    self.remote
                ),
            })
    }

    async fn query_command(
        &mut self,
        ids: &QueryIds,
        command: streaming_query_command::Command,
    ) -> Result<Option<streaming_query_command_result::ResultType>> {
        let responses = self
            .execute(command::CommandType::StreamingQueryCommand(
                proto::StreamingQueryCommand {
                    query_id: Some(ids.proto()),
                    command: Some(command),
                },
            ))
            .await?;
        Ok(responses.into_iter().find_map(|r| match r {
            execute_plan_response::ResponseType::StreamingQueryCommandResult(r) => r.result_type,
            _ => None,
        }))
    }

    /// The query's status.
    pub async fn status(&mut self, ids: &QueryIds) -> Result<QueryState> {
        match self
            .query_command(ids, streaming_query_command::Command::Status(true))
            .await?
        {
            Some(streaming_query_command_result::ResultType::Status(s)) => Ok(QueryState {
                message: s.status_message,
                is_active: s.is_active,
                is_trigger_active: s.is_trigger_active,
            }),
            _ => Err(self.unexpected("status")),
        }
    }

    /// The query's recent progress reports, as Spark's JSON, oldest first.
    pub async fn recent_progress(&mut self, ids: &QueryIds) -> Result<Vec<String>> {
        match self
            .query_command(ids, streaming_query_command::Command::RecentProgress(true))
            .await?
        {
            Some(streaming_query_command_result::ResultType::RecentProgress(p)) => {
                Ok(p.recent_progress_json)
            }
            _ => Err(self.unexpected("recent progress")),
        }
    }

    /// The query's last report, as Spark's JSON (`None` before its first).
    pub async fn last_progress(&mut self, ids: &QueryIds) -> Result<Option<String>> {
        match self
            .query_command(ids, streaming_query_command::Command::LastProgress(true))
            .await?
        {
            Some(streaming_query_command_result::ResultType::RecentProgress(p)) => {
                Ok(p.recent_progress_json.into_iter().last())
            }
            _ => Err(self.unexpected("last progress")),
        }
    }

    /// Why the query failed, if it did: Spark's message, with its error class.
    pub async fn exception(&mut self, ids: &QueryIds) -> Result<Option<String>> {
        match self
            .query_command(ids, streaming_query_command::Command::Exception(true))
            .await?
        {
            Some(streaming_query_command_result::ResultType::Exception(e)) => {
                Ok(e.exception_message.map(|m| match e.error_class {
                    Some(class) if !m.contains(&class) => format!("[{class}] {m}"),
                    _ => m,
                }))
            }
            _ => Ok(None),
        }
    }

    /// Stops the query (Spark waits for its current batch).
    pub async fn stop(&mut self, ids: &QueryIds) -> Result<()> {
        self.query_command(ids, streaming_query_command::Command::Stop(true))
            .await?;
        Ok(())
    }

    /// The query of id `id` among this session's active ones.
    pub async fn find_active(&mut self, id: &str) -> Result<Option<QueryIds>> {
        let responses = self
            .execute(command::CommandType::StreamingQueryManagerCommand(
                proto::StreamingQueryManagerCommand {
                    command: Some(streaming_query_manager_command::Command::Active(true)),
                },
            ))
            .await?;
        Ok(responses
            .into_iter()
            .filter_map(|r| match r {
                execute_plan_response::ResponseType::StreamingQueryManagerCommandResult(r) => {
                    r.result_type
                }
                _ => None,
            })
            .flat_map(|r| match r {
                streaming_query_manager_command_result::ResultType::Active(a) => a.active_queries,
                _ => Vec::new(),
            })
            .filter_map(|q| q.id)
            .find(|q| q.id == id)
            .map(|q| QueryIds {
                id: q.id,
                run_id: q.run_id,
            }))
    }

    /// Ends the session on the server (its queries stop with it).
    pub async fn release(&mut self) -> Result<()> {
        let request = proto::ReleaseSessionRequest {
            session_id: self.session_id.clone(),
            user_context: self.user(),
            ..Default::default()
        };
        let remote = self.remote.clone();
        self.client
            .release_session(request)
            .await
            .map_err(|s| status_error(&remote, s))?;
        Ok(())
    }

    fn unexpected(&self, what: &str) -> Error {
        Error::Spark {
            lost: false,
            message: format!("Spark Connect at {} sent no {what}", self.remote),
        }
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes_parse_as_spark_reads_them() {
        let r = Remote::parse("sc://spark.example:443").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("spark.example", 443));
        let r = Remote::parse("sc://localhost").unwrap();
        assert_eq!(r.port, DEFAULT_PORT);
        let r = Remote::parse("sc://h:1/;user_id=ana").unwrap();
        assert_eq!(r.user_id, "ana");
        assert_eq!(r.to_string(), "sc://h:1");
        for bad in [
            "http://h:1",
            "sc://:1",
            "sc://h:x",
            "sc://h:0",
            "sc://h/;x=1",
            "sc://h/;y",
        ] {
            let e = Remote::parse(bad).unwrap_err();
            assert_eq!(e.sqlstate().code(), "22023", "{bad}: {e}");
        }
        let e = Remote::parse("sc://h/;use_ssl=true").unwrap_err();
        assert_eq!(e.sqlstate().code(), "0A000");
    }
}
