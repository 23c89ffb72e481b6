//! Roles, their passwords, and the proof a login gives. Pure logic, without I/O: the wire
//! ([`crate::server`]) runs the exchange, the catalog stores the roles.
//!
//! A password is stored as Postgres stores it:
//! - a SCRAM-SHA-256 secret, `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
//!   The password cannot be recovered from it, and it is not enough to log in.
//! - Postgres's md5 secret, `md5` + md5(password ‖ user), for clients that only speak md5
//!   (`--auth md5`).
//!
//! A password given already hashed (as `pg_dump` writes `CREATE ROLE … PASSWORD
//! 'SCRAM-SHA-256$…'`) is kept as given.
//!
//! The server side of SCRAM-SHA-256 (RFC 5802 and 7677, without channel binding) is
//! [`ScramServer`]; md5's challenge is [`md5_response_matches`].

use std::collections::BTreeSet;
use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::rand::{SecureRandom, SystemRandom};
use ring::{digest, hmac};
use serde::{Deserialize, Serialize};

/// Postgres 14's predefined role whose members may read every relation.
pub const READ_ALL_DATA: &str = "pg_read_all_data";
/// Postgres 14's predefined role whose members may write every table.
pub const WRITE_ALL_DATA: &str = "pg_write_all_data";
/// The predefined roles a `GRANT` may name.
pub const PREDEFINED_ROLES: [&str; 2] = [READ_ALL_DATA, WRITE_ALL_DATA];

/// A role made with `CREATE ROLE` (or `CREATE USER`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleDef {
    pub name: String,
    #[serde(default)]
    pub superuser: bool,
    /// Whether it may log in (`LOGIN`; `CREATE USER` implies it).
    #[serde(default)]
    pub login: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
    /// The roles granted to it (`GRANT pg_read_all_data TO name`).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub member_of: BTreeSet<String>,
}

/// What a statement needs of the role running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Privilege {
    /// Nothing: `SET`, `SHOW`, transaction control, catalog queries.
    None,
    /// Reading a stream, table, sink or view: `pg_read_all_data`.
    Read,
    /// Adding or changing rows of a table or table stream: `pg_write_all_data`.
    Write,
    /// Everything else: creating, dropping, altering, stopping; roles.
    Superuser,
}

impl RoleDef {
    /// A role with no attributes and no password.
    pub fn new(name: impl Into<String>) -> RoleDef {
        RoleDef {
            name: name.into(),
            superuser: false,
            login: false,
            password: None,
            member_of: BTreeSet::new(),
        }
    }

    /// Whether this role may do what needs `privilege`.
    pub fn has(&self, privilege: Privilege) -> bool {
        self.superuser
            || match privilege {
                Privilege::None => true,
                Privilege::Read => self.member_of.contains(READ_ALL_DATA),
                Privilege::Write => self.member_of.contains(WRITE_ALL_DATA),
                Privilege::Superuser => false,
            }
    }
}

/// A role's stored password: its SCRAM secret and, when the password was given in clear
/// or as md5, its md5 secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Secret {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scram: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5: Option<String>,
}

impl Secret {
    /// The secrets of `password` for role `user`.
    pub fn new(user: &str, password: &str) -> Secret {
        if ScramSecret::parse(password).is_some() {
            return Secret {
                scram: Some(password.to_string()),
                md5: None,
            };
        }
        if is_md5_secret(password) {
            return Secret {
                scram: None,
                md5: Some(password.to_string()),
            };
        }
        Secret {
            scram: Some(postgres_protocol::password::scram_sha_256(
                password.as_bytes(),
            )),
            md5: Some(postgres_protocol::password::md5(password.as_bytes(), user)),
        }
    }
}

