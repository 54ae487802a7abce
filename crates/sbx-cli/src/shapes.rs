//! The JSON shapes `sbx … --json` prints, and their parsers.
//!
//! Unknown fields are ignored. A field this crate uses must have its type when present; a shape
//! it does not recognise is [`Error::Malformed`], never an empty answer, so a changed `sbx`
//! output can never read as "no sandboxes" or "no MCP servers".

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::error::{Call, Error};
use crate::name::SbxName;

type Object = Map<String, Value>;

/// One row of `sbx ls --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LsRow {
    /// The sandbox name (always a non-empty string).
    pub name: String,
    /// The sandbox id; `None` when absent or empty.
    pub id: Option<String>,
    /// `running`, `stopped`, … as `sbx` says.
    pub status: Option<String>,
    /// The agent the sandbox was created for (`shell`).
    pub agent: Option<String>,
    /// The template it was created from.
    pub template: Option<String>,
    /// The host paths mounted into it.
    pub workspaces: Vec<PathBuf>,
    /// Its CPU count, when given as a number (or a numeric string).
    pub cpus: Option<u64>,
    /// Its memory size as `sbx` prints it.
    pub memory: Option<String>,
    /// When it was created, as `sbx` prints it.
    pub created_at: Option<String>,
}

impl LsRow {
    /// The row's name as an [`SbxName`], or `None` when `sbx` lists a name this crate could not
    /// pass back to it (which then belongs to no caller of this crate).
    pub fn sbx_name(&self) -> Option<SbxName> {
        SbxName::new(self.name.clone()).ok()
    }
}

/// One registered MCP server of `sbx mcp ls --json`. Any element counts as a server, whatever
/// its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct McpServer {
    /// Its name, when the element is an object with a string `name`.
    pub name: Option<String>,
    /// Its URL, when the element is an object with a string `url`.
    pub url: Option<String>,
}

/// `sbx policy ls [<name>] --json`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PolicyList {
    /// Every rule listed.
    pub rules: Vec<PolicyRule>,
}

/// One rule of [`PolicyList`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PolicyRule {
    /// `global` or `sandbox:<name>`.
    pub scope: Option<String>,
    /// `allow` or `deny`.
    pub decision: Option<String>,
    /// `active`, …
    pub status: Option<String>,
    /// `network`, …
    pub resource_type: Option<String>,
    /// The resources the rule names.
    pub resources: Vec<String>,
    /// The hosts of its HTTP targets.
    pub http_targets: Vec<String>,
}

impl PolicyRule {
    /// Whether the rule belongs to sandbox `name` (`scope == "sandbox:<name>"`).
    pub fn belongs_to(&self, name: &SbxName) -> bool {
        self.scope
            .as_deref()
            .and_then(|scope| scope.strip_prefix("sandbox:"))
            == Some(name.as_str())
    }

    /// Whether the rule is an active global allow, which opens every sandbox's network.
    pub fn is_active_global_allow(&self) -> bool {
        self.scope.as_deref() == Some("global")
            && self.decision.as_deref() == Some("allow")
            && self.status.as_deref() == Some("active")
    }
}

/// `sbx policy check network --json <host>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyCheck {
    /// Whether the host is reachable under the current policy.
    pub allowed: bool,
    /// Whether policy governance is active.
    pub governance_active: bool,
}

/// `sbx secret ls --json`: names and scopes only; `sbx` never prints secret values here.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SecretList {
    /// The stored secrets.
    pub secrets: Vec<SecretEntry>,
    /// How many secrets come from the environment only.
    pub env_only_count: u64,
    /// Custom secrets mapped to environment variables.
    pub custom_secrets: Vec<CustomSecret>,
}

/// One entry of [`SecretList::secrets`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SecretEntry {
    /// The secret's name.
    pub name: Option<String>,
    /// Its scope.
    pub scope: Option<String>,
}

/// One entry of [`SecretList::custom_secrets`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CustomSecret {
    /// The environment variable it is exposed as.
    pub env: Option<String>,
    /// Its scope.
    pub scope: Option<String>,
    /// The targets it applies to.
    pub targets: Vec<String>,
}

/// Reads one JSON document; anything else is malformed.
fn document(call: Call, bytes: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(bytes).map_err(|err| Error::malformed(call, format!("not JSON: {err}")))
}

