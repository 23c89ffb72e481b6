//! Role statements: `CREATE`/`ALTER`/`DROP ROLE`, `GRANT`/`REVOKE`. Roles are kept in the
//! catalog file, their passwords hashed ([`crate::auth`]); logins read them through
//! [`Engine::role`].

use std::collections::HashMap;

use super::{Engine, Output};
use crate::auth::{PREDEFINED_ROLES, RoleDef, Secret};
use crate::error::{Error, Result};
use crate::sql::roles::RoleOptions;

impl Engine {
    /// The role of that name, as it is now.
    pub fn role(&self, name: &str) -> Option<RoleDef> {
        self.roles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Every role, by name.
    pub fn roles(&self) -> Vec<RoleDef> {
        let mut roles: Vec<RoleDef> = self
            .roles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        roles.sort_by(|a, b| a.name.cmp(&b.name));
        roles
    }

    pub(super) fn set_roles(&self, roles: &[RoleDef]) {
        let by_name: HashMap<String, RoleDef> =
            roles.iter().map(|r| (r.name.clone(), r.clone())).collect();
        *self.roles.lock().unwrap_or_else(|e| e.into_inner()) = by_name;
    }

    pub(super) async fn create_role(
        &self,
        name: &str,
        if_not_exists: bool,
        options: RoleOptions,
    ) -> Result<Output> {
        reserved(name)?;
        let mut cat = self.catalog.lock().await;
        if cat.roles.iter().any(|r| r.name == name) {
            if if_not_exists {
                return Ok(Output::Command("CREATE ROLE".into()));
            }
            return Err(Error::DuplicateObject {
                kind: "role",
                name: name.to_string(),
            });
        }
        let mut role = RoleDef::new(name);
        apply(&mut role, options);
        let mut roles = cat.roles.clone();
        roles.push(role);
        self.save_roles(&mut cat, roles)?;
        Ok(Output::Command("CREATE ROLE".into()))
    }

    pub(super) async fn alter_role(&self, name: &str, options: RoleOptions) -> Result<Output> {
        reserved(name)?;
        let mut cat = self.catalog.lock().await;
        let mut roles = cat.roles.clone();
        let role = roles
            .iter_mut()
            .find(|r| r.name == name)
            .ok_or_else(|| undefined(name))?;
        apply(role, options);
        self.save_roles(&mut cat, roles)?;
        Ok(Output::Command("ALTER ROLE".into()))
    }

    pub(super) async fn drop_role(&self, names: &[String], if_exists: bool) -> Result<Output> {
        let mut cat = self.catalog.lock().await;
        let mut roles = cat.roles.clone();
        for name in names {
            reserved(name)?;
            match roles.iter().position(|r| &r.name == name) {
                Some(i) => {
                    roles.remove(i);
                }
                None if if_exists => {
                    tracing::info!(role = %name, "role does not exist, skipping");
                }
                None => return Err(undefined(name)),
            }
        }
        self.save_roles(&mut cat, roles)?;
        Ok(Output::Command("DROP ROLE".into()))
    }

    pub(super) async fn grant_role(
        &self,
        granted: &[String],
        members: &[String],
        revoke: bool,
    ) -> Result<Output> {
        for g in granted {
            if !PREDEFINED_ROLES.contains(&g.as_str()) {
                if self.role(g).is_none() {
                    return Err(undefined(g));
                }
                return Err(Error::Unsupported {
                    message: format!("granting role \"{g}\" is not supported"),
                    hint: Some(format!(
                        "Grant a predefined role: {}.",
                        PREDEFINED_ROLES.join(" or ")
                    )),
                });
            }
        }
        let mut cat = self.catalog.lock().await;
        let mut roles = cat.roles.clone();
        for member in members {
            let role = roles
                .iter_mut()
                .find(|r| &r.name == member)
                .ok_or_else(|| undefined(member))?;
            for g in granted {
                if revoke {
                    role.member_of.remove(g);
                } else {
                    role.member_of.insert(g.clone());
                }
            }
        }
        self.save_roles(&mut cat, roles)?;
        let tag = if revoke { "REVOKE ROLE" } else { "GRANT ROLE" };
        Ok(Output::Command(tag.into()))
    }

    /// Makes `roles` the catalog's, durably, then the ones logins see.
    fn save_roles(&self, cat: &mut crate::catalog::Catalog, roles: Vec<RoleDef>) -> Result<()> {
        let before = std::mem::replace(&mut cat.roles, roles);
        if let Err(e) = cat.save(self.data_dir()) {
            cat.roles = before;
            return Err(e);
        }
        self.set_roles(&cat.roles);
        Ok(())
    }
}

fn apply(role: &mut RoleDef, options: RoleOptions) {
    if let Some(s) = options.superuser {
        role.superuser = s;
    }
    if let Some(l) = options.login {
        role.login = l;
    }
    if let Some(password) = options.password {
        // Postgres clears the password on an empty one, with a notice.
        role.password = password
            .filter(|p| !p.is_empty())
            .map(|p| Secret::new(&role.name, &p));
    }
}

fn reserved(name: &str) -> Result<()> {
    if name.starts_with("pg_") {
        return Err(Error::InvalidOption {
            message: format!("role name \"{name}\" is reserved"),
            hint: Some("Role names starting with \"pg_\" are reserved.".into()),
        });
    }
    Ok(())
}

fn undefined(name: &str) -> Error {
    Error::UndefinedObject {
        kind: "role",
        name: name.to_string(),
    }
}