fn is_md5_secret(s: &str) -> bool {
    s.len() == 35 && s.starts_with("md5") && s[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// A parsed SCRAM-SHA-256 secret.
#[derive(Debug, Clone, PartialEq)]
pub struct ScramSecret {
    iterations: u32,
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl ScramSecret {
    /// Parses Postgres's `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    pub fn parse(s: &str) -> Option<ScramSecret> {
        let rest = s.strip_prefix("SCRAM-SHA-256$")?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored_key, server_key) = keys.split_once(':')?;
        let secret = ScramSecret {
            iterations: iterations.parse().ok().filter(|i| *i > 0)?,
            salt: BASE64.decode(salt).ok()?,
            stored_key: BASE64.decode(stored_key).ok()?,
            server_key: BASE64.decode(server_key).ok()?,
        };
        (secret.stored_key.len() == 32 && secret.server_key.len() == 32).then_some(secret)
    }

    /// A secret no proof matches. A login as a role that does not exist, or has no
    /// password, goes through the whole exchange with it and then fails, as Postgres's
    /// mock authentication does, so the failure does not tell which roles exist.
    pub fn mock() -> ScramSecret {
        ScramSecret {
            iterations: 4096,
            salt: random_bytes::<16>().to_vec(),
            stored_key: random_bytes::<32>().to_vec(),
            server_key: random_bytes::<32>().to_vec(),
        }
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // The system's random source failing is not something a login can recover from; an
    // all-zero nonce would still be unique per server key, so fall back rather than panic.
    if SystemRandom::new().fill(&mut bytes).is_err() {
        tracing::error!("the system random source failed");
    }
    bytes
}

/// Why a SCRAM exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// A message that is not SCRAM: the client gets 08P01.
    Malformed(String),
    /// The proof does not match: the client gets 28P01.
    WrongPassword,
}

/// The server's side of one SCRAM-SHA-256 exchange, after the client's first message.
#[derive(Debug)]
pub struct ScramServer {
    secret: ScramSecret,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl ScramServer {
    /// Reads the client's first message; answers the server's first message.
    pub fn start(
        secret: ScramSecret,
        client_first: &[u8],
    ) -> Result<(ScramServer, String), ScramError> {
        let malformed = |m: &str| ScramError::Malformed(m.to_string());
        let text = std::str::from_utf8(client_first)
            .map_err(|_| malformed("the SCRAM message is not UTF-8"))?;
        // gs2-header: a channel binding flag, an optional authzid, then the bare message.
        let mut parts = text.splitn(3, ',');
        let (Some(flag), Some(authzid), Some(bare)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("malformed SCRAM message"));
        };
        match flag {
            "n" | "y" => {}
            f if f.starts_with("p=") => {
                return Err(malformed(
                    "channel binding is not supported: the server did not offer SCRAM-SHA-256-PLUS",
                ));
            }
            _ => {
                return Err(malformed(
                    "malformed SCRAM message (bad channel binding flag)",
                ));
            }
        }
        if !authzid.is_empty() {
            return Err(malformed(
                "client uses authorization identity, but it is not supported",
            ));
        }
        let mut attrs = bare.split(',');
        // The user name is the startup packet's; Postgres's clients leave `n=` empty.
        if !attrs.next().is_some_and(|a| a.starts_with("n=")) {
            return Err(malformed("malformed SCRAM message (expected n=)"));
        }
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b)))
            .ok_or_else(|| malformed("malformed SCRAM message (expected a nonce r=)"))?;
        let nonce = format!("{client_nonce}{}", BASE64.encode(random_bytes::<18>()));
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&secret.salt),
            secret.iterations
        );
        let server = ScramServer {
            secret,
            gs2_header: format!("{flag},{authzid},"),
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok((server, server_first))
    }

    /// Checks the client's final message; answers the server's final message (which
    /// proves to the client that the server knew the secret).
    pub fn finish(&self, client_final: &[u8]) -> Result<String, ScramError> {
        let malformed = |m: &str| ScramError::Malformed(m.to_string());
        let text = std::str::from_utf8(client_final)
            .map_err(|_| malformed("the SCRAM message is not UTF-8"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or_else(|| malformed("malformed SCRAM message (expected a proof p=)"))?;
        let mut attrs = without_proof.split(',');
        let binding = attrs
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .and_then(|b| BASE64.decode(b).ok())
            .ok_or_else(|| malformed("malformed SCRAM message (expected c=)"))?;
        if binding != self.gs2_header.as_bytes() {
            return Err(malformed("SCRAM channel binding check failed"));
        }
        if attrs.next().and_then(|a| a.strip_prefix("r=")) != Some(self.nonce.as_str()) {
            return Err(malformed("SCRAM nonce does not match"));
        }
        let proof = BASE64
            .decode(proof)
            .map_err(|_| malformed("malformed SCRAM proof"))?;
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let signature = hmac_sha256(&self.secret.stored_key, auth_message.as_bytes());
        if proof.len() != signature.len() {
            return Err(ScramError::WrongPassword);
        }
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let stored_key = digest::digest(&digest::SHA256, &client_key);
        if !equal_in_constant_time(stored_key.as_ref(), &self.secret.stored_key) {
            return Err(ScramError::WrongPassword);
        }
        let verifier = hmac_sha256(&self.secret.server_key, auth_message.as_bytes());
        Ok(format!("v={}", BASE64.encode(verifier)))
    }
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), message)
        .as_ref()
        .to_vec()
}

fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh salt for md5's challenge.
pub fn md5_salt() -> [u8; 4] {
    random_bytes::<4>()
}

/// Whether a client's answer to md5's challenge (`md5` + md5(secret's hex ‖ salt)) matches
/// the stored md5 secret.
pub fn md5_response_matches(secret: &str, salt: [u8; 4], response: &str) -> bool {
    let Some(hex) = secret.strip_prefix("md5") else {
        return false;
    };
    let mut input = hex.as_bytes().to_vec();
    input.extend_from_slice(&salt);
    let expected = format!("md5{:x}", md5::compute(input));
    equal_in_constant_time(expected.as_bytes(), response.as_bytes())
}

/// How a client proves who it is: `pg_hba.conf`'s methods that Tidemark has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// Any user name is taken as given.
    Trust,
    /// A password, proved by SCRAM-SHA-256 without sending it.
    ScramSha256,
    /// A password, proved by md5's challenge (for clients without SCRAM).
    Md5,
}

impl AuthMethod {
    /// The method of that name, as `pg_hba.conf` spells it.
    pub fn from_name(name: &str) -> Option<AuthMethod> {
        match name {
            "trust" => Some(AuthMethod::Trust),
            "scram-sha-256" => Some(AuthMethod::ScramSha256),
            "md5" => Some(AuthMethod::Md5),
            _ => None,
        }
    }

    /// The method for a client at `peer`: the configured one or, by default, trust for a
    /// loopback client and SCRAM-SHA-256 for any other (the `pg_hba.conf` of a fresh
    /// Postgres, with passwords required off the machine).
    pub fn for_peer(configured: Option<AuthMethod>, peer: IpAddr) -> AuthMethod {
        configured.unwrap_or(if is_loopback(peer) {
            AuthMethod::Trust
        } else {
            AuthMethod::ScramSha256
        })
    }

    /// Whether the server may listen on `listen` with `configured`: trust is only for
    /// loopback, unless the operator says `--insecure`.
    pub fn check_listen(
        configured: Option<AuthMethod>,
        listen: IpAddr,
        insecure: bool,
    ) -> Result<(), String> {
        if configured == Some(AuthMethod::Trust) && !is_loopback(listen) && !insecure {
            return Err(format!(
                "refusing to listen on {listen} with --auth trust: anyone who can reach it could \
                 connect as any user; use --auth scram-sha-256 (or leave --auth out: clients \
                 off this machine then need a password), or say --insecure"
            ));
        }
        Ok(())
    }
}