/// The array itself, or the array under `key` of an object (the legacy keyed shape).
fn list_or_keyed(call: Call, value: Value, key: &str) -> Result<Vec<Value>, Error> {
    match value {
        Value::Array(items) => Ok(items),
        Value::Object(mut object) => match object.remove(key) {
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(Error::malformed(
                call,
                format!("`{key}` is {}, not an array", kind(&other)),
            )),
            None => Err(Error::malformed(
                call,
                format!("an object without `{key}`, not an array"),
            )),
        },
        other => Err(Error::malformed(
            call,
            format!("{}, not an array", kind(&other)),
        )),
    }
}

/// The object at the top of the document.
fn top_object(call: Call, value: Value) -> Result<Object, Error> {
    match value {
        Value::Object(object) => Ok(object),
        other => Err(Error::malformed(
            call,
            format!("{}, not an object", kind(&other)),
        )),
    }
}

/// Describes a JSON value's type for an error message.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads the fields of one object, naming where it is in errors.
struct Fields<'a> {
    call: Call,
    place: &'a str,
    object: &'a Object,
}

impl<'a> Fields<'a> {
    fn of(call: Call, place: &'a str, value: &'a Value) -> Result<Self, Error> {
        match value {
            Value::Object(object) => Ok(Fields {
                call,
                place,
                object,
            }),
            other => Err(Error::malformed(
                call,
                format!("{place} is {}, not an object", kind(other)),
            )),
        }
    }

    fn wrong(&self, key: &str, wanted: &str, got: &Value) -> Error {
        Error::malformed(
            self.call,
            format!("{}: `{key}` is {}, not {wanted}", self.place, kind(got)),
        )
    }

    /// A string field; absent or null is `None`, another type is malformed.
    fn string(&self, key: &str) -> Result<Option<String>, Error> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    /// A string field that is only informative: another type reads as `None`.
    fn string_lenient(&self, key: &str) -> Option<String> {
        match self.object.get(key) {
            Some(Value::String(text)) => Some(text.clone()),
            Some(Value::Number(number)) => Some(number.to_string()),
            _ => None,
        }
    }

    /// A boolean field that must be present.
    fn required_bool(&self, key: &str) -> Result<bool, Error> {
        match self.object.get(key) {
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(other) => Err(self.wrong(key, "a boolean", other)),
            None => Err(Error::malformed(
                self.call,
                format!("{}: `{key}` is missing", self.place),
            )),
        }
    }

    /// An array field; absent or null is empty, another type is malformed.
    fn array(&self, key: &str) -> Result<&'a [Value], Error> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(self.wrong(key, "an array", other)),
        }
    }

    /// An array field of strings.
    fn strings(&self, key: &str) -> Result<Vec<String>, Error> {
        self.array(key)?
            .iter()
            .map(|item| match item {
                Value::String(text) => Ok(text.clone()),
                other => Err(Error::malformed(
                    self.call,
                    format!(
                        "{}: `{key}` holds {}, not only strings",
                        self.place,
                        kind(other)
                    ),
                )),
            })
            .collect()
    }
}

/// Parses `sbx ls --json`: an array of rows, or an object whose `sandboxes` member is one.
///
/// # Errors
///
/// [`Error::Malformed`] for anything else, for a row that is not an object with a non-empty
/// string `name`, for an `id` that is not a string, and for `workspaces` that is not an array of
/// strings.
pub fn parse_ls(bytes: &[u8]) -> Result<Vec<LsRow>, Error> {
    let call = Call::Ls;
    let items = list_or_keyed(call, document(call, bytes)?, "sandboxes")?;
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let place = format!("row {index}");
            let fields = Fields::of(call, &place, item)?;
            let name = match fields.string("name")? {
                Some(name) if !name.is_empty() => name,
                _ => {
                    return Err(Error::malformed(
                        call,
                        format!("{place} has no non-empty string `name`"),
                    ))
                }
            };
            let cpus = match item.get("cpus") {
                Some(Value::Number(number)) => number.as_u64(),
                Some(Value::String(text)) => text.trim().parse().ok(),
                _ => None,
            };
            Ok(LsRow {
                name,
                id: fields.string("id")?.filter(|id| !id.is_empty()),
                status: fields.string_lenient("status"),
                agent: fields.string_lenient("agent"),
                template: fields.string_lenient("template"),
                workspaces: fields
                    .strings("workspaces")?
                    .into_iter()
                    .map(PathBuf::from)
                    .collect(),
                cpus,
                memory: fields.string_lenient("memory"),
                created_at: fields.string_lenient("created_at"),
            })
        })
        .collect()
}

/// Parses `sbx mcp ls --json`: an array, or an object whose `servers` member is one. Every
/// element is a registered server.
///
/// # Errors
///
/// [`Error::Malformed`] for any other shape.
pub fn parse_mcp_ls(bytes: &[u8]) -> Result<Vec<McpServer>, Error> {
    let call = Call::McpLs;
    let items = list_or_keyed(call, document(call, bytes)?, "servers")?;
    Ok(items
        .iter()
        .map(|item| McpServer {
            name: item.get("name").and_then(Value::as_str).map(str::to_owned),
            url: item.get("url").and_then(Value::as_str).map(str::to_owned),
        })
        .collect())
}

/// Parses `sbx policy ls [<name>] --json`: `{"rules": [...]}`.
///
/// # Errors
///
/// [`Error::Malformed`] when the document is not an object with a `rules` array of objects, or a
/// rule's fields have the wrong types.
pub fn parse_policy_ls(bytes: &[u8]) -> Result<PolicyList, Error> {
    let call = Call::PolicyLs;
    let top = document(call, bytes)?;
    let fields = Fields::of(call, "the document", &top)?;
    if !matches!(top.get("rules"), Some(Value::Array(_))) {
        return Err(Error::malformed(call, "no `rules` array"));
    }
    let rules = fields
        .array("rules")?
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let place = format!("rule {index}");
            let rule = Fields::of(call, &place, item)?;
            let http_targets = rule
                .array("http_targets")?
                .iter()
                .map(|target| {
                    Fields::of(call, &place, target)?
                        .string("host")?
                        .ok_or_else(|| {
                            Error::malformed(call, format!("{place}: an http target has no `host`"))
                        })
                })
                .collect::<Result<_, _>>()?;
            Ok(PolicyRule {
                scope: rule.string("scope")?,
                decision: rule.string("decision")?,
                status: rule.string("status")?,
                resource_type: rule.string("resource_type")?,
                resources: rule.strings("resources")?,
                http_targets,
            })
        })
        .collect::<Result<_, Error>>()?;
    Ok(PolicyList { rules })
}

/// Parses `sbx policy check network --json <host>`: `{"allowed": bool, "governance":
/// {"active": bool}}`.
///
/// # Errors
///
/// [`Error::Malformed`] for any other shape.
pub fn parse_policy_check(bytes: &[u8]) -> Result<PolicyCheck, Error> {
    let call = Call::PolicyCheck;
    let top = document(call, bytes)?;
    let fields = Fields::of(call, "the document", &top)?;
    let allowed = fields.required_bool("allowed")?;
    let governance = top
        .get("governance")
        .ok_or_else(|| Error::malformed(call, "`governance` is missing"))?;
    let governance_active =
        Fields::of(call, "`governance`", governance)?.required_bool("active")?;
    Ok(PolicyCheck {
        allowed,
        governance_active,
    })
}

/// Parses `sbx secret ls --json`: `{"secrets": [{name, scope}], "env_only_count": int,
/// "custom_secrets": [{env, scope, targets}]}`.
///
/// # Errors
///
/// [`Error::Malformed`] when the document is not an object with a `secrets` array, or a field
/// has the wrong type.
pub fn parse_secret_ls(bytes: &[u8]) -> Result<SecretList, Error> {
    let call = Call::SecretLs;
    let top = top_object(call, document(call, bytes)?)?;
    let top = Value::Object(top);
    let fields = Fields::of(call, "the document", &top)?;
    if !matches!(top.get("secrets"), Some(Value::Array(_))) {
        return Err(Error::malformed(call, "no `secrets` array"));
    }
    let secrets = fields
        .array("secrets")?
        .iter()
        .map(|item| {
            let entry = Fields::of(call, "a secret", item)?;
            Ok(SecretEntry {
                name: entry.string("name")?,
                scope: entry.string("scope")?,
            })
        })
        .collect::<Result<_, Error>>()?;
    let env_only_count = match top.get("env_only_count") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(number)) => number
            .as_u64()
            .ok_or_else(|| Error::malformed(call, "`env_only_count` is not a whole number"))?,
        Some(other) => return Err(fields.wrong("env_only_count", "a number", other)),
    };
    let custom_secrets = fields
        .array("custom_secrets")?
        .iter()
        .map(|item| {
            let entry = Fields::of(call, "a custom secret", item)?;
            Ok(CustomSecret {
                env: entry.string("env")?,
                scope: entry.string("scope")?,
                targets: entry.strings("targets")?,
            })
        })
        .collect::<Result<_, Error>>()?;
    Ok(SecretList {
        secrets,
        env_only_count,
        custom_secrets,
    })
}