/// Whether `ip` is this machine's loopback (IPv4-mapped IPv6 included).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

    /// Runs a whole exchange with tokio-postgres's client side of SCRAM.
    fn login(stored: &Secret, password: &str) -> Result<(), ScramError> {
        let secret = ScramSecret::parse(stored.scram.as_deref().unwrap()).unwrap();
        let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unrequested());
        let (server, server_first) = ScramServer::start(secret, client.message())?;
        client.update(server_first.as_bytes()).unwrap();
        let server_final = server.finish(client.message())?;
        // The client checks the server's signature: the server knew the secret.
        client.finish(server_final.as_bytes()).unwrap();
        Ok(())
    }

    #[test]
    fn scram_accepts_the_password_and_refuses_another() {
        let stored = Secret::new("ann", "s3cret pass");
        assert_eq!(login(&stored, "s3cret pass"), Ok(()));
        assert_eq!(login(&stored, "s3cret"), Err(ScramError::WrongPassword));
        assert_eq!(login(&stored, ""), Err(ScramError::WrongPassword));
    }

    #[test]
    fn stored_secrets_are_postgres_formats_and_not_the_password() {
        // A password with characters base64 never has: a random salt or key cannot hold it.
        let stored = Secret::new("ann", "pw d!");
        let scram = stored.scram.as_deref().unwrap();
        assert!(scram.starts_with("SCRAM-SHA-256$4096:"), "{scram}");
        assert!(!scram.contains("pw d!"));
        // Postgres's md5 secret of password `pw d!` for user `ann`: md5("pw d!ann").
        assert_eq!(
            stored.md5.as_deref(),
            Some(format!("md5{:x}", md5::compute("pw d!ann")).as_str())
        );
        // Hashed input is kept as given.
        assert_eq!(Secret::new("bob", scram).scram.as_deref(), Some(scram));
        assert_eq!(Secret::new("bob", scram).md5, None);
        let md5 = stored.md5.clone().unwrap();
        assert_eq!(Secret::new("x", &md5).md5, Some(md5));
    }

    #[test]
    fn a_mock_secret_refuses_every_password() {
        let mut client = ScramSha256::new(b"anything", ChannelBinding::unrequested());
        let (server, first) = ScramServer::start(ScramSecret::mock(), client.message()).unwrap();
        client.update(first.as_bytes()).unwrap();
        assert_eq!(
            server.finish(client.message()),
            Err(ScramError::WrongPassword)
        );
    }

    #[test]
    fn malformed_scram_messages_are_refused_not_panicked_on() {
        let secret = || ScramSecret::parse(&Secret::new("a", "b").scram.unwrap()).unwrap();
        for bad in [
            &b""[..],
            b"n,,",
            b"x,,n=,r=abc",
            b"p=tls-server-end-point,,n=,r=abc",
            b"n,a=someone,n=,r=abc",
            b"n,,n=,r=",
            b"n,,r=abc",
            b"\xff\xfe",
        ] {
            assert!(
                matches!(
                    ScramServer::start(secret(), bad),
                    Err(ScramError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        let (server, _) = ScramServer::start(secret(), b"n,,n=,r=abc").unwrap();
        for bad in [
            &b""[..],
            b"c=biws,r=abc",
            b"c=eSws,r=abc,p=AAAA",
            b"c=biws,r=wrong,p=AAAA",
            b"c=biws,r=abc,p=!!",
        ] {
            assert!(
                matches!(server.finish(bad), Err(ScramError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn md5_challenge_matches_postgres_formula() {
        let stored = Secret::new("ann", "pw").md5.unwrap();
        let salt = [1, 2, 3, 4];
        // The client's side, as libpq computes it from the password.
        let inner = format!("{:x}", md5::compute("pwann"));
        let mut input = inner.into_bytes();
        input.extend_from_slice(&salt);
        let response = format!("md5{:x}", md5::compute(input));
        assert!(md5_response_matches(&stored, salt, &response));
        assert!(!md5_response_matches(&stored, [4, 3, 2, 1], &response));
        assert!(!md5_response_matches(&stored, salt, "md5"));
    }

    #[test]
    fn trust_is_for_loopback_unless_configured() {
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let remote: IpAddr = "10.1.2.3".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        assert_eq!(AuthMethod::for_peer(None, local), AuthMethod::Trust);
        assert_eq!(AuthMethod::for_peer(None, mapped), AuthMethod::Trust);
        assert_eq!(AuthMethod::for_peer(None, remote), AuthMethod::ScramSha256);
        assert_eq!(
            AuthMethod::for_peer(Some(AuthMethod::Md5), local),
            AuthMethod::Md5
        );
        assert!(AuthMethod::check_listen(None, any, false).is_ok());
        assert!(AuthMethod::check_listen(Some(AuthMethod::Trust), local, false).is_ok());
        assert!(AuthMethod::check_listen(Some(AuthMethod::Trust), any, false).is_err());
        assert!(AuthMethod::check_listen(Some(AuthMethod::Trust), any, true).is_ok());
    }

    #[test]
    fn privileges_follow_the_predefined_roles() {
        let mut r = RoleDef::new("r");
        assert!(r.has(Privilege::None));
        assert!(!r.has(Privilege::Read));
        r.member_of.insert(READ_ALL_DATA.into());
        assert!(r.has(Privilege::Read));
        assert!(!r.has(Privilege::Write));
        assert!(!r.has(Privilege::Superuser));
        r.superuser = true;
        assert!(r.has(Privilege::Superuser) && r.has(Privilege::Write));
    }
}
